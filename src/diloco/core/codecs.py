"""Compression of outer gradients behind one protocol: every codec encodes, decodes and reduces.

``all_reduce`` (``diloco.core.comm``) runs every codec the same way::

    message_k, residual_k = codec.encode(item_k, base, residual_k, rng)   # each local worker
    everyone = gather(messages)                                           # the collective
    decoded = [codec.decode(everyone[k], like) for k in sorted(everyone)]
    delta, reduced_bytes = codec.reduce(decoded, weights, base)
    bytes_sent = codec.bytes_sent(messages in worker order, reduced_bytes)

``item_k`` is worker k's parameters (``base`` the model it started from) or its outer
gradient itself (``base`` None); ``residual_k`` its error-feedback memory by key. ``rng``
is worker k's generator for this synchronisation (``codec_generators``), for stochastic
codecs; the three below are deterministic and never draw.

A codec is chosen by name (``codec_for``): ``CommSpec.compress``, an entry of
``diloco.core.registry.CODECS`` (``factory(spec, dtype, **options) -> Codec``), or when
it is None the built-in entry the wire-format fields choose (``codec_name``). A plugin
registers its factory there, and ``--compress NAME:key=value`` runs it.

* ``NativeCodec``: nothing encoded; the reduce is milestone 24's ``compute_outer_gradient``
  (or milestone 15's average), so plain DiLoCo stays DiLoCo bit for bit. Ring all-reduce
  bytes, ``2 (K-1)/K N b``.
* ``DenseCodec``: float32/16, bfloat16, int8 or fp4 (``diloco.core.quantize``), with sign
  pruning and error feedback. Reduce-scatter of payloads, the owner's mean (TIES-merging's
  disjoint mean when pruned), all-gather of the mean encoded again:
  ``(K-1)/K (|E(Delta_k)| + |E(mean)|)`` bytes.
* ``SparseCodec``: SparseLoCo's chunked top-k or DeMo's DCT top-k with error feedback
  (``diloco.methods.sparse``), all-gathered as bytes and averaged on receipt:
  ``(K-1) |message|`` bytes.

``bytes_sent`` models these collectives. Under MPI (``MPIExecutor.reduce_messages``) the
native codec (``summable``: its reduce works value by value) is reduce-scattered and
all-gathered as modelled; the others travel as ``to_wire``'s payload bytes, all-gathered,
and are decoded (``from_wire``) and reduced on every rank (``docs/cli.md`` gives the bytes).

The wire format's fields are ``diloco.config.sections.CommSpec``'s, declared once.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from diloco._validation import api_checks
from diloco.config.sections import CommSpec, parse_compress
from diloco.core.flatbuf import unflatten
from diloco.core.quantize import FORMATS, decode, encode, from_bytes, sign_prune_mask, to_bytes, wire_unit
from diloco.core.registry import CODECS
from diloco.methods.sparse import (
    ErrorFeedbackState,
    SparseConfig,
    compress_with_feedback,
    decode_sparse,
    params_from_bytes,
    params_to_bytes,
)
from diloco.model import Params
from diloco.outer import compute_outer_gradient
from diloco.params import average_params, subtract_params

__all__ = ["Codec", "NativeCodec", "DenseCodec", "SparseCodec", "codec_for", "codec_name", "codec_generators",
           "is_native", "sparse_config",
           "native_bytes", "encode_delta", "reduce_decoded"]


class Codec(Protocol):
    """How one worker's outer gradient travels and how the K of them combine (module doc).

    ``summable``: whether ``reduce`` works value by value (a collective may reduce-scatter
    it); ``lossy``: whether decoding loses anything (``--error-feedback`` needs it).
    """

    summable: bool
    lossy: bool

    def encode(self, item: Params, base: Params | None, residual: dict, rng=None) -> tuple[object, dict]: ...

    def decode(self, message, like: Params) -> Params: ...

    def reduce(self, decoded: list, weights, base: Params | None) -> tuple[Params, int]: ...

    def bytes_sent(self, messages: list, reduced_bytes: int) -> tuple[float, int]: ...

    def to_wire(self, message) -> bytes: ...

    def from_wire(self, buffer: bytes, like: Params) -> object: ...


def is_native(spec: CommSpec, dtype) -> bool:
    """True when nothing is encoded: the plain milestone path applies."""
    return ((spec.comm_dtype is None or spec.comm_dtype == np.dtype(dtype).name) and spec.sign_prune == 0.0
            and spec.topk is None)


def native_bytes(num_values: int, num_workers: int, itemsize: int) -> float:
    """Ring all-reduce bytes per worker, ``2 (K-1)/K N b`` (milestone 30's formula)."""
    api_checks.native_bytes(num_values, num_workers, itemsize)
    return 2.0 * (num_workers - 1) / num_workers * num_values * itemsize


def _outer_gradient(item: Params, base: Params | None) -> Params:
    return subtract_params(base, item) if base is not None else item


class NativeCodec:
    """Nothing encoded: the workers' items travel as they are (module doc).

    ``summable``: ``reduce`` works value by value, so a collective may apply it to chunks
    of the flattened items (a reduce-scatter) and get the same bits as on whole arrays.
    """

    summable = True
    lossy = False

    def __init__(self, dtype) -> None:
        self.dtype = np.dtype(dtype)

    def encode(self, item: Params, base, residual: dict, rng=None) -> tuple[Params, dict]:
        return item, residual

    def decode(self, message: Params, like) -> Params:
        return message

    def reduce(self, decoded: list, weights, base) -> tuple[Params, int]:
        delta = compute_outer_gradient(base, decoded, weights) if base is not None else average_params(decoded, weights)
        return delta, 0

    def bytes_sent(self, messages: list, reduced_bytes: int) -> tuple[float, int]:
        size = sum(value.size for value in messages[0].values())
        return native_bytes(size, len(messages), self.dtype.itemsize), size * self.dtype.itemsize

    def to_wire(self, message: Params) -> bytes:
        return b"".join(np.ascontiguousarray(value, dtype=self.dtype).tobytes() for value in message.values())

    def from_wire(self, buffer: bytes, like: Params) -> Params:
        return unflatten(np.frombuffer(buffer, dtype=self.dtype), like)


def encode_delta(delta: np.ndarray, spec: CommSpec):
    """A worker's payload for one tensor: sign-pruned (if asked) and encoded."""
    fmt = spec.comm_dtype or delta.dtype.name
    keep = sign_prune_mask(delta, spec.sign_prune) if spec.sign_prune > 0 else None
    return encode(delta, fmt, block_size=spec.comm_block, keep=keep)


def reduce_decoded(decoded: list, pruned: bool, weights=None) -> np.ndarray:
    """Combine K decoded tensors: the (weighted) mean, or with pruning TIES-merging's disjoint mean.

    TIES (Yadav et al., 2023): elect the sign of the sum per coordinate, then average only
    the entries that are non-zero and agree with it (0 where none do); unweighted.
    """
    if not pruned:
        return average_params([{"v": d} for d in decoded], weights)["v"]
    stacked = np.stack(decoded)
    elected = np.sign(stacked.sum(axis=0))
    agree = (np.sign(stacked) == elected) & (stacked != 0)
    count = agree.sum(axis=0)
    total = np.where(agree, stacked, 0).sum(axis=0)
    return (total / np.maximum(count, 1)).astype(stacked.dtype)


class DenseCodec:
    """Every value in a low-precision format, with sign pruning and error feedback (module doc).

    Error feedback (Seide et al., 2014; Karimireddy et al., 2019): each worker keeps what its
    encoding lost, ``e_k <- (Delta_k + e_k) - D(E(Delta_k + e_k))``, and adds it to its next
    outer gradient.

    Not ``summable``: the reduce encodes each tensor's mean again with its scale blocks, so
    it is applied to whole tensors; a message travels as ``to_wire``'s bytes.
    """

    summable = False

    def __init__(self, spec: CommSpec, dtype) -> None:
        self.spec, self.dtype = spec, np.dtype(dtype)

    @property
    def lossy(self) -> bool:
        """Whether decoding loses anything: pruning, or a format narrower than the params'."""
        fmt = self.spec.comm_dtype or self.dtype.name
        return self.spec.sign_prune > 0 or fmt not in (self.dtype.name, "float64")

    def encode(self, item: Params, base, residual: dict, rng=None) -> tuple[dict, dict]:
        payloads, residual = {}, dict(residual)
        for key, value in _outer_gradient(item, base).items():
            if self.spec.error_feedback and key in residual:
                value = value + residual[key]
            payloads[key] = encode_delta(value, self.spec)
            if self.spec.error_feedback:
                residual[key] = value - decode(payloads[key], self.dtype)
        return payloads, residual

    def decode(self, message: dict, like) -> Params:
        return {key: decode(payload, self.dtype) for key, payload in message.items()}

    def reduce(self, decoded: list, weights, base) -> tuple[Params, int]:
        """The owner's mean of each unit, encoded again for the all-gather, and decoded."""
        pruned, reduced_bytes, delta = self.spec.sign_prune > 0, 0, {}
        for key in decoded[0]:
            reduced = reduce_decoded([d[key] for d in decoded], pruned, weights)
            keep = reduced != 0 if pruned else None  # a pruned result is sparse: send its support
            payload = encode(reduced, self.spec.comm_dtype or self.dtype.name, block_size=self.spec.comm_block,
                             keep=keep)
            reduced_bytes += payload.nbytes
            delta[key] = decode(payload, self.dtype)
        return delta, reduced_bytes

    def bytes_sent(self, messages: list, reduced_bytes: int) -> tuple[float, int]:
        num_workers = len(messages)
        mean_payload = sum(payload.nbytes for message in messages for payload in message.values()) / num_workers
        return (num_workers - 1) / num_workers * (mean_payload + reduced_bytes), int(round(mean_payload))

    def to_wire(self, message: dict) -> bytes:
        """``quantize.to_bytes`` of every tensor's payload, in key order (``nbytes`` each, no framing)."""
        return b"".join(to_bytes(payload) for payload in message.values())

    def from_wire(self, buffer: bytes, like: Params) -> dict:
        fmt, message, offset = self.spec.comm_dtype or self.dtype.name, {}, 0
        for key, value in like.items():
            message[key], offset = from_bytes(buffer, fmt, value.shape, wire_unit(value.size, self.spec.comm_block),
                                              sparse=self.spec.sign_prune > 0, offset=offset)
        if offset != len(buffer):
            raise ValueError(f"a dense message for these tensors is {offset} bytes, got {len(buffer)}")
        return message


def sparse_config(spec: CommSpec) -> SparseConfig | None:
    """The ``SparseConfig`` of a spec's ``topk`` fields; None when outer gradients are dense."""
    if spec.topk is None:
        return None
    return SparseConfig(spec.topk_chunk, spec.topk, spec.topk_bits, spec.topk_transform, spec.topk_decay)


class SparseCodec:
    """Top-k (or DCT top-k) with error feedback, all-gathered as bytes (module doc).

    Sparse tensors are not summed on the way, since their sum is not sparse: every worker's
    message, ``params_to_bytes`` of its payloads (after ``compress_with_feedback``, the one
    top-k + error-feedback transform), is decoded on receipt and the K are averaged.
    """

    summable = False
    lossy = True

    def __init__(self, spec: CommSpec) -> None:
        self.spec, self.config = spec, sparse_config(spec)

    def encode(self, item: Params, base, residual: dict, rng=None) -> tuple[bytes, dict]:
        delta = _outer_gradient(item, base)
        feedback = self.spec.error_feedback
        owed = {key: residual[key] if feedback and key in residual else np.zeros_like(v) for key, v in delta.items()}
        payloads, _, state = compress_with_feedback(delta, ErrorFeedbackState(owed), self.config)
        return params_to_bytes(payloads), {**residual, **state.residual} if feedback else dict(residual)

    def decode(self, message: bytes, like: Params) -> Params:
        return {key: decode_sparse(p) for key, p in params_from_bytes(message, like, self.config).items()}

    def reduce(self, decoded: list, weights, base) -> tuple[Params, int]:
        return average_params(decoded, weights), 0

    def bytes_sent(self, messages: list, reduced_bytes: int) -> tuple[float, int]:
        mean_message = sum(len(message) for message in messages) / len(messages)
        return float((len(messages) - 1) * mean_message), int(round(mean_message))

    def to_wire(self, message: bytes) -> bytes:
        return message

    def from_wire(self, buffer: bytes, like: Params) -> bytes:
        return bytes(buffer)


# The built-in entries of diloco.core.registry.CODECS: factory(spec, dtype, **options) -> Codec.
def NATIVE_CODEC(spec: CommSpec, dtype) -> NativeCodec:  # noqa: N802 (the registry's entry names)
    return NativeCodec(dtype)


def TOPK_CODEC(spec: CommSpec, dtype) -> SparseCodec:  # noqa: N802
    return SparseCodec(spec)


DENSE_CODEC = DenseCodec


def codec_name(spec: CommSpec, dtype) -> str:
    """The registered codec ``spec`` chooses: its ``compress``, else the built-in its fields choose."""
    if spec.compress is not None:
        return parse_compress(spec.compress)[0]
    return "native" if is_native(spec, dtype) else "topk" if spec.topk is not None else "dense"


def codec_for(spec: CommSpec, dtype) -> Codec:
    """The codec of ``spec`` for params of ``dtype``: ``CODECS[codec_name(spec, dtype)](spec, dtype, **options)``.

    Raises
    ------
    ValueError
        An unknown wire format, or options the codec refuses (named with ``compress``).
    """
    if spec.comm_dtype is not None and spec.comm_dtype not in FORMATS:
        raise ValueError(f"comm format must be one of {FORMATS}, got {spec.comm_dtype!r}")
    options = parse_compress(spec.compress)[1] if spec.compress is not None else {}
    try:
        return CODECS[codec_name(spec, dtype)](spec, np.dtype(dtype), **options)
    except TypeError as exc:
        raise ValueError(f"compress={spec.compress!r}: {exc}") from None


def codec_generators(seed: int, stamp: tuple, workers) -> dict:
    """Worker k's generator for a codec's draws at one synchronisation, ``stamp`` (round, step, fragment):
    ``SeedSequence(seed, spawn_key=(*stamp, k))``. Its own stream: the run's generator draws as
    before, and every executor, and a resumed run, hands a worker the same draws."""
    return {k: np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(*stamp, k))) for k in workers}
