"""Outer optimizers as transforms: ``init(params) -> state``, ``update(params, delta, state, config)``.

The registry ``OUTER_OPTIMIZERS`` maps ``DiLoCoConfig.outer_optimizer`` to an
``OuterOptimizer`` pair, in the style of optax's ``GradientTransformation``. Every
executor and algorithm of ``diloco.core`` steps the global model through it, and
the asynchronous schedule's delayed Nesterov does too, so an optimizer
added here runs everywhere: DiLoCo, Streaming DiLoCo (one state per fragment), eager
updates (one state per worker), on the reference, fast and MPI executors.

* ``"sgd"``: PyTorch ``SGD(outer_lr, momentum=mu, nesterov=...)`` through milestones
  22-23: Nesterov (the paper), heavy ball (``nesterov=False``), or plain SGD at mu = 0
  (FedAvg at lr = 1).
* ``"adam"``: Adam through milestones 08-10 with ``beta1 = outer_momentum``,
  ``beta2 = outer_beta2`` and a large ``eps = outer_eps`` (0.1, as the paper and FedOpt
  use for pseudo-gradients), no weight decay.
* ``"lion"``: Lion (Chen et al., 2023, arXiv 2302.06675) on the pseudo-gradient, with
  ``beta1 = outer_momentum`` and ``beta2 = outer_beta2``, no weight decay:
  ``theta -= lr sign(b1 m + (1 - b1) delta)``, then ``m = b2 m + (1 - b2) delta``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from diloco.adamw import AdamWState, adam_param_step, bias_correct_moments, update_adam_moments
from diloco.model import Params
from diloco.outer import OuterState, init_outer_optimizer, nesterov_param_update, update_outer_momentum

__all__ = ["OuterOptimizer", "OUTER_OPTIMIZERS", "outer_optimizer", "copy_outer_state"]


class OuterOptimizer(NamedTuple):
    """A pure pair: ``init(params) -> OuterState`` and ``update(params, delta, state, config) -> (params, state)``."""

    init: Callable
    update: Callable


def _sgd_update(params: Params, delta: Params, state: OuterState, config) -> tuple[Params, OuterState]:
    state = update_outer_momentum(state, delta, config.outer_momentum)
    return nesterov_param_update(params, delta, state, config.outer_lr, config.outer_momentum,
                                 nesterov=config.nesterov), state


def _adam_update(params: Params, delta: Params, state: OuterState, config) -> tuple[Params, OuterState]:
    """``m = b1 m + (1-b1) d``, ``v = b2 v + (1-b2) d^2``, ``theta -= lr m_hat / (sqrt(v_hat) + eps)``."""
    second = state.second_moment
    if second is None:
        second = {key: np.zeros_like(value) for key, value in state.momentum.items()}
    beta1, beta2 = config.outer_momentum, config.outer_beta2
    moments = update_adam_moments(AdamWState(state.step, state.momentum, second), delta, beta1, beta2)
    m_hat, v_hat = bias_correct_moments(moments, beta1, beta2)
    new_params = adam_param_step(params, m_hat, v_hat, config.outer_lr, config.outer_eps)
    return new_params, OuterState(moments.m, moments.v, moments.step)


def _lion_update(params: Params, delta: Params, state: OuterState, config) -> tuple[Params, OuterState]:
    beta1, beta2, lr = config.outer_momentum, config.outer_beta2, config.outer_lr
    m = state.momentum
    new_params = {k: params[k] - lr * np.sign(beta1 * m[k] + (1.0 - beta1) * delta[k]) for k in params}
    return new_params, OuterState({k: beta2 * m[k] + (1.0 - beta2) * delta[k] for k in m}, None, state.step + 1)


OUTER_OPTIMIZERS: dict[str, OuterOptimizer] = {
    "sgd": OuterOptimizer(init_outer_optimizer, _sgd_update),
    "adam": OuterOptimizer(init_outer_optimizer, _adam_update),
    "lion": OuterOptimizer(init_outer_optimizer, _lion_update),
}


def outer_optimizer(config) -> OuterOptimizer:
    """The ``OuterOptimizer`` that ``config.outer_optimizer`` names."""
    return OUTER_OPTIMIZERS[config.outer_optimizer]


def copy_outer_state(state: OuterState) -> OuterState:
    """A copy of ``state`` sharing no memory with it."""
    second = state.second_moment
    return OuterState({key: value.copy() for key, value in state.momentum.items()},
                      None if second is None else {key: value.copy() for key, value in second.items()}, state.step)
