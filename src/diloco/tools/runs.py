"""Run folders: what every ``diloco`` command leaves on disk.

A run folder ``runs/<time>-<name>/`` holds

* ``config.json``      the experiment (``DiLoCoConfig.to_dict``) and the data it ran on;
* ``environment.json`` package versions, Python, platform, seed, git commit if any;
* ``history.jsonl``    one JSON object per round, appended and flushed as the round ends
                       (so a Ctrl-C keeps every finished round);
* ``summary.json``     final numbers per algorithm, ``"status": "completed"`` or
                       ``"interrupted"``;
* PNG plots            written by ``diloco.tools.plots``.

JSON files are written to a temporary name and renamed into place, so an interruption
never leaves half a file. NumPy only; nothing here imports matplotlib or tqdm.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from datetime import datetime
from importlib import metadata
from pathlib import Path

__all__ = [
    "HISTORY_FIELDS",
    "create_run_dir",
    "write_json",
    "read_jsonl",
    "HistoryWriter",
    "environment_record",
    "git_commit",
]

# The fields of every history.jsonl record, in order (docs/cli.md explains each).
HISTORY_FIELDS = (
    "algo", "round", "step", "inner_loss", "eval_loss", "eval_accuracy", "all_reduces", "bytes_sent",
    "cumulative_bytes", "pseudo_grad_norm", "worker_losses", "time",
)

_OPTIONAL_PACKAGES = ("numpy", "tqdm", "matplotlib", "mnist1d", "scipy")


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return slug or "run"


def create_run_dir(root, name: str) -> Path:
    """Make and return a new folder ``root/<YYYYmmdd-HHMMSS>-<name>``.

    A clash (two runs in the same second) gets a ``-2``, ``-3``, ... suffix; an
    existing folder is never reused.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stem = f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{_slug(name)}"
    for attempt in range(1, 1000):
        path = root / (stem if attempt == 1 else f"{stem}-{attempt}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"could not create a fresh run folder under {root}")


def _jsonable(value):
    """NaN/Inf become None (JSON has no such numbers); NumPy scalars become Python ones."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path, data) -> Path:
    """Write ``data`` as indented JSON, atomically (temporary file, then rename)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(json.dumps(_jsonable(data), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def read_jsonl(path) -> list[dict]:
    """Every complete record of a JSONL file (a torn last line, if any, is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


class HistoryWriter:
    """Appends one record per round to ``history.jsonl`` and keeps them in memory.

    ``writer.callback(algo, **tags)`` returns an ``on_round`` function for
    ``train_diloco`` / ``train_synchronous_baseline``: each call stamps the record
    with the algorithm, the tags and the seconds since the callback was made, writes
    it as one line and flushes, so the file always holds every finished round.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.records: list[dict] = []
        self.path.touch()

    def append(self, record: dict) -> dict:
        ordered = {key: record[key] for key in HISTORY_FIELDS if key in record}
        ordered.update({key: value for key, value in record.items() if key not in ordered})
        line = json.dumps(_jsonable(ordered), allow_nan=False) + "\n"
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(line)  # one write per record: a line is either all there or absent
            handle.flush()
        self.records.append(ordered)
        return ordered

    def callback(self, algo: str, after=None, **tags):
        """An ``on_round`` callback writing records tagged ``algo`` (and ``tags``).

        ``after(record)``, if given, runs once the record is on disk (a progress bar).
        """
        start = time.perf_counter()

        def on_round(record: dict) -> None:
            stamped = {"algo": algo, **tags, **record, "time": time.perf_counter() - start}
            stamped.setdefault("pseudo_grad_norm", None)
            written = self.append(stamped)
            if after is not None:
                after(written)

        return on_round

    def for_algo(self, algo: str, **tags) -> list[dict]:
        return [r for r in self.records
                if r.get("algo") == algo and all(r.get(k) == v for k, v in tags.items())]


def git_commit(directory=None) -> str | None:
    """The commit checked out in ``directory`` (default: where this package lives), or None.

    Read-only (``git rev-parse HEAD``); a ``+dirty`` suffix marks uncommitted changes.
    """
    directory = Path(directory) if directory is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=directory,
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not commit:
        return None
    return commit + ("+dirty" if dirty else "")


def environment_record(seed=None, argv=None) -> dict:
    """What produced a run: versions, interpreter, platform, seed, command line, commit."""
    import diloco

    packages = {"diloco": diloco.__version__}
    for name in _OPTIONAL_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "created": datetime.now().isoformat(timespec="seconds"),
        "seed": seed,
        "argv": list(sys.argv if argv is None else argv),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": packages,
        "git_commit": git_commit(),
    }
