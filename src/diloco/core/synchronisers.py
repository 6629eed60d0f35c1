"""Synchronisers: what happens inside a round, one per schedule, each over its own state.

A synchroniser owns one schedule of synchronisation. The driver (``diloco.core.driver``)
runs every one of them the same way, one round at a time::

    state = synchroniser.init(run_state, executor)  # round 0, or a checkpoint's RunState
    state, outcome = synchroniser.round(state, executor, round_index, rng)
    run_state = synchroniser.run_state(state, executor, round_index, rng, history)

``state`` is the synchroniser's own ``NamedTuple`` (the global params first); ``outcome``
a ``RoundOutcome``, what the round's record is built from (``diloco.core.records``).

* ``GradientSync``: the synchronous baseline, gradients averaged every step
  (``Executor.run_sync``).
* ``FragmentSync``: DiLoCo and Streaming DiLoCo: each fragment syncs after its step of
  the round (``diloco.core.schedule.round_plan``) and is merged into the workers ``tau``
  steps later (``merge_step``), in this round or the next; DiLoCo is one fragment,
  synced after step H, merged at once.
* ``EagerSync``: eager updates (Kale et al., 2025, tau = H): every worker applies its
  own fresh outer gradient and the others' one round late, on its own outer copy.
* ``AsyncSync``: asynchronous DiLoCo (Liu et al., 2024): groups of arrivals in order of
  simulated time (``diloco.core.schedule.async_plan``), each applied at once.

A new schedule is a new synchroniser with these three methods; the driver does not change.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from diloco.core.model_seam import fragment_units
from diloco.core.netsim import all_reduce_seconds
from diloco.core.outer import outer_optimizer
from diloco.core.schedule import async_plan, event_steps, merge_step, round_plan
from diloco.core.state import RunState
from diloco.core.sync import begin_sync, eager_consensus, eager_sync, finish_sync, merge_fragment, sync_fragment
from diloco.methods.asynchrony import AsyncOuterState, delayed_outer_update
from diloco.model import Params
from diloco.outer import OuterState, init_outer_optimizer

__all__ = ["RoundOutcome", "GradientSync", "FragmentSync", "EagerSync", "AsyncSync", "synchroniser",
           "initial_extra", "is_eager", "trip_seconds"]


class RoundOutcome(NamedTuple):
    """What one round hands the driver for its record.

    ``losses[k]``: worker k's per-step training losses, in pieces ``(steps,)``;
    ``syncs``: ``[h, bytes sent, tau]`` per synchronisation; ``delta``: the round's outer
    gradient by key (the last group's, asynchronous; None for the baseline);
    ``dropped``: the dropped workers as the record shows them; ``cosines``: the mean
    pairwise cosine of each sync's pseudo-gradients (with ``record_similarity``);
    ``arrived``: the workers whose trips the round's simulated clock counts;
    ``staleness``: the largest staleness of an arrival (asynchronous only);
    ``now``: the simulated second the round ends at (asynchronous only).
    """

    losses: dict
    syncs: list
    delta: Params | None
    dropped: list
    cosines: list
    arrived: tuple
    staleness: int | None = None
    now: float | None = None


class _Log:
    """What a round notes while it runs; ``outcome()`` turns it into a ``RoundOutcome``."""

    def __init__(self, workers) -> None:
        self.losses = {k: [] for k in workers}
        self.syncs, self.delta, self.dropped, self.cosines = [], {}, [], []

    def ran(self, losses: dict) -> None:
        for k, values in losses.items():
            self.losses[k].append(values)

    def synced(self, h: int, result, tau: int) -> None:
        self.delta.update(result.delta)
        self.dropped.extend(result.dropped)
        self.cosines.append(result.cosine)
        self.syncs.append([h, result.bytes_sent, tau])

    def outcome(self, order, arrived, **fields) -> RoundOutcome:
        delta = {key: self.delta[key] for key in order if key in self.delta}
        return RoundOutcome(self.losses, self.syncs, delta, self.dropped, self.cosines, tuple(arrived), **fields)


def _merge(executor, received: Params, targets, mix: float) -> None:
    """Merge ``received`` into each local worker among ``targets`` (``merge_fragment``)."""
    local = executor.read(tuple(received))
    for k in targets:
        if k in local:
            executor.write(k, merge_fragment(local[k], received, mix))


def _split(state: OuterState, keys: list) -> list:
    """One ``OuterState`` per fragment, from the state over every key."""
    second = state.second_moment
    return [OuterState({k: state.momentum[k] for k in group},
                       None if second is None else {k: second[k] for k in group}, state.step) for group in keys]


def _join(states, order) -> OuterState:
    """The state over every key (in ``order``), from the fragments' states."""
    momentum = {k: v for s in states for k, v in s.momentum.items()}
    seconds = [s.second_moment for s in states]
    second = None if any(s is None for s in seconds) else {k: v for s in seconds for k, v in s.items()}
    return OuterState({k: momentum[k] for k in order}, None if second is None else {k: second[k] for k in order},
                      states[0].step)


def _load(executor, state, workers) -> None:
    """Start the executor's workers from ``state``: their own params, or the global model."""
    executor.load(state.worker_params or {k: state.global_params for k in workers}, state.worker_states)


def _run_state(round_index, params, outer, extra, executor, rng, history, worker_params=True) -> RunState:
    snapshot_params, worker_states = executor.snapshot()
    return RunState(round_index, params, outer, snapshot_params if worker_params else None, worker_states, rng,
                    history, extra)


# --- the synchronous baseline: gradients averaged every step ------------------------------------

class GradientState(NamedTuple):
    """The baseline's state: its one shared model (the executor holds the optimizer state)."""

    params: Params


class GradientSync:
    """The synchronous baseline: ``Executor.run_sync`` averages the K gradients every step."""

    def __init__(self, config) -> None:
        self.config = config

    def init(self, state, executor) -> GradientState:
        _load(executor, state, range(1))  # the one shared model, key 0
        return GradientState(state.global_params)

    def round(self, state: GradientState, executor, round_index: int, rng) -> tuple[GradientState, RoundOutcome]:
        rngs = rng.spawn(self.config.num_workers)  # the same streams DiLoCo's workers get
        losses = executor.run_sync(rngs, self.config.inner_steps)
        everyone = tuple(range(self.config.num_workers))
        outcome = RoundOutcome({k: [v] for k, v in losses.items()}, [], None, [], [], everyone)
        return GradientState(executor.shared()), outcome

    def run_state(self, state: GradientState, executor, round_index: int, rng, history):
        return _run_state(round_index, state.params, None, {}, executor, rng, history, worker_params=False)


# --- DiLoCo and Streaming DiLoCo: fragments synced at their offsets, merged tau steps later -----

class FragmentState(NamedTuple):
    """DiLoCo's state between rounds.

    ``outer``: one ``OuterState`` per fragment; ``residuals[k]``: worker k's error-feedback
    residual by key; ``pending``: ``(merge step, received fragment, targets)`` of the syncs
    not yet merged, oldest first (only with overlap, across a round's end).
    """

    params: Params
    outer: tuple
    residuals: dict
    pending: tuple


def _fragments(config, params: Params) -> list[tuple[str, ...]]:
    """The P fragments' keys: the model's (the MLP's layers, ``fragment_keys``; a transformer's blocks)."""
    return fragment_units(config, params)


class FragmentSync:
    """DiLoCo (one fragment) and Streaming DiLoCo (Douillard et al., 2025, arXiv 2501.18512).

    The model's L layers (a transformer's blocks) are split into P fragments
    (``fragment_keys``: *strided*, the paper's choice, or *sequential*). Fragment p
    synchronises every H inner steps, offset by ``t_p = floor(p H / P)``, so a round of H
    steps holds one sync of each. At its sync its outer gradient
    ``Delta_p = theta_p - mean_k theta_{k,p}`` is all-reduced (possibly encoded,
    ``diloco.core.comm``) and the outer step updates ``theta_p``; the workers keep
    training, and ``tau`` steps later (in this round or the next) each merges the result:
    ``theta_{k,p} <- mix theta_p + (1 - mix) theta_{k,p}``. With P = 1, tau = 0 and
    mix = 1 this is DiLoCo, bit for bit.

    With tau > 0 each sync is begun at its step (``begin_sync``) and finished at its merge
    step, or at the round's end if that comes first (``finish_sync``: the outer step), in
    the order they began; under MPI its all-reduce is in flight meanwhile. One process
    computes the same values, only later.
    """

    def __init__(self, config, params: Params, weights) -> None:
        family = config.family
        self.config, self.weights, self.order = config, weights, tuple(params)
        self.keys = [self.order] if family.fragments == 1 else _fragments(config, params)
        self.plan = round_plan(config, self.keys)
        self.tau = family.tau(config.inner_steps)

    def init(self, state, executor) -> FragmentState:
        _load(executor, state, range(self.config.num_workers))
        extra = state.extra
        return FragmentState(state.global_params, tuple(_split(state.outer_state, self.keys)),
                             dict(extra.get("residuals", {})), tuple(extra.get("pending", ())))

    def round(self, state: FragmentState, executor, round_index: int, rng) -> tuple[FragmentState, RoundOutcome]:
        inner_steps, log = self.config.inner_steps, _Log(executor.workers)
        rngs = rng.spawn(self.config.num_workers)
        done, flying = 0, ()
        while done < inner_steps:  # the next stop is taken after each one: a merge due in this round is a stop
            due = [item[0] for item in state.pending] + [item[0] for item in flying]
            stops = event_steps(self.plan, due, round_index, inner_steps)
            h = min([s for s in stops if s > done] + [inner_steps])
            log.ran(executor.run(rngs, h - done))
            done = h
            state, flying = self._sync_events(state, h, executor, round_index, rng, flying)
            step = (round_index - 1) * inner_steps + h
            state, flying = self._land(state, flying, step, executor, log)
            state = self._merge_due(state, step, executor)
        state, _ = self._land(state, flying, None, executor, log)  # the record needs every outer step
        dropped = sorted(set(log.dropped)) if len(self.plan) > 1 else log.dropped
        outcome = log.outcome(self.order, range(self.config.num_workers))
        return state, outcome._replace(dropped=dropped)

    def _sync_events(self, state: FragmentState, h: int, executor, round_index: int, rng, flying: tuple
                     ) -> tuple[FragmentState, tuple]:
        """Begin the syncs due after step h (``begin_sync``); each all-reduce stays in flight, under MPI
        with tau > 0, until ``_land`` finishes it at its merge step."""
        residuals = state.residuals
        for event in (e for e in self.plan if e.h == h):
            started = begin_sync(state.params, event.keys, executor, self.config, rng, self.weights, residuals,
                                 overlap=self.tau > 0, stamp=(round_index, h, event.fragment))
            residuals = started.residuals
            flying += ((merge_step(round_index, h, self.config), event.fragment, h, started),)
        return state._replace(residuals=residuals), flying

    def _land(self, state: FragmentState, flying: tuple, step: int | None, executor, log
              ) -> tuple[FragmentState, tuple]:
        """Finish the syncs in flight whose merge is due at ``step`` (all of them with None), in the
        order they began: the outer step, the log, and the fragment pending for its merge."""
        params, outer, pending = state.params, list(state.outer), state.pending
        for merge_at, fragment, h, started in (item for item in flying if step is None or item[0] == step):
            result = finish_sync(started, params, outer[fragment], executor, self.config)
            params, outer[fragment] = result.global_params, result.outer_state
            log.synced(h, result, self.tau)
            pending += ((merge_at, result.received, result.targets),)
        rest = () if step is None else tuple(item for item in flying if item[0] != step)
        return state._replace(params=params, outer=tuple(outer), pending=pending), rest

    def _merge_due(self, state: FragmentState, step: int, executor) -> FragmentState:
        for _, received, targets in (item for item in state.pending if item[0] == step):
            _merge(executor, received, targets, self.config.family.mix)
        return state._replace(pending=tuple(item for item in state.pending if item[0] != step))

    def run_state(self, state: FragmentState, executor, round_index: int, rng, history):
        extra = {"residuals": state.residuals, "pending": list(state.pending)}
        return _run_state(round_index, state.params, _join(state.outer, self.order), extra, executor, rng, history)


# --- eager updates: each worker's own fresh outer gradient, the others' one round late ----------

class EagerState(NamedTuple):
    """Eager updates' state: the consensus ``params``, the global outer state (untouched:
    each worker steps its own copy), ``residuals``, and ``eager``: each worker's outer
    copy ``thetas``, its outer state ``outer``, ``previous_local`` and ``previous_global``."""

    params: Params
    outer: OuterState
    residuals: dict
    eager: dict


def initial_extra(params: Params, config) -> dict:
    """``RunState.extra`` at round 0: the eager workers' outer copies (eager updates), else empty."""
    if not is_eager(config):
        return {}
    workers = range(config.num_workers)
    return {"eager": {"thetas": {k: params for k in workers},
                      "outer": {k: init_outer_optimizer(params) for k in workers},
                      "previous_local": {}, "previous_global": None}}


def is_eager(config) -> bool:
    return config.family.eager and config.family.tau(config.inner_steps) > 0


class EagerSync:
    """Eager updates (Kale et al., 2025, arXiv 2502.12996, tau = H): ``eager_sync`` after step H.

    The all-reduce of round t's outer gradients runs during round t+1's inner steps, so at
    the end of round t worker k applies its own share fresh and the others' one round late,
    ``Delta_k^(t) / K + (Delta^(t-1) - Delta_k^(t-1) / K)`` (shard weights ``w_k`` for
    ``1/K``), on its own outer copy. One worker, or tau = 0, is DiLoCo; K > 1 with overlap
    is not (the first round applies only ``Delta_k^(1) / K``). The model evaluated after
    each round is the workers' average (``eager_consensus``), never communicated.
    """

    def __init__(self, config, params: Params, weights, shares) -> None:
        self.config, self.weights, self.shares, self.order = config, weights, shares, tuple(params)

    def init(self, state, executor) -> EagerState:
        _load(executor, state, range(self.config.num_workers))
        return EagerState(state.global_params, state.outer_state, dict(state.extra.get("residuals", {})),
                          state.extra["eager"])

    def round(self, state: EagerState, executor, round_index: int, rng) -> tuple[EagerState, RoundOutcome]:
        inner_steps, log = self.config.inner_steps, _Log(executor.workers)
        log.ran(executor.run(rng.spawn(self.config.num_workers), inner_steps))
        eager, exchange, residuals = eager_sync(state.eager, executor, self.config, self.weights, self.shares,
                                                state.residuals, stamp=(round_index,))
        log.delta.update(exchange.delta)
        log.syncs.append([inner_steps, exchange.bytes_sent, inner_steps])
        params = eager_consensus(eager["thetas"], executor, self.weights)
        outcome = log.outcome(self.order, range(self.config.num_workers))
        return EagerState(params, state.outer, residuals, eager), outcome

    def run_state(self, state: EagerState, executor, round_index: int, rng, history):
        extra = {"residuals": state.residuals, "pending": [], "eager": state.eager}
        return _run_state(round_index, state.params, state.outer, extra, executor, rng, history)


# --- asynchronous DiLoCo: groups of arrivals in order of simulated time -------------------------

def trip_seconds(config, params: Params) -> float:
    """Seconds of one trip of a pseudo-gradient on the simulated network (0 without one):
    the all-reduce of the params' own bytes (``diloco.core.netsim``)."""
    family = config.family
    if not family.simulates_network:
        return 0.0
    size = sum(int(np.asarray(v).size) for v in params.values())
    itemsize = np.dtype(config.dtype).itemsize
    payload = 2.0 * (config.num_workers - 1) / config.num_workers * size * itemsize
    return all_reduce_seconds(payload, config.num_workers, family.bandwidth, family.latency)


def initial_clock(params: Params, num_workers: int, delayed: bool) -> dict:
    """``RunState.extra["async"]`` before the first arrival: every worker starts from version 0
    (``starts[k] = (version, params)``), no arrival applied, simulated second 0; with
    delayed Nesterov its anchor and pending arrivals."""
    clock = {"starts": {k: (0, params) for k in range(num_workers)}, "version": 0, "now": 0.0, "delayed": None}
    if delayed:
        clock["delayed"] = {"anchor": {k: v.copy() for k, v in params.items()}, "pending": [], "arrivals": 0}
    return clock


class AsyncState(NamedTuple):
    """Asynchronous DiLoCo's state: ``params``, the outer state, ``residuals`` and ``clock``
    (``initial_clock``: each worker's start snapshot, the version, the simulated second,
    delayed Nesterov's anchor and held arrivals)."""

    params: Params
    outer: OuterState
    residuals: dict
    clock: dict


class AsyncSync:
    """Asynchronous DiLoCo: each round is its groups of arrivals (``async_plan``), applied in order.

    The group's workers take their H_k inner steps from the model they started from
    (worker k's batches from child k of ``rng.spawn(K)``, one spawn per group, so equal
    speeds spend the run's generator as DiLoCo's rounds do); ``sync_fragment`` averages
    their pseudo-gradients ``start_k - theta_k`` and applies them to the current global
    model (the outer optimizer, or delayed Nesterov); the kept workers restart from the
    result (``merge_fragment``), and every arriving worker's next pseudo-gradient is
    measured from it.
    """

    def __init__(self, config, params: Params, weights) -> None:
        self.config, self.weights, self.order = config, weights, tuple(params)
        self.groups = async_plan(config, trip_seconds(config, params))
        self.period = config.asynchrony.delayed_nesterov
        self.update = None
        if self.period:
            self.update = functools.partial(delayed_outer_update, period=self.period,
                                            update=outer_optimizer(config).update)

    def init(self, state, executor) -> AsyncState:
        _load(executor, state, range(self.config.num_workers))
        clock = state.extra.get("async") or initial_clock(state.global_params, self.config.num_workers,
                                                          self.period > 0)
        return AsyncState(state.global_params, state.outer_state, dict(state.extra.get("residuals", {})), clock)

    def round(self, state: AsyncState, executor, round_index: int, rng) -> tuple[AsyncState, RoundOutcome]:
        log, clock = _Log(executor.workers), state.clock
        params, outer, residuals = state.params, self._wrap(state.outer, clock["delayed"]), state.residuals
        starts, version, arrived, stale = dict(clock["starts"]), clock["version"], [], 0
        for number, group in enumerate(self.groups[round_index - 1]):
            self._steps(group, executor, rng.spawn(self.config.num_workers), log)
            result = sync_fragment(params, self.order, outer, executor, self.config, rng, self.weights, residuals,
                                   workers=group.workers, starts=starts, outer_update=self.update,
                                   stamp=(round_index, number))
            params, outer, residuals = result.global_params, result.outer_state, result.residuals
            log.delta.clear()  # the round's record shows its last group's outer gradient
            log.synced(self.config.inner_steps, result, 0)
            _merge(executor, result.received, result.targets, self.config.family.mix)
            stale = max([stale] + [version - v for v in group.versions])
            version += len(group.workers)
            starts.update({k: (version, params) for k in group.workers})
            arrived.extend(group.workers)
        outer, delayed = self._unwrap(outer)
        clock = {"starts": starts, "version": version, "now": self.groups[round_index - 1][-1].time, "delayed": delayed}
        outcome = log.outcome(self.order, arrived, staleness=stale, now=clock["now"])
        return AsyncState(params, outer, residuals, clock), outcome

    @staticmethod
    def _steps(group, executor, rngs, log) -> None:
        """The group's workers' inner steps, the workers with equal H_k together."""
        for h in sorted(set(group.steps)):
            chosen = [k for k, steps in zip(group.workers, group.steps, strict=True) if steps == h]
            log.ran(executor.run(rngs, h, workers=chosen))

    def _wrap(self, outer: OuterState, delayed):
        if not self.period:
            return outer
        return AsyncOuterState(outer, delayed["anchor"], tuple(delayed["pending"]), delayed["arrivals"])

    def _unwrap(self, outer) -> tuple[OuterState, dict | None]:
        if not self.period:
            return outer, None
        return outer.outer, {"anchor": outer.anchor, "pending": list(outer.pending), "arrivals": outer.arrivals}

    def run_state(self, state: AsyncState, executor, round_index: int, rng, history):
        extra = {"residuals": state.residuals, "pending": [], "async": state.clock}
        return _run_state(round_index, state.params, state.outer, extra, executor, rng, history)


def synchroniser(algo: str, config, params: Params, weights, shares):
    """The synchroniser of ``algo`` with ``config``'s schedule."""
    if algo == "sync":
        return GradientSync(config)
    if config.asynchrony.asynchronous:
        return AsyncSync(config, params, weights)
    if is_eager(config):
        return EagerSync(config, params, weights, shares)
    return FragmentSync(config, params, weights)
