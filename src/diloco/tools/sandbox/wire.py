"""The sandbox wire format, part 1: frames, array buffers and exceptions as plain data.

Between the grader's tests and the sandboxed submission only plain data crosses, never
pickle. A *frame* is ``MAGIC``, two lengths, a JSON header, then the arrays the header
refers to, each one ``.npy`` blob that is read back with ``allow_pickle=False``; anything
else is a ``WireError``. Values inside the header are described in ``wire_values``.

Arrays keep their memory sharing across the boundary. Each side gives every *root*
buffer that crossed a handle (held weakly, in a ``Registry``), and an array is sent as
its data plus its place in its root (byte offset and strides). A result that is a view of
an argument therefore comes back as a view of the caller's argument, an argument changed
in place is changed in place for the caller too, and two results that share memory in
the sandbox share it for the caller.

An exception crosses as its builtin base classes, message, simple ``args``, traceback
lines and the last line of the graded package that ran (``describe_exception``); the
other side raises the nearest builtin class again (``rebuild_exception``).

Nothing that arrives is trusted (``wire_decode``): every size is checked against a cap
before anything of that size is allocated (the header's bytes and its count of JSON
containers, the number and total size of the blobs, an array's declared shape, the buffers
a message may make the reader allocate: ``Budget``), an array is copied out of the bytes
received (never a view of them, never memory at an address the sender chose), and only
numeric dtypes load.

This module and ``wire_values`` import only the standard library and NumPy (and each
other, relatively): the sandbox loads them from a copy, never through ``diloco``.
"""


from __future__ import annotations

import builtins
import io
import json
import os
import re
import select
import struct
import time
import traceback
import weakref

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds
except ImportError:  # NumPy < 2
    byte_bounds = np.byte_bounds

MAGIC = b"DLW2"
MAX_HEADER = 4 << 20  # bytes of JSON; the milestone suite's largest is about 8 KB
MAX_CONTAINERS = 100_000  # JSON objects and arrays in one header (each costs ~100 bytes parsed)
MAX_DEPTH = 64  # nesting of values (the suite's deepest is about 6)
MAX_BLOBS = 10_000  # arrays in one frame (the suite's most is about 50)
MAX_FRAME = 128 << 20  # header and blobs together (the suite's largest is about 2 MB)
MAX_DECODE = 128 << 20  # bytes one message may make the reader allocate (copies, shared buffers)
MAX_NDIM = 32
MAX_DIGITS = 1000  # of one JSON integer (a PCG64 state has 39)
ARRAY_KINDS = set("biufc")  # bool, integers, floats, complex: numbers only


class WireError(ValueError):
    """A frame or value that is not well-formed (or cannot be sent)."""


class Budget:
    """Bytes a message may still make the reader allocate; ``take`` past the cap is a ``WireError``."""

    def __init__(self, limit: int = MAX_DECODE):
        self.left = limit

    def take(self, size: int, what: str = "arrays") -> None:
        if size > self.left:
            raise WireError(f"the message's {what} need more than the {MAX_DECODE >> 20} MiB a message may use")
        self.left -= size


# --------------------------------------------------------------------------- frames


def _wait(fd: int, write: bool, deadline: float | None) -> None:
    timeout = None if deadline is None else deadline - time.monotonic()
    if timeout is not None and timeout <= 0:
        raise TimeoutError
    ready = select.select([], [fd], [], timeout) if write else select.select([fd], [], [], timeout)
    if not any(ready):
        raise TimeoutError


class Reader:
    """Buffered reads from a pipe: one frame takes one or two system calls, not one per field."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = bytearray()

    def exact(self, size: int, deadline: float | None) -> bytes:
        while len(self._buffer) < size:
            _wait(self.fd, False, deadline)
            chunk = os.read(self.fd, min(max(size - len(self._buffer), 1 << 16), 1 << 22))
            if not chunk:
                raise EOFError("the other end closed the channel")
            self._buffer += chunk
        data = bytes(memoryview(self._buffer)[:size])
        del self._buffer[:size]
        return data


def write_frame(fd: int, header: dict, blobs: list[bytes], deadline: float | None = None) -> None:
    """Send one frame; ``TimeoutError`` when the reader stops reading before ``deadline``."""
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    parts = [MAGIC, struct.pack("<QI", len(text), len(blobs)), text]
    for blob in blobs:
        parts += [struct.pack("<Q", len(blob)), blob]
    view = memoryview(b"".join(parts))
    while view:
        _wait(fd, True, deadline)
        view = view[os.write(fd, view[:1 << 20]):]


def _integer(text: str) -> int:
    if len(text) > MAX_DIGITS:
        raise WireError(f"an integer of {len(text)} digits")
    return int(text)


def parse_header(text: bytes) -> dict:
    """A frame's JSON header, refused before parsing when it holds too many containers."""
    containers = text.count(b"{") + text.count(b"[")  # an upper bound: brackets in strings count too
    if containers > MAX_CONTAINERS:
        raise WireError(f"a header of {containers} JSON containers (at most {MAX_CONTAINERS})")
    try:
        header = json.loads(text.decode("utf-8"), parse_int=_integer)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"the frame's header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("the frame's header is not a JSON object")
    return header


def read_frame(source: Reader | int, deadline: float | None = None) -> tuple[dict, list[bytes]]:
    """One frame: ``(header, blobs)``. ``WireError`` if malformed, ``EOFError``, ``TimeoutError``.

    Every length is checked before that many bytes are read: a header of at most
    ``MAX_HEADER`` bytes, at most ``MAX_BLOBS`` blobs, at most ``MAX_FRAME`` bytes in all.
    """
    reader = source if isinstance(source, Reader) else Reader(source)
    magic = reader.exact(len(MAGIC), deadline)
    if magic != MAGIC:
        raise WireError(f"not a frame of the sandbox wire format (starts {magic!r})")
    size, count = struct.unpack("<QI", reader.exact(12, deadline))
    if size > MAX_HEADER or count > MAX_BLOBS:
        raise WireError(f"frame too large ({size} header bytes, {count} arrays; at most {MAX_HEADER} and "
                        f"{MAX_BLOBS})")
    header = parse_header(reader.exact(size, deadline))
    blobs, total = [], size
    for _ in range(count):
        (length,) = struct.unpack("<Q", reader.exact(8, deadline))
        total += length + 8
        if total > MAX_FRAME:
            raise WireError(f"frame larger than {MAX_FRAME} bytes")
        blobs.append(reader.exact(length, deadline))
    return header, blobs


# --------------------------------------------------------------------------- array roots


def root_of(array: np.ndarray) -> np.ndarray:
    """The array at the end of ``array``'s chain of ndarray bases: the buffer it lives in."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def flat_bytes(root: np.ndarray) -> np.ndarray | None:
    """``root``'s bytes as a flat uint8 view, in memory order; None when they are not contiguous."""
    if root.flags.c_contiguous:
        flat = root.reshape(-1)
    elif root.flags.f_contiguous:
        flat = root.reshape(-1, order="F")
    else:
        return None
    return flat.view(np.uint8) if flat.size else None


class Registry:
    """Root buffers that crossed the boundary, by handle, held weakly (one per side)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self._count = 0
        self._by_id: dict[int, tuple[weakref.ref, str]] = {}
        self._by_handle: dict[str, weakref.ref] = {}

    def handle(self, root: np.ndarray) -> str:
        entry = self._by_id.get(id(root))
        if entry is not None and entry[0]() is root:
            return entry[1]
        self._count += 1
        handle = f"{self.prefix}{self._count}"
        self.adopt(handle, root)
        return handle

    def adopt(self, handle: str, root: np.ndarray) -> None:
        key = id(root)

        def forget(ref, key=key, handle=handle):
            if self._by_id.get(key, (None,))[0] is ref:
                del self._by_id[key]
            if self._by_handle.get(handle) is ref:
                del self._by_handle[handle]

        ref = weakref.ref(root, forget)
        self._by_id[key] = (ref, handle)
        self._by_handle[handle] = ref

    def root(self, handle: str) -> np.ndarray | None:
        ref = self._by_handle.get(handle)
        return None if ref is None else ref()


def blob_of(array: np.ndarray) -> bytes:
    if array.dtype.kind not in ARRAY_KINDS:
        raise WireError(f"an array of dtype {array.dtype} cannot cross (only numbers, bools and strings)")
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


_NPY = re.compile(rb"\x93NUMPY\x01\x00(..)\{'descr': '([<>|=][biufc]\d{1,2})', 'fortran_order': (True|False), "
                  rb"'shape': \(((?:\d{1,19}, ?){0,32}\d{0,19})\), \} *\n", re.S)


def load_array(blob, budget: Budget | None = None) -> np.ndarray:
    """The array of an ``.npy`` blob, checked before anything is allocated, as a copy of its own.

    Only the header ``np.save`` writes (version 1.0), parsed by a strict pattern, never
    evaluated: a numeric dtype (``ARRAY_KINDS``), at most ``MAX_NDIM`` dimensions, and a
    shape that accounts for exactly the blob's bytes. The result owns its memory (it is no
    view of ``blob``) and is charged to ``budget``.
    """
    if not isinstance(blob, (bytes, bytearray)):
        raise WireError("an array blob that is not bytes")
    match = _NPY.match(blob)
    if match is None:
        raise WireError(f"an array blob whose header is not that of an array of numbers: {bytes(blob[:80])!r}")
    start = 10 + int.from_bytes(match[1], "little")
    dtype = np.dtype(match[2].decode("ascii"))
    shape = tuple(int(n) for n in match[4].split(b",") if n.strip())
    if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise WireError(f"an array blob of dtype {dtype} (only numbers may cross)")
    if len(shape) > MAX_NDIM or match.end() != start:
        raise WireError(f"an array blob of shape {shape} (at most {MAX_NDIM} dimensions) or a malformed header")
    count = 1
    for n in shape:
        count *= n
    if count * dtype.itemsize != len(blob) - start:
        raise WireError(f"an array blob whose shape {shape} does not match its {len(blob) - start} bytes")
    if budget is not None:
        budget.take(count * dtype.itemsize)
    flat = np.frombuffer(blob, dtype=dtype, count=count, offset=start)
    array = flat.reshape(shape[::-1]).T if match[3] == b"True" else flat.reshape(shape)
    return array.copy(order="K")


# --------------------------------------------------------------------------- exceptions

_SIMPLE = (str, int, float, bool, type(None))


def describe_exception(exc: BaseException, package_dir: str = "", skip: int = 1) -> dict:
    """``exc`` as plain data; ``skip`` leading frames (the sandbox's own) are left out."""
    cls = type(exc)
    try:
        message = str(exc)[:20000]
    except Exception:  # noqa: BLE001 - a broken __str__ must not stop the reply
        message = f"<{cls.__name__} whose message cannot be shown>"
    frames = traceback.extract_tb(exc.__traceback__)[skip:]
    where = ""
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if package_dir and path.startswith(package_dir + os.sep):
            name = "diloco/" + os.path.relpath(path, package_dir)
            where = f"{name}:{frame.lineno}: {(frame.line or '').strip()}"
            break
    lines = [line.rstrip() for chunk in traceback.format_list(frames[-20:]) for line in chunk.splitlines()]
    return {
        "type": cls.__name__,
        "bases": [c.__name__ for c in cls.__mro__ if c.__module__ == "builtins"],
        "message": message,
        "args": list(exc.args) if all(type(a) in _SIMPLE for a in exc.args) else None,
        "traceback": lines + [f"{cls.__name__}: {message[:2000]}"],
        "where": where,
        "notes": [str(note)[:500] for note in getattr(exc, "__notes__", [])][:5],
    }


def rebuild_exception(error: dict) -> Exception | None:
    """The nearest builtin ``Exception`` class of ``error``, raised again with its message.

    ``None`` when there is none (``SystemExit``, ``KeyboardInterrupt``): the caller
    decides what that means. ``WireError`` when ``error`` is malformed.
    """
    if type(error) is not dict or type(error.get("bases")) is not list or type(error.get("message")) is not str:
        raise WireError("a malformed exception")
    cls = _builtin_exception(error["bases"])
    if cls is None:
        return None
    return _constructed(cls, error["message"][:20000], _simple_args(error.get("args")))


def _builtin_exception(bases: list) -> type[Exception] | None:
    """The first of (the first 50) ``bases`` that names a builtin ``Exception`` class, else None."""
    for name in bases[:50]:
        cls = getattr(builtins, name, None) if type(name) is str else None
        if isinstance(cls, type) and issubclass(cls, Exception):
            return cls
    return None


def _simple_args(args) -> list | None:
    """``args`` when it is a short list of plain values (strings not too long), else None."""
    if type(args) is not list or len(args) > 20 or not all(type(a) in _SIMPLE for a in args):
        return None
    if any(type(a) is str and len(a) > 20000 for a in args):
        return None
    return args


def _constructed(cls: type[Exception], message: str, args: list | None) -> Exception:
    """``cls(*args)`` when that prints as ``message``, else ``cls(message)``, else (a class whose
    constructor wants other arguments) a plain ``Exception(message)``."""
    try:
        exc = cls(*args) if args is not None else cls(message)
        if str(exc) != message:
            exc = cls(message)
    except Exception:  # noqa: BLE001 - a class whose constructor wants other arguments
        exc = Exception(message)
    return exc
