"""The BLAS thread policy: one thread for small matrices, every free core for large ones.

OpenBLAS starts one thread per core and lets them spin while they wait for work. For the
small matrices of this project (a 32 x 64 by 64 x 128 product is half a million
floating-point operations, a few microseconds) the threads cost more than they save, and
when other processes use the cores a threaded product can take 50 times longer. The rule:

* the largest matrix product of one training step, ``2 b d_{l-1} d_l`` FLOPs, below
  ``LARGE_MATMUL_FLOPS`` (1e7): **one thread**;
* above it: **the free cores**, ``cores - round(load)`` with ``load`` the one-minute load
  average (processes already running), at least 1: never more threads than idle cores;
* ``--threads N`` overrides the rule.

``threadpoolctl`` (the ``cli`` extra) sets the limit at run time; without it the policy
is skipped (NumPy keeps its default) and ``--threads`` is an error. The crossover and the
cost of oversubscription are measured in ``benchmarks/results.md``.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["LARGE_MATMUL_FLOPS", "largest_matmul_flops", "free_cores", "choose_threads", "blas_threads",
           "ThreadsUnavailable"]

# Below this many FLOPs per product one thread is at least as fast as two (measured).
LARGE_MATMUL_FLOPS = 1e7


class ThreadsUnavailable(ImportError):
    """``--threads`` was given but threadpoolctl is not installed."""


def largest_matmul_flops(layer_sizes, batch_size: int) -> float:
    """FLOPs of the largest product of one step: ``max_l 2 b d_{l-1} d_l``."""
    sizes = list(layer_sizes)
    return max((2.0 * batch_size * fan_in * fan_out for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True)),
               default=0.0)


def free_cores(cores: int | None = None, load: float | None = None) -> int:
    """Cores this process may use, minus the load already running on them (at least 1)."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load is None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, min(cores, cores - round(load)))


def choose_threads(layer_sizes, batch_size: int, *, requested: int | None = None, cores: int | None = None,
                   load: float | None = None) -> int:
    """The number of BLAS threads for a model of ``layer_sizes`` trained on batches of ``batch_size``.

    Parameters
    ----------
    layer_sizes : sequence of int
        ``(d_in, h_1, ..., C)``.
    batch_size : int
        Rows of one product (per worker).
    requested : int >= 1 or None, keyword-only
        ``--threads``: returned as it is.
    cores, load : keyword-only, for tests
        Default to this process's CPU affinity and the one-minute load average.

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
    return free_cores(cores, load)


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
