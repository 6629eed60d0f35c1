"""The fast engine's two entry points, DiLoCo and the synchronous baseline, and its layout rule.

``train_diloco_fast`` and ``train_synchronous_fast`` are the one driver
(``diloco.core.driver.train``) on the stacked executor (``diloco.engine.stacked``): same
algorithm, same random draws and same record schema as ``diloco.loop.train_diloco`` and
``train_synchronous_baseline``; only the execution differs. The layout rule is
``diloco.engine.layout`` (re-exported here).
"""

from __future__ import annotations

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.core.driver import train
from diloco.core.hooks import callbacks
from diloco.engine.layout import LAYOUTS, STACKED_MAX_BYTES, choose_layout

__all__ = ["LAYOUTS", "STACKED_MAX_BYTES", "choose_layout", "train_diloco_fast", "train_synchronous_fast"]


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
