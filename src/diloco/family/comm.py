"""How K workers average their outer gradients when the wire format is not the params'.

A ring all-reduce of low-precision payloads cannot add codes with different scales, so
(as deployed systems do) the all-reduce is a reduce-scatter followed by an all-gather,
each of encoded payloads::

    1. every worker k encodes its outer gradient          E(Delta_k)      (optionally sign-pruned,
                                                                            with error feedback)
    2. reduce-scatter: the owner of each unit decodes the K payloads into the params' dtype
       and averages them                                   mean_k D(E(Delta_k))
       (with sign pruning: TIES-merging's elected sign and disjoint mean instead)
    3. all-gather: the owner encodes the reduced unit again and everybody decodes it
                                                           Delta = D(E(mean))

Each worker sends ``(K-1)/K`` of its payload in step 2 and ``(K-1)/K`` of the reduced
payload in step 3, so ``bytes_sent = (K-1)/K (|E(Delta_k)| + |E(mean)|)``: the ring
all-reduce's ``2 (K-1)/K N b`` of milestone 30 when both payloads are N values of b bytes.
``diloco.family.mpi_family`` does exactly this with real messages.

When nothing is encoded (``CommSpec.fmt`` None or the params' own dtype, no pruning)
the average is milestone 24's ``compute_outer_gradient`` itself, so the plain path stays
DiLoCo bit for bit.

Error feedback (Seide et al., 2014; Karimireddy et al., 2019): each worker keeps what its
encoding lost, ``e_k <- (Delta_k + e_k) - D(E(Delta_k + e_k))``, and adds it to its next
outer gradient, so quantisation errors are delayed rather than lost.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import api_checks
from diloco.family.quantize import FORMATS, Encoded, decode, encode, sign_prune_mask
from diloco.model import Params
from diloco.outer import compute_outer_gradient
from diloco.params import average_params, subtract_params

__all__ = ["CommSpec", "Exchange", "is_native", "encode_delta", "reduce_decoded", "exchange",
           "exchange_deltas", "native_bytes"]


class CommSpec(NamedTuple):
    """How outer gradients travel.

    Attributes
    ----------
    fmt : str or None
        A ``quantize.FORMATS`` entry, or None for the params' own dtype (nothing encoded).
    block_size : int >= 0
        Values per scale block (0: one scale per tensor).
    sign_prune : float in [0, 1)
        Fraction of each tensor's smallest-magnitude entries each worker drops.
    error_feedback : bool
        Carry each worker's encoding error into its next outer gradient.
    """

    fmt: str | None = None
    block_size: int = 32
    sign_prune: float = 0.0
    error_feedback: bool = False


class Exchange(NamedTuple):
    """The result of one all-reduce of outer gradients.

    Attributes
    ----------
    delta : dict of str -> ndarray
        The averaged outer gradient every worker applies, in the params' dtype.
    bytes_sent : float
        Bytes each worker sent (mean over workers).
    payload_bytes : int
        Size of one worker's encoded outer gradient (``N * itemsize`` when native).
    residuals : list of K dicts
        Error-feedback memory after this exchange (empty dicts without error feedback).
    """

    delta: Params
    bytes_sent: float
    payload_bytes: int
    residuals: list


def is_native(spec: CommSpec, dtype) -> bool:
    """True when nothing is encoded: the plain milestone path applies."""
    return (spec.fmt is None or spec.fmt == np.dtype(dtype).name) and spec.sign_prune == 0.0


def native_bytes(num_values: int, num_workers: int, itemsize: int) -> float:
    """Ring all-reduce bytes per worker, ``2 (K-1)/K N b`` (milestone 30's formula)."""
    api_checks.native_bytes(num_values, num_workers, itemsize)
    return 2.0 * (num_workers - 1) / num_workers * num_values * itemsize


def encode_delta(delta: np.ndarray, spec: CommSpec) -> Encoded:
    """A worker's payload for one tensor: sign-pruned (if asked) and encoded."""
    fmt = spec.fmt or delta.dtype.name
    keep = sign_prune_mask(delta, spec.sign_prune) if spec.sign_prune > 0 else None
    return encode(delta, fmt, block_size=spec.block_size, keep=keep)


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


def exchange_deltas(deltas: list, spec: CommSpec, residuals: list | None = None, weights=None) -> Exchange:
    """All-reduce K outer gradients (dicts with the same keys) through their encodings.

    ``weights`` (K non-negative reals or None) weight the mean as milestone 15 does.
    """
    num_workers = len(deltas)
    residuals = residuals if residuals is not None else [{} for _ in deltas]
    dtype = next(iter(deltas[0].values())).dtype
    if spec.fmt is not None and spec.fmt not in FORMATS:
        raise ValueError(f"comm format must be one of {FORMATS}, got {spec.fmt!r}")
    if is_native(spec, dtype):
        delta = average_params(deltas, weights)
        size = sum(value.size for value in delta.values())
        return Exchange(delta, native_bytes(size, num_workers, dtype.itemsize), size * dtype.itemsize, residuals)
    pruned = spec.sign_prune > 0
    sent, reduced_bytes, new_residuals, delta = 0, 0, [dict(r) for r in residuals], {}
    for key in deltas[0]:
        decoded = []
        for k, worker_delta in enumerate(deltas):
            value = worker_delta[key]
            if spec.error_feedback and key in residuals[k]:
                value = value + residuals[k][key]
            payload = encode_delta(value, spec)
            sent += payload.nbytes
            decoded.append(decode(payload, dtype))
            if spec.error_feedback:
                new_residuals[k][key] = value - decoded[-1]
        reduced = reduce_decoded(decoded, pruned, weights)
        keep = reduced != 0 if pruned else None  # a pruned result is sparse: send its support
        payload = encode(reduced, spec.fmt or dtype.name, block_size=spec.block_size, keep=keep)
        reduced_bytes += payload.nbytes
        delta[key] = decode(payload, dtype)
    mean_payload = sent / num_workers
    bytes_sent = (num_workers - 1) / num_workers * (mean_payload + reduced_bytes)
    return Exchange(delta, float(bytes_sent), int(round(mean_payload)), new_residuals)


def exchange(global_params: Params, worker_params: list, spec: CommSpec, residuals: list | None = None,
             weights=None) -> Exchange:
    """The averaged outer gradient of workers that all started from ``global_params``.

    Native: ``compute_outer_gradient`` (milestone 24), bit-identical to DiLoCo. Otherwise
    every worker's ``global - theta_k`` (milestone 14) goes through ``exchange_deltas``.
    """
    dtype = next(iter(global_params.values())).dtype
    if is_native(spec, dtype):
        delta = compute_outer_gradient(global_params, worker_params, weights)
        size = sum(value.size for value in delta.values())
        return Exchange(delta, native_bytes(size, len(worker_params), dtype.itemsize), size * dtype.itemsize,
                        residuals if residuals is not None else [{} for _ in worker_params])
    deltas = [subtract_params(global_params, theta) for theta in worker_params]
    return exchange_deltas(deltas, spec, residuals, weights)
