"""Wire formats for outer gradients: float64, float32, float16, bfloat16, int8 and fp4 (E2M1).

``encode(x, fmt)`` turns one tensor into codes (and scales); ``decode(encoded, dtype)``
turns them back into floats of the params' dtype. The float formats round to nearest,
ties to even; the two integer-like formats share one power-of-two scale per block of
``block_size`` consecutive values (``block_size=0``: one scale for the whole tensor)::

    float64               the values as they are (sign pruning at full precision)
    float32 / float16     numpy's cast (round to nearest even), after saturating to the
                          format's largest finite value (no overflow to inf)
    bfloat16              the top 16 bits of a float32, rounded to nearest even by bit
                          manipulation (``bfloat16_bits``)
    int8                  q = rint(x / s) in [-127, 127],   s = 2^ceil(log2(amax / 127))
    fp4 (E2M1)            q = the nearest of +-{0, .5, 1, 1.5, 2, 3, 4, 6} to x / s
                          (ties to the even code), s = 2^ceil(log2(amax / 6))

with ``amax`` the block's largest magnitude. The scale is a power of two stored as one
byte, its exponent (as in the OCP Microscaling formats' E8M0 scales): ``x / s`` and
``q * s`` are exact, so a decoded tensor encodes to itself (idempotence), and because
``amax / s <= qmax`` no code ever saturates. An all-zero block gets the smallest scale
and decodes to zeros; exponents are clamped to [-127, 127] (values below ``2^-127``
round to zero, values above ``qmax * 2^127`` saturate).

Sparse payloads (``keep``, from ``sign_prune_mask``) carry a bitmap of the kept
positions and codes for the kept values only. The payload of a tensor is the
concatenation of its *units* (one unit per scale block; for the float formats a unit is
a block of ``block_size`` values, or the tensor): ``[bitmap][scale][codes]`` per unit,
fp4 codes two per byte. ``Encoded.nbytes`` is that size and equals ``len(to_bytes(e))``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import NonFiniteError, api_checks, shown
from diloco.config.sections import FORMATS

__all__ = ["FORMATS", "BITS", "E2M1_GRID", "Encoded", "encode", "decode", "quantize", "to_bytes", "from_bytes",
           "bfloat16_bits", "bfloat16_values", "sign_prune_mask", "unit_bounds", "wire_unit", "scale_exponents",
           "fp4_codes"]

BITS = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16, "int8": 8, "fp4": 4}
SCALED = ("int8", "fp4")
# The 8 magnitudes of E2M1 (2 exponent bits, 1 mantissa bit); index i has mantissa bit i & 1.
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_QMAX = {"int8": 127.0, "fp4": 6.0}
_EXP_MIN, _EXP_MAX = -127, 127
_BF16_MAX = float(np.array([0x7F7F0000], dtype=np.uint32).view(np.float32)[0])  # 3.3895e38


class Encoded(NamedTuple):
    """One tensor on the wire.

    Attributes
    ----------
    fmt : str
        One of ``FORMATS``.
    shape : tuple of int
        The tensor's shape.
    unit : int
        Values per unit (scale block), ``>= 1``; the tensor's size for one unit.
    codes : ndarray of shape (kept,)
        One code per kept value, flat (C) order: float64, float32, float16, uint16 (bfloat16 bits),
        int8, or uint8 holding an fp4 code ``sign << 3 | magnitude index``.
    exponents : ndarray of shape (units,), int16
        The power-of-two scale exponent of each unit; empty for the float formats.
    keep : ndarray of bool of shape (size,) or None
        Kept positions of a sparse payload; None when dense.
    """

    fmt: str
    shape: tuple
    unit: int
    codes: np.ndarray
    exponents: np.ndarray
    keep: np.ndarray | None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: per unit, bitmap + scale byte + packed codes."""
        lengths = np.diff(unit_bounds(self.size, self.unit))
        kept = lengths if self.keep is None else _per_unit(self.keep, self.unit)
        total = np.ceil(kept * BITS[self.fmt] / 8).sum()
        if self.fmt in SCALED:
            total += lengths.size
        if self.keep is not None:
            total += np.ceil(lengths / 8).sum()
        return int(total)


def unit_bounds(size: int, unit: int) -> np.ndarray:
    """Flat offsets ``[0, unit, 2 unit, ..., size]`` of the units of a tensor of ``size`` values."""
    api_checks.unit_bounds(size, unit)
    return np.append(np.arange(0, size, unit), size) if size else np.zeros(1, dtype=np.int64)


def _per_unit(keep: np.ndarray, unit: int) -> np.ndarray:
    """Number of kept values in each unit."""
    starts = unit_bounds(keep.size, unit)[:-1]
    return np.add.reduceat(keep.astype(np.int64), starts) if keep.size else np.zeros(0, dtype=np.int64)


def _check(x, name: str = "x") -> np.ndarray:
    if not isinstance(x, np.ndarray) or not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"{name} must be a floating numpy array, got {type(x).__name__}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    if not np.all(np.isfinite(x)):
        raise NonFiniteError(f"{name} must be finite (a pseudo-gradient with NaN or inf cannot be encoded)")
    return x


def _check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {shown(fmt)}")
    return fmt


def bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 codes (uint16) of ``x``, rounded to nearest even, saturated at +-3.39e38.

    float64 input first goes to float32 with *round to odd* (truncate, then set the last
    bit if anything was dropped), which makes the two roundings equal one correct rounding
    to bfloat16. Then, on the float32 bits ``b``: ``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``.
    """
    api_checks.bfloat16_bits(x)
    x = np.clip(x, -_BF16_MAX, _BF16_MAX)
    single = x.astype(np.float32)
    if x.dtype != np.float32:
        back = single.astype(x.dtype)
        inexact = back != x
        away = np.abs(back) > np.abs(x)  # rounded away from zero: step one ulp back
        single = np.where(away, np.nextafter(single, np.float32(0)), single)
        bits = single.view(np.uint32) | inexact.astype(np.uint32)
    else:
        bits = single.view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype(np.uint16)


def bfloat16_values(codes: np.ndarray, dtype=np.float32) -> np.ndarray:
    """The floats of bfloat16 codes (uint16): the code is the top half of a float32."""
    api_checks.bfloat16_values(codes, dtype)
    return (codes.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(dtype)


def scale_exponents(values: np.ndarray, unit_ids: np.ndarray, units: int, qmax: float) -> np.ndarray:
    """Per unit, ``ceil(log2(amax / qmax))`` clamped to [-127, 127]; amax 0 gives -127 (exercise x01).

    ``values[i]`` belongs to unit ``unit_ids[i]`` (0 <= id < ``units``); ``amax`` is a unit's
    largest ``|value|`` (0 for a unit with no values). Returns int16 of shape ``(units,)``:
    the smallest exponent e with ``amax / 2^e <= qmax``, so no code saturates.
    """
    _check_exponent_args(values, unit_ids, units, qmax)
    # BEGIN EXERCISE x01
    amax = np.zeros(units, dtype=np.float64)
    np.maximum.at(amax, unit_ids, np.abs(values).astype(np.float64))
    exponents = np.full(units, _EXP_MIN, dtype=np.int64)
    positive = amax > 0
    mantissa, exponent = np.frexp(amax[positive] / qmax)  # value = mantissa * 2^exponent, mantissa in [.5, 1)
    exponents[positive] = np.where(mantissa == 0.5, exponent - 1, exponent)
    return np.clip(exponents, _EXP_MIN, _EXP_MAX).astype(np.int16)
    # END EXERCISE x01


def _described(x) -> str:
    return f"{x.dtype} array of shape {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__


def _check_exponent_args(values, unit_ids, units, qmax) -> None:
    if not isinstance(values, np.ndarray) or values.ndim != 1 or not np.issubdtype(values.dtype, np.floating):
        raise TypeError(f"values must be a 1-D floating numpy array, got {_described(values)}")
    if (not isinstance(unit_ids, np.ndarray) or unit_ids.shape != values.shape
            or not np.issubdtype(unit_ids.dtype, np.integer)):
        raise TypeError(f"unit_ids must be an integer numpy array shaped like values {values.shape}, "
                        f"got {_described(unit_ids)}")
    if isinstance(units, bool) or not isinstance(units, (int, np.integer)) or units < 0:
        raise ValueError(f"units must be a non-negative int, got {units!r}")
    if isinstance(qmax, bool) or not isinstance(qmax, (int, float, np.floating)) or not 0 < qmax < np.inf:
        raise ValueError(f"qmax must be a positive finite number, got {qmax!r}")


def fp4_codes(scaled: np.ndarray) -> np.ndarray:
    """E2M1 codes (uint8 ``sign << 3 | index``) of ``scaled`` (= x / s, |scaled| <= 6 up to clipping),
    the nearest of ``E2M1_GRID``, ties to the even index (exercise x01)."""
    if not isinstance(scaled, np.ndarray) or not np.issubdtype(scaled.dtype, np.floating):
        raise TypeError(f"scaled must be a floating numpy array, got {_described(scaled)}")
    # BEGIN EXERCISE x01
    magnitude = np.minimum(np.abs(scaled), 6.0)
    high = np.clip(np.searchsorted(E2M1_GRID, magnitude), 1, 7)
    low = high - 1
    below, above = magnitude - E2M1_GRID[low], E2M1_GRID[high] - magnitude
    index = np.where(above < below, high, low)
    tie = above == below
    index = np.where(tie, np.where(low % 2 == 0, low, high), index)
    sign = np.signbit(scaled).astype(np.uint8) << 3
    return (sign | index.astype(np.uint8)).astype(np.uint8)
    # END EXERCISE x01


def encode(x: np.ndarray, fmt: str, *, block_size: int = 0, keep: np.ndarray | None = None) -> Encoded:
    """Encode one tensor for the wire.

    Parameters
    ----------
    x : ndarray, float32 or float64, finite
    fmt : one of ``FORMATS``
    block_size : int >= 0, keyword-only
        Values per scale block (and per unit); 0 = the whole tensor is one block.
    keep : ndarray of bool shaped like ``x``, or None, keyword-only
        Positions to send (a sparse payload); None sends every value.

    Returns
    -------
    Encoded

    Raises
    ------
    TypeError, ValueError
        ``x`` not a finite float array, unknown ``fmt``, negative ``block_size``, ``keep``
        of another shape.
    """
    api_checks.encode(x, fmt, block_size)
    x = _check(x)
    _check_format(fmt)
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 0:
        raise ValueError(f"block_size must be a non-negative int, got {block_size!r}")
    flat = x.ravel()
    unit = wire_unit(flat.size, block_size)
    keep = _kept(keep, x.shape)
    values = flat if keep is None else flat[keep]
    unit_ids = (np.arange(flat.size) if keep is None else np.flatnonzero(keep)) // unit
    codes, exponents = _codes(values, fmt, unit_ids, unit_bounds(flat.size, unit).size - 1)
    return Encoded(fmt, tuple(x.shape), unit, codes, exponents, keep)


def wire_unit(size: int, block_size: int) -> int:
    """Values per unit of a tensor of ``size`` values: ``block_size``, or the whole tensor when 0."""
    return int(block_size) if block_size else max(int(size), 1)


def _kept(keep, shape) -> np.ndarray | None:
    """``keep`` checked and flattened (a copy), or None."""
    if keep is None:
        return None
    keep = np.asarray(keep)
    if keep.dtype != bool or keep.shape != shape:
        raise ValueError(f"keep must be a bool array of shape {shape}, got {keep.dtype} {keep.shape}")
    return keep.ravel().copy()


def _codes(values: np.ndarray, fmt: str, unit_ids: np.ndarray, units: int) -> tuple[np.ndarray, np.ndarray]:
    """The codes of ``values`` in ``fmt`` and the units' scale exponents (none for the float formats)."""
    exponents = np.zeros(0, dtype=np.int16)
    if fmt == "float64":
        return values.astype(np.float64), exponents  # exact (float64 params, or float32 ones widened)
    if fmt in ("float32", "float16"):
        info = np.finfo(fmt)
        return np.clip(values, info.min, info.max).astype(fmt), exponents
    if fmt == "bfloat16":
        return bfloat16_bits(values), exponents
    exponents = scale_exponents(values, unit_ids, units, _QMAX[fmt])
    scaled = np.ldexp(values, -exponents[unit_ids].astype(np.int32))  # exact: a power of two
    if fmt == "int8":
        return np.clip(np.rint(scaled), -127, 127).astype(np.int8), exponents
    return fp4_codes(scaled), exponents


def decode(encoded: Encoded, dtype=np.float64) -> np.ndarray:
    """The tensor an ``Encoded`` stands for, in ``dtype`` (the params' dtype); unsent values are 0."""
    api_checks.decode(encoded, dtype)
    if not isinstance(encoded, Encoded):
        raise TypeError(f"encoded must be an Encoded (from encode), got {type(encoded).__name__}")
    dtype = np.dtype(dtype)
    fmt, codes = encoded.fmt, encoded.codes
    if fmt in ("float64", "float32", "float16"):
        values = codes.astype(dtype)
    elif fmt == "bfloat16":
        values = bfloat16_values(codes, dtype)
    else:
        unit_ids = (np.arange(encoded.size) if encoded.keep is None else np.flatnonzero(encoded.keep)) // encoded.unit
        if fmt == "int8":
            magnitudes = codes.astype(dtype)
        else:
            magnitudes = E2M1_GRID[codes & 7].astype(dtype)
            magnitudes = np.where((codes >> 3) == 1, -magnitudes, magnitudes)
        values = np.ldexp(magnitudes, encoded.exponents[unit_ids].astype(np.int32)).astype(dtype)
    if encoded.keep is None:
        return values.reshape(encoded.shape)
    out = np.zeros(encoded.size, dtype=dtype)
    out[encoded.keep] = values
    return out.reshape(encoded.shape)


def quantize(x: np.ndarray, fmt: str, *, block_size: int = 0, keep: np.ndarray | None = None) -> np.ndarray:
    """``decode(encode(x, ...), x.dtype)``: what a receiver gets for ``x``."""
    return decode(encode(x, fmt, block_size=block_size, keep=keep), x.dtype)


def sign_prune_mask(x: np.ndarray, fraction: float) -> np.ndarray:
    """Keep-mask dropping the ``floor(fraction * size)`` smallest magnitudes of ``x``.

    The trim step of TIES-merging (Yadav et al., 2023), whose sign-based pruning the DiLoCo
    paper applies to outer gradients (its Table 6). Ties in magnitude drop the later index.

    Returns
    -------
    ndarray of bool shaped like ``x``
    """
    x = _check(x)
    if not (isinstance(fraction, (int, float, np.floating)) and 0.0 <= float(fraction) < 1.0):
        raise ValueError(f"fraction must be in [0, 1), got {fraction!r}")
    flat = np.abs(x.ravel())
    dropped = int(np.floor(float(fraction) * flat.size))
    keep = np.ones(flat.size, dtype=bool)
    if dropped:
        order = np.argsort(-flat, kind="stable")  # largest first, earlier index first among equals
        keep[order[flat.size - dropped:]] = False
    return keep.reshape(x.shape)


# --- the byte layout of an Encoded tensor (what travels): to_bytes and its inverse from_bytes ---
#
# Per unit (scale block), in order: [bitmap: ceil(n_u / 8) bytes, sparse payloads only, bit i
# of the unit = value i kept] [scale: 1 byte, int8 and fp4 only, the exponent e + 127] [codes:
# kept_u codes, little-endian; fp4 two per byte, the first in the low nibble]; so
# len(to_bytes(e)) == e.nbytes. The format, shape and unit size are agreed in advance.

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
