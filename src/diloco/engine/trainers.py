"""The fast engine's two entry points, DiLoCo and the synchronous baseline, and its layout rule.

``train_diloco_fast`` and ``train_synchronous_fast`` are the one driver
(``diloco.core.driver.train``) on the stacked executor (``diloco.engine.stacked``): same
algorithm, same random draws and same record schema as ``diloco.loop.train_diloco`` and
``train_synchronous_baseline``; only the execution differs.
"""

from __future__ import annotations

import numpy as np

from diloco._validation import api_checks
from diloco.config import DiLoCoConfig
from diloco.core.driver import train
from diloco.core.hooks import callbacks

__all__ = ["LAYOUTS", "STACKED_MAX_BYTES", "choose_layout", "train_diloco_fast", "train_synchronous_fast"]

LAYOUTS = ("auto", "stacked", "per-worker")
# Stack the K workers while one (K, P) buffer stays this small (2 MB: the L2 cache of a
# core or two): on the demo's model stacking is ~1.5x faster. Beyond it batched matmul
# gains nothing (each worker's product is one large BLAS call already) while the stacked
# buffers cost K times the memory: on 784-512-512-10 (43 MB per buffer at K = 8) both
# layouts run at the same speed and per-worker peaks 100 MB lower (benchmarks/results.md).
STACKED_MAX_BYTES = 2**21


def choose_layout(num_workers: int, num_values: int, layout: str = "auto", *, itemsize: int = 8) -> str:
    """``"stacked"`` or ``"per-worker"``: the layout for K workers of P values of ``itemsize`` bytes.

    ``"auto"`` stacks when ``K * P * itemsize <= STACKED_MAX_BYTES``; the other two
    layouts are returned as they are.
    """
    api_checks.choose_layout(num_workers, num_values, layout, itemsize)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout != "auto":
        return layout
    return "stacked" if num_workers * num_values * itemsize <= STACKED_MAX_BYTES else "per-worker"


def train_diloco_fast(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None, rng=None,
                      on_round=None, layout: str = "auto", encode=None):
    """DiLoCo (milestone 26's algorithm, with every mechanism of ``config``) on the stacked executor.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round, encode
        As for ``diloco.loop.train_diloco``; ``config.engine`` is not consulted.
    layout : "auto", "stacked" or "per-worker", keyword-only
        Stacked: the K workers take each inner step together (batched matmul, one AdamW
        pass over a ``(K, P)`` buffer). Per-worker: worker after worker, each with one
        ``(1, P)`` model, as the loop does. ``"auto"`` uses ``choose_layout``.

    Returns
    -------
    TrainResult(params, history)
        Equal to ``train_diloco``'s within rounding (the tests allow 1e-10 relative in
        float64, 1e-5 in float32).
    """
    return train("diloco", x, y, config, x_eval=x_eval, y_eval=y_eval, rng=rng, encode=encode, executor="stacked",
                 hooks=callbacks(on_round), layout=layout)


def train_synchronous_fast(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None,
                           rng=None, on_round=None, encode=None):
    """The synchronous baseline (milestone 27's algorithm) on the stacked executor, the K batches as one.

    One shared model sees the K workers' mini-batches as ``K`` groups of one forward and
    backward pass (``K * b`` rows, one BLAS call per layer); the gradient is the mean of
    the groups' gradients, as the all-reduce would give, then one AdamW step.

    Returns
    -------
    TrainResult(params, history)
        Equal to ``train_synchronous_baseline``'s up to rounding (the K groups' gradients
        are summed inside one matrix product instead of one by one).
    """
    return train("sync", x, y, config, x_eval=x_eval, y_eval=y_eval, rng=rng, encode=encode, executor="stacked",
                 hooks=callbacks(on_round))
