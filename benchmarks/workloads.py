"""The benchmark's models and data, shared by every case.

(a) the demo's model: digits, 64-128-10, batch 32, K = 8, H = 50 (the ``DiLoCoConfig``
    defaults). Timed over 3 rounds (1,200 worker-steps) after a warm-up round.
(b) a wide model: 784-512-512-10, batch 128, K = 8, on 8,192 random 784-feature examples
    of 10 classes (seeded; the speed does not depend on the values). Timed over one round
    of H = 5 (40 worker-steps, about 16 GFLOP) after a warm-up round.

FLOPs of one worker-step, counting the matrix products only (the bias adds, ReLU, softmax
and AdamW are O(b d) or O(P) and left out)::

    F = 2 b (2 sum_{l=1..L} d_{l-1} d_l + sum_{l=2..L} d_{l-1} d_l)

forward ``a_{l-1} W_l``, weight gradient ``a_{l-1}^T dz_l``, and input gradient
``dz_l W_l^T`` for every layer but the first: (a) 1.29 MFLOP, (b) 410.8 MFLOP.
"""

from __future__ import annotations

import numpy as np

MODELS = {
    "a": {"label": "(a) 64-128-10, batch 32, K=8, H=50", "sizes": (64, 128, 10), "hidden": (128,), "batch": 32,
          "workers": 8, "H": 50, "rounds": 3},
    "b": {"label": "(b) 784-512-512-10, batch 128, K=8, H=5", "sizes": (784, 512, 512, 10), "hidden": (512, 512),
          "batch": 128, "workers": 8, "H": 5, "rounds": 1},
}


def flops_per_worker_step(sizes, batch: int) -> float:
    """``F`` above, for layer widths ``sizes = (d_0, ..., d_L)``."""
    products = [d_in * d_out for d_in, d_out in zip(sizes[:-1], sizes[1:], strict=True)]
    return 2.0 * batch * (2 * sum(products) + sum(products[1:]))


def make_data(model: str, dtype: str):
    """``(x, y)`` training data of model ``model``, features in ``dtype``."""
    if model == "a":
        from diloco.data import load_digits_split

        data = load_digits_split(0)
        return data.x_train.astype(dtype), data.y_train
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8192, 784)).astype(dtype)
    return x, rng.integers(0, 10, 8192)
