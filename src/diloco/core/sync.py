"""One synchronisation of a fragment: drop, weights, compress, aggregate, outer step, merge.

``sync_fragment`` is the only place where the workers' parameters become a new global
model, on every executor and for every algorithm of ``diloco.core`` but the synchronous
baseline (which averages gradients inside ``Executor.run_sync``):

1. **drop**: ``diloco.core.mechanisms.draw_dropped`` (``drop_prob``) from the run's generator;
   a dropped worker's outer gradient is left out; ``drop_rule`` says where it goes on from:
   its own params (``"carry"``: it is not a merge target) or the new global model
   (``"restart"``: it is merged like the kept workers, so its round's work is lost);
2. **weights**: ``pseudo_grad_weights`` (uniform, or shard sizes), over the kept workers;
3. **compress and aggregate**: ``diloco.core.comm.all_reduce`` through the executor's
   collective (``collective``: its ``reduce_messages`` under MPI, else its ``gather``), with error
   feedback;
4. **outer step**: ``diloco.core.outer`` (one state per fragment);
5. **merge**: the received fragment replaces (``mix = 1``) or mixes into the kept
   workers' copies, ``tau`` steps later (``diloco.core.schedule.merge_step``).

Eager updates (tau > 0) replace steps 4-5 by the eager rule (``eager_sync``): each worker
applies its own fresh outer gradient and the others' one round late, on its own outer
copy.

``sync_fragment`` is ``begin_sync`` (steps 1-3) then ``finish_sync`` (step 4). Streaming
DiLoCo with tau > 0 calls them apart: under MPI the all-reduce begun at the sync stays in
flight (a posted reduce-scatter) until ``finish_sync`` at the merge, tau inner steps later.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from diloco._validation import api_checks
from diloco.core.codecs import codec_generators
from diloco.core.comm import all_reduce
from diloco.core.mechanisms import draw_dropped, mean_pairwise_cosine
from diloco.core.outer import copy_outer_state, outer_optimizer
from diloco.model import Params
from diloco.outer import OuterState
from diloco.params import average_params, scale_params, subtract_params

__all__ = ["SyncResult", "Started", "sync_fragment", "begin_sync", "finish_sync", "merge_targets",
           "eager_outer_gradient", "eager_sync", "merge_fragment"]


class SyncResult(NamedTuple):
    """What one fragment sync hands back to the driver."""

    global_params: Params
    outer_state: object
    delta: Params
    received: Params
    targets: tuple
    bytes_sent: float
    dropped: list
    cosine: float | None
    residuals: dict


def collective(executor, overlap: bool = False) -> dict:
    """``all_reduce``'s collective of ``executor``: its ``reduce_messages`` where it has one
    (MPI; left in flight with ``overlap``), else its ``gather`` followed by the one-process reduction."""
    reduce = getattr(executor, "reduce_messages", None)
    if reduce is not None and overlap:
        reduce = functools.partial(reduce, overlap=True)
    return {"gather": executor.gather, "reduce": reduce}


def _without_lost(executor, dropped: list, kept: list) -> tuple[list, list]:
    """``dropped`` and ``kept`` with the workers whose process died (an MPI executor's ``lost``, which
    left them out of the all-reduce) moved to ``dropped``."""
    lost = set(getattr(executor, "lost", ())) & set(kept)
    if not lost:
        return dropped, kept
    return sorted({*dropped, *lost}), [k for k in kept if k not in lost]


def _kept_weights(weights, kept) -> dict | None:
    return None if weights is None else {k: weights[k] for k in kept}


def _bases(local: dict, sub_global: Params, keys: tuple, kept: list, starts) -> tuple[dict, Params]:
    """What ``all_reduce`` forms ``base - theta_k`` from: every worker's own start snapshot.

    DiLoCo (``starts`` None) and an asynchronous group that started from one model version
    hand it the parameters and that model (milestone 24, bit for bit). Workers that started
    from different versions hand it ``-(start_k - theta_k)`` around a zero model, which gives
    back each ``start_k - theta_k`` exactly (IEEE negation and ``0 - x`` are exact).
    """
    if starts is None:
        return local, sub_global
    versions = {starts[k][0] for k in kept}
    if len(versions) == 1:
        start = starts[kept[0]][1]
        return local, {key: start[key] for key in keys}
    items = {k: {key: -(starts[k][1][key] - theta[key]) for key in keys} for k, theta in local.items()}
    return items, {key: np.zeros_like(value) for key, value in sub_global.items()}


def merge_targets(kept: list, arriving, drop_rule: str) -> tuple:
    """The workers the new global fragment is merged into: the kept ones (``"carry"``: a
    dropped worker goes on from its own params) or every arriving worker (``"restart"``;
    all K in synchronous DiLoCo)."""
    return tuple(arriving) if drop_rule == "restart" else tuple(kept)


def sync_fragment(global_params: Params, keys: tuple, outer_state, executor, config, rng, weights, residuals: dict,
                  *, workers=None, starts: dict | None = None, outer_update=None, stamp: tuple = ()) -> SyncResult:
    """Synchronise fragment ``keys`` (steps 1-4 of the module doc); the merge is the driver's, later.

    Asynchronous DiLoCo syncs a group of arrivals: ``workers`` (default: all K), each
    with ``starts[k] = (version, params)``, the global model it started from (default:
    ``global_params`` for every worker); the group's outer gradient is applied to the
    current ``global_params`` by ``outer_update(params, delta, state, config, count=...)``
    (default: the config's outer optimizer), ``count`` the arrivals kept. ``stamp`` names
    this synchronisation for the codec's generators (``begin_sync``).
    """
    started = begin_sync(global_params, keys, executor, config, rng, weights, residuals, workers=workers,
                         starts=starts, stamp=stamp)
    return finish_sync(started, global_params, outer_state, executor, config, outer_update)


class Started(NamedTuple):
    """A fragment sync up to its all-reduce (``begin_sync``), which may still be in flight:
    ``exchange.delta`` is then a function that waits for it. ``exchange`` is None when every
    outer gradient was dropped; ``residuals`` are the new error-feedback memories."""

    sub_global: Params
    exchange: object
    arriving: list
    dropped: list
    kept: list
    cosine: float | None
    residuals: dict


def begin_sync(global_params: Params, keys: tuple, executor, config, rng, weights, residuals: dict, *,
               workers=None, starts: dict | None = None, overlap: bool = False, stamp: tuple = ()) -> Started:
    """Steps 1-3 of the module doc: drop, weights, encode and all-reduce, left in flight with
    ``overlap`` where the executor can (``MPIExecutor.reduce_messages``); ``finish_sync`` does the rest.
    ``stamp`` (round, step, fragment) seeds each worker's generator for the codec (``codec_generators``)."""
    arriving = range(config.num_workers) if workers is None else sorted(workers)
    dropped = [k for k in draw_dropped(rng, config) if k in arriving]  # [] unless drop_prob > 0; drawn for all K
    kept = [k for k in arriving if k not in dropped]
    local = {k: v for k, v in executor.read(keys).items() if k in arriving}
    sub_global = {key: global_params[key] for key in keys}
    cosine = _similarity(local, sub_global, keys, arriving, starts, executor) if config.record_similarity else None
    if not kept:  # every outer gradient was dropped: nothing reaches the server
        return Started(sub_global, None, list(arriving), dropped, kept, cosine, residuals)
    items, base = _bases({k: v for k, v in local.items() if k in kept}, sub_global, keys, kept, starts)
    ex = all_reduce(items, config.family.comm, {k: residuals.get(k, {}) for k in local if k in kept},
                    _kept_weights(weights, kept), global_params=base, **collective(executor, overlap),
                    rngs=codec_generators(config.seed, stamp, items))
    return Started(sub_global, ex, list(arriving), dropped, kept, cosine, {**residuals, **ex.residuals})


def _similarity(local: dict, sub_global: Params, keys: tuple, arriving, starts, executor) -> float:
    """The mean pairwise cosine of the arriving workers' outer gradients (``record_similarity``)."""
    items, base = _bases(local, sub_global, keys, list(arriving), starts)
    everyone = executor.gather(items)
    return mean_pairwise_cosine(base, [everyone[k] for k in sorted(everyone)])


def finish_sync(started: Started, global_params: Params, outer_state, executor, config,
                outer_update=None) -> SyncResult:
    """Step 4 of the module doc: wait for ``started``'s all-reduce, then the outer step on its fragment of
    ``global_params`` (the current model: other fragments may have synced meanwhile)."""
    sub_global, ex, arriving = started.sub_global, started.exchange, started.arriving
    if ex is None:  # every outer gradient was dropped: no outer step
        delta = {key: np.zeros_like(value) for key, value in sub_global.items()}
        received = {key: value.copy() for key, value in sub_global.items()}
        same = copy_outer_state(outer_state) if isinstance(outer_state, OuterState) else outer_state
        return SyncResult({**global_params, **received}, same, delta, received,
                          merge_targets(started.kept, arriving, config.drop_rule), 0.0, started.dropped,
                          started.cosine, started.residuals)
    delta = ex.delta() if callable(ex.delta) else ex.delta  # in flight until now (MPI, overlap)
    dropped, kept = _without_lost(executor, started.dropped, started.kept)
    if outer_update is None:
        received, new_outer = outer_optimizer(config).update(sub_global, delta, outer_state, config)
    else:
        received, new_outer = outer_update(sub_global, delta, outer_state, config, count=len(kept))
    return SyncResult({**global_params, **received}, new_outer, delta, received,
                      merge_targets(kept, arriving, config.drop_rule), ex.bytes_sent, dropped, started.cosine,
                      started.residuals)


def merge_fragment(local: Params, received: Params, mix: float) -> Params:
    """``mix * received + (1 - mix) * local`` per array; at ``mix = 1`` an exact copy of ``received``."""
    if mix == 1.0:
        return {key: value.copy() for key, value in received.items()}
    return {key: mix * value + (1.0 - mix) * local[key] for key, value in received.items()}


def eager_outer_gradient(local_now: Params, local_previous: Params | None, global_previous: Params | None,
                         share: float) -> Params:
    """``w_k Delta_k^(t) + (Delta^(t-1) - w_k Delta_k^(t-1))``; the bracket is 0 in round 1.

    Parameters
    ----------
    local_now : dict
        This worker's fresh outer gradient ``Delta_k^(t)``.
    local_previous, global_previous : dict or None
        ``Delta_k^(t-1)`` and the all-reduced ``Delta^(t-1)``; None before round 2.
    share : float in (0, 1]
        ``w_k``, the worker's weight in the average: ``1/K``, or its shard's share with
        shard-size weights (``diloco.core.mechanisms.normalised_weights``).
    """
    api_checks.eager_outer_gradient(local_now, share)
    own = scale_params(local_now, share)
    if global_previous is None:
        return own
    others = subtract_params(global_previous, scale_params(local_previous, share))
    return {key: own[key] + others[key] for key in own}


def eager_sync(eager: dict, executor, config, weights, shares, residuals: dict, stamp: tuple = ()
               ) -> tuple[dict, object, dict]:
    """One eager update of every local worker (tau = H); returns ``(eager state, exchange, residuals)``.
    ``stamp`` seeds the codec's generators (``begin_sync``).

    ``eager`` holds ``thetas``, ``outer`` (each worker's outer copy and state, by worker
    index), ``previous_local`` and ``previous_global``.
    """
    keys = tuple(next(iter(eager["thetas"].values())))
    local = executor.read(keys)
    deltas = {k: subtract_params(eager["thetas"][k], local[k]) for k in local}
    ex = all_reduce(deltas, config.family.comm, {k: residuals.get(k, {}) for k in local},
                    None if weights is None else dict(enumerate(weights)), **collective(executor),
                    rngs=codec_generators(config.seed, stamp, deltas))
    update = outer_optimizer(config).update
    thetas, outer, previous = {}, {}, {}
    for k in local:
        applied = eager_outer_gradient(deltas[k], eager["previous_local"].get(k), eager["previous_global"], shares[k])
        thetas[k], outer[k] = update(eager["thetas"][k], applied, eager["outer"][k], config)
        executor.write(k, thetas[k])
        previous[k] = deltas[k]
    state = {"thetas": thetas, "outer": outer, "previous_local": previous, "previous_global": ex.delta}
    return state, ex, {**residuals, **ex.residuals}


def eager_consensus(thetas: dict, executor, weights) -> Params:
    """The workers' average of their outer copies (what is evaluated; never communicated in training)."""
    everyone = executor.gather(thetas)
    return average_params([everyone[k] for k in sorted(everyone)], weights)
