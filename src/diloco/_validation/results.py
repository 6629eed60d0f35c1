"""Checks of a direct milestone call's result: finite inputs must not give Inf or NaN.

``result_check(name, ...)`` registers a check in ``RESULT_CHECKS``; ``milestone`` runs it
after a direct call (depth 1) only, like the argument checks. Finite inputs whose
magnitudes are too large for the dtype can overflow in the arithmetic, and so can an
unstable formula in a learner's code; either way the call raises a ``ValueError`` naming
the inputs and both causes, never returns a silent Inf or NaN.
"""

from __future__ import annotations

import numpy as np

from diloco._validation import RESULT_CHECKS

__all__ = ["result_check", "require_finite"]


def result_check(*names):
    """Register a check of the result of the milestones ``names`` (direct calls only)."""

    def register(check):
        for name in names:
            RESULT_CHECKS[name] = check
        return check

    return register


def _first_non_finite(values) -> str | None:
    """``"[key]"`` of the first array (or ``""`` for a scalar) holding Inf or NaN, else None."""
    for key, value in values:
        array = np.asarray(value)
        if not np.isfinite(array.sum()) and not np.isfinite(array).all():
            return key
    return None


def _overflowed(function: str, what: str, inputs: str, hint: str = "") -> ValueError:
    # Two causes, both named: inputs too large for the dtype, or (in a learner's code) an
    # unstable formula such as exp of a large logit where a stable form stays finite.
    return ValueError(f"{function}: {what} overflowed to Inf or NaN although {inputs} are finite: their magnitudes "
                      f"are too large for the dtype{hint}, or the computation overflows where a stable form "
                      "would not")


def require_finite(function: str, what: str, inputs: str, values, hint: str = "") -> None:
    key = _first_non_finite(values)
    if key is not None:
        raise _overflowed(function, f"{what}{key}", inputs, hint)


def _items(params) -> list:
    return [(f"[{key!r}]", value) for key, value in params.items()]


@result_check("model_forward")
def _forward_result(result, *args, **kwargs):
    require_finite("model_forward", "the logits", "params and x", [("", result[0])])


@result_check("cross_entropy_loss")
def _loss_result(result, *args, **kwargs):
    require_finite("cross_entropy_loss", "the loss", "the logits", [("", result)],
                    " (a row's largest minus smallest logit exceeds it)")


@result_check("model_backward")
def _backward_result(result, *args, **kwargs):
    require_finite("model_backward", "the gradient", "params, cache and labels", _items(result))


@result_check("update_adam_moments")
def _moments_result(result, *args, **kwargs):
    require_finite("update_adam_moments", "the new state.m", "state and grads", _items(result.m))
    require_finite("update_adam_moments", "the new state.v", "state and grads", _items(result.v),
                    " (v accumulates grads ** 2)")


@result_check("bias_correct_moments")
def _bias_result(result, *args, **kwargs):
    m_hat, v_hat = result
    require_finite("bias_correct_moments", "m_hat", "state, beta1 and beta2", _items(m_hat),
                    " (m / (1 - beta1 ** step) with 1 - beta1 ** step tiny)")
    require_finite("bias_correct_moments", "v_hat", "state, beta1 and beta2", _items(v_hat),
                    " (v / (1 - beta2 ** step) with 1 - beta2 ** step tiny)")


@result_check("adam_param_step")
def _adam_step_result(result, *args, **kwargs):
    require_finite("adam_param_step", "the new params", "params, m_hat, v_hat, lr and eps", _items(result))


@result_check("nesterov_param_update")
def _nesterov_result(result, *args, **kwargs):
    require_finite("nesterov_param_update", "the new params", "params, outer_grad, outer_state, lr and momentum",
                    _items(result))


@result_check("scale_params")
def _scale_result(result, *args, **kwargs):
    require_finite("scale_params", "params * scalar", "params and scalar", _items(result))


@result_check("subtract_params")
def _subtract_result(result, *args, **kwargs):
    require_finite("subtract_params", "params_a - params_b", "params_a and params_b", _items(result))


@result_check("average_params")
def _average_result(result, *args, **kwargs):
    require_finite("average_params", "the average", "params_list and weights", _items(result))


@result_check("compute_outer_gradient")
def _outer_gradient_result(result, *args, **kwargs):
    require_finite("compute_outer_gradient", "the pseudo-gradient", "global_params and worker_params_list",
                    _items(result))


@result_check("update_outer_momentum")
def _outer_momentum_result(result, *args, **kwargs):
    require_finite("update_outer_momentum", "the new momentum", "outer_state and outer_grad",
                    _items(result.momentum))


_DIVERGED = " (training diverged: lower the learning rate, or standardise the data)"


@result_check("local_train_step")
def _local_step_result(result, *args, **kwargs):
    new_params, _, loss = result
    require_finite("local_train_step", "the loss", "params, adam_state and x_batch", [("", loss)], _DIVERGED)
    require_finite("local_train_step", "the new params", "params, adam_state and x_batch", _items(new_params),
                    _DIVERGED)


@result_check("inner_train_worker")
def _worker_result(result, *args, **kwargs):
    worker_params, _, losses = result
    require_finite("inner_train_worker", "the losses", "params, adam_state and x_shard", [("", losses)], _DIVERGED)
    require_finite("inner_train_worker", "the worker's params", "params, adam_state and x_shard",
                    _items(worker_params), _DIVERGED)


@result_check("run_diloco_round")
def _round_result(result, *args, **kwargs):
    require_finite("run_diloco_round", "the new global params", "global_params, the states and the shards",
                    _items(result[0]), _DIVERGED)


@result_check("train_diloco", "train_synchronous_baseline")
def _train_result(result, *args, **kwargs):
    require_finite("training", "the final params", "x and the config", _items(result.params), _DIVERGED)


@result_check("evaluate_loss")
def _evaluate_result(result, *args, **kwargs):
    require_finite("evaluate_loss", "the loss", "params and x", [("", result)])
