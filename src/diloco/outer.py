"""Part 5 - the outer optimizer: SGD with Nesterov momentum on pseudo-gradients.

Milestones 21-24. Once per round the K workers' models are turned into one
pseudo-gradient, ``delta = theta_global - mean_k theta_k`` (old minus new, so it points
uphill like a gradient), and the global model takes one step of PyTorch's
``SGD(lr, momentum=mu, nesterov=True)`` along it::

    m     = mu m + delta                     # milestone 22 (no dampening)
    theta = theta - lr (delta + mu m)        # milestone 23, m already updated
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import check_args, milestone, state_type
from diloco.model import Params
from diloco.params import average_params, subtract_params

__all__ = [
    "OuterState",
    "init_outer_optimizer",
    "update_outer_momentum",
    "nesterov_param_update",
    "compute_outer_gradient",
]


@state_type
class OuterState(NamedTuple):
    """Immutable state of the outer optimizer.

    Attributes
    ----------
    momentum : dict of str -> ndarray
        The momentum buffer ``m``, shaped and typed like the global params.
    second_moment : dict of str -> ndarray, or None
        Only for the outer Adam optimizer (``diloco.core.outer.OUTER_OPTIMIZERS``): the second
        moment ``v``; None until its first step (the SGD optimizers never use it).
    step : int
        Only for outer Adam: the number of outer steps taken (bias correction).
    """

    momentum: Params
    second_moment: Params | None = None
    step: int = 0


@milestone
def init_outer_optimizer(params: Params) -> OuterState:
    """Milestone 21: the outer optimizer state before the first round.

    ``m = 0`` with the keys, shapes and dtype of ``params``.

    Parameters
    ----------
    params : dict of str -> ndarray

    Returns
    -------
    OuterState
        Fresh zero arrays.

    Raises
    ------
    TypeError, ValueError
        ``params`` is not a non-empty dict of floating arrays.
    """
    check_args.init_outer_optimizer(params)
    # BEGIN SOLUTION
    return OuterState(momentum={key: np.zeros_like(value) for key, value in params.items()})
    # END SOLUTION


@milestone
def update_outer_momentum(outer_state: OuterState, outer_grad: Params, momentum: float) -> OuterState:
    """Milestone 22: fold a pseudo-gradient into the momentum buffer, ``m' = mu m + delta``.

    No dampening (PyTorch's default ``dampening=0``).

    Parameters
    ----------
    outer_state : OuterState
    outer_grad : dict of str -> ndarray
        The pseudo-gradient delta, shaped like ``outer_state.momentum``.
    momentum : float in [0, 1)
        mu.

    Returns
    -------
    OuterState
        A new state, its keys in the order of ``outer_grad``; ``outer_state`` is unchanged.

    Raises
    ------
    TypeError, ValueError
        Mismatched structures, non-finite values, ``momentum`` outside [0, 1).
    """
    momentum = check_args.update_outer_momentum(outer_state, outer_grad, momentum)
    # BEGIN SOLUTION
    return OuterState(
        momentum={key: momentum * outer_state.momentum[key] + outer_grad[key] for key in outer_grad}
    )
    # END SOLUTION


@milestone
def nesterov_param_update(params: Params, outer_grad: Params, outer_state: OuterState, lr: float,
                          momentum: float, *, nesterov: bool = True) -> Params:
    """Milestone 23: the outer step of PyTorch's SGD with Nesterov momentum.

    ``theta' = theta - lr (delta + mu m)`` where ``m`` is the buffer *already updated*
    by ``update_outer_momentum`` for this delta. With ``nesterov=False`` it is the
    heavy-ball step ``theta' = theta - lr m``. With ``mu = 0`` both are plain SGD,
    ``theta - lr delta``; with ``lr = 1`` as well, the new params are the workers'
    average (FedAvg).

    Parameters
    ----------
    params : dict of str -> ndarray
        Global parameters before the step.
    outer_grad : dict of str -> ndarray
        The pseudo-gradient delta.
    outer_state : OuterState
        The updated momentum buffer ``m``.
    lr : float > 0
        Outer learning rate.
    momentum : float in [0, 1)
        mu.
    nesterov : bool, keyword-only
        Nesterov (default, as in the paper) or heavy-ball momentum.

    Returns
    -------
    dict of str -> ndarray
        New global parameters, keys in the order of ``params``.

    Raises
    ------
    TypeError, ValueError
        Mismatched structures, ``lr <= 0``, ``momentum`` outside [0, 1).
    """
    lr, momentum = check_args.nesterov_param_update(params, outer_grad, outer_state, lr, momentum, nesterov)
    # BEGIN SOLUTION
    buffer = outer_state.momentum
    if nesterov:
        return {key: params[key] - lr * (outer_grad[key] + momentum * buffer[key]) for key in params}
    return {key: params[key] - lr * buffer[key] for key in params}
    # END SOLUTION


@milestone
def compute_outer_gradient(global_params: Params, worker_params_list, weights=None) -> Params:
    """Milestone 24: the pseudo-gradient, old minus new.

    ``delta = sum_k w_k (theta_global - theta_k) = theta_global - sum_k w_k theta_k``
    with weights normalised to sum 1 (uniform ``1/K`` when None). It points from the
    workers' average back to where the round started, like a gradient, so the outer
    optimizer *subtracts* it.

    Parameters
    ----------
    global_params : dict of str -> ndarray
        The parameters every worker started the round from.
    worker_params_list : non-empty list of K dicts shaped like ``global_params``
    weights : sequence of K non-negative reals, or None

    Returns
    -------
    dict of str -> ndarray
        delta, shaped like ``global_params``.

    Raises
    ------
    ValueError
        Empty list, mismatched structures, bad weights.
    """
    check_args.compute_outer_gradient(global_params, worker_params_list, weights)
    # BEGIN SOLUTION
    return subtract_params(global_params, average_params(worker_params_list, weights))
    # END SOLUTION
