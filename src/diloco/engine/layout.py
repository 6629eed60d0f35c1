"""Which layout the fast engine runs DiLoCo's K workers in: the rule, fitted to measurements.

*Stacked*: the K workers take each inner step together (one batched matmul per layer, one
AdamW pass over a ``(K, P)`` buffer). *Per-worker*: one worker after another in ``(1, P)``
buffers. Both do the same arithmetic; stacking saves the per-call cost of NumPy and BLAS
K-fold and costs memory: the parameters, gradients and activations of K models at once
(the AdamW moments are ``(K, P)`` in both layouts).

The measurements (``benchmarks/layout_grid.py``, the fit's data in
``benchmarks/layout_grid.json``; CPU time, one BLAS thread, model w-w-10, batch 32,
H = 10, K = 1..64, w = 64..512, float64 and float32, the numba AdamW loop a long run ends
on, taken 2026-12-02 on an idle two-core AMD EPYC at a load average of 0.6-0.9; ``make
bench`` redraws the same grid with the NumPy AdamW passes in ``benchmarks/results.md``):
stacked is 1.07-2.2x faster for w = 64 and 128 at any K >= 2; for w = 256 it is
1.07-1.20x faster up to K = 8 and 0.88-1.05x of per-worker from K = 16 on; for w = 512
(one model's parameters over 1 MiB) per-worker is faster in every cell with K >= 2, by
2-25%. On the benchmark's models (``make bench``, two idle runs of 2026-12-02): (a)
64-128-10 stacks 1.4-1.7x faster; on (b) 784-512-512-10 (5.4 MB a model in float64) the
two layouts are within 10% of each other either way (stacked / per-worker 0.91-1.07x).

The rule: **stacked for K >= 2 while one model's parameters take at most
``MODEL_MAX_BYTES`` (1 MiB) and the K models' at most ``STACKED_MAX_BYTES`` (8 MiB), else
per-worker**: beyond either, the K models' activations and gradients no longer stay in
cache together and stacking loses what it saves in calls. In the fitted grid the rule's
pick is more than 5% slower than the faster layout in 2 of the 48 cells with K >= 2, by
7% at most (w = 128, K = 64, float64: per-worker picked, stacked 1.07x faster); in the
NumPy-AdamW grid of the same day, in 1 of 48, by 10% (w = 256, K = 16, float32). The rule
was fitted on one machine: on another, forcing ``--layout`` (``train_diloco_fast``'s
``layout=``) and ``benchmarks/layout_grid.py`` say whether it still holds. The earlier
rule (stack up to 256 MB), fitted on a loaded machine, stacked w = 512, where per-worker
is 1.02-1.28x faster on an idle one.
"""

from __future__ import annotations

from diloco._validation import api_checks, shown

__all__ = ["LAYOUTS", "MODEL_MAX_BYTES", "STACKED_MAX_BYTES", "choose_layout"]

LAYOUTS = ("auto", "stacked", "per-worker")
# Stack while one model's P * itemsize is at most MODEL_MAX_BYTES and the K models' K * P * itemsize at
# most STACKED_MAX_BYTES (bytes; fitted to benchmarks/layout_grid.json, see the module doc).
MODEL_MAX_BYTES = 2**20
STACKED_MAX_BYTES = 2**23


def choose_layout(num_workers: int, num_values: int, layout: str = "auto", *, itemsize: int = 8) -> str:
    """``"stacked"`` or ``"per-worker"``: the layout for K workers of P values of ``itemsize`` bytes.

    ``"auto"`` applies the rule above: stacked when ``K >= 2``,
    ``P * itemsize <= MODEL_MAX_BYTES`` and ``K * P * itemsize <= STACKED_MAX_BYTES``, else
    per-worker. ``"stacked"`` and ``"per-worker"`` are returned as they are.

    Raises
    ------
    ValueError
        ``layout`` is not one of ``LAYOUTS``, or K, P or ``itemsize`` is not a positive int.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {shown(layout)}")
    for name, value in (("num_workers", num_workers), ("num_values", num_values), ("itemsize", itemsize)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    api_checks.choose_layout(num_workers, num_values, layout, itemsize)  # sizes no machine could hold
    if layout != "auto":
        return layout
    if num_workers == 1:
        return "per-worker"  # the same work: the simpler path
    model = num_values * itemsize
    return "stacked" if model <= MODEL_MAX_BYTES and num_workers * model <= STACKED_MAX_BYTES else "per-worker"
