"""The byte layout of an ``Encoded`` tensor: ``to_bytes`` and its inverse ``from_bytes``.

Per unit (scale block), in order::

    [bitmap: ceil(n_u / 8) bytes, sparse payloads only, bit i of the unit = value i kept]
    [scale:  1 byte, int8 and fp4 only, the exponent e + 127]
    [codes:  kept_u codes, little-endian; fp4 two per byte, the first in the low nibble]

so ``len(to_bytes(e)) == e.nbytes``. Nothing else travels: the format, shape and unit
size are agreed in advance (they follow from the config), as in a real collective.
"""

from __future__ import annotations

import numpy as np

from diloco.core.quantize import BITS, SCALED, Encoded, unit_bounds

__all__ = ["to_bytes", "from_bytes"]

_CODE_DTYPES = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "int8": "i1", "fp4": "u1"}


def _pack_codes(codes: np.ndarray, fmt: str) -> bytes:
    if fmt != "fp4":
        return codes.astype(_CODE_DTYPES[fmt]).tobytes()
    padded = np.zeros(codes.size + codes.size % 2, dtype=np.uint8)
    padded[:codes.size] = codes
    return (padded[0::2] | (padded[1::2] << 4)).astype(np.uint8).tobytes()


def _unpack_codes(buffer: bytes, offset: int, count: int, fmt: str) -> tuple[np.ndarray, int]:
    length = (count * BITS[fmt] + 7) // 8
    raw = np.frombuffer(buffer, dtype=np.uint8, count=length, offset=offset)
    if fmt == "fp4":
        codes = np.empty(2 * length, dtype=np.uint8)
        codes[0::2], codes[1::2] = raw & 0x0F, raw >> 4
        codes = codes[:count]
    else:
        codes = raw.view(_CODE_DTYPES[fmt]).astype(np.dtype(_CODE_DTYPES[fmt]).newbyteorder("="))
    return codes, offset + length


def to_bytes(encoded: Encoded) -> bytes:
    """The wire bytes of ``encoded`` (``encoded.nbytes`` of them)."""
    bounds = unit_bounds(encoded.size, encoded.unit)
    position = 0  # index into encoded.codes
    pieces = []
    for u, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        if encoded.keep is not None:
            kept = encoded.keep[start:stop]
            pieces.append(np.packbits(kept, bitorder="little").tobytes())
            count = int(kept.sum())
        else:
            count = int(stop - start)
        if encoded.fmt in SCALED:
            pieces.append(bytes([int(encoded.exponents[u]) + 127]))
        pieces.append(_pack_codes(encoded.codes[position:position + count], encoded.fmt))
        position += count
    return b"".join(pieces)


def from_bytes(buffer: bytes, fmt: str, shape, unit: int, *, sparse: bool, offset: int = 0
               ) -> tuple[Encoded, int]:
    """Parse one tensor's payload starting at ``offset``.

    Returns
    -------
    (Encoded, next_offset)
    """
    shape = tuple(int(n) for n in shape)
    size = int(np.prod(shape, dtype=np.int64))
    bounds = unit_bounds(size, unit)
    keep_parts, code_parts, exponents = [], [], []
    for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
        length = int(stop - start)
        if sparse:
            nbytes = (length + 7) // 8
            bits = np.frombuffer(buffer, dtype=np.uint8, count=nbytes, offset=offset)
            kept = np.unpackbits(bits, count=length, bitorder="little").astype(bool)
            keep_parts.append(kept)
            offset += nbytes
            count = int(kept.sum())
        else:
            count = length
        if fmt in SCALED:
            exponents.append(buffer[offset] - 127)
            offset += 1
        codes, offset = _unpack_codes(buffer, offset, count, fmt)
        code_parts.append(codes)
    codes = np.concatenate(code_parts) if code_parts else np.zeros(0, dtype=_CODE_DTYPES[fmt])
    keep = np.concatenate(keep_parts) if sparse and keep_parts else (np.zeros(0, bool) if sparse else None)
    return Encoded(fmt, shape, unit, codes, np.array(exponents, dtype=np.int16), keep), offset
