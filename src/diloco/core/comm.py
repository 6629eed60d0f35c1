"""The collective of outer gradients: ``all_reduce`` runs the wire format's codec through the executor's gather.

Every synchronisation of every executor averages its outer gradients here, once: each
local worker's item is encoded (``diloco.core.codecs``: native, dense low-precision with
sign pruning and error feedback, or sparse top-k / DCT with error feedback), then the
executor's reduction combines the messages: ``reduce_in_order`` where one process holds
every worker (the executor's ``gather`` collects them, an identity; they are decoded and
reduced in ascending worker order), or the executor's own collective
(``MPIExecutor.reduce_messages``: a reduce-scatter and all-gather of flat buffers for a
summable codec, an all-gather of payload bytes otherwise) that applies the same codec
``reduce`` in the same worker order, so every executor computes the same sum, bit for
bit. ``bytes_sent`` is the codec's model of what a ring collective moves.
"""

from __future__ import annotations

from typing import NamedTuple

from diloco.config.sections import CommSpec
from diloco.core.codecs import codec_for, is_native, native_bytes
from diloco.model import Params

__all__ = ["CommSpec", "Exchange", "all_reduce", "reduce_in_order", "exchange", "exchange_deltas", "native_bytes"]


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
    residuals : dict of worker index -> dict
        Error-feedback memory of the local workers after this exchange (as given when nothing
        is encoded or without error feedback).
    """

    delta: Params
    bytes_sent: float
    payload_bytes: int
    residuals: dict


def _local(items: dict) -> dict:
    """The single-process collective: every worker's item is here already."""
    return items


def reduce_in_order(messages: dict, codec, like: Params, weights: dict | None, base: Params | None,
                    gather=_local) -> tuple[Params, float, int]:
    """Every worker's message (``gather``), decoded and reduced in ascending worker order.

    Returns ``(delta, bytes_sent, payload_bytes)``: the codec's reduce and its byte model.
    """
    everyone = gather(messages)
    order = sorted(everyone)
    w = None if weights is None else [weights[k] for k in order]
    delta, reduced_bytes = codec.reduce([codec.decode(everyone[k], like) for k in order], w, base)
    bytes_sent, payload_bytes = codec.bytes_sent([everyone[k] for k in order], reduced_bytes)
    return delta, float(bytes_sent), payload_bytes


def all_reduce(local: dict, spec: CommSpec, residuals: dict | None = None, weights: dict | None = None, *,
               global_params: Params | None = None, gather=_local, reduce=None, rngs: dict | None = None) -> Exchange:
    """The one aggregation of outer gradients, on every executor, through ``spec``'s codec.

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
        (``_local`` in one process). Workers are combined in ascending index order, so
        every executor computes the same sum.
    reduce : callable(messages, codec, like, weights, base) -> (delta, bytes_sent, payload_bytes), keyword-only
        The executor's own collective (``MPIExecutor.reduce_messages``), given this
        process's encoded messages; None: ``reduce_in_order`` through ``gather``.
    rngs : dict of worker index -> numpy.random.Generator, keyword-only, optional
        Each local worker's generator for this synchronisation (``codecs.codec_generators``),
        handed to ``codec.encode``; None: no generator (a deterministic codec never draws).

    Returns
    -------
    Exchange
        ``residuals`` holds the local workers' new error-feedback memory.
    """
    residuals = {} if residuals is None else residuals
    like = global_params if global_params is not None else next(iter(local.values()))
    codec = codec_for(spec, next(iter(like.values())).dtype)
    messages, new_residuals = {}, {}
    for k, item in local.items():
        messages[k], new_residuals[k] = codec.encode(item, global_params, residuals.get(k, {}),
                                                     None if rngs is None else rngs[k])
    if reduce is None:
        delta, bytes_sent, payload_bytes = reduce_in_order(messages, codec, like, weights, global_params, gather)
    else:
        delta, bytes_sent, payload_bytes = reduce(messages, codec, like, weights, global_params)
    return Exchange(delta, bytes_sent, payload_bytes, new_residuals)


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
