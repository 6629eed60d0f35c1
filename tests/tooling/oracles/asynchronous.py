"""Asynchronous DiLoCo (Liu et al. 2024, arXiv 2401.09135): arrivals, delayed Nesterov, DyLU.

Worker k takes ``c_k`` seconds per inner step and ``H_k`` steps per trip (``H``, or with
dynamic local updates ``H_k = floor(H v_k / max_j v_j)``, ``v_k = 1 / c_k``, at least 1).
It starts from the global model, and when its pseudo-gradient ``g_k = start_k - theta_k``
arrives the server applies it to the *current* global model; the worker restarts from
the result at once. Arrivals at the same simulated second form one group, applied
together (the grace period of the paper, at 0 s).

The outer step of a group (its kept workers' weighted mean ``g``, ``c`` arrivals):

* plain: ``OuterOpt(theta, g)``, SGD with Nesterov momentum on the current model;
* delayed Nesterov with period N (the paper's Algorithm 3, "momentum applied every N
  arrivals"): between momentum steps ``theta <- theta - lr c g / N`` (each arrival's
  ``g_t / N``); the group that brings the arrivals since the last momentum step to N or
  more folds their mean (groups weighted by their counts) into the momentum and steps
  from the model of the last momentum step, ``theta = anchor - lr (mean + beta m)``:
  over N arrivals that is the paper's ``-lr (Delta / N + beta m)``.

Conventions the core takes where the paper leaves a choice:

* a round is the run of groups up to the first one after which every worker has
  arrived at least once in the round (about one trip of the slowest worker; with equal
  speeds, one group of all K: a DiLoCo round);
* batches: the run's generator spawns K children per *group* (worker k of the group
  draws its H_k batches from child k); drops: K uniforms per group, after its spawn;
* the arriving workers of a group are merged with the new model (``mix`` of it, as in
  Streaming DiLoCo), dropped ones too under ``restart``; every arriving worker's next
  ``g_k`` is measured from the new global model (so a carried worker's next one holds
  the lost work);
* the staleness of an arrival is the number of arrivals applied between its worker's
  start and the group it arrives in;
* a dropped arrival is reported as dropped: only the arriving workers of a group can be;
* with sparse outer gradients (``oracles.compression``) each kept arrival sends the
  top-k message of its error-feedback buffer fed with its ``g_k``.
"""

from __future__ import annotations

import math
from fractions import Fraction

from oracles.common import (
    OracleResult,
    draw_drops,
    fresh_inner,
    outer_sgd,
    ring_bytes,
    round_entry,
    start,
    uses_size_weights,
    weighted_mean,
    worker_steps,
)
from oracles.compression import message_bytes, send

__all__ = ["local_steps", "async_schedule", "async_diloco"]


def _step_times(config) -> list:
    section = config.asynchrony
    if section.speed_spread > 0:
        raise NotImplementedError("drawn speeds: give step_times")
    times = [Fraction(1)] * config.num_workers if section.step_times is None else \
        [Fraction(t) for t in section.step_times]
    if section.straggler is not None:
        times[section.straggler] *= Fraction(section.straggler_factor)
    return times


def local_steps(config) -> list:
    """``H_k`` of every worker, in exact arithmetic."""
    times = _step_times(config)
    if not config.asynchrony.dynamic_local_steps:
        return [config.inner_steps] * config.num_workers
    fastest = min(times)
    return [max(1, math.floor(config.inner_steps * fastest / c)) for c in times]


def async_schedule(config) -> list:
    """Every round's groups, ``(second, workers, steps, start versions)``, by an event simulation."""
    times, steps = _step_times(config), local_steps(config)
    trip = [h * c for h, c in zip(steps, times, strict=True)]
    finish, begun = list(trip), [0] * config.num_workers
    applied, rounds, groups, seen = 0, [], [], set()
    while len(rounds) < config.rounds:
        now = min(finish)
        workers = [k for k in range(config.num_workers) if finish[k] == now]
        groups.append((now, workers, [steps[k] for k in workers], [begun[k] for k in workers]))
        applied += len(workers)
        for k in workers:
            finish[k], begun[k] = now + trip[k], applied
        seen.update(workers)
        if len(seen) == config.num_workers:
            rounds.append(groups)
            groups, seen = [], set()
    return rounds


class _Server:
    """The global model and its outer optimizer (plain, or delayed Nesterov)."""

    def __init__(self, theta, config):
        self.theta, self.config = theta, config
        self.momentum = {key: 0.0 * value for key, value in theta.items()}
        self.anchor, self.pending = theta, []
        self.period = config.asynchrony.delayed_nesterov

    def apply(self, g: dict, count: int) -> None:
        if not self.period:
            self.theta, self.momentum = outer_sgd(self.theta, g, self.momentum, self.config)
            return
        self.pending.append((count, g))
        held = sum(c for c, _ in self.pending)
        if held < self.period:
            lr = self.config.outer_lr
            self.theta = {key: self.theta[key] - lr * (count * g[key] / self.period) for key in self.theta}
            return
        counts = [c for c, _ in self.pending]
        mean = {key: weighted_mean([p[key] for _, p in self.pending], counts) for key in self.theta}
        self.theta, self.momentum = outer_sgd(self.anchor, mean, self.momentum, self.config)
        self.anchor, self.pending = self.theta, []


def _group_gradient(begin, local, kept, shared, config):
    """The kept arrivals' weighted mean ``g`` (their sparse messages with ``topk``), and the
    bytes each sent; zeros when none is kept."""
    weights, residual = shared
    theta = begin[0]
    if not kept:
        return {key: 0.0 * value for key, value in theta.items()}, 0.0
    outer = {k: {key: begin[k][key] - local[k][key] for key in theta} for k in kept}
    sent_bytes = ring_bytes(sum(value.size for value in theta.values()), len(kept))
    if config.family.topk is not None:
        for k in kept:
            outer[k], residual[k] = send(outer[k], residual[k], config.family)
        sent_bytes = float((len(kept) - 1) * message_bytes(theta, config.family))
    g = {key: weighted_mean([outer[k][key] for k in kept], [weights[k] for k in kept]) for key in theta}
    return g, sent_bytes


def async_diloco(x, y, config, x_eval=None, y_eval=None) -> OracleResult:
    """Train asynchronous DiLoCo; one entry per round of groups."""
    if not config.asynchrony.asynchronous or config.family.simulates_network:
        raise NotImplementedError("asynchronous DiLoCo without a simulated network")
    num_workers, mix = config.num_workers, config.family.mix
    rng, shards, theta = start(x, y, config, y_eval)
    weights = [float(len(y_k)) if uses_size_weights(config) else 1.0 for _, y_k in shards]
    server = _Server(theta, config)
    local, begin = [dict(theta) for _ in range(num_workers)], [theta] * num_workers
    adam = [fresh_inner(theta, config) for _ in range(num_workers)]
    residual = [{key: 0.0 * value for key, value in theta.items()} for _ in range(num_workers)]
    version, rounds = 0, []
    for groups in async_schedule(config):
        losses = {k: [] for k in range(num_workers)}
        arrivals, stale, dropped, syncs, g = [], 0, [], [], {}
        for _, workers, steps, versions in groups:
            streams = rng.spawn(num_workers)
            for k, h in zip(workers, steps, strict=True):
                local[k], adam[k], more = worker_steps(local[k], adam[k], shards[k], h, config, streams[k])
                losses[k] += more
            lost = draw_drops(rng, config)
            kept = [k for k in workers if k not in lost]
            dropped += [k for k in workers if k in lost]
            g, sent_bytes = _group_gradient(begin, local, kept, (weights, residual), config)
            if kept:
                server.apply(g, len(kept))
            for k in (workers if config.drop_rule == "restart" else kept):
                local[k] = {key: mix * server.theta[key] + (1.0 - mix) * local[k][key] for key in theta}
            stale = max([stale] + [version - v for v in versions])
            version += len(workers)
            for k in workers:
                begin[k] = server.theta
            arrivals += workers
            syncs.append([config.inner_steps, sent_bytes, 0])
        rounds.append(round_entry(losses, server.theta, g, x_eval, y_eval, dropped=dropped, syncs=syncs,
                                  arrivals=arrivals, max_staleness=stale, seconds=float(groups[-1][0])))
    return OracleResult(server.theta, rounds)
