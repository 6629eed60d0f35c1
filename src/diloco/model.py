"""Part 1 - the model: a ReLU multi-layer perceptron, its loss and its gradient.

Milestones 1-6. Parameters are a ``dict`` ``{"W1", "b1", ..., "WL", "bL"}`` with
``W_l`` of shape ``(fan_in, fan_out)`` and ``b_l`` of shape ``(fan_out,)``. The
arithmetic runs in the parameters' floating dtype (float64 by default, float32 works).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import check_args, milestone, state_type

Params = dict[str, np.ndarray]

__all__ = [
    "Params",
    "ForwardCache",
    "init_model_params",
    "relu",
    "model_forward",
    "softmax",
    "cross_entropy_loss",
    "model_backward",
]


@state_type
class ForwardCache(NamedTuple):
    """What ``model_backward`` needs from the forward pass.

    Attributes
    ----------
    layer_inputs : tuple of L ndarrays
        ``a_0 = x`` (cast to the params' dtype), then the ReLU outputs ``a_1 .. a_{L-1}``;
        ``a_{l-1}`` has shape ``(n, fan_in_l)``.
    pre_activations : tuple of L ndarrays
        ``z_l = a_{l-1} @ W_l + b_l`` of shape ``(n, fan_out_l)``; ``z_L`` are the logits.
    """

    layer_inputs: tuple
    pre_activations: tuple


@milestone
def init_model_params(layer_sizes, rng, *, dtype=np.float64) -> Params:
    """Milestone 01: He-initialise an MLP.

    ``W_l ~ N(0, 2 / fan_in)`` element-wise (He/Kaiming normal, for ReLU), ``b_l = 0``.
    Layer by layer, ``W_l`` is drawn as ``rng.standard_normal((fan_in, fan_out))`` times
    ``sqrt(2 / fan_in)``, so the same generator state gives identical parameters.

    Parameters
    ----------
    layer_sizes : sequence of int, length >= 2
        ``(d_in, h_1, ..., C)``: input width, hidden widths, number of classes.
    rng : numpy.random.Generator
        Source of the random draws (advanced by this call).
    dtype : float32 or float64, keyword-only
        Dtype of the returned arrays.

    Returns
    -------
    params : dict of str -> ndarray
        ``W_l`` of shape ``(layer_sizes[l-1], layer_sizes[l])``, ``b_l`` of shape
        ``(layer_sizes[l],)``, keys ``W1, b1, ..., WL, bL`` in that order.

    Raises
    ------
    TypeError
        ``rng`` is not a Generator, a size is not an int, or ``dtype`` is not floating.
    ValueError
        Fewer than two sizes, or a size < 1.
    """
    sizes, dtype = check_args.init_model_params(layer_sizes, rng, dtype)
    # BEGIN SOLUTION
    params: Params = {}
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True), start=1):
        std = np.sqrt(2.0 / fan_in)
        params[f"W{layer}"] = (rng.standard_normal((fan_in, fan_out)) * std).astype(dtype)
        params[f"b{layer}"] = np.zeros(fan_out, dtype=dtype)
    return params
    # END SOLUTION


@milestone
def relu(x: np.ndarray) -> np.ndarray:
    """Milestone 02: the rectified linear unit, ``relu(x) = max(x, 0)`` element-wise.

    Parameters
    ----------
    x : ndarray of any shape, floating dtype

    Returns
    -------
    ndarray of the same shape and dtype
        A new array; ``x`` is not modified. ``relu(-0.0)`` and ``relu(0.0)`` are zero.
        Non-finite values are not refused: an element-wise function of any float array,
        it gives what IEEE ``max`` gives, ``relu(inf) = inf``, ``relu(-inf) = 0`` and
        ``relu(nan) = nan`` (the model's callers refuse non-finite data before it).

    Raises
    ------
    TypeError
        ``x`` is not a floating ndarray.
    """
    check_args.relu(x)
    # BEGIN SOLUTION
    return np.maximum(x, 0).astype(x.dtype, copy=False)
    # END SOLUTION


@milestone
def model_forward(params: Params, x: np.ndarray) -> tuple[np.ndarray, ForwardCache]:
    """Milestone 03: the forward pass of the MLP.

    ``a_0 = x``; for ``l = 1 .. L``: ``z_l = a_{l-1} @ W_l + b_l`` and
    ``a_l = relu(z_l)`` for ``l < L`` (no ReLU after the last layer).

    Parameters
    ----------
    params : dict of str -> ndarray
        MLP parameters ``W1, b1, ..., WL, bL``.
    x : ndarray of shape (n, d_in), floating
        Inputs; cast to the params' dtype.

    Returns
    -------
    logits : ndarray of shape (n, C), params' dtype
        ``z_L``.
    cache : ForwardCache
        The layer inputs ``a_0 .. a_{L-1}`` and pre-activations ``z_1 .. z_L``.

    Raises
    ------
    TypeError, ValueError
        Malformed params, non-floating or non-finite ``x``, or ``x.shape[1]`` not ``d_in``.
    """
    num_layers = check_args.model_forward(params, x)
    # BEGIN SOLUTION
    activation = x.astype(params["W1"].dtype)  # (n, d_in), a copy: the cache never aliases x
    layer_inputs, pre_activations = [], []
    for layer in range(1, num_layers + 1):
        layer_inputs.append(activation)
        z = activation @ params[f"W{layer}"] + params[f"b{layer}"]  # (n, fan_out)
        pre_activations.append(z)
        if layer < num_layers:
            activation = relu(z)
    return z, ForwardCache(tuple(layer_inputs), tuple(pre_activations))
    # END SOLUTION


@milestone
def softmax(logits: np.ndarray) -> np.ndarray:
    """Milestone 04: softmax along the last axis, stable for huge logits.

    ``softmax(z)_j = exp(z_j - max_k z_k) / sum_i exp(z_i - max_k z_k)``. Subtracting the
    row max leaves the result unchanged mathematically and keeps ``exp`` from overflowing.

    Parameters
    ----------
    logits : ndarray of shape (..., C), float16, float32 or float64, finite

    Returns
    -------
    ndarray of the same shape and dtype
        Non-negative entries; every row sums to 1.

    Raises
    ------
    TypeError
        ``logits`` is not a floating ndarray.
    ValueError
        ``logits`` is 0-D, has an empty last axis, or holds NaN/Inf.
    """
    check_args.softmax(logits)
    # BEGIN SOLUTION
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)
    # END SOLUTION


@milestone
def cross_entropy_loss(logits: np.ndarray, labels: np.ndarray) -> float:
    """Milestone 05: mean cross-entropy of integer labels under softmax(logits).

    ``L = (1/n) sum_i [ logsumexp(z_i) - z_{i, y_i} ]`` with
    ``logsumexp(z) = m + log sum_j exp(z_j - m)``, ``m = max_j z_j``: finite for logits
    of 1e4 where the naive ``-log(softmax)`` overflows.

    Parameters
    ----------
    logits : ndarray of shape (n, C), floating, finite
    labels : ndarray of shape (n,), integer, values in [0, C)

    Returns
    -------
    float
        The mean loss, a Python float >= 0. Exact to the rounding of the logits' own size:
        ``logsumexp(z) - z_y`` subtracts two numbers of size ``max |z|``, so a loss below
        their spacing (about ``max |z| * 2**-52``) rounds away. Two equal logits of 1e200
        give 0.0, not ``log 2``; logits shifted by the row's own ``z_y`` give it back.

    Raises
    ------
    ValueError
        Empty batch (n == 0), mismatched n, labels out of range, non-finite logits.
    TypeError
        Non-floating logits or non-integer labels.
    """
    check_args.cross_entropy_loss(logits, labels)
    # BEGIN SOLUTION
    row_max = logits.max(axis=1, keepdims=True)  # (n, 1)
    log_sum_exp = row_max[:, 0] + np.log(np.exp(logits - row_max).sum(axis=1))  # (n,)
    correct = logits[np.arange(logits.shape[0]), labels]  # (n,)
    losses = log_sum_exp - correct
    mean = np.mean(losses)
    # Losses near the float range can overflow their sum while their mean fits: average them scaled.
    return float(mean if np.isfinite(mean) else np.sum(losses / losses.size))
    # END SOLUTION


@milestone
def model_backward(params: Params, cache: ForwardCache, labels: np.ndarray) -> Params:
    """Milestone 06: gradient of the mean cross-entropy with respect to every parameter.

    With ``p = softmax(z_L)`` and one-hot ``Y``: ``dz_L = (p - Y) / n``; for
    ``l = L .. 1``: ``dW_l = a_{l-1}^T dz_l``, ``db_l = sum_i dz_l``,
    ``da_{l-1} = dz_l W_l^T`` and ``dz_{l-1} = da_{l-1} * [z_{l-1} > 0]``.

    Parameters
    ----------
    params : dict of str -> ndarray
        The parameters the forward pass used.
    cache : ForwardCache
        From ``model_forward(params, x)``.
    labels : ndarray of shape (n,), integer, values in [0, C)

    Returns
    -------
    grads : dict of str -> ndarray
        Same keys, shapes and dtype as ``params``.

    Raises
    ------
    TypeError, ValueError
        Malformed params or cache, or labels that do not match the batch.
    """
    num_layers = check_args.model_backward(params, cache, labels)
    # BEGIN SOLUTION
    logits = cache.pre_activations[-1]  # (n, C)
    n = logits.shape[0]
    dz = softmax(logits)  # (n, C), a fresh array
    dz[np.arange(n), labels] -= 1.0
    dz /= n
    grads: Params = {}
    for layer in range(num_layers, 0, -1):
        a_prev = cache.layer_inputs[layer - 1]  # (n, fan_in)
        grads[f"W{layer}"] = a_prev.T @ dz  # (fan_in, fan_out)
        grads[f"b{layer}"] = dz.sum(axis=0)  # (fan_out,)
        if layer > 1:
            da_prev = dz @ params[f"W{layer}"].T  # (n, fan_in)
            dz = da_prev * (cache.pre_activations[layer - 2] > 0)
    return {key: grads[key] for key in params}
    # END SOLUTION
