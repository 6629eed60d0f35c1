"""Which layout the fast engine runs DiLoCo's K workers in: the rule, fitted to measurements.

*Stacked*: the K workers take each inner step together (one batched matmul per layer, one
AdamW pass over a ``(K, P)`` buffer). *Per-worker*: one worker after another in ``(1, P)``
buffers. Both do the same arithmetic; stacking saves the per-call cost of NumPy and BLAS
K-fold and costs memory: the parameters, gradients and activations of K models at once
(the AdamW moments are ``(K, P)`` in both layouts).

The measurements (``benchmarks/layout_grid.py``; CPU time, one BLAS thread, model w-w-10,
batch 32, K = 1..64, w = 64..512, float64 and float32, the numba AdamW loop; the grid is
redrawn in ``benchmarks/results.md`` by ``make bench``, the fit's data is
``benchmarks/layout_grid.json``, taken at a load average of 4-9 on two cores): stacked is
1.4-3.3x faster for w = 64 and 128 and K >= 4, and 0.87-1.33x of per-worker for w = 256
and 512 (1.0-1.2x in most of those cells); per-worker was faster by more than 5% in 2 of
the 48 cells with K >= 2 (stacked 0.87x at w = 256, K = 4, float64; 0.95x at w = 512,
K = 8, float32), each beside faster-stacked cells of the same width. K = 1 is the same work
either way. The largest stacked buffer measured, 131 MB (K = 64, w = 512, float64), was
still 1.16x faster. The fixed 2 MB threshold this replaces chose per-worker where stacked
was 1.4-2.3x faster (w = 64 at K = 64, w = 128 at K >= 16 in float64 and K >= 32 in
float32).

With AdamW as NumPy passes instead (no ``fast`` extra, or a process's first 2**28 values:
the grid ``make bench`` redraws runs so) the margin at w = 512 shrinks or turns: in the
2026-12-01 ``make bench`` grid per-worker was 1.07-1.19x faster in 9 of its 48 cells with
K >= 2 (w = 512 in float32 for K >= 4, w = 512 at K = 2, 4 and w = 256 at K = 16, 64 in
float64); the rule still stacks there, a known cost of at most 1.19x in that grid.

The rule: **stacked for K >= 2 while the stacked ``(K, P)`` buffer stays within
``STACKED_MAX_BYTES`` (256 MB, twice the largest measured), else per-worker**; beyond it
the measured gain is small (about 1.1-1.3x) and the memory of K models grows without
bound, so per-worker keeps the run's peak memory at one model's activations.
"""

from __future__ import annotations

from diloco._validation import api_checks, shown

__all__ = ["LAYOUTS", "STACKED_MAX_BYTES", "choose_layout"]

LAYOUTS = ("auto", "stacked", "per-worker")
# Stack while K * P * itemsize is at most this (bytes): twice the largest stacked buffer measured.
STACKED_MAX_BYTES = 2**28


def choose_layout(num_workers: int, num_values: int, layout: str = "auto", *, itemsize: int = 8) -> str:
    """``"stacked"`` or ``"per-worker"``: the layout for K workers of P values of ``itemsize`` bytes.

    ``"auto"`` applies the rule above: stacked when ``K >= 2`` and
    ``K * P * itemsize <= STACKED_MAX_BYTES``, else per-worker. ``"stacked"`` and
    ``"per-worker"`` are returned as they are.

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
    return "stacked" if num_workers * num_values * itemsize <= STACKED_MAX_BYTES else "per-worker"
