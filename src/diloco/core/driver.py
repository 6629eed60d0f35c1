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
3. the record (``diloco.loop.round_record`` and ``finish_record``), the executor's
   ``round_ended`` (MPI: replacements for dead workers join here), then the hooks.

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

import numpy as np

from diloco._validation import milestone
from diloco.config import DiLoCoConfig
from diloco.config.sections import WIRE_FIELDS
from diloco.core.executors import MPIExecutor, ReferenceExecutor
from diloco.core.mechanisms import init_inner_state, normalised_weights, pseudo_grad_weights, uses_plain_worker
from diloco.core.records import SimulatedClock, round_fields
from diloco.core.state import RunState
from diloco.core.synchronisers import initial_extra, is_eager, synchroniser
from diloco.loop import TrainResult, finish_record, prepare_training
from diloco.model import Params
from diloco.outer import init_outer_optimizer

__all__ = ["ALGORITHMS", "EXECUTORS", "RunState", "train", "initial_state", "check_algorithm", "baseline_config",
           "diloco_only_settings", "is_course_algorithm"]

ALGORITHMS = ("diloco", "sync")
EXECUTORS = ("reference", "fast", "mpi")


# The settings that configure DiLoCo's outer gradient, which the baseline lacks: the config's
# own fields and its family section's. One table for the refusal and for ``baseline_config``.
DILOCO_ONLY = ("outer_optimizer", "outer_lr", "outer_momentum", "nesterov", "outer_beta2", "outer_eps",
               "shard_weighting", "drop_prob", "drop_rule", "record_similarity")
DILOCO_ONLY_FAMILY = WIRE_FIELDS + ("fragments", "overlap", "mix", "eager")
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
    if is_eager(config) and config.drop_prob > 0:
        raise ValueError("eager updates with drop_prob > 0 are not defined (the eager rule needs every worker's "
                         "fresh outer gradient): use drop_prob=0 with eager, or eager=False")


def initial_state(algo: str, params: Params, config, rng) -> RunState:
    """Round 0: every worker at the initial model with a fresh inner-optimizer state, a zero outer state."""
    if algo == "sync":
        return RunState(0, params, None, None, {0: init_inner_state(params, config)}, rng, [], {})
    states = {k: init_inner_state(params, config) for k in range(config.num_workers)}
    return RunState(0, params, init_outer_optimizer(params), None, states, rng, [], initial_extra(params, config))


def make_executor(name: str, shards, config, encode=None, comm=None, timeout=None, layout: str = "auto",
                  survive_failures: bool = False, replace=None):
    """The executor ``name`` ("reference", "fast" or "mpi") over ``shards``."""
    if name == "reference":
        return ReferenceExecutor(shards, config, encode)
    if name == "mpi":
        if comm is None:
            raise ValueError("executor 'mpi' needs comm= (an mpi4py communicator)")
        return MPIExecutor(shards, config, comm, encode, timeout, survive_failures, replace)
    if name == "fast":
        try:
            from diloco.engine.fast import FastExecutor  # absent from learner workspaces
        except ImportError:
            raise ValueError("executor 'fast' (--engine fast) is not installed here (learner workspaces leave "
                             "it out): use the reference executor") from None
        return FastExecutor(shards, config, encode, layout)
    raise ValueError(f"executor must be one of {EXECUTORS}, got {name!r}")


def _call(hooks, phase: str, record, get_state) -> None:
    for hook in hooks:
        method = getattr(hook, phase, None)
        if method is not None:
            method(record, get_state)


@milestone  # a trainer's depth: the milestones it calls skip their checks, as inside train_diloco
def train(algo: str, x, y, config, *, x_eval=None, y_eval=None, rng=None, encode=None, executor: str = "reference",
          hooks=(), start: RunState | None = None, comm=None, timeout: float | None = None,
          sync_fields: bool | None = None, layout: str = "auto", survive_failures: bool = False,
          replace=None) -> TrainResult:
    """Train ``algo`` ("diloco", with ``config.family``'s mechanisms, or "sync") on ``executor``.

    Parameters
    ----------
    algo : "diloco" or "sync"
    x, y, config, x_eval, y_eval, rng, encode
        As for ``diloco.loop.train_diloco``.
    executor : "reference", "fast" or "mpi", keyword-only
    hooks : sequence of hook objects, keyword-only
        See the module doc (``diloco.core.hooks``).
    start : RunState, keyword-only, optional
        Continue after ``start.round`` (a checkpoint's state) instead of from round 0.
    comm, timeout : keyword-only
        The MPI communicator and the collectives' time limit (executor "mpi").
    survive_failures : bool, keyword-only
        Executor "mpi" under an MPI with ULFM: a rank that dies becomes a dropped worker
        (``diloco.core.membership``) instead of ending the job.
    replace : sequence of str, keyword-only, optional
        With ``survive_failures``: the argv of a replacement process (``python -m
        diloco.tools.cli.mpi`` and the run's flags); the survivors start one for each worker
        lost in a round, at that round's end (``MPIExecutor.round_ended``).
    layout : "auto", "stacked" or "per-worker", keyword-only
        The fast executor's layout (``diloco.engine.layout.choose_layout``).
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
    exe = make_executor(executor, shards, config, encode, comm, timeout, layout, survive_failures, replace)
    state = initial_state(algo, params, config, rng) if start is None else start
    fields = algo == "diloco" and (not config.family.algorithm_is_diloco() if sync_fields is None else sync_fields)
    weights = pseudo_grad_weights(shards, config)  # None (uniform), or shard sizes
    plan = synchroniser(algo, config, state.global_params, weights, normalised_weights(shards, config))
    return _rounds(plan, exe, state, config, (x_eval, y_eval), encode, tuple(hooks), fields)


def _rounds(plan, exe, state: RunState, config, held_out, encode, hooks, fields) -> TrainResult:
    """The one loop: each round is the synchroniser's ``round``, its record, then the hooks."""
    rng, history = state.rng, list(state.history)
    current = plan.init(state, exe)
    clock = SimulatedClock(config, state.global_params) if config.asynchrony.simulates_speeds else None
    for round_index in range(state.round + 1, config.rounds + 1):
        exe.round_index = round_index
        current, outcome = plan.round(current, exe, round_index, rng)
        params = current.params
        step_losses = exe.gather({k: np.concatenate(v) for k, v in outcome.losses.items() if v})
        record = round_fields(outcome, params, step_losses, config, sync_fields=fields, clock=clock,
                              history=history, executor=exe)
        record["round"] = round_index
        _call(hooks, "trained", record, (params, step_losses))
        finish_record(record, round_index, config, params, *held_out, history, encode=encode)
        get_state = functools.partial(plan.run_state, current, exe, round_index, rng, history)
        exe.round_ended(record, get_state)
        _call(hooks, "finished", record, get_state)
    return TrainResult(current.params, history)
