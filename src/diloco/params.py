"""Part 3 - arithmetic on parameter dicts.

Milestones 12-15. DiLoCo moves whole models around: copies for each worker, the
difference between the global model and a worker's, and the average over workers.
These four functions work on any dict of str -> floating ndarray, not only MLPs.
"""

from __future__ import annotations

import numpy as np

from diloco._validation import check_params, check_real, check_same_structure, check_sequence
from diloco.model import Params

__all__ = ["clone_params", "scale_params", "subtract_params", "average_params"]


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
    check_params(params, finite=False)
    # BEGIN SOLUTION
    return {key: value.copy() for key, value in params.items()}
    # END SOLUTION


def scale_params(params: Params, scalar: float) -> Params:
    """Milestone 13: every array times ``scalar``, ``c * theta``.

    Parameters
    ----------
    params : dict of str -> ndarray
    scalar : finite real number

    Returns
    -------
    dict of str -> ndarray
        New arrays, same keys, shapes and dtype (a float32 model stays float32).

    Raises
    ------
    TypeError
        ``scalar`` is not a real number.
    ValueError
        ``scalar`` is NaN or infinite.
    """
    check_params(params)
    scalar = check_real(scalar, "scalar")
    # BEGIN SOLUTION
    return {key: value * scalar for key, value in params.items()}
    # END SOLUTION


def subtract_params(params_a: Params, params_b: Params) -> Params:
    """Milestone 14: ``a - b`` key by key.

    Parameters
    ----------
    params_a, params_b : dicts with the same keys, shapes and dtype

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
    check_params(params_a, "params_a")
    check_params(params_b, "params_b")
    check_same_structure(params_a, params_b, "params_a", "params_b")
    # BEGIN SOLUTION
    return {key: params_a[key] - params_b[key] for key in params_a}
    # END SOLUTION


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
    check_sequence(params_list, "params_list")
    for k, params in enumerate(params_list):
        check_params(params, f"params_list[{k}]")
        check_same_structure(params_list[0], params, "params_list[0]", f"params_list[{k}]")
    num = len(params_list)
    if weights is None:
        weights = [1.0] * num
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(f"weights must be a sequence of {num} non-negative numbers, got {type(weights).__name__}")
    if len(weights) != num:
        raise ValueError(f"weights must have one entry per params dict ({num}), got {len(weights)}")
    weights = [check_real(w, f"weights[{k}]", low=0.0) for k, w in enumerate(weights)]
    total = sum(weights)
    if total <= 0.0:
        raise ValueError("weights must not all be zero: they are normalised to sum to 1")
    # BEGIN SOLUTION
    normalised = [w / total for w in weights]
    return {
        key: sum(w * params[key] for w, params in zip(normalised, params_list))
        for key in params_list[0]
    }
    # END SOLUTION
