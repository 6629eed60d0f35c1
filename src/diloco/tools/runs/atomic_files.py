"""Files written so that a crash never tears them: temporary file, fsync, ``os.replace``.

``atomic_write_bytes`` writes to a temporary name in the same folder, flushes and
``fsync``-s it, then renames it over the target with ``os.replace`` and syncs the folder.
A failure (disk full, a kill) leaves either the old file or the new one, never half of
one, and never a stray temporary file when Python is still running to remove it; the
error names the file the caller asked for. ``write_json`` writes strict JSON this way
(NaN/Inf become null); ``read_json`` names the file it cannot parse. ``npz_bytes`` is an
``.npz`` archive of arrays in memory, made whole before a stop signal is let through. Re-exported by
``diloco.tools.runs.folders``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from diloco.runtime import stop_signals

__all__ = ["atomic_write_bytes", "atomic_write_text", "write_json", "read_json", "npz_bytes"]


def npz_bytes(arrays: dict) -> bytes:
    """``np.savez`` of ``arrays`` into memory. A stop signal landing inside waits until the archive
    is whole (``stop_signals.deferred``): ``zipfile`` stopped between ``_writing = True`` and the
    writer it returns cannot close its archive, and its ``ValueError`` would replace the signal."""
    buffer = io.BytesIO()
    with stop_signals.deferred():
        np.savez(buffer, **arrays)
    return buffer.getvalue()


def _fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: not every platform allows it)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically: temporary file, flush, fsync, ``os.replace``.

    On any failure (``OSError`` such as a full disk, ``MemoryError``, a ``KeyboardInterrupt``)
    the temporary file is removed and ``path`` keeps its previous content, if it had one.
    """
    path = Path(path)
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), 0o644)
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        if isinstance(exc, OSError) and exc.filename != str(path):
            raise name_os_error(exc, path) from exc
        raise
    _fsync_dir(path.parent)
    return path


def name_os_error(exc: OSError, path: Path) -> OSError:
    """The same error, naming the file the caller asked for (not a temporary name, not none)."""
    return type(exc)(exc.errno, exc.strerror or str(exc), str(path))


def atomic_write_text(path, text: str) -> Path:
    """``atomic_write_bytes`` of ``text`` encoded as UTF-8."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def to_jsonable(value):
    """NaN/Inf become None (JSON has no such numbers); NumPy scalars become Python ones."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path, data) -> Path:
    """Write ``data`` as indented, strict JSON (NaN/Inf become null), atomically."""
    return atomic_write_text(path, json.dumps(to_jsonable(data), indent=2, allow_nan=False) + "\n")


def read_json(path):
    """Parse a JSON file; ``ValueError`` naming the file if it is not valid JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
