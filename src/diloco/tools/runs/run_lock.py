"""One writer per run folder: an advisory lock for the whole run, and room kept for the last word.

``lock_run_dir`` takes ``fcntl.flock`` of the folder's ``.lock`` for as long as this
process lives (or until ``release_runs``): a second writer, such as a second
``--resume`` of the same run, is refused with ``RunLocked`` naming the pid holding it.
The kernel drops the lock of a process that dies, even by SIGKILL, so a stale ``.lock``
never blocks a resume.

It also writes ``.reserve`` (16 kB of zeros). ``free_reserves`` deletes it just before
the failure summary is written (``diloco.tools.runs.faults``), so that a disk that filled up
while a checkpoint was written still has room to say ``"failed"`` and why. Re-exported
by ``diloco.tools.runs.folders``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from diloco.tools.runs.atomic_files import atomic_write_bytes

__all__ = ["RunLocked", "LOCK_NAME", "RESERVE_NAME", "lock_run_dir", "held_runs", "free_reserves", "release_runs"]


class RunLocked(OSError):
    """Another live process holds a run folder's lock; ``pid`` says which (None if unknown)."""

    def __init__(self, run_dir: Path, pid: int | None):
        holder = f"process {pid}" if pid is not None else "another process"
        super().__init__(errno.EWOULDBLOCK, f"{run_dir} is being written by {holder} (its .lock is held); "
                                            f"wait for it to end, or stop it first")
        self.run_dir, self.pid = run_dir, pid


LOCK_NAME, RESERVE_NAME = ".lock", ".reserve"
RESERVE_BYTES = 16 * 1024  # room for summary.json and its temporary copy on a full disk

# run folder -> (the locked file descriptor, the command that holds it): this process's runs.
_HELD: dict[Path, tuple[int, str]] = {}


def lock_run_dir(run_dir, command: str = "") -> Path:
    """Take the folder's advisory lock (``fcntl.flock`` of ``.lock``) for this process's lifetime.

    One writer per run folder: a second process (a second ``--resume`` of the same run)
    gets ``RunLocked`` naming the pid in the lock file. The kernel drops a lock when its
    process dies (even by SIGKILL), so a stale ``.lock`` left by a dead process does not
    block a resume. The lock file holds the pid for messages only; it is overwritten in
    place, the one file here not replaced atomically (a replaced file would not be the
    locked one). Also writes ``.reserve`` (see ``free_reserves``). Idempotent in-process.
    """
    run_dir = Path(run_dir).resolve()
    if run_dir in _HELD:
        return run_dir
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        raise RunLocked(run_dir, int(text) if text.isdigit() else None) from None
    except BaseException:
        os.close(fd)
        raise
    _HELD[run_dir] = (fd, command)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        with contextlib.suppress(OSError):  # best effort: a disk already full gets no reserve
            atomic_write_bytes(run_dir / RESERVE_NAME, bytes(RESERVE_BYTES))
    except BaseException:
        release_runs(run_dir)
        raise
    return run_dir


def held_runs() -> dict[Path, str]:
    """The run folders this process holds the lock of, with the command that made them."""
    return {path: command for path, (_, command) in _HELD.items()}


def free_reserves() -> None:
    """Delete the ``.reserve`` of every held folder: its space is there for the failure summary."""
    for path in _HELD:
        with contextlib.suppress(OSError):
            os.unlink(path / RESERVE_NAME)


def release_runs(run_dir=None) -> None:
    """Release the lock of ``run_dir`` (default: every held folder) and delete its reserve."""
    for path in [Path(run_dir).resolve()] if run_dir is not None else list(_HELD):
        held = _HELD.pop(path, None)
        if held is None:
            continue
        with contextlib.suppress(OSError):
            os.unlink(path / RESERVE_NAME)
        with contextlib.suppress(OSError):
            os.close(held[0])
