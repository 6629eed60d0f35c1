"""Part 3 - arithmetic on parameter dicts.

Milestones 12-15. DiLoCo moves whole models around: copies for each worker, the
difference between the global model and a worker's, and the average over workers.
These four functions work on any dict of str -> floating ndarray, not only MLPs.
"""

from __future__ import annotations

from diloco._validation import check_args, milestone
from diloco.model import Params

__all__ = ["clone_params", "scale_params", "subtract_params", "average_params"]


@milestone
def clone_params(params: Params) -> Params:
    """Milestone 12: a deep copy of ``params``.

    Parameters
    ----------
    params : dict of str -> ndarray

    Returns
    -------
    dict of str -> ndarray
        Same keys (same order), equal values, fresh memory: mutating the result never
        changes ``params``.

    Raises
    ------
    TypeError, ValueError
        ``params`` is not a non-empty dict of floating arrays.
    """
    check_args.clone_params(params)
    # BEGIN SOLUTION
    return {key: value.copy() for key, value in params.items()}
    # END SOLUTION


@milestone
def scale_params(params: Params, scalar: float) -> Params:
    """Milestone 13: every array times ``scalar``, ``c * theta``.

    Parameters
    ----------
    params : dict of str -> ndarray
    scalar : finite real number

    Returns
    -------
    dict of str -> ndarray
        New arrays, same keys (in the same order), shapes and dtype (a float32 model stays float32).

    Raises
    ------
    TypeError
        ``scalar`` is not a real number.
    ValueError
        ``scalar`` is NaN or infinite.
    """
    scalar = check_args.scale_params(params, scalar)
    # BEGIN SOLUTION
    return {key: value * scalar for key, value in params.items()}
    # END SOLUTION


@milestone
def subtract_params(params_a: Params, params_b: Params) -> Params:
    """Milestone 14: ``a - b`` key by key.

    Parameters
    ----------
    params_a, params_b : dicts with the same keys (in any order), shapes and dtype

    Returns
    -------
    dict of str -> ndarray
        New arrays, keys in the order of ``params_a``.

    Raises
    ------
    ValueError
        The keys or shapes differ.
    TypeError
        The dtypes differ or an entry is not a floating array.
    """
    check_args.subtract_params(params_a, params_b)
    # BEGIN SOLUTION
    return {key: params_a[key] - params_b[key] for key in params_a}
    # END SOLUTION


@milestone
def average_params(params_list, weights=None) -> Params:
    """Milestone 15: the element-wise (weighted) mean of several parameter dicts.

    ``avg = sum_k w_k theta_k`` with ``w_k = weights[k] / sum(weights)``, uniform
    (``1/K``) when ``weights`` is None.

    Parameters
    ----------
    params_list : non-empty list of K dicts with the same keys, shapes and dtype
    weights : sequence of K non-negative finite reals, not all zero, or None

    Returns
    -------
    dict of str -> ndarray
        New arrays, keys in the order of ``params_list[0]``.

    Raises
    ------
    ValueError
        Empty list, mismatched structures, wrong number of weights, a negative or
        non-finite weight, or weights that sum to zero.
    """
    weights = check_args.average_params(params_list, weights)
    # BEGIN SOLUTION
    total = sum(weights)
    normalised = [w / total for w in weights]
    return {
        key: sum(w * params[key] for w, params in zip(normalised, params_list, strict=True))
        for key in params_list[0]
    }
    # END SOLUTION
