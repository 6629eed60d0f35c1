"""The one driver: every algorithm, on every executor, in one loop over rounds and steps.

``train(algo, x, y, config, executor=..., hooks=...)`` shards the data and initialises
the model exactly as milestone 26 does (``diloco.loop.prepare_training``), then, every
round:

1. ``rng.spawn(K)``: worker k draws all its batches of the round from child k (so every
   algorithm and executor sees the same batches for a seed);
2. DiLoCo and its family: the executor runs the workers' inner steps up to each step of
   the round's plan (``diloco.core.schedule``), where fragments synchronise
   (``diloco.core.sync``) and received fragments are merged back; the synchronous
   baseline: ``Executor.run_sync`` (gradients averaged every step);
3. the record (``diloco.loop.round_record`` and ``finish_record``), then the hooks.

Hooks (``diloco.core.hooks``) are objects with optional ``trained(record, (params,
losses))`` (before the held-out evaluation, with the new global params and each worker's
per-step training losses: the divergence guard's check) and ``finished(record, state)``
(after it: the network clock, the guard, history files, progress bars, checkpoints),
where ``state()`` builds the ``RunState`` a checkpoint holds. On the reference executor
with default settings the driver computes exactly what ``train_diloco`` and
``train_synchronous_baseline`` compute, bit for bit (``tests/tooling/test_core.py``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from diloco._validation import milestone
from diloco.config import DiLoCoConfig
from diloco.core.executors import MPIExecutor, ReferenceExecutor
from diloco.core.netsim import all_reduce_seconds
from diloco.core.outer import outer_optimizer
from diloco.core.schedule import (
    async_plan,
    event_steps,
    fragment_keys,
    merge_step,
    round_plan,
    synchronous_round_seconds,
    worker_local_steps,
    worker_step_times,
)
from diloco.core.sync import eager_consensus, eager_sync, merge_fragment, sync_fragment
from diloco.loop import TrainResult, finish_record, prepare_training, round_record
from diloco.mechanisms import init_inner_state, normalised_weights, pseudo_grad_weights, uses_plain_worker
from diloco.methods.asynchrony import AsyncOuterState, delayed_outer_update
from diloco.model import Params
from diloco.outer import OuterState, init_outer_optimizer

__all__ = ["ALGORITHMS", "EXECUTORS", "RunState", "train", "initial_state", "check_algorithm", "baseline_config",
           "diloco_only_settings", "is_course_algorithm"]

ALGORITHMS = ("diloco", "sync")
EXECUTORS = ("reference", "stacked", "mpi")


class RunState(NamedTuple):
    """Everything a checkpoint holds after ``round`` rounds, nothing else.

    ``outer_state`` is the outer optimizer's state over every key (the fragments' states
    side by side: each fragment syncs once a round, so their step counts agree at a round's
    end); None for the baseline. ``worker_params`` is None while every worker starts the
    next round from ``global_params``. ``extra`` holds the family's state: error-feedback
    residuals, fragments still to merge, the eager workers' outer copies.
    """

    round: int
    global_params: Params
    outer_state: OuterState | None
    worker_params: dict | None
    worker_states: dict
    rng: np.random.Generator
    history: list
    extra: dict


# The settings that configure DiLoCo's outer gradient, which the baseline lacks: the config's
# own fields and its family section's. One table for the refusal and for ``baseline_config``.
DILOCO_ONLY = ("outer_optimizer", "outer_lr", "outer_momentum", "nesterov", "outer_beta2", "outer_eps",
               "shard_weighting", "drop_prob", "drop_rule", "record_similarity")
DILOCO_ONLY_FAMILY = ("comm_dtype", "sign_prune", "error_feedback", "topk", "topk_chunk", "topk_bits",
                      "topk_transform", "topk_decay", "fragments", "overlap", "mix", "eager")
ASYNC_FIELDS = ("asynchronous", "step_times", "speed_spread", "straggler", "straggler_factor", "delayed_nesterov",
                "dynamic_local_steps")  # the baseline has no outer gradient to apply on arrival


def diloco_only_settings(config) -> list[str]:
    """The settings of ``config`` that configure DiLoCo's outer gradient, off their defaults."""
    plain, plain_family = type(config)(), type(config.family)()
    plain_async = type(config.asynchrony)()
    return ([f"{n}={getattr(config, n)!r}" for n in DILOCO_ONLY if getattr(config, n) != getattr(plain, n)]
            + [f"{n}={getattr(config.family, n)!r}" for n in DILOCO_ONLY_FAMILY
               if getattr(config.family, n) != getattr(plain_family, n)]
            + [f"asynchrony.{n}={getattr(config.asynchrony, n)!r}" for n in ASYNC_FIELDS
               if getattr(config.asynchrony, n) != getattr(plain_async, n)])


def is_course_algorithm(config, encode=None) -> bool:
    """Whether ``config`` asks for exactly the course's Algorithm 1 (milestones 25-27): no lr
    schedule, clipping, shard-size weights, outer optimizer but SGD, drops, similarity record,
    input encoder or family setting, so the learner's ``train_diloco`` trains it as it is."""
    uniform = config.shard_weighting == "uniform" or (config.shard_weighting == "auto" and config.iid)
    return (uses_plain_worker(config, encode) and uniform
            and config.outer_optimizer == "sgd" and config.drop_prob == 0 and not config.record_similarity
            and config.family == type(config.family)() and config.asynchrony == type(config.asynchrony)())


def baseline_config(config):
    """``config`` with the DiLoCo-only settings at their defaults: what ``compare`` trains the baseline with."""
    plain, plain_family = type(config)(), type(config.family)()
    return config.replace(**{n: getattr(plain, n) for n in DILOCO_ONLY},
                          family=config.family.replace(**{n: getattr(plain_family, n) for n in DILOCO_ONLY_FAMILY}),
                          asynchrony=type(config.asynchrony)())


def check_algorithm(algo: str, config) -> None:
    """Refuse, in one line, what ``algo`` cannot run by design; check the family's structure."""
    if algo not in ALGORITHMS:
        raise ValueError(f"algo must be one of {ALGORITHMS}, got {algo!r}")
    if algo == "sync":
        names = diloco_only_settings(config)
        if names:
            raise ValueError(f"the synchronous baseline has no outer gradient to drop, compress, fragment or feed "
                             f"to an outer optimizer: {', '.join(names)} configure(s) DiLoCo only")
        return
    config.family.check_against(config)
    config.asynchrony.check_against(config)
    if _eager(config) and config.drop_prob > 0:
        raise ValueError("eager updates with drop_prob > 0 are not defined (the eager rule needs every worker's "
                         "fresh outer gradient): use drop_prob=0 with eager, or eager=False")


def _eager(config) -> bool:
    return config.family.eager and config.family.tau(config.inner_steps) > 0


def initial_state(algo: str, params: Params, config, rng) -> RunState:
    """Round 0: every worker at the initial model with a fresh inner-optimizer state, a zero outer state."""
    if algo == "sync":
        return RunState(0, params, None, None, {0: init_inner_state(params, config)}, rng, [], {})
    states = {k: init_inner_state(params, config) for k in range(config.num_workers)}
    extra = {}
    if _eager(config):
        extra["eager"] = {"thetas": {k: params for k in range(config.num_workers)},
                          "outer": {k: init_outer_optimizer(params) for k in range(config.num_workers)},
                          "previous_local": {}, "previous_global": None}
    return RunState(0, params, init_outer_optimizer(params), None, states, rng, [], extra)


def make_executor(name: str, shards, config, encode=None, comm=None, timeout=None, layout: str = "auto"):
    """The executor ``name`` ("reference", "stacked" or "mpi") over ``shards``."""
    if name == "reference":
        return ReferenceExecutor(shards, config, encode)
    if name == "mpi":
        if comm is None:
            raise ValueError("executor 'mpi' needs comm= (an mpi4py communicator)")
        return MPIExecutor(shards, config, comm, encode, timeout)
    if name == "stacked":
        try:
            from diloco.engine.stacked import StackedExecutor  # absent from learner workspaces
        except ImportError:
            raise ValueError("executor 'stacked' (--engine fast) is not installed here (learner workspaces leave "
                             "it out): use the reference executor") from None
        return StackedExecutor(shards, config, encode, layout)
    raise ValueError(f"executor must be one of {EXECUTORS}, got {name!r}")


def _split(state: OuterState, keys: list) -> list:
    second = state.second_moment
    return [OuterState({k: state.momentum[k] for k in group},
                       None if second is None else {k: second[k] for k in group}, state.step) for group in keys]


def _join(states: list, order) -> OuterState:
    momentum = {k: v for s in states for k, v in s.momentum.items()}
    seconds = [s.second_moment for s in states]
    second = None if any(s is None for s in seconds) else {k: v for s in seconds for k, v in s.items()}
    return OuterState({k: momentum[k] for k in order}, None if second is None else {k: second[k] for k in order},
                      states[0].step)


def _call(hooks, phase: str, record, get_state) -> None:
    for hook in hooks:
        method = getattr(hook, phase, None)
        if method is not None:
            method(record, get_state)


@milestone  # a trainer's depth: the milestones it calls skip their checks, as inside train_diloco
def train(algo: str, x, y, config, *, x_eval=None, y_eval=None, rng=None, encode=None, executor: str = "reference",
          hooks=(), start: RunState | None = None, comm=None, timeout: float | None = None,
          sync_fields: bool | None = None, layout: str = "auto") -> TrainResult:
    """Train ``algo`` ("diloco", with ``config.family``'s mechanisms, or "sync") on ``executor``.

    Parameters
    ----------
    algo : "diloco" or "sync"
    x, y, config, x_eval, y_eval, rng, encode
        As for ``diloco.loop.train_diloco``.
    executor : "reference", "stacked" or "mpi", keyword-only
    hooks : sequence of hook objects, keyword-only
        See the module doc (``diloco.core.hooks``).
    start : RunState, keyword-only, optional
        Continue after ``start.round`` (a checkpoint's state) instead of from round 0.
    comm, timeout : keyword-only
        The MPI communicator and the collectives' time limit (executor "mpi").
    layout : "auto", "stacked" or "per-worker", keyword-only
        The stacked executor's layout (``diloco.engine.trainers.choose_layout``).
    sync_fields : bool, keyword-only, optional
        Give DiLoCo's records the per-sync fields (``syncs``, ``peak_sync_bytes``,
        ``bytes_per_step``) and the encoded ``bytes_sent``; by default only when
        ``config.family`` is not plain DiLoCo, so plain records are milestone 26's.

    Returns
    -------
    TrainResult(params, history)
    """
    if isinstance(config, DiLoCoConfig):  # refused before any work (else prepare_training names the type)
        check_algorithm(algo, config)
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng, encode=encode)
    exe = make_executor(executor, shards, config, encode, comm, timeout, layout)
    state = initial_state(algo, params, config, rng) if start is None else start
    if algo == "sync":
        return _sync_rounds(exe, state, config, shards, x_eval, y_eval, encode, tuple(hooks))
    fields = not config.family.algorithm_is_diloco() if sync_fields is None else sync_fields
    return _diloco_rounds(exe, state, config, shards, x_eval, y_eval, encode, tuple(hooks), fields)


def _sync_rounds(exe, state: RunState, config, shards, x_eval, y_eval, encode, hooks) -> TrainResult:
    rng, history = state.rng, list(state.history)
    exe.load({0: state.global_params}, state.worker_states)
    params = state.global_params
    for round_index in range(state.round + 1, config.rounds + 1):
        exe.round_index = round_index
        rngs = rng.spawn(config.num_workers)  # the same streams DiLoCo's workers get
        step_losses = exe.gather(exe.run_sync(rngs, config.inner_steps))
        params = exe.shared()
        record = round_record([float(step_losses[k].mean()) for k in sorted(step_losses)], params, config)

        def get_state(round_index=round_index, params=params):
            _, states = exe.snapshot()
            return RunState(round_index, params, None, None, states, rng, history, {})

        record["round"] = round_index
        _call(hooks, "trained", record, (params, step_losses))
        finish_record(record, round_index, config, params, x_eval, y_eval, history, encode=encode)
        _call(hooks, "finished", record, get_state)
    return TrainResult(params, history)


def _diloco_rounds(exe, state: RunState, config, shards, x_eval, y_eval, encode, hooks, fields) -> TrainResult:
    family, num_workers, inner_steps = config.family, config.num_workers, config.inner_steps
    eager_mode = _eager(config)
    tau = family.tau(inner_steps)
    weights = pseudo_grad_weights(shards, config)  # None (uniform), or shard sizes
    shares = normalised_weights(shards, config)
    rng, history, params = state.rng, list(state.history), state.global_params
    order = tuple(params)
    # One fragment (DiLoCo, eager updates) is the whole model: the streaming schedule (exercise x02) is not needed.
    keys = [order] if eager_mode or family.fragments == 1 else fragment_keys(params, family.fragments, family.pattern)
    plan = round_plan(config, keys)
    outer = _split(state.outer_state, keys)
    extra = {"residuals": {}, "pending": [], **state.extra}
    residuals, pending, eager = dict(extra["residuals"]), list(extra["pending"]), extra.get("eager")
    starts = state.worker_params or {k: params for k in range(num_workers)}
    exe.load(starts, state.worker_states)
    speeds, asynchronous = config.asynchrony.simulates_speeds, config.asynchrony.asynchronous
    trip = _trip_seconds(config, params) if speeds else 0.0
    work = worker_step_times(config) * worker_local_steps(config) if speeds else None  # H_k c_k
    if asynchronous:
        groups = async_plan(config, trip)
        clock = extra.get("async") or initial_clock(params, num_workers, config.asynchrony.delayed_nesterov > 0)
        extra = {k: v for k, v in extra.items() if k != "async"}
    for round_index in range(state.round + 1, config.rounds + 1):
        exe.round_index = round_index
        losses = {k: [] for k in exe.workers}
        syncs, deltas, dropped, cosines = [], {}, [], []
        done = 0
        if asynchronous:
            params, outer[0], residuals, clock, arrived = _arrivals(groups[round_index - 1], exe, params, outer[0],
                                                                      keys[0], clock, config, rng, weights, residuals,
                                                                      (losses, syncs, deltas, dropped, cosines))
        rngs = None if asynchronous else rng.spawn(num_workers)
        h = inner_steps if asynchronous else 0
        while h < inner_steps:  # the next stop is taken after each one, so a merge due in this round is a stop
            stops = event_steps(plan, [item[0] for item in pending], round_index, inner_steps)
            h = min([s for s in stops if s > done] + [inner_steps])
            for k, values in exe.run(rngs, h - done).items():
                losses[k].append(values)
            done = h
            step = (round_index - 1) * inner_steps + h
            for event in (e for e in plan if e.h == h):
                if eager_mode:
                    eager, ex, residuals = eager_sync(eager, exe, config, weights, shares, residuals)
                    deltas.update(ex.delta)
                    syncs.append([h, ex.bytes_sent, inner_steps])
                    continue
                result = sync_fragment(params, event.keys, outer[event.fragment], exe, config, rng, weights,
                                       residuals)
                params, outer[event.fragment], residuals = result.global_params, result.outer_state, result.residuals
                deltas.update(result.delta)
                dropped.extend(result.dropped)
                cosines.append(result.cosine)
                syncs.append([h, result.bytes_sent, tau])
                pending.append((merge_step(round_index, h, config), result.received, result.targets))
            for item in [p for p in pending if p[0] == step]:
                pending.remove(item)
                received, targets = item[1], item[2]
                local = exe.read(tuple(received))
                for k in targets:
                    if k in local:
                        exe.write(k, merge_fragment(local[k], received, family.mix))
        if eager_mode:
            params = eager_consensus(eager["thetas"], exe, weights)
        step_losses = exe.gather({k: np.concatenate(v) for k, v in losses.items() if v})
        mean_losses = {k: float(v.mean()) for k, v in step_losses.items()}
        pseudo_grad = {key: deltas[key] for key in order if key in deltas}
        record = round_record([mean_losses[k] for k in sorted(mean_losses)], params, config, pseudo_grad=pseudo_grad)
        if fields:
            record["all_reduces"] = len(syncs)
            record["bytes_sent"] = float(sum(s[1] for s in syncs))
            record["peak_sync_bytes"] = float(max((s[1] for s in syncs), default=0.0))
            record["bytes_per_step"] = record["bytes_sent"] / inner_steps
            record["syncs"] = syncs
        if speeds:  # the simulated clock of workers with speeds: the arrivals', or the wait for the slowest
            before = history[-1]["sim_cumulative_seconds"] if history else 0.0
            now = clock["now"] if asynchronous else before + synchronous_round_seconds(config, trip)
            record["sim_seconds"], record["sim_cumulative_seconds"] = now - before, now
            busy = work[arrived[0]].sum() if asynchronous else work.sum()  # compute seconds of the round's trips
            record["sim_utilization"] = float(min(1.0, busy / (num_workers * (now - before))))
        if asynchronous:  # one outer step per group of arrivals
            record["all_reduces"], (record["arrivals"], record["max_staleness"]) = len(syncs), arrived
        if config.drop_prob > 0:
            record["dropped_workers"] = sorted(set(dropped)) if len(plan) > 1 else dropped
        if config.record_similarity:
            record["pseudo_grad_cosine"] = (None if any(c is None for c in cosines)
                                            else float(np.mean(cosines)))
        if exe.name == "mpi":
            record["allreduce_seconds"] = exe.collective_seconds
            record["mpi_bytes_sent"] = int(exe.sent_bytes)
            exe.collective_seconds, exe.sent_bytes = 0.0, 0

        def get_state(round_index=round_index, params=params, outer=tuple(outer), residuals=residuals,
                      pending=tuple(pending), eager=eager, clock=clock if asynchronous else None):
            worker_params, worker_states = exe.snapshot()
            state_extra = {"residuals": residuals, "pending": list(pending)}
            if eager is not None:
                state_extra["eager"] = eager
            if clock is not None:
                state_extra["async"] = clock
            joined = [o.outer if isinstance(o, AsyncOuterState) else o for o in outer]
            return RunState(round_index, params, _join(joined, order), worker_params, worker_states, rng,
                            history, state_extra)

        record["round"] = round_index
        _call(hooks, "trained", record, (params, step_losses))
        finish_record(record, round_index, config, params, x_eval, y_eval, history, encode=encode)
        _call(hooks, "finished", record, get_state)
    return TrainResult(params, history)


# --- Asynchronous DiLoCo (Liu et al. 2024): a sync schedule of groups of arrivals ---

def _trip_seconds(config, params) -> float:
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


def _arrivals(groups, exe, params, outer, keys, clock, config, rng, weights, residuals, out):
    """One round of asynchronous DiLoCo: each group of arrivals, in order of simulated time.

    The group's workers take their H_k inner steps from the model they started from
    (worker k's batches from child k of ``rng.spawn(K)``, one spawn per group, so equal
    speeds spend the run's generator as DiLoCo's rounds do); ``sync_fragment`` averages
    their pseudo-gradients ``start_k - theta_k`` and applies them to the current global
    model (the outer optimizer, or delayed Nesterov); the kept workers restart from the
    result (``merge_fragment``), and every arriving worker's next pseudo-gradient is
    measured from it.
    """
    losses, syncs, deltas, dropped, cosines = out
    period = config.asynchrony.delayed_nesterov
    starts, version = dict(clock["starts"]), clock["version"]
    update, delayed = None, clock["delayed"]
    if period:
        update = functools.partial(delayed_outer_update, period=period, update=outer_optimizer(config).update)
        outer = AsyncOuterState(outer, delayed["anchor"], tuple(delayed["pending"]), delayed["arrivals"])
    arrived, stale = [], 0
    for group in groups:
        rngs = rng.spawn(config.num_workers)
        for h in sorted(set(group.steps)):
            chosen = [k for k, steps in zip(group.workers, group.steps, strict=True) if steps == h]
            for k, values in exe.run(rngs, h, workers=chosen).items():
                losses[k].append(values)
        result = sync_fragment(params, keys, outer, exe, config, rng, weights, residuals, workers=group.workers,
                               starts=starts, outer_update=update)
        params, outer, residuals = result.global_params, result.outer_state, result.residuals
        deltas.clear()  # the round's record shows its last group's outer gradient
        deltas.update(result.delta)
        dropped.extend(result.dropped)
        cosines.append(result.cosine)
        syncs.append([config.inner_steps, result.bytes_sent, 0])
        local = exe.read(tuple(result.received))
        for k in result.targets:
            if k in local:
                exe.write(k, merge_fragment(local[k], result.received, config.family.mix))
        stale = max([stale] + [version - v for v in group.versions])
        version += len(group.workers)
        for k in group.workers:
            starts[k] = (version, params)
        arrived.extend(group.workers)
    if period:
        delayed = {"anchor": outer.anchor, "pending": list(outer.pending), "arrivals": outer.arrivals}
        outer = outer.outer
    clock = {"starts": starts, "version": version, "now": groups[-1].time, "delayed": delayed}
    return params, outer, residuals, clock, (arrived, stale)
