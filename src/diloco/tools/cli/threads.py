"""The BLAS thread policy: one thread for small matrices; for large ones, what a short probe says.

OpenBLAS starts one thread per core and lets them spin while they wait for work. For the
small matrices of this project (a 32 x 64 by 64 x 128 product is half a million
floating-point operations, a few microseconds) the threads cost more than they save, and
when another process holds a core a threaded product can take many times longer. The
rule, decided afresh for every run (every command that trains):

* the largest matrix product of one training step, ``2 b d_{l-1} d_l`` FLOPs, below
  ``LARGE_MATMUL_FLOPS`` (1e7): **one thread**, no probe;
* above it, a probe of about a tenth of a second:

  1. **idle cores**: the idle share of each core this process may use over
     ``IDLE_WINDOW`` seconds, summed, read from ``/proc/stat`` while this process sleeps
     (so every busy core is another process's, running *now*: unlike the load average,
     no process that has just finished counts);
  2. the candidate ``floor(idle + 0.25)``, between 1 and the cores: never more threads
     than idle cores, so **1 whenever another process keeps a core of two busy**;
  3. if the candidate is above 1, the step's largest product is timed (wall clock) with
     1 thread and with the candidate; the candidate is kept only if it is at least
     ``MIN_SPEEDUP`` times faster;

* without ``/proc/stat`` (not Linux) the probe cannot see the other processes: one thread;
* ``--threads N`` overrides the rule.

``threadpoolctl`` (the ``cli`` extra) sets the limit at run time; without it the policy
is skipped (NumPy keeps its default) and ``--threads`` is an error. The crossover, the
cost of oversubscription and the probe's choices are measured in ``benchmarks/results.md``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time

import numpy as np

__all__ = ["LARGE_MATMUL_FLOPS", "IDLE_WINDOW", "MIN_SPEEDUP", "largest_matmul_flops", "largest_matmul_shape",
           "usable_cores", "idle_cores", "free_cores", "probe_speedup", "choose_threads", "blas_threads",
           "ThreadsUnavailable"]

# Below this many FLOPs per product one thread is at least as fast as two (measured).
LARGE_MATMUL_FLOPS = 1e7
# Seconds of /proc/stat sampling: 5 scheduler ticks at 100 Hz.
IDLE_WINDOW = 0.05
# More threads must make the probe's product at least this much faster to be used.
MIN_SPEEDUP = 1.15


class ThreadsUnavailable(ImportError):
    """``--threads`` was given but threadpoolctl is not installed."""


def largest_matmul_flops(layer_sizes, batch_size: int) -> float:
    """FLOPs of the largest product of one step: ``max_l 2 b d_{l-1} d_l``."""
    sizes = list(layer_sizes)
    return max((2.0 * batch_size * fan_in * fan_out for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True)),
               default=0.0)


def largest_matmul_shape(layer_sizes, batch_size: int) -> tuple:
    """``(b, d_{l-1}, d_l)`` of the largest product of one step."""
    sizes = list(layer_sizes)
    return max(((batch_size, a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)),
               key=lambda shape: shape[1] * shape[2])


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cpu_times(stat_path: str = "/proc/stat") -> dict:
    """``{cpu number: (idle, total)}`` jiffies since boot, from the ``cpuN`` lines (idle includes iowait)."""
    times = {}
    with open(stat_path) as handle:
        for line in handle:
            name, *values = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            fields = [int(value) for value in values[:8]]  # user nice system idle iowait irq softirq steal
            times[int(name[3:])] = (fields[3] + fields[4], sum(fields))
    return times


def idle_cores(window: float = IDLE_WINDOW, *, stat_path: str = "/proc/stat", cpus=None,
               sleep=time.sleep) -> float | None:
    """Cores left idle by every other process over the next ``window`` seconds; None without ``/proc/stat``.

    This process sleeps meanwhile, so all the busy time is other processes'. Summed over
    ``cpus``, the CPUs this process may run on (its affinity).
    """
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    try:
        before = _cpu_times(stat_path)
        sleep(window)
        after = _cpu_times(stat_path)
        idle = 0.0
        for cpu in cpus:
            (idle_0, total_0), (idle_1, total_1) = before[cpu], after[cpu]
            idle += 1.0 if total_1 <= total_0 else min(1.0, max(0.0, (idle_1 - idle_0) / (total_1 - total_0)))
    except (OSError, ValueError, IndexError, KeyError):
        return None
    return idle


def free_cores(cores: int | None = None, idle: float | None = None) -> int:
    """Threads the idle cores allow: ``floor(idle + 0.25)`` between 1 and ``cores``.

    ``idle`` defaults to ``idle_cores()``; when that cannot be read, 1.
    """
    cores = usable_cores() if cores is None else cores
    if idle is None:
        idle = idle_cores()
        if idle is None:
            return 1
    return max(1, min(cores, math.floor(idle + 0.25)))


def probe_speedup(shape, threads: int, *, dtype=np.float64, repeats: int = 3) -> float:
    """How many times faster ``threads`` BLAS threads compute one ``(m, k) @ (k, n)`` product than one.

    Wall clock, best of ``repeats`` per thread count, the two interleaved. Needs threadpoolctl.
    """
    from threadpoolctl import threadpool_limits

    m, k, n = shape
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype=dtype)
    best = {1: math.inf, threads: math.inf}
    for _ in range(repeats):
        for count in best:
            with threadpool_limits(limits=count, user_api="blas"):
                np.matmul(a, b, out=out)  # wakes the pool
                start = time.perf_counter()
                np.matmul(a, b, out=out)
                best[count] = min(best[count], time.perf_counter() - start)
    return best[1] / max(best[threads], 1e-12)


def choose_threads(layer_sizes, batch_size: int, *, requested: int | None = None, cores: int | None = None,
                   idle: float | None = None, speedup=None) -> int:
    """The number of BLAS threads for a model of ``layer_sizes`` trained on batches of ``batch_size``.

    Parameters
    ----------
    layer_sizes : sequence of int
        ``(d_in, h_1, ..., C)``.
    batch_size : int
        Rows of one product (per worker).
    requested : int >= 1 or None, keyword-only
        ``--threads``: returned as it is.
    cores, idle : keyword-only, for tests
        Default to this process's CPU affinity and ``idle_cores()``.
    speedup : callable ``(shape, threads) -> float`` or None, keyword-only
        Defaults to ``probe_speedup`` (skipped, one thread, without threadpoolctl).

    Returns
    -------
    int >= 1
    """
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise ValueError(f"threads must be a positive int, got {requested!r}")
        return requested
    if largest_matmul_flops(layer_sizes, batch_size) < LARGE_MATMUL_FLOPS:
        return 1
    candidate = free_cores(cores, idle)
    if candidate == 1:
        return 1
    if speedup is None:
        try:
            import threadpoolctl  # noqa: F401
        except ImportError:
            return 1
        speedup = probe_speedup
    return candidate if speedup(largest_matmul_shape(layer_sizes, batch_size), candidate) >= MIN_SPEEDUP else 1


def blas_threads(threads: int, *, required: bool = False):
    """A context manager limiting the BLAS pool to ``threads`` threads.

    Without threadpoolctl it does nothing, unless ``required`` (the user asked for a
    number), when it raises ``ThreadsUnavailable``.
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        if required:
            raise ThreadsUnavailable("--threads needs threadpoolctl, from the 'cli' extra: "
                                     "pip install 'diloco[cli]'") from None
        return contextlib.nullcontext()
    return threadpool_limits(limits=threads, user_api="blas")
