"""Sparse outer gradients with error feedback: SparseLoCo's chunked top-k and DeMo's chunked DCT.

SparseLoCo (Sarfi et al. 2025, arXiv 2508.15706) sends, per worker and round, only the
largest entries of each chunk of its pseudo-gradient, optionally quantised to 2 bits, and
keeps what it did not send in an error-feedback buffer that plays the role of the outer
momentum (``beta`` is its decay)::

    e_k   <- beta e_k + Delta_k
    s_k   =  Q(TopK(e_k))           the payload: per chunk of C values, k of them
    e_k   <- e_k - D(s_k)           what was not sent stays for the next round

DeMo (Peng et al. 2024, arXiv 2411.19870) does the same on the momentum, in the domain of
an orthonormal chunked DCT-II, "then top-k of the transformed momentum":
``q = TopK(DCT(m))``, ``m <- m - IDCT(q)``. Both are ``compress_with_feedback`` here, with
``transform="none"`` or ``"dct"``. We chunk the *flattened* tensor into runs of C values
(DeMo takes 2-D blocks of a matrix; this is our simplification).

Honest bytes. The receiver knows the shape, the dtype and the config, so per chunk of
length L it knows the count ``k_L = min(L, max(1, ceil(density L)))``. A payload is::

    [scales : one per chunk, at the dtype's width, only with 2-bit values]
    [indices: k_L per chunk, ceil(log2 C) bits each, the position inside the chunk]
    [values : k_L per chunk, 2-bit codes or the dtype's full width]

each part packed little-endian and padded to a byte, so ``len(to_bytes(p)) ==
encoded_nbytes(size, config, dtype)``. The 2-bit code ``q`` means ``s (2q - 3) / 3`` with
``s`` the chunk's largest kept magnitude: four levels ``{-s, -s/3, s/3, s}`` (our
quantiser, not SparseLoCo's own). With ``density = 1`` and no quantisation the decoded
tensor is the input bit for bit, so the averaged pseudo-gradient is DiLoCo's.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from diloco._validation import check_float_array, check_params, check_positive_int, check_real
from diloco.config.sections import MAX_DCT_CHUNK, TRANSFORMS
from diloco.model import Params

__all__ = ["TRANSFORMS", "MAX_DCT_CHUNK", "SparseConfig", "SparsePayload", "ErrorFeedbackState", "kept_per_chunk",
           "chunk_lengths", "dct_matrix", "chunked_dct", "chunked_idct", "topk_mask", "encode_sparse", "decode_sparse",
           "encoded_nbytes", "to_bytes", "from_bytes", "params_to_bytes", "params_from_bytes", "init_error_feedback",
           "compress_with_feedback"]

# TRANSFORMS ("none", "dct") and MAX_DCT_CHUNK (1024: the DCT is a C x C matrix product, 8 MB
# of float64) live in diloco.config.sections, which validates FamilyConfig's sparse fields.
_LEVELS = np.array([-1.0, -1.0 / 3.0, 1.0 / 3.0, 1.0])


@dataclass(frozen=True)
class SparseConfig:
    """How a tensor is sparsified (validated at construction; errors name the field)."""

    chunk: int = 4096         # C >= 1, values per chunk (DeMo's 64-by-64 blocks hold 4096)
    density: float = 0.02     # in (0, 1], the fraction of each chunk sent (SparseLoCo: 1-3%)
    bits: int | None = None   # None: values at the dtype's width; 2: 2-bit codes + one scale per chunk
    transform: str = "none"   # "none" (SparseLoCo) or "dct" (DeMo; chunk <= MAX_DCT_CHUNK)
    decay: float = 1.0        # beta in [0, 1], the error-feedback buffer's decay (DeMo's momentum)

    def __post_init__(self) -> None:
        try:
            chunk = check_positive_int(self.chunk, "chunk")
            density = check_real(self.density, "density", low=0.0, low_open=True, high=1.0)
            decay = check_real(self.decay, "decay", low=0.0, high=1.0)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"SparseConfig.{exc}") from None
        if self.bits not in (None, 2) or isinstance(self.bits, bool):
            raise ValueError(f"SparseConfig.bits must be None or 2, got {self.bits!r}")
        if self.transform not in TRANSFORMS:
            raise ValueError(f"SparseConfig.transform must be one of {TRANSFORMS}, got {self.transform!r}")
        if self.transform == "dct" and chunk > MAX_DCT_CHUNK:
            raise ValueError(f"SparseConfig.chunk must be <= {MAX_DCT_CHUNK} with transform='dct', got {chunk}")
        for name, value in (("chunk", chunk), ("density", density), ("decay", decay)):
            object.__setattr__(self, name, value)


class SparsePayload(NamedTuple):
    """One tensor's sparse payload (what ``to_bytes`` serialises)."""

    shape: tuple            # the tensor's shape
    dtype: str              # "float32" or "float64"
    config: SparseConfig
    indices: np.ndarray     # (kept,) int64: positions inside their chunk, chunk by chunk, ascending
    values: np.ndarray      # (kept,) the kept values of dtype, or their 2-bit codes (uint8 in 0..3)
    scales: np.ndarray      # (chunks,) of dtype with 2-bit codes; empty otherwise


class ErrorFeedbackState(NamedTuple):
    """Immutable error-feedback state of one worker."""

    residual: Params  # e, what has not been sent yet (DeMo: the momentum), shaped and typed like the params


def chunk_lengths(size: int, chunk: int) -> np.ndarray:
    """The lengths of the runs of ``chunk`` values of a tensor of ``size`` values (the last may be shorter)."""
    return np.diff(np.append(np.arange(0, size, chunk), size)) if size else np.zeros(0, np.int64)


def kept_per_chunk(size: int, config: SparseConfig) -> np.ndarray:
    """``k_L = min(L, max(1, ceil(density L)))`` for every chunk length L of a tensor of ``size`` values."""
    lengths = chunk_lengths(size, config.chunk)
    return np.array([min(n, max(1, math.ceil(round(config.density * n, 9)))) for n in lengths], dtype=np.int64)


@functools.lru_cache(maxsize=16)
def dct_matrix(n: int, dtype: str = "float64") -> np.ndarray:
    """The orthonormal DCT-II matrix ``D[k, i] = sqrt(2/n) c_k cos(pi (2i + 1) k / (2n))``, ``c_0 = 1/sqrt(2)``.

    ``D D^T = I``, so the inverse (DCT-III) is ``D^T``. Read-only (cached).
    """
    n = check_positive_int(n, "n")
    k, i = np.arange(n)[:, None], np.arange(n)[None, :]
    matrix = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * i + 1) * k / (2 * n))
    matrix[0] /= np.sqrt(2.0)
    matrix = matrix.astype(dtype)
    matrix.flags.writeable = False
    return matrix


def _chunks_apply(x: np.ndarray, chunk: int, inverse: bool) -> np.ndarray:
    flat = x.ravel()
    out = np.empty_like(flat)
    full = flat.size // chunk * chunk
    for start, stop, n in ((0, full, chunk), (full, flat.size, flat.size - full)):
        if stop > start:
            matrix = dct_matrix(n, flat.dtype.name)
            rows = flat[start:stop].reshape(-1, n)
            out[start:stop] = (rows @ matrix if inverse else rows @ matrix.T).ravel()
    return out.reshape(x.shape)


def chunked_dct(x: np.ndarray, chunk: int) -> np.ndarray:
    """The DCT-II of every run of ``chunk`` values of ``x.ravel()`` (the last run may be shorter)."""
    return _chunks_apply(check_float_array(x, "x"), check_positive_int(chunk, "chunk"), inverse=False)


def chunked_idct(coefficients: np.ndarray, chunk: int) -> np.ndarray:
    """The inverse of ``chunked_dct``: ``chunked_idct(chunked_dct(x, C), C) == x`` up to rounding."""
    return _chunks_apply(check_float_array(coefficients, "coefficients"), check_positive_int(chunk, "chunk"),
                         inverse=True)


def _topk_flat(flat: np.ndarray, config: SparseConfig) -> np.ndarray:
    """Flat positions kept: per chunk the k largest |x|, ties to the earlier index, ascending (exercise x03)."""
    # BEGIN EXERCISE x03
    kept, chunk = kept_per_chunk(flat.size, config), config.chunk
    full = flat.size // chunk  # the full chunks at once, then the shorter last one
    parts = [(0, flat[:full * chunk].reshape(full, chunk), kept[:full])] if full else []
    if flat.size > full * chunk:
        parts.append((full * chunk, flat[full * chunk:].reshape(1, -1), kept[full:]))
    positions = []
    for start, rows, counts in parts:
        order = np.sort(np.argsort(-np.abs(rows), axis=1, kind="stable")[:, :counts[0]], axis=1)
        positions.append((start + order + rows.shape[1] * np.arange(rows.shape[0])[:, None]).ravel())
    return np.concatenate(positions).astype(np.int64) if positions else np.zeros(0, dtype=np.int64)
    # END EXERCISE x03


def topk_mask(x: np.ndarray, config: SparseConfig) -> np.ndarray:
    """Bool mask of ``x``'s shape: the top-|x| ``k_L`` entries of every chunk (ties to the earlier index)."""
    check_float_array(x, "x")
    mask = np.zeros(x.size, dtype=bool)
    mask[_topk_flat(x.ravel(), config)] = True
    return mask.reshape(x.shape)


def encode_sparse(x: np.ndarray, config: SparseConfig) -> SparsePayload:
    """The payload of ``x``: top-k per chunk (of its DCT with ``transform="dct"``), 2-bit codes if asked.

    Raises ``TypeError`` or ``ValueError`` for ``x`` not a finite float32/float64 array,
    or ``config`` not a SparseConfig.
    """
    check_float_array(x, "x")
    if not isinstance(config, SparseConfig):
        raise TypeError(f"config must be a SparseConfig, got {type(config).__name__}")
    flat = (chunked_dct(x, config.chunk) if config.transform == "dct" else x).ravel()
    positions = _topk_flat(flat, config)
    kept = kept_per_chunk(flat.size, config)
    values = flat[positions]
    scales = np.zeros(0, dtype=x.dtype)
    if config.bits == 2:
        owner = np.repeat(np.arange(kept.size), kept)
        scales = np.zeros(kept.size, dtype=x.dtype)
        np.maximum.at(scales, owner, np.abs(values))
        safe = np.where(scales > 0, scales, 1)[owner]
        values = np.clip(np.rint((values / safe + 1.0) * 1.5), 0, 3).astype(np.uint8)
    return SparsePayload(tuple(x.shape), x.dtype.name, config, positions % config.chunk, values, scales)


def decode_sparse(payload: SparsePayload) -> np.ndarray:
    """The dense tensor a payload stands for (inverse DCT applied); unsent entries are 0."""
    config, size = payload.config, int(np.prod(payload.shape, dtype=np.int64))
    kept = kept_per_chunk(size, config)
    owner = np.repeat(np.arange(kept.size), kept)
    values = payload.values
    if config.bits == 2:
        values = (payload.scales[owner] * _LEVELS[payload.values].astype(payload.dtype)).astype(payload.dtype)
    flat = np.zeros(size, dtype=payload.dtype)
    flat[owner * config.chunk + payload.indices] = values
    dense = flat.reshape(payload.shape)
    return chunked_idct(dense, config.chunk) if config.transform == "dct" else dense


def _index_bits(chunk: int) -> int:
    return (chunk - 1).bit_length()  # ceil(log2 C); 0 when C = 1


def encoded_nbytes(size: int, config: SparseConfig, dtype) -> int:
    """Bytes of the payload of a tensor of ``size`` values: scales + packed indices + packed values."""
    width, kept = np.dtype(dtype).itemsize, kept_per_chunk(size, config)
    total, scales = int(kept.sum()), kept.size * width if config.bits else 0
    return scales + (total * _index_bits(config.chunk) + 7) // 8 + (total * (config.bits or 8 * width) + 7) // 8


def _pack(numbers: np.ndarray, bits: int) -> bytes:
    if bits == 0 or numbers.size == 0:
        return b""
    planes = (numbers.astype(np.uint64)[:, None] >> np.arange(bits, dtype=np.uint64)) & np.uint64(1)
    return np.packbits(planes.astype(np.uint8).ravel(), bitorder="little").tobytes()


def _unpack(buffer: bytes, count: int, bits: int) -> np.ndarray:
    if bits == 0 or count == 0:
        return np.zeros(count, dtype=np.int64)
    raw = np.unpackbits(np.frombuffer(buffer, dtype=np.uint8), count=count * bits, bitorder="little")
    return (raw.reshape(count, bits).astype(np.int64) << np.arange(bits)).sum(axis=1)


def to_bytes(payload: SparsePayload) -> bytes:
    """The wire bytes of a payload, ``encoded_nbytes(size, config, dtype)`` of them."""
    config, little = payload.config, np.dtype(payload.dtype).newbyteorder("<")
    values = _pack(payload.values, 2) if config.bits == 2 else payload.values.astype(little).tobytes()
    return payload.scales.astype(little).tobytes() + _pack(payload.indices, _index_bits(config.chunk)) + values


def from_bytes(buffer: bytes, shape, config: SparseConfig, dtype) -> SparsePayload:
    """Parse the bytes of one tensor's payload (the inverse of ``to_bytes``).

    Raises ``ValueError`` when ``buffer`` is not exactly ``encoded_nbytes`` long, holds a
    position outside its chunk, or a value or scale that is not finite.
    """
    shape, dtype = tuple(int(n) for n in shape), np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    expected = encoded_nbytes(size, config, dtype)
    if len(buffer) != expected:
        raise ValueError(f"buffer must be {expected} bytes for shape {shape}, got {len(buffer)}")
    kept = kept_per_chunk(size, config)
    little, total = dtype.newbyteorder("<"), int(kept.sum())
    offset = kept.size * dtype.itemsize if config.bits else 0
    scales = np.frombuffer(buffer[:offset], dtype=little).astype(dtype)
    index_bytes = (total * _index_bits(config.chunk) + 7) // 8
    indices = _unpack(buffer[offset:offset + index_bytes], total, _index_bits(config.chunk))
    rest = buffer[offset + index_bytes:]
    values = (_unpack(rest, total, 2).astype(np.uint8) if config.bits == 2
              else np.frombuffer(rest, dtype=little).astype(dtype))
    if total and np.any(indices >= np.repeat(chunk_lengths(size, config.chunk), kept)):
        raise ValueError("buffer holds a position outside its chunk (corrupt payload)")
    if not (np.all(np.isfinite(scales)) and (config.bits or np.all(np.isfinite(values)))):
        raise ValueError("buffer holds a value or scale that is not finite (corrupt payload)")
    return SparsePayload(shape, dtype.name, config, indices, values, scales)


def params_to_bytes(payloads: dict) -> bytes:
    """One worker's message: the ``to_bytes`` of every tensor's payload, in key order, back to back."""
    return b"".join(to_bytes(payload) for payload in payloads.values())


def params_from_bytes(buffer: bytes, like: Params, config: SparseConfig) -> dict:
    """The payloads of a ``params_to_bytes`` message, for tensors shaped and typed like ``like``.

    Each tensor's length is ``encoded_nbytes`` (the receiver knows shapes and config), so
    the message carries no framing. Raises ``ValueError`` when ``buffer`` is not exactly
    their sum long (or a part is corrupt, as ``from_bytes`` says).
    """
    sizes = [encoded_nbytes(value.size, config, value.dtype) for value in like.values()]
    if len(buffer) != sum(sizes):
        raise ValueError(f"buffer must be {sum(sizes)} bytes for these tensors, got {len(buffer)}")
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return {key: from_bytes(buffer[offsets[i]:offsets[i + 1]], value.shape, config, value.dtype)
            for i, (key, value) in enumerate(like.items())}


def init_error_feedback(params: Params) -> ErrorFeedbackState:
    """Zero residuals shaped and typed like ``params``."""
    check_params(params)
    return ErrorFeedbackState({key: np.zeros_like(value) for key, value in params.items()})


def compress_with_feedback(delta: Params, state: ErrorFeedbackState, config: SparseConfig
                           ) -> tuple[dict, Params, ErrorFeedbackState]:
    """One worker's compressed send with error feedback, for every array of ``delta`` (exercise x03).

    ``e' = beta e + delta``, ``payload = encode(e')``, ``sent = decode(payload)``,
    ``e'' = e' - sent``; so ``sent + e'' == beta e + delta`` (up to one rounding of the
    subtraction; exactly without quantisation or transform). Returns ``(payloads, sent,
    new_state)``: the SparsePayload of every key (what travels), the decoded tensors the
    receivers average, and the new residuals.

    Raises ``TypeError`` or ``ValueError`` for ``delta`` not a dict of finite float arrays,
    or ``state.residual`` of another structure.
    """
    check_params(delta, "delta")
    if not isinstance(state, ErrorFeedbackState):
        raise TypeError(f"state must be an ErrorFeedbackState, got {type(state).__name__}")
    check_params(state.residual, "state.residual")
    if list(state.residual) != list(delta):
        raise ValueError(f"state.residual must have the keys of delta {list(delta)}, got {list(state.residual)}")
    payloads, sent, residual = {}, {}, {}
    for key, value in delta.items():
        old = state.residual[key]
        if old.shape != value.shape or old.dtype != value.dtype:
            raise ValueError(f"state.residual[{key!r}] must be {value.dtype} {value.shape} like delta, got {old.shape}")
        # BEGIN EXERCISE x03
        buffer = value + old if config.decay == 1.0 else config.decay * old + value
        payloads[key] = encode_sparse(buffer, config)
        sent[key] = decode_sparse(payloads[key])
        residual[key] = buffer - sent[key]
        # END EXERCISE x03
    return payloads, sent, ErrorFeedbackState(residual)
