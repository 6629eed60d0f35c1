"""Run folders: what every ``diloco`` command leaves on disk, written so a crash never tears a file.

A run folder ``runs/<time>-<name>/`` holds

* ``config.json``      the experiment (``DiLoCoConfig.to_dict``) and the data it ran on;
* ``environment.json`` package versions, Python, platform, seed, git commit if any;
* ``history.jsonl``    one JSON object per round, appended as the round ends (so a Ctrl-C
                       or a kill keeps every finished round);
* ``summary.json``     ``"status"`` (see ``STATUSES``) and, once the run ends, the final
                       numbers per algorithm;
* ``checkpoints/``     ``diloco.tools.runs.checkpoint`` files, and ``params-<algo>.npz``, the
                       final global parameters;
* PNG plots            written by ``diloco.tools.studies.plots``;
* ``.lock``            the advisory lock of the one process writing the folder (its pid);
* ``.reserve``         a few kB kept free while the run writes, so that a full disk can
                       still take the ``"failed"`` summary (``diloco.tools.runs.run_lock``).

Every whole file is written atomically: to a temporary name in the same folder, flushed
and ``fsync``-ed, then renamed over the target with ``os.replace`` (``atomic_write_bytes``).
A failure (disk full, a kill) leaves either the old file or the new one, never half of one,
and never a stray temporary file when Python is still running to remove it. JSONL files
grow by appending one whole line per record (``JsonlWriter``); a failed append is cut
back to the previous length, so the file never ends in a torn line, and ``read_jsonl``
skips (with a ``TornLineWarning``) a torn last line left by a power cut.
NumPy only; nothing here imports matplotlib or tqdm. The atomic writes live in
``diloco.tools.runs.atomic_files`` and ``environment.json``'s record in
``diloco.tools.runs.run_environment``; both are re-exported here.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import time
import warnings
from datetime import datetime
from pathlib import Path

from diloco.loop import RoundRecord
from diloco.tools.runs.atomic_files import (
    atomic_write_bytes,
    atomic_write_text,
    name_os_error,
    npz_bytes,
    read_json,
    to_jsonable,
    write_json,
)
from diloco.tools.runs.run_environment import environment_record, git_commit
from diloco.tools.runs.run_lock import RunLocked, free_reserves, held_runs, lock_run_dir, release_runs

__all__ = [
    "HISTORY_FIELDS",
    "STATUSES",
    "TornLineWarning",
    "create_run_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "npz_bytes",
    "write_json",
    "read_json",
    "read_jsonl",
    "repair_jsonl",
    "JsonlWriter",
    "HistoryWriter",
    "environment_record",
    "git_commit",
    "RunLocked",
    "lock_run_dir",
    "held_runs",
    "free_reserves",
    "release_runs",
]

# The fields of every history.jsonl record, in order: the algorithm, every field each
# ``diloco.loop.RoundRecord`` has (the one schema of a round's record), the DiLoCo-only
# ``pseudo_grad_norm`` (None for the baseline) and the wall time. Other RoundRecord fields
# follow where a run has them. docs/cli.md explains each.
HISTORY_FIELDS = (
    "algo", *(name for name in RoundRecord.__annotations__ if name in RoundRecord.__required_keys__),
    "pseudo_grad_norm", "time",
)

# The values of summary.json's "status" (docs/failure-and-recovery.md explains each).
STATUSES = ("running", "completed", "interrupted", "diverged", "failed")


class TornLineWarning(UserWarning):
    """``read_jsonl`` skipped an incomplete last line (a write cut short by a crash)."""


def _slug(name: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")
    return slug or "run"


def create_run_dir(root, name: str) -> Path:
    """Make and return a new folder ``root/<YYYYmmdd-HHMMSS>-<name>``.

    A clash (two runs in the same second) gets a ``-2``, ``-3``, ... suffix; an
    existing folder is never reused.

    Raises
    ------
    OSError
        ``root`` cannot be created or written, or the name is too long for the file system.
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


def _parse_line(line: bytes):
    try:
        record = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _split_jsonl(path: Path) -> tuple[list[dict], bytes]:
    """(the records, a torn tail) of a JSONL file; a damaged line before the last raises."""
    data = path.read_bytes()
    *complete, tail = data.split(b"\n")  # ``tail`` is what follows the last newline
    records = []
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        record = _parse_line(line)
        if record is None:
            raise ValueError(f"{path}: line {number} is not a JSON object; the file is damaged, not torn")
        records.append(record)
    if tail.strip():
        record = _parse_line(tail)
        if record is None:
            return records, tail
        records.append(record)  # complete, only its newline is missing
    return records, b""


def read_jsonl(path) -> list[dict]:
    """Every complete record of a JSONL file.

    A torn last line (a crash in the middle of an append) is skipped with a
    ``TornLineWarning`` that says how many bytes were ignored; ``repair_jsonl`` removes
    it from the file.

    Raises
    ------
    ValueError
        A line other than the last is not a JSON object (the file was damaged, not torn).
    """
    records, torn = _split_jsonl(Path(path))
    if torn:
        warnings.warn(f"{path}: skipped a torn last line ({len(torn)} bytes)", TornLineWarning, stacklevel=2)
    return records


def repair_jsonl(path) -> str | None:
    """Rewrite a JSONL file without its torn last line (atomically).

    Returns a message saying what was removed, or None when the file was whole.
    """
    path = Path(path)
    records, torn = _split_jsonl(path)
    data = path.read_bytes()
    if not torn and (not data or data.endswith(b"\n")):
        return None
    atomic_write_text(path, "".join(json.dumps(record) + "\n" for record in records))
    if not torn:
        return f"{path.name}: added the missing newline after the last record"
    return f"{path.name}: removed a torn last line ({len(torn)} bytes); {len(records)} records kept"


class JsonlWriter:
    """Appends one JSON object per line; a line is either all there or absent.

    Each record is one ``write`` of the whole line with the file opened for appending.
    If the write fails part-way (a full disk), the file is cut back to its length before
    the write and the ``OSError`` propagates, so the file never ends in a torn line.
    """

    def __init__(self, path):
        self.path = Path(path)
        self.path.touch()

    def write_line(self, record: dict) -> None:
        line = (json.dumps(to_jsonable(record), allow_nan=False) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            start = os.fstat(fd).st_size
            try:
                written = 0
                while written < len(line):
                    written += os.write(fd, line[written:])
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
                if isinstance(exc, OSError) and exc.filename is None:
                    raise name_os_error(exc, self.path) from exc
                raise
        finally:
            os.close(fd)

    def rewrite(self, records: list[dict]) -> None:
        """Replace the whole file by ``records`` (atomically)."""
        atomic_write_text(self.path, "".join(json.dumps(to_jsonable(r), allow_nan=False) + "\n" for r in records))


class HistoryWriter(JsonlWriter):
    """Appends one record per round to ``history.jsonl`` and keeps them in memory.

    ``writer.callback(algo, **tags)`` returns an ``on_round`` function for
    ``train_diloco`` / ``train_synchronous_baseline``: each call stamps the record
    with the algorithm, the tags and the seconds since the callback was made, and
    appends it as one line, so the file always holds every finished round.

    ``guard(record)``, if given, sees every stamped record before it is written and may
    raise (the divergence guard of ``diloco.tools.runs.training``): the bad round is then
    neither written nor kept.
    """

    def __init__(self, path, *, guard=None):
        super().__init__(path)
        self.records: list[dict] = []
        self.guard = guard
        self._next: dict = {}

    def mark_next(self, **fields) -> None:
        """Add ``fields`` to the next record appended (``--allow-code-change`` marks where)."""
        self._next.update(fields)

    def append(self, record: dict) -> dict:
        ordered = {key: record[key] for key in HISTORY_FIELDS if key in record}
        ordered.update({key: value for key, value in record.items() if key not in ordered})
        ordered.update(self._next)
        if self.guard is not None:
            self.guard(ordered)
        self.write_line(ordered)
        self.records.append(ordered)
        self._next = {}
        return ordered

    def verify(self) -> None:
        """Raise ``OSError`` (naming the file) unless the file holds the records written through this
        writer: a run never says "completed" beside a history that was lost or changed from outside."""
        try:
            on_disk = len(read_jsonl(self.path))
        except ValueError:
            on_disk = None
        if on_disk != len(self.records):
            held = "damaged lines" if on_disk is None else f"{on_disk:,} records"
            raise OSError(errno.EIO, f"it holds {held}, but the run wrote {len(self.records):,} (the file was "
                                     f"changed from outside the run)", str(self.path))

    def restart(self, records: list[dict]) -> None:
        """Make ``records`` the whole history (on disk and in memory): resuming a run."""
        self.rewrite(records)
        self.records = list(records)

    def callback(self, algo: str, after=None, *, time_offset: float = 0.0, **tags):
        """An ``on_round`` callback writing records tagged ``algo`` (and ``tags``).

        ``after(record)``, if given, runs once the record is on disk (a progress bar).
        ``time_offset`` is added to the seconds (a resumed run continues its clock).
        """
        start = time.perf_counter() - time_offset

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
