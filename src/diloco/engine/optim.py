"""AdamW and the outer Nesterov step, in place on flat buffers.

The same equations as milestones 08-11 and 22-23 (``diloco.adamw``, ``diloco.outer``),
evaluated in the same order, so results agree with the milestone functions to the last
bit. Every array is updated in place (``out=``). AdamW walks the buffers in chunks of
``CHUNK`` values, so the eleven passes of one chunk run in the core's cache instead of
streaming the whole ``(K, P)`` buffers from memory eleven times; two chunk-sized scratch
arrays replace the temporaries the pure functions allocate.
"""

from __future__ import annotations

import numpy as np

from diloco.config import AdamWConfig, DiLoCoConfig

__all__ = ["CHUNK", "adamw_scratch", "adamw_update", "outer_update", "mean_rows_into"]

# Values per AdamW chunk: 32768 float64 are 256 kB per array, six arrays fit a 2 MB L2 cache.
CHUNK = 2**15


def adamw_scratch(size: int, dtype) -> tuple:
    """The two scratch arrays ``adamw_update`` needs for buffers of ``size`` values."""
    length = min(size, CHUNK)
    return np.empty(length, dtype=dtype), np.empty(length, dtype=dtype)


def adamw_update(params: np.ndarray, m: np.ndarray, v: np.ndarray, grads: np.ndarray, step: int,
                 config: AdamWConfig, scratch: tuple) -> None:
    """One AdamW step (``torch.optim.AdamW`` order) on every row at once, in place.

    ::

        m     = b1 m + (1 - b1) g
        v     = b2 v + (1 - b2) g^2
        theta = theta (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)

    Parameters
    ----------
    params, m, v, grads : C-contiguous ndarrays of one shape, e.g. (S, P)
        ``params``, ``m`` and ``v`` are overwritten.
    step : int >= 1
        t, the step being taken (all rows share it).
    config : AdamWConfig
    scratch : from ``adamw_scratch(params.size, dtype)``
    """
    flat = [array.reshape(-1) for array in (params, m, v, grads)]  # views: the arrays are contiguous
    size = flat[0].size
    for start in range(0, size, CHUNK):
        stop = min(start + CHUNK, size)
        chunk = [array[start:stop] for array in flat]
        _adamw_chunk(*chunk, step, config, scratch[0][:stop - start], scratch[1][:stop - start])


def _adamw_chunk(params, m, v, grads, step, config, update, denom) -> None:
    beta1, beta2, lr = config.beta1, config.beta2, config.lr
    m *= beta1
    m += np.multiply(grads, 1.0 - beta1, out=update)
    np.multiply(grads, grads, out=update)
    update *= 1.0 - beta2
    v *= beta2
    v += update
    np.divide(m, 1.0 - beta1**step, out=update)  # m_hat
    update *= lr
    np.divide(v, 1.0 - beta2**step, out=denom)  # v_hat
    np.sqrt(denom, out=denom)
    denom += config.eps
    update /= denom
    params *= 1.0 - lr * config.weight_decay  # decay on the pre-step parameters
    params -= update


def mean_rows_into(rows: np.ndarray, out: np.ndarray, scratch: np.ndarray, *, first: bool, weight: float) -> None:
    """Accumulate ``out += weight * row`` for every row of ``rows`` (``out = ...`` when ``first``).

    Called with ``weight = 1/K`` over the K workers' parameters, in worker order, it sums
    as ``average_params`` does (milestone 15): ``((w theta_0 + w theta_1) + w theta_2) ...``.
    """
    for index, row in enumerate(rows):
        if first and index == 0:
            np.multiply(row, weight, out=out)
        else:
            out += np.multiply(row, weight, out=scratch)


def outer_update(params: np.ndarray, momentum: np.ndarray, pseudo_grad: np.ndarray, config: DiLoCoConfig,
                 scratch: np.ndarray) -> None:
    """The outer SGD step with (Nesterov) momentum, in place on ``params`` and ``momentum``.

    ::

        m     = mu m + delta
        theta = theta - lr (delta + mu m)      (Nesterov)   or   theta - lr m   (heavy ball)
    """
    mu, lr = config.outer_momentum, config.outer_lr
    momentum *= mu
    momentum += pseudo_grad
    if config.nesterov:
        np.multiply(momentum, mu, out=scratch)
        scratch += pseudo_grad
        scratch *= lr
    else:
        np.multiply(momentum, lr, out=scratch)
    params -= scratch
