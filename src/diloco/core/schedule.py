"""When what synchronises: the sync schedule of every algorithm, as data.

A round is H inner steps. ``round_plan(config, keys, round_index)`` lists, in order, the
inner steps ``h`` (1..H) after which something happens, and what: fragment syncs
(``SyncEvent``). Merges of received fragments fall due ``tau`` steps after their sync
(``merge_step``) and may cross into the next round; the driver keeps them pending.

* DiLoCo: one fragment (the whole model), synced after step H, tau = 0.
* Streaming DiLoCo (Douillard et al., 2025): the L layers in P fragments (``strided`` or
  ``sequential``); fragment p syncs when the run's step t satisfies
  ``(t - t_p) mod H == 0`` with ``t_p = floor(p H / P)``, so after step ``t_p`` of every
  round (step H for p = 0).
* Eager updates (Kale et al., 2025): the whole model after step H, with the eager rule
  (``diloco.core.sync``); with tau = 0 it is DiLoCo.
* The synchronous baseline: no parameter syncs; the executor averages the gradients
  every step (``Executor.run_sync``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from diloco._validation import api_checks
from diloco.config.sections import PATTERNS
from diloco.methods.asynchrony import (
    arrival_schedule,
    arrivals_bound,
    draw_step_times,
    dynamic_local_steps,
    synchronous_round_time,
)
from diloco.model import Params

__all__ = ["SyncEvent", "fragment_layers", "fragment_keys", "block_fragment_keys", "sync_offsets", "sync_steps",
           "round_plan",
           "merge_step", "event_steps", "ArrivalGroup", "worker_step_times", "worker_local_steps", "async_plan",
           "synchronous_round_seconds", "check_speeds"]


class SyncEvent(NamedTuple):
    """Fragment ``fragment`` (its parameter ``keys``) synchronises after inner step ``h`` of the round."""

    h: int
    fragment: int
    keys: tuple


def fragment_layers(num_layers: int, fragments: int, pattern: str = "strided") -> list[list[int]]:
    """The 1-based layers of each fragment.

    >>> fragment_layers(4, 2)
    [[1, 3], [2, 4]]
    >>> fragment_layers(4, 2, "sequential")
    [[1, 2], [3, 4]]
    """
    api_checks.fragment_layers(num_layers, fragments, pattern)
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if not 1 <= fragments <= num_layers:
        raise ValueError(f"fragments must be between 1 and the number of layers ({num_layers}), got {fragments}")
    # BEGIN EXERCISE x02
    layers = list(range(1, num_layers + 1))
    if pattern == "strided":
        return [layers[p::fragments] for p in range(fragments)]
    return [list(chunk) for chunk in np.array_split(layers, fragments)]
    # END EXERCISE x02


def fragment_keys(params: Params, fragments: int, pattern: str = "strided") -> list[tuple[str, ...]]:
    """The parameter keys (``W_l``, ``b_l``) of each fragment of an MLP's params."""
    api_checks.fragment_keys(params, fragments, pattern)
    # BEGIN EXERCISE x02
    num_layers = len(params) // 2
    return [tuple(key for layer in group for key in (f"W{layer}", f"b{layer}"))
            for group in fragment_layers(num_layers, fragments, pattern)]
    # END EXERCISE x02


def block_fragment_keys(blocks: list[tuple[str, ...]], fragments: int, pattern: str = "strided"
                        ) -> list[tuple[str, ...]]:
    """The keys of each fragment of a model whose units are ``blocks`` (the transformer's).

    ``fragment_layers`` groups the blocks as it groups an MLP's layers: block ``i``
    (1-based) is layer ``i``.
    """
    return [tuple(key for unit in group for key in blocks[unit - 1])
            for group in fragment_layers(len(blocks), fragments, pattern)]


def sync_offsets(fragments: int, inner_steps: int) -> list[int]:
    """``t_p = floor(p H / P)`` for p = 0..P-1 (needs P <= H, so the offsets differ)."""
    api_checks.sync_offsets(fragments, inner_steps)
    if fragments > inner_steps:
        raise ValueError(f"fragments ({fragments}) must not exceed inner_steps ({inner_steps})")
    # BEGIN EXERCISE x02
    return [(p * inner_steps) // fragments for p in range(fragments)]
    # END EXERCISE x02


def sync_steps(fragment: int, fragments: int, inner_steps: int, total_steps: int) -> list[int]:
    """The 1-based inner steps ``t <= total_steps`` at which ``fragment`` synchronises."""
    api_checks.sync_steps(fragment, fragments, inner_steps, total_steps)
    # BEGIN EXERCISE x02
    offset = sync_offsets(fragments, inner_steps)[fragment]
    return list(range(offset if offset > 0 else inner_steps, total_steps + 1, inner_steps))
    # END EXERCISE x02


def round_plan(config, keys: list[tuple[str, ...]]) -> list[SyncEvent]:
    """The fragment syncs of one round, in the order they happen (by step, then fragment).

    ``keys`` are the fragments' parameter keys (``fragment_keys``); the plan is the same
    every round.
    """
    inner_steps = config.inner_steps
    offsets = sync_offsets(len(keys), inner_steps) if len(keys) > 1 else [0]  # one fragment: DiLoCo's sync after H
    events = [SyncEvent(offset if offset > 0 else inner_steps, p, tuple(k))
              for p, (k, offset) in enumerate(zip(keys, offsets, strict=True))]
    return sorted(events, key=lambda e: (e.h, e.fragment))


def merge_step(round_index: int, h: int, config) -> int:
    """The run's step (1-based, over all rounds) at which a sync after step h of the round is merged."""
    tau = config.family.tau(config.inner_steps)
    if config.family.eager:
        tau = 0  # eager updates apply their result at once (the overlap is in the rule itself)
    return (round_index - 1) * config.inner_steps + h + tau


def event_steps(plan: list[SyncEvent], pending_steps, round_index: int, inner_steps: int) -> list[int]:
    """The steps h of the round after which the driver stops the inner loop (a sync or a merge), ascending."""
    first = (round_index - 1) * inner_steps
    due = {event.h for event in plan}
    due.update(step - first for step in pending_steps if first < step <= first + inner_steps)
    return sorted(due)


# --- Asynchronous DiLoCo (Liu et al. 2024): the arrival groups of every round, as data ---

class ArrivalGroup(NamedTuple):
    """Workers whose pseudo-gradients reach the server at simulated second ``time``, together.

    ``steps[i]`` inner steps of ``workers[i]`` stand behind its arrival, computed from the
    global model of version ``versions[i]`` (the arrivals applied when it started). The
    group is applied at once; its workers then restart from the new global model.
    """

    time: float
    workers: tuple
    steps: tuple
    versions: tuple


def worker_step_times(config) -> np.ndarray:
    """Seconds per inner step of each worker (``config.asynchrony``): given, drawn, or 1 s each.

    Drawn times come from a generator seeded by ``config.seed`` and a fixed tag, never from
    the run's own generator, so the batches and drops stay DiLoCo's.
    """
    section = config.asynchrony
    if section.step_times is not None:
        times = np.array(section.step_times, dtype=np.float64)
    else:
        times = draw_step_times(config.num_workers, np.random.default_rng([config.seed, 0xA5C]),
                                spread=section.speed_spread)
    if section.straggler is not None:
        times[section.straggler] *= section.straggler_factor
    if not (np.all(np.isfinite(times)) and np.all(times > 0)):  # exp(spread z) or the factor left float64
        what = (f"speed_spread {section.speed_spread:g}" if section.step_times is None
                else "step_times") + (f" with straggler_factor {section.straggler_factor:g}"
                                      if section.straggler is not None else "")
        raise ValueError(f"asynchrony: {what} gives step times of {times.min():.3g} to {times.max():.3g} s, outside "
                         f"float64's positive finite range: use a smaller spread or factor")
    return times


def worker_local_steps(config) -> np.ndarray:
    """H_k of each worker: H, or with dynamic local updates ``dynamic_local_steps`` (DyLU)."""
    if config.asynchrony.dynamic_local_steps:
        return dynamic_local_steps(worker_step_times(config), config.inner_steps)
    return np.full(config.num_workers, config.inner_steps, dtype=np.int64)


def async_plan(config, comm_time: float = 0.0) -> list[list[ArrivalGroup]]:
    """The arrival groups of rounds 1..R of asynchronous DiLoCo.

    ``diloco.methods.asynchrony.arrival_schedule`` orders the arrivals (worker k's trip
    takes ``H_k c_k + comm_time``); arrivals at the same simulated time form one group.
    A round ends at the first group boundary where every worker has arrived at least once
    in it, so it spans about one trip of the slowest worker (what a synchronous round
    waits for), and with equal speeds it is one group of all K workers: a DiLoCo round.
    Its cost is bounded before anything is scheduled (``arrivals_bound``): speeds too far
    apart for ``MAX_ARRIVALS`` arrivals, or a clock that overflows, raise ``ValueError``.
    """
    num_workers, rounds = config.num_workers, config.rounds
    times, steps = worker_step_times(config), worker_local_steps(config)
    budget = arrivals_bound(times, steps, rounds, comm_time=comm_time) + 1  # + 1: the group after the last
    arrivals = arrival_schedule(times, steps, budget, comm_time=comm_time)
    plan, groups, seen, i, n = [], [], set(), 0, arrivals.worker.size
    while len(plan) < rounds:
        j = i
        while j < n and arrivals.time[j] == arrivals.time[i]:
            j += 1
        if j == n:  # cannot happen within the bound; a loud error, never a loop
            raise RuntimeError(f"async_plan: {budget:,} arrivals did not make {rounds} rounds")
        groups.append(ArrivalGroup(float(arrivals.time[i]), tuple(int(k) for k in arrivals.worker[i:j]),
                                   tuple(int(h) for h in arrivals.steps[i:j]),
                                   tuple(int(v) for v in arrivals.version[i:j])))
        seen.update(groups[-1].workers)
        i = j
        if len(seen) == num_workers:
            plan.append(groups)
            groups, seen = [], set()
    return plan


def check_speeds(config, comm_time: float = 0.0) -> None:
    """Raise ``ValueError`` (one line, with the numbers) unless the workers' speeds can be simulated:
    step times in float64's range, a clock that does not overflow, and for an asynchronous run a
    schedule of at most ``MAX_ARRIVALS`` arrivals (``arrivals_bound``). Cheap: nothing is scheduled."""
    section = config.asynchrony
    if not section.simulates_speeds:
        return
    times, steps = worker_step_times(config), worker_local_steps(config)
    if section.asynchronous:
        arrivals_bound(times, steps, config.rounds, comm_time=comm_time)
        return
    with np.errstate(over="ignore"):
        end = config.rounds * (float(np.max(times * steps)) + comm_time)
    if not math.isfinite(end):
        raise ValueError(f"step times of up to {times.max():.3g} s x {config.inner_steps:,} inner steps x "
                         f"{config.rounds:,} rounds overflow the simulated clock (float64): use shorter step times")


def synchronous_round_seconds(config, comm_time: float = 0.0) -> float:
    """One synchronous DiLoCo round with these speeds: the wait for the slowest, ``max_k H_k c_k + comm``."""
    return synchronous_round_time(worker_step_times(config), worker_local_steps(config), comm_time=comm_time)
