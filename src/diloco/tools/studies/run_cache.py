"""The studies' run cache: one JSON outcome per finished run, named by what the run depends on.

A run depends on its algorithm, its config, its seed, its data and, for a study that runs
its arms its own way (``diloco study async`` stops each run at a simulated time), that
runner. The key hashes the config as its **changes from the defaults**
(``config_changes``): the fields whose value differs from ``type(config)()``'s, sections
compared field by field. A field added later with a default changes no stored key, so
every stored run keeps hitting; a field set away from its default changes the key. A
change that alters what a stored run would give (the maths, ``outcome_of``'s fields, a
default's value) bumps ``CACHE_VERSION`` instead, and every stored run is then trained
again. A run on the reference engine also carries ``code_version``: a hash of the sources a
learner writes (the milestone and exercise modules), which that engine runs, so a run
stored before a milestone body changed is trained again (in a learner workspace, after
every fix to a milestone).

Runs stored under the first key (the whole ``config.to_dict()``, no version) are still
found: ``RunCache.get`` looks the legacy key up when the key misses and copies a hit to
its new name.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import time
from pathlib import Path

from diloco.tools.runs.atomic_files import write_json

__all__ = ["CACHE_VERSION", "RunCache", "config_changes", "code_version"]

# Bump on any change that makes a stored outcome stale: the training maths, the fields of
# ``paper_runs.outcome_of``, a config default's value (the key stores only the changes from it).
CACHE_VERSION = 1


# The outcome's metrics a diverged run leaves NaN or infinite (stored as null, read back as NaN).
_METRICS = ("eval_loss", "eval_accuracy", "eval_perplexity", "eval_bits", "best_eval_loss", "inner_loss")


def _changes(value, default):
    """``value`` where it differs from ``default``: a dict of the differing keys (nested), the
    value itself for a differing leaf, ``None`` where they are equal."""
    if isinstance(value, dict) and isinstance(default, dict):
        out = {}
        for name, item in value.items():
            if name not in default:
                out[name] = item
                continue
            differs = _changes(item, default[name])
            if differs is not None:
                out[name] = differs
        return out or None
    return None if value == default else value


def config_changes(config) -> dict:
    """The fields of ``config.to_dict()`` that differ from the defaults of its class (sections
    compared field by field): ``{"rounds": 4, "inner": {"lr": 0.01}}``."""
    return _changes(config.to_dict(), type(config)().to_dict()) or {}


@functools.lru_cache(maxsize=1)
def learner_sources() -> str:
    """A hash of the modules a learner writes: the milestone modules and the exercises' (each
    module's path under ``diloco`` and its bytes)."""
    from diloco.exercises import exercise_functions
    from diloco.milestones import MILESTONES

    modules = sorted({m.module for m in MILESTONES} | {module for module, _ in exercise_functions()})
    digest = hashlib.sha256()
    for module in modules:
        spec = importlib.util.find_spec(f"diloco.{module}")
        digest.update(module.encode("utf-8") + b"\0" + Path(spec.origin).read_bytes())
    return digest.hexdigest()[:16]


def code_version(config) -> str | None:
    """``learner_sources()`` for a run on the reference engine (it runs those functions), None
    for the fast engine (its maths is versioned by ``CACHE_VERSION``)."""
    return learner_sources() if config.engine == "reference" else None


def _digest(record: dict) -> str:
    text = json.dumps(record, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class RunCache:
    """Outcomes on disk, one JSON file per run, named by ``key``.

    Two studies asking for the same run get the same file, so it is trained once. The
    label is not part of the key; a hit is relabelled. Files are written atomically. Two
    processes sharing the folder (``make results --jobs 2``) train a run once: the first to
    ``claim`` its key trains it, the other waits for its outcome (``claim``).
    """

    POLL_SECONDS = 2.0  # how often a process waiting on another's run looks for its outcome

    def __init__(self, directory) -> None:
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"run cache {self.directory} is a file, not a folder")

    @staticmethod
    def key(algo: str, config, seed: int, data_key, runner: str | None = None) -> str:
        """The file name of a run: a hash of ``CACHE_VERSION``, the algorithm, the config's
        changes from its defaults, the seed, the data, the ``code_version`` (reference engine)
        and (when given) the runner's name."""
        record = {"version": CACHE_VERSION, "algo": algo, "changes": config_changes(config), "seed": int(seed),
                  "data": data_key}
        code = code_version(config)
        record = record if code is None else {**record, "code": code}
        return _digest(record if runner is None else {**record, "runner": runner})

    @staticmethod
    def legacy_key(algo: str, config, seed: int, data_key) -> str:
        """The first key: the whole config (``to_dict``), no version (``get`` migrates its files)."""
        return _digest({"algo": algo, "config": config.to_dict(), "seed": int(seed), "data": data_key})

    def _read(self, key: str) -> dict | None:
        path = self.directory / f"{key}.json"
        if not path.is_file():
            return None
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # unreadable: train again
        if not isinstance(stored, dict):
            return None
        # JSON keeps a diverged run's NaN or infinite metric as null: it comes back a NaN
        return {k: float("nan") if v is None and k in _METRICS else v for k, v in stored.items()}

    def get(self, key: str, legacy: str | None = None) -> dict | None:
        """The stored outcome of ``key``; else that of ``legacy`` (copied to ``key``); else None."""
        stored = self._read(key)
        if stored is None and legacy is not None:
            stored = self._read(legacy)
            if stored is not None:
                self.put(key, stored)
        return stored

    def through(self, key: str, train, legacy: str | None = None) -> tuple[dict, bool]:
        """``(outcome, cached)``: the stored outcome of ``key`` (or ``legacy``, ``get``) and True;
        else ``train()``'s, stored under ``key`` while this process holds its ``claim`` (a process
        training it meanwhile gives its outcome instead), and False. Every study run comes here."""
        stored = self.get(key, legacy)
        if stored is not None:
            return stored, True
        with self.claim(key) as stored:
            if stored is not None:
                return stored, True
            outcome = train()
            self.put(key, outcome)
            return outcome, False

    def put(self, key: str, outcome: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_json(self.directory / f"{key}.json", outcome)

    @contextlib.contextmanager
    def claim(self, key: str):
        """Hold ``key`` while this process trains it; yields the outcome when another process has
        stored it meanwhile (then there is nothing to train), else None.

        The claim is a lock file (``<key>.lock``, made with ``O_EXCL``, holding the owner's pid),
        removed on leaving, whatever happens. A process finding another's live claim waits,
        polling every ``POLL_SECONDS``, until the outcome is stored or the claim goes; a claim
        whose owner is no longer running (killed) is taken over.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        lock = self.directory / f"{key}.lock"
        while True:
            stored = self._read(key)
            if stored is not None:
                yield stored
                return
            if self._take(lock):
                break
            time.sleep(self.POLL_SECONDS)
        try:
            yield self._read(key)
        finally:
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()

    @staticmethod
    def _take(lock: Path) -> bool:
        """Make ``lock`` ours: create it, or replace it when its owner has stopped; False while another
        running process holds it."""
        try:
            handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = int(lock.read_text(encoding="utf-8") or 0)
            except (OSError, ValueError):
                return False  # being written by its owner right now
            if owner and _running(owner):
                return False
            with contextlib.suppress(FileNotFoundError):
                lock.unlink()  # its owner stopped: taken over on the next try
            return False
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(str(os.getpid()))
        return True

    def count(self) -> int:
        """The runs stored (files in the folder)."""
        return len(list(self.directory.glob("*.json"))) if self.directory.is_dir() else 0


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists (``kill(pid, 0)``; one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
