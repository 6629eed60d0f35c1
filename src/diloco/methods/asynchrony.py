"""Asynchronous DiLoCo with heterogeneous workers (Liu et al. 2024, arXiv 2401.09135).

Each worker k takes ``c_k`` seconds per inner step. It starts from the global model,
takes ``H_k`` steps and sends its pseudo-gradient ``g = theta_start - theta_k``; the
server applies it *when it arrives*, while the others are still computing on an older
model (their pseudo-gradients are stale), and the worker restarts at once from the
current global model. ``arrival_schedule`` is that event queue as a pure function.

The paper's two fixes, as we restate them from its text:

* **Delayed Nesterov (DN)** (its Algorithm 3): "momentum applied every N arrivals". The
  server sums the arrivals and applies only ``g_t / N`` in between; every N-th arrival it
  folds the average into the momentum and takes the Nesterov step::

      Delta <- Delta + g_t
      t mod N == 0:  m <- beta m + Delta / N,  theta <- theta - lr (g_t / N + beta m),  Delta <- 0
      otherwise:     theta <- theta - lr g_t / N

  Over N arrivals the parameters move by ``-lr (Delta / N + beta m)``: one Nesterov step
  on the average, as synchronous DiLoCo takes once per round.
* **Dynamic local updates (DyLU)**: each worker's H in proportion to its speed,
  ``H_k = floor(H v_k / max_j v_j)`` with ``v_k = 1 / c_k``, so that all workers take
  about the same wall time per round and slow workers' updates are not stale.

The training core runs these rules as a sync schedule (``diloco.core.schedule.async_plan``,
``DiLoCoConfig.asynchrony``): ``arrival_schedule`` orders the arrivals, and
``delayed_outer_update`` is delayed Nesterov for a group of simultaneous arrivals, through
the core's outer optimizer (``tests/tooling/test_async_core.py``).

Reductions (``tests/tooling/test_asynchrony.py``): with equal speeds the arrivals come
in round-robin order, K at a time from the same model, and K delayed-Nesterov arrivals
with ``N = K`` are milestones 22-23 applied once to milestone 15's average of them, bit
for bit; with one worker both rules are DiLoCo with K = 1.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from diloco._validation import (
    check_generator,
    check_nonneg_int,
    check_params,
    check_positive_int,
    check_probability,
    check_real,
    check_same_structure,
)
from diloco.model import Params
from diloco.outer import OuterState, init_outer_optimizer, nesterov_param_update, update_outer_momentum
from diloco.params import average_params

__all__ = ["Arrivals", "AsyncOuterState", "MAX_ARRIVALS", "draw_step_times", "dynamic_local_steps",
           "arrival_schedule", "arrivals_bound",
           "synchronous_round_time", "init_async_outer", "delayed_nesterov_step",
           "delayed_outer_update"]


class Arrivals(NamedTuple):
    """The order in which pseudo-gradients reach the server.

    Attributes
    ----------
    worker : ndarray of int64, shape (n,)
        Who arrives, in order of application.
    time : ndarray of float64, shape (n,)
        Simulated seconds at the arrival.
    version : ndarray of int64, shape (n,)
        How many arrivals the server had applied when this worker started its work (the
        global model it started from); the staleness of arrival i is ``i - version[i]``.
    steps : ndarray of int64, shape (n,)
        The inner steps behind this arrival.
    """

    worker: np.ndarray
    time: np.ndarray
    version: np.ndarray
    steps: np.ndarray

    @property
    def staleness(self) -> np.ndarray:
        """Arrivals applied between this worker's start and its own arrival."""
        return np.arange(self.worker.size) - self.version


class AsyncOuterState(NamedTuple):
    """Immutable state of the asynchronous outer optimizer.

    Attributes
    ----------
    outer : OuterState
        The momentum buffer m (milestone 21's state), shaped like the global params.
    anchor : dict of str -> ndarray
        DN only: the global params at the last momentum step.
    pending : tuple of dicts
        DN only: the pseudo-gradients received since the last momentum step (fewer than N).
    arrivals : int
        Arrivals applied so far (t).
    """

    outer: OuterState
    anchor: Params
    pending: tuple
    arrivals: int


def _check_times(step_times, name: str = "step_times") -> np.ndarray:
    try:
        times = np.asarray(step_times, dtype=np.float64)
    except (TypeError, ValueError):
        times = np.zeros(0)
    if times.ndim != 1 or times.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of seconds per step, got {step_times!r}")
    if not (np.all(np.isfinite(times)) and np.all(times > 0)):
        raise ValueError(f"{name} must be finite and > 0, got {times.tolist()}")
    return times


def _check_steps(local_steps, times: np.ndarray) -> np.ndarray:
    steps = np.asarray(local_steps)
    if steps.ndim > 1 or steps.size not in (1, times.size) or not np.issubdtype(steps.dtype, np.integer) \
            or np.any(steps < 1):
        raise ValueError(f"local_steps must be a positive int or one per worker ({times.size}), got {local_steps!r}")
    return np.broadcast_to(steps.ravel(), times.shape).astype(np.int64)


def draw_step_times(num_workers: int, rng: np.random.Generator, *, mean: float = 1.0, spread: float = 0.0,
                    straggler: int | None = None, straggler_factor: float = 1.0) -> np.ndarray:
    """Per-worker seconds per inner step: ``c_k = mean exp(spread z_k)``, ``z_k ~ N(0, 1)``.

    A log-normal around ``mean`` (its median); ``spread = 0`` gives equal workers and draws
    nothing. Worker ``straggler`` (if given) is ``straggler_factor`` times slower.

    Returns
    -------
    ndarray of float64, shape (num_workers,)

    Raises
    ------
    TypeError, ValueError
        A non-Generator ``rng``, a non-positive count, mean or factor, a negative spread,
        a straggler index out of range.
    """
    num_workers = check_positive_int(num_workers, "num_workers")
    check_generator(rng)
    mean = check_real(mean, "mean", low=0.0, low_open=True)
    spread = check_real(spread, "spread", low=0.0)
    factor = check_real(straggler_factor, "straggler_factor", low=0.0, low_open=True)
    times = np.full(num_workers, mean)
    if spread > 0:
        with np.errstate(over="ignore"):  # an overflow to inf is refused where the times are used
            times = mean * np.exp(spread * rng.standard_normal(num_workers))
    if straggler is not None:
        index = check_nonneg_int(straggler, "straggler")
        if index >= num_workers:
            raise ValueError(f"straggler must be a worker index in [0, {num_workers}), got {straggler}")
        times[index] *= factor
    return times


def dynamic_local_steps(step_times, inner_steps: int, *, min_steps: int = 1) -> np.ndarray:
    """DyLU: ``H_k = max(min_steps, floor(H v_k / max_j v_j))``, ``v_k = 1 / c_k``.

    The fastest worker takes ``inner_steps``; one twice as slow takes half of them.

    Returns
    -------
    ndarray of int64, shape (K,)
    """
    times = _check_times(step_times)
    inner_steps = check_positive_int(inner_steps, "inner_steps")
    min_steps = check_positive_int(min_steps, "min_steps")
    ratio = times.min() / times  # v_k / max v, exactly 1.0 for the fastest
    return np.maximum(min_steps, np.floor(inner_steps * ratio + 1e-9)).astype(np.int64)


def arrival_schedule(step_times, local_steps, num_arrivals: int, *, comm_time: float = 0.0,
                     grace: float = 0.0) -> Arrivals:
    """The event queue: which worker's pseudo-gradient arrives when, computed from which model.

    Every worker starts at time 0 from version 0. Worker k's work takes
    ``H_k c_k + comm_time`` seconds. Arrivals are applied in order of time, then of worker
    index. Arrivals within ``grace`` seconds of the first of a group are applied one after
    the other, and only then do those workers restart, from the model after the whole
    group, at the time of its last arrival (the paper's grace period; ``grace = 0`` groups
    exact ties, which is what makes equal workers synchronous).

    Parameters
    ----------
    step_times : sequence of K positive floats
    local_steps : int, or sequence of K positive ints (e.g. ``dynamic_local_steps``)
    num_arrivals : int >= 0
    comm_time, grace : float >= 0, keyword-only

    Returns
    -------
    Arrivals with ``num_arrivals`` entries.
    """
    times = _check_times(step_times)
    steps = _check_steps(local_steps, times)
    num_arrivals = check_nonneg_int(num_arrivals, "num_arrivals")
    comm_time = check_real(comm_time, "comm_time", low=0.0)
    grace = check_real(grace, "grace", low=0.0)
    duration = steps * times + comm_time
    queue = [(float(duration[k]), k, 0) for k in range(times.size)]  # (finish time, worker, version)
    heapq.heapify(queue)
    worker, when, version, applied = [], [], [], 0
    while applied < num_arrivals:
        first = heapq.heappop(queue)
        group = [first]
        while queue and queue[0][0] <= first[0] + grace:
            group.append(heapq.heappop(queue))
        for finish, k, start_version in group:
            worker.append(k)
            when.append(finish)
            version.append(start_version)
        applied += len(group)
        restart = group[-1][0]
        for _, k, _ in group:
            heapq.heappush(queue, (restart + float(duration[k]), k, applied))
    return Arrivals(np.array(worker[:num_arrivals], dtype=np.int64), np.array(when[:num_arrivals]),
                    np.array(version[:num_arrivals], dtype=np.int64),
                    steps[np.array(worker[:num_arrivals], dtype=np.int64)].astype(np.int64))


# The most arrivals a schedule is built for (``arrivals_bound``): a few MB of event queue, and
# already more worker trips than a teaching run trains. A speed ratio that needs more is refused.
MAX_ARRIVALS = 100_000


def arrivals_bound(step_times, local_steps, rounds: int, *, comm_time: float = 0.0) -> int:
    """How many arrivals ``rounds`` rounds can take at most, computed without scheduling them.

    A round (``diloco.core.schedule.async_plan``) ends once every worker has arrived in it,
    so it lasts at most the slowest trip ``d_max`` (each worker is always working, and its
    trip ``d_k = H_k c_k + comm_time`` ends within ``d_k`` of any moment); worker k arrives
    at most ``ceil(d_max / d_k) + 1`` times in it. The bound is ``rounds`` times the sum.

    Raises
    ------
    ValueError
        A trip or the simulated clock of the whole run overflows float64, or the bound
        exceeds ``MAX_ARRIVALS`` (the speed ratio the schedule cannot serve), with the numbers.
    """
    times = _check_times(step_times)
    steps = _check_steps(local_steps, times)
    rounds = check_positive_int(rounds, "rounds")
    comm_time = check_real(comm_time, "comm_time", low=0.0)
    with np.errstate(over="ignore"):
        trips = steps * times + comm_time
        end = 2.0 * rounds * float(trips.max())  # the simulated clock at the end, with room to spare
    if not (np.all(np.isfinite(trips)) and np.isfinite(end)):
        raise ValueError(f"step times of {times.max():.3g} s x {int(steps.max()):,} inner steps x {rounds:,} rounds "
                         f"overflow the simulated clock (float64): use shorter step times")
    with np.errstate(over="ignore"):
        ratio = float(trips.max() / trips.min())
        bound = rounds * float(np.sum(np.ceil(trips.max() / trips) + 1.0))
    if not bound <= MAX_ARRIVALS:
        raise ValueError(f"the slowest worker's trip is {ratio:.3g} times the fastest's, so {rounds:,} rounds of "
                         f"{times.size:,} workers need up to {bound:.3g} arrivals, more than the {MAX_ARRIVALS:,} an "
                         f"asynchronous schedule is built for: bring the step times closer or use fewer rounds")
    return int(bound)


def synchronous_round_time(step_times, local_steps, *, comm_time: float = 0.0) -> float:
    """Seconds of one synchronous DiLoCo round, which waits for the slowest: ``max_k H_k c_k + comm_time``."""
    times = _check_times(step_times)
    steps = _check_steps(local_steps, times)
    return float(np.max(steps * times)) + check_real(comm_time, "comm_time", low=0.0)


def init_async_outer(params: Params) -> AsyncOuterState:
    """Zero momentum (milestone 21), the anchor at ``params``, no pending arrivals."""
    check_params(params)
    return AsyncOuterState(init_outer_optimizer(params), {k: v.copy() for k, v in params.items()}, (), 0)


def _check_step(params, state, pseudo_grad):
    check_params(params)
    check_params(pseudo_grad, "pseudo_grad")
    check_same_structure(params, pseudo_grad, "params", "pseudo_grad")
    if not isinstance(state, AsyncOuterState):
        raise TypeError(f"state must be an AsyncOuterState (from init_async_outer), got {type(state).__name__}")
    check_same_structure(params, state.outer.momentum, "params", "state.outer.momentum")


def delayed_nesterov_step(params: Params, state: AsyncOuterState, pseudo_grad: Params, *, lr: float,
                          momentum: float, period: int) -> tuple[Params, AsyncOuterState]:
    """Delayed Nesterov (DN): ``g_t / N`` on every arrival, the momentum step every ``N = period`` arrivals.

    Between momentum steps ``theta <- theta - lr g_t / N``. On the N-th arrival the
    average ``Delta / N`` of the N pending pseudo-gradients (milestone 15's
    ``average_params``) goes through milestones 22-23 from the anchor (the params of the
    last momentum step): ``m <- beta m + Delta / N``, ``theta = anchor - lr (Delta / N + beta m)``,
    which equals the paper's ``theta - lr (g_t / N + beta m)`` (the anchor minus the
    ``N - 1`` steps in between) and is DiLoCo's outer step on that average bit for bit.
    ``params`` must be the previous call's result.

    Returns
    -------
    (new_params, new_state)
    """
    _check_step(params, state, pseudo_grad)
    period = check_positive_int(period, "period")
    lr = check_real(lr, "lr", low=0.0, low_open=True)
    momentum = check_probability(momentum, "momentum")  # checked on every arrival, not only the N-th
    pending = state.pending + (pseudo_grad,)
    if len(pending) < period:
        new_params = {k: params[k] - lr * (pseudo_grad[k] / period) for k in params}
        return new_params, AsyncOuterState(state.outer, state.anchor, pending, state.arrivals + 1)
    mean = average_params(list(pending))
    outer = update_outer_momentum(state.outer, mean, momentum)
    new_params = nesterov_param_update(state.anchor, mean, outer, lr, momentum)
    anchor = {k: v.copy() for k, v in new_params.items()}
    return new_params, AsyncOuterState(outer, anchor, (), state.arrivals + 1)



def delayed_outer_update(params: Params, delta: Params, state: AsyncOuterState, config, *, count: int = 1,
                         period: int, update) -> tuple[Params, AsyncOuterState]:
    """Delayed Nesterov for a *group* of ``count`` arrivals whose mean pseudo-gradient is ``delta``.

    The training core's form of ``delayed_nesterov_step``: a group of g arrivals moves the
    params by ``-lr g delta / N`` (the g arrivals' ``-lr g_t / N``) while fewer than N
    arrivals are pending; at the first group that brings N or more, the pending groups'
    mean (weighted by their counts; ``delta`` itself when it is the only one) goes through
    ``update`` (the outer optimizer, ``diloco.core.outer``) from the anchor, the params of
    the last momentum step. ``state.pending`` holds ``(count, delta)`` pairs. With equal
    speeds every group is the K workers and N = K makes every group a momentum step from
    the current model: DiLoCo's outer step, bit for bit.

    Returns
    -------
    (new_params, new_state)
    """
    period = check_positive_int(period, "period")
    count = check_positive_int(count, "count")
    if not isinstance(state, AsyncOuterState):
        raise TypeError(f"state must be an AsyncOuterState, got {type(state).__name__}")
    pending = state.pending + ((count, delta),)
    held = sum(c for c, _ in pending)
    if held < period:
        new_params = {k: params[k] - config.outer_lr * (count * delta[k] / period) for k in params}
        return new_params, AsyncOuterState(state.outer, state.anchor, pending, state.arrivals + count)
    mean = delta if len(pending) == 1 else average_params([d for _, d in pending], [c for c, _ in pending])
    new_params, outer = update(state.anchor, mean, state.outer, config)
    anchor = {k: v.copy() for k, v in new_params.items()}
    return new_params, AsyncOuterState(outer, anchor, (), state.arrivals + count)
