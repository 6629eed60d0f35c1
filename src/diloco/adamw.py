"""Part 2 - the inner optimizer, AdamW, as four small pure functions.

Milestones 7-11, then ``adamw_step``, their composition, exactly as
``torch.optim.AdamW`` orders it (decay on the pre-step parameters)::

    m_t     = b1 m_{t-1} + (1 - b1) g_t                        # milestone 08
    v_t     = b2 v_{t-1} + (1 - b2) g_t^2                      # milestone 08
    m_hat   = m_t / (1 - b1^t),  v_hat = v_t / (1 - b2^t)      # milestone 09
    theta_t = theta_{t-1} (1 - lr wd)                          # milestone 11
              - lr m_hat / (sqrt(v_hat) + eps)                 # milestone 10
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import check_args, milestone, state_type
from diloco.model import Params

__all__ = [
    "AdamWState",
    "init_adamw_state",
    "update_adam_moments",
    "bias_correct_moments",
    "adam_param_step",
    "decoupled_weight_decay",
    "adamw_step",
]


@state_type
class AdamWState(NamedTuple):
    """Immutable AdamW state of one worker.

    Attributes
    ----------
    step : int
        Number of updates taken so far (``t``); 0 before the first.
    m : dict of str -> ndarray
        First-moment estimate, shaped and typed like the params.
    v : dict of str -> ndarray
        Second-moment estimate (of ``g^2``), shaped and typed like the params; >= 0.
    """

    step: int
    m: Params
    v: Params


@milestone
def init_adamw_state(params: Params) -> AdamWState:
    """Milestone 07: the AdamW state before the first step.

    ``step = 0``, ``m = 0`` and ``v = 0`` with the keys, shapes and dtype of ``params``.

    Parameters
    ----------
    params : dict of str -> ndarray

    Returns
    -------
    AdamWState
        Fresh zero arrays (sharing no memory with ``params`` or with each other).

    Raises
    ------
    TypeError, ValueError
        ``params`` is not a non-empty dict of floating arrays.
    """
    check_args.init_adamw_state(params)
    # BEGIN SOLUTION
    return AdamWState(
        step=0,
        m={key: np.zeros_like(value) for key, value in params.items()},
        v={key: np.zeros_like(value) for key, value in params.items()},
    )
    # END SOLUTION


@milestone
def update_adam_moments(state: AdamWState, grads: Params, beta1: float, beta2: float) -> AdamWState:
    """Milestone 08: fold one gradient into the moment estimates.

    ``m' = b1 m + (1 - b1) g``, ``v' = b2 v + (1 - b2) g^2`` (element-wise square),
    ``step' = step + 1``.

    Parameters
    ----------
    state : AdamWState
    grads : dict of str -> ndarray
        Same keys, shapes and dtype as ``state.m``; finite.
    beta1, beta2 : float in [0, 1)

    Returns
    -------
    AdamWState
        A new state; ``state`` is unchanged.

    Raises
    ------
    TypeError, ValueError
        Mismatched keys or shapes, non-finite grads, betas outside [0, 1).
    """
    beta1, beta2 = check_args.update_adam_moments(state, grads, beta1, beta2)
    # BEGIN SOLUTION
    m = {key: beta1 * state.m[key] + (1.0 - beta1) * grads[key] for key in grads}
    v = {key: beta2 * state.v[key] + (1.0 - beta2) * grads[key] ** 2 for key in grads}
    return AdamWState(step=state.step + 1, m=m, v=v)
    # END SOLUTION


@milestone
def bias_correct_moments(state: AdamWState, beta1: float, beta2: float) -> tuple[Params, Params]:
    """Milestone 09: undo the zero-initialisation bias of the moments.

    ``m_hat = m / (1 - b1^t)``, ``v_hat = v / (1 - b2^t)`` with ``t = state.step``.

    Parameters
    ----------
    state : AdamWState with ``step >= 1``
    beta1, beta2 : float in [0, 1)

    Returns
    -------
    (m_hat, v_hat) : two dicts of new arrays shaped like ``state.m``

    Raises
    ------
    ValueError
        ``state.step == 0`` (no gradient has been seen: the correction divides by zero),
        or betas outside [0, 1).
    """
    beta1, beta2 = check_args.bias_correct_moments(state, beta1, beta2)
    # BEGIN SOLUTION
    correction1 = 1.0 - beta1**state.step
    correction2 = 1.0 - beta2**state.step
    m_hat = {key: value / correction1 for key, value in state.m.items()}
    v_hat = {key: value / correction2 for key, value in state.v.items()}
    return m_hat, v_hat
    # END SOLUTION


@milestone
def adam_param_step(params: Params, m_hat: Params, v_hat: Params, lr: float, eps: float) -> Params:
    """Milestone 10: the Adam step, ``theta - lr * m_hat / (sqrt(v_hat) + eps)``.

    Parameters
    ----------
    params, m_hat, v_hat : dicts with the same keys, shapes and dtype
        ``v_hat`` must be >= 0.
    lr : float > 0
    eps : float > 0

    Returns
    -------
    dict of str -> ndarray
        New parameters.

    Raises
    ------
    TypeError, ValueError
        Mismatched structures, negative ``v_hat``, ``lr`` or ``eps`` not positive.
    """
    lr, eps = check_args.adam_param_step(params, m_hat, v_hat, lr, eps)
    # BEGIN SOLUTION
    return {key: params[key] - lr * m_hat[key] / (np.sqrt(v_hat[key]) + eps) for key in params}
    # END SOLUTION


@milestone
def decoupled_weight_decay(params: Params, lr: float, weight_decay: float) -> Params:
    """Milestone 11: decoupled weight decay, ``theta * (1 - lr * weight_decay)``.

    Decoupled (Loshchilov and Hutter, 2019): the decay shrinks the parameters directly
    instead of being added to the gradient, so Adam's scaling does not touch it.

    Parameters
    ----------
    params : dict of str -> ndarray
    lr : float > 0
    weight_decay : float >= 0, with ``lr * weight_decay < 1``

    Returns
    -------
    dict of str -> ndarray
        New arrays (a copy even when ``weight_decay == 0``).

    Raises
    ------
    ValueError
        ``lr <= 0``, ``weight_decay < 0`` or ``lr * weight_decay >= 1`` (the factor
        would flip or zero the weights).
    """
    lr, weight_decay = check_args.decoupled_weight_decay(params, lr, weight_decay)
    # BEGIN SOLUTION
    factor = 1.0 - lr * weight_decay
    return {key: value * factor for key, value in params.items()}
    # END SOLUTION


def adamw_step(params: Params, state: AdamWState, grads: Params, config) -> tuple[Params, AdamWState]:
    """One AdamW step, composed from milestones 08-11 in ``torch.optim.AdamW`` order.

    ``theta_t = theta_{t-1} - lr wd theta_{t-1} - lr m_hat / (sqrt(v_hat) + eps)``:
    the decay acts on the pre-step parameters. Provided (not a milestone): it calls
    your functions, so it is correct once they are.

    Parameters
    ----------
    params, grads : dicts with the same keys, shapes and dtype
    state : AdamWState
    config : AdamWConfig

    Returns
    -------
    (new_params, new_state)
    """
    check_args.adamw_config(config)
    state = update_adam_moments(state, grads, config.beta1, config.beta2)
    m_hat, v_hat = bias_correct_moments(state, config.beta1, config.beta2)
    decayed = decoupled_weight_decay(params, config.lr, config.weight_decay)
    return adam_param_step(decayed, m_hat, v_hat, config.lr, config.eps), state
