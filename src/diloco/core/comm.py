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
The MPI executor does exactly this with real messages.

When nothing is encoded (``CommSpec.fmt`` None or the params' own dtype, no pruning)
the average is milestone 24's ``compute_outer_gradient`` itself, so the plain path stays
DiLoCo bit for bit.

Error feedback (Seide et al., 2014; Karimireddy et al., 2019): each worker keeps what its
encoding lost, ``e_k <- (Delta_k + e_k) - D(E(Delta_k + e_k))``, and adds it to its next
outer gradient, so quantisation errors are delayed rather than lost.

Sparse outer gradients (``CommSpec.topk``: SparseLoCo's chunked top-k, DeMo's top-k of a
chunked DCT) are not summed on the way, since the sum of sparse tensors is not sparse:
every worker's message, ``methods.sparse.params_to_bytes`` of its payloads (after
``compress_with_feedback``, the one top-k + error-feedback transform), is all-gathered as
those bytes and decoded on receipt, and each worker averages the K decoded tensors. So
``bytes_sent = (K-1) |message|``, the ring all-gather's, with ``|message|`` the sum of
``encoded_nbytes`` over the tensors; under MPI exactly those bytes travel.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import api_checks
from diloco.config_sections import CommSpec
from diloco.core.quantize import FORMATS, Encoded, decode, encode, sign_prune_mask
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

__all__ = ["CommSpec", "Exchange", "is_native", "sparse_config", "encode_delta", "reduce_decoded", "all_reduce",
           "exchange", "exchange_deltas", "native_bytes"]


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
    return (spec.fmt is None or spec.fmt == np.dtype(dtype).name) and spec.sign_prune == 0.0 and spec.topk is None


def sparse_config(spec: CommSpec) -> SparseConfig | None:
    """The ``SparseConfig`` of a spec's ``topk`` fields; None when outer gradients are dense."""
    if spec.topk is None:
        return None
    return SparseConfig(spec.topk_chunk, spec.topk, spec.topk_bits, spec.topk_transform, spec.topk_decay)


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


def _local(items: dict) -> dict:
    """The single-process collective: every worker's item is here already."""
    return items


def all_reduce(local: dict, spec: CommSpec, residuals: dict | None = None, weights: dict | None = None, *,
               global_params: Params | None = None, gather=_local) -> Exchange:
    """The one aggregation of outer gradients, on every executor.

    Parameters
    ----------
    local : dict of worker index -> dict of str -> ndarray
        The workers this process holds (every kept worker in one process, one under MPI):
        their parameters when ``global_params`` is given (the outer gradient is
        ``global - theta_k``), else their outer gradients themselves.
    spec : CommSpec
    residuals : dict of worker index -> dict, optional
        Error-feedback memory of the local workers.
    weights : dict of worker index -> float, optional
        Each kept worker's weight (milestone 15's normalisation); None: uniform.
    gather : callable(dict) -> dict, keyword-only
        The collective: merges the per-process dicts of every process, keyed by worker
        (``_local`` in one process; an all-gather under MPI). Workers are combined in
        ascending index order, so every executor computes the same sum.

    Returns
    -------
    Exchange
        ``residuals`` holds the local workers' new error-feedback memory.
    """
    residuals = {} if residuals is None else residuals
    some = next(iter(local.values())) if local else next(iter(global_params.values())) if global_params else None
    dtype = next(iter((global_params or some).values())).dtype
    if spec.fmt is not None and spec.fmt not in FORMATS:
        raise ValueError(f"comm format must be one of {FORMATS}, got {spec.fmt!r}")
    if is_native(spec, dtype):
        everyone = gather(local)
        order = sorted(everyone)
        w = None if weights is None else [weights[k] for k in order]
        items = [everyone[k] for k in order]
        delta = (compute_outer_gradient(global_params, items, w) if global_params is not None
                 else average_params(items, w))
        size = sum(value.size for value in delta.values())
        return Exchange(delta, native_bytes(size, len(order), dtype.itemsize), size * dtype.itemsize,
                        {k: residuals.get(k, {}) for k in local})
    if spec.topk is not None:
        return _sparse_all_reduce(local, spec, residuals, weights, global_params, gather)
    payloads, new_residuals = {}, {}
    for k, item in local.items():
        delta_k = subtract_params(global_params, item) if global_params is not None else item
        payloads[k], new_residuals[k] = {}, dict(residuals.get(k, {}))
        for key, value in delta_k.items():
            if spec.error_feedback and key in new_residuals[k]:
                value = value + new_residuals[k][key]
            payloads[k][key] = encode_delta(value, spec)
            if spec.error_feedback:
                new_residuals[k][key] = value - decode(payloads[k][key], dtype)
    everyone = gather(payloads)
    order = sorted(everyone)
    w = None if weights is None else [weights[k] for k in order]
    pruned = spec.sign_prune > 0
    sent = sum(payload.nbytes for k in order for payload in everyone[k].values())
    reduced_bytes, delta = 0, {}
    for key in everyone[order[0]]:
        reduced = reduce_decoded([decode(everyone[k][key], dtype) for k in order], pruned, w)
        keep = reduced != 0 if pruned else None  # a pruned result is sparse: send its support
        payload = encode(reduced, spec.fmt or dtype.name, block_size=spec.block_size, keep=keep)
        reduced_bytes += payload.nbytes
        delta[key] = decode(payload, dtype)
    num_workers = len(order)
    mean_payload = sent / num_workers
    bytes_sent = (num_workers - 1) / num_workers * (mean_payload + reduced_bytes)
    return Exchange(delta, float(bytes_sent), int(round(mean_payload)), new_residuals)


def _sparse_all_reduce(local: dict, spec: CommSpec, residuals: dict, weights, global_params, gather) -> Exchange:
    """The all-gather of sparse messages (module doc): compress, send the bytes, decode, average."""
    config = sparse_config(spec)
    messages, new_residuals = {}, {}
    for k, item in local.items():
        delta_k = subtract_params(global_params, item) if global_params is not None else item
        old = residuals.get(k, {})
        owed = {key: old[key] if spec.error_feedback and key in old else np.zeros_like(v) for key, v in delta_k.items()}
        payloads, _, state = compress_with_feedback(delta_k, ErrorFeedbackState(owed), config)
        messages[k] = params_to_bytes(payloads)
        new_residuals[k] = {**old, **state.residual} if spec.error_feedback else dict(old)
    everyone = gather(messages)
    order = sorted(everyone)
    like = global_params if global_params is not None else next(iter(local.values()))
    decoded = [{key: decode_sparse(p) for key, p in params_from_bytes(everyone[k], like, config).items()}
               for k in order]
    delta = average_params(decoded, None if weights is None else [weights[k] for k in order])
    mean_message = sum(len(everyone[k]) for k in order) / len(order)
    return Exchange(delta, float((len(order) - 1) * mean_message), int(round(mean_message)), new_residuals)


def exchange_deltas(deltas: list, spec: CommSpec, residuals: list | None = None, weights=None) -> Exchange:
    """All-reduce K outer gradients (dicts with the same keys) through their encodings.

    ``weights`` (K non-negative reals or None) weight the mean as milestone 15 does. This
    is ``all_reduce`` over a list, in one process.
    """
    residuals = residuals if residuals is not None else [{} for _ in deltas]
    result = all_reduce(dict(enumerate(deltas)), spec, dict(enumerate(residuals)),
                        None if weights is None else dict(enumerate(weights)))
    if is_native(spec, next(iter(deltas[0].values())).dtype):
        return result._replace(residuals=list(residuals))
    return result._replace(residuals=[result.residuals[k] for k in range(len(deltas))])


def exchange(global_params: Params, worker_params: list, spec: CommSpec, residuals: list | None = None,
             weights=None) -> Exchange:
    """The averaged outer gradient of workers that all started from ``global_params``.

    Native: ``compute_outer_gradient`` (milestone 24), bit-identical to DiLoCo. Otherwise
    every worker's ``global - theta_k`` (milestone 14) is encoded (``all_reduce``).
    """
    residuals = residuals if residuals is not None else [{} for _ in worker_params]
    result = all_reduce(dict(enumerate(worker_params)), spec, dict(enumerate(residuals)),
                        None if weights is None else dict(enumerate(weights)), global_params=global_params)
    return result._replace(residuals=[result.residuals.get(k, residuals[k]) for k in range(len(worker_params))])
