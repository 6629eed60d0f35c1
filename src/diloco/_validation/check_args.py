"""One argument checker per milestone: ``check_args.<milestone name>(...)``.

Each milestone function starts with one line, a call to its checker here, so a stub
shows the signature, the docstring, that line and the ``raise``. A checker raises
``TypeError`` or ``ValueError`` naming the argument, and returns the few normalised
values the body needs (a Python float for a learning rate, an int for a size).

Results
-------
A direct call's result is checked as well (``result_check``, run by ``milestone``):
finite inputs too large for their dtype can overflow to Inf or NaN in the arithmetic,
and a milestone must then raise ``ValueError`` naming those inputs instead of returning
the overflow. Nested calls skip it, like the argument checks: in training the
divergence guard of ``diloco.tools.runs.training`` reports a blow-up with its round and worker.

Checks once per call tree
-------------------------
Every checker is wrapped by ``checker``. When its milestone was called directly
(``call_depth() <= 1``, see ``milestone``), it checks everything. When the milestone
was called by another milestone (the worker calls the step, which calls forward,
backward and AdamW), the outer call has already checked what flows in, so the checker
only computes its return value (the ``nested`` function). An outer checker therefore
also checks every argument it passes straight through to an inner milestone (the
round checks each worker's state and shard, for instance).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Set

import numpy as np

import diloco.config as _config
from diloco._validation import (
    FLOAT_DTYPES,
    STATE_TYPES,
    call_depth,
    check_bool,
    check_count,
    check_fits_in_memory,
    check_float_array,
    check_generator,
    check_labels,
    check_mlp_params,
    check_nonneg_int,
    check_params,
    check_positive_int,
    check_probability,
    check_real,
    check_same_structure,
    check_sequence,
    shown,
)

# The checks of a direct call's result; importing the module registers them (RESULT_CHECKS).
from diloco._validation.results import require_finite


def checker(nested=None):
    """Decorate a checker: run it on a direct call, only ``nested`` on a nested one."""

    def decorate(check):
        @functools.wraps(check)
        def run(*args, **kwargs):
            if call_depth() <= 1:
                return check(*args, **kwargs)
            return None if nested is None else nested(*args, **kwargs)

        return run

    return decorate


def _num_layers(params, *_, **__) -> int:
    return len(params) // 2


# --- shared pieces -------------------------------------------------------------------------

def adamw_state(state, params=None, params_name: str = "params", name: str = "state"):
    """``state`` is an AdamWState whose moments match each other (and ``params``, if given)."""
    if not isinstance(state, STATE_TYPES["diloco.adamw.AdamWState"]):
        raise TypeError(f"{name} must be an AdamWState, got {type(state).__name__}")
    check_count(state.step, f"{name}.step")  # 10**400 would overflow beta ** step
    check_params(state.m, f"{name}.m")
    check_params(state.v, f"{name}.v")
    check_same_structure(state.m, state.v, f"{name}.m", f"{name}.v")
    if any(np.any(value < 0) for value in state.v.values()):
        raise ValueError(f"{name}.v must be >= 0 everywhere (it is a moving average of squared gradients)")
    if params is not None:
        check_same_structure(params, state.m, params_name, f"{name}.m")
    return state


def outer_state(state, reference, reference_name: str):
    if not isinstance(state, STATE_TYPES["diloco.outer.OuterState"]):
        raise TypeError(f"outer_state must be an OuterState, got {type(state).__name__}")
    check_params(state.momentum, "outer_state.momentum")
    check_same_structure(reference, state.momentum, reference_name, "outer_state.momentum")
    return state


def adamw_config(config):
    if not isinstance(config, _config.AdamWConfig):
        raise TypeError(f"config must be an AdamWConfig, got {type(config).__name__}")
    return config


def diloco_config(config):
    if not isinstance(config, _config.DiLoCoConfig):
        raise TypeError(f"config must be a DiLoCoConfig, got {type(config).__name__}")
    return config


def dataset(x, y, num_workers) -> int:
    check_float_array(x, "x", ndim=2)
    check_labels(y, "y", n=x.shape[0])
    return workers_fit(num_workers, x.shape[0])


def workers_fit(num_workers, num_examples: int) -> int:
    """``num_workers`` is a positive int no larger than the number of examples."""
    num_workers = check_positive_int(num_workers, "num_workers")
    if num_workers > num_examples:
        raise ValueError(
            f"num_workers ({num_workers}) must be <= the number of examples ({num_examples}): "
            "every worker needs at least one"
        )
    return num_workers


def shard(x_shard, y_shard, params=None, x_name: str = "x_shard", y_name: str = "y_shard") -> None:
    """A non-empty shard; with ``params``, its width and labels fit the model."""
    check_float_array(x_shard, x_name, ndim=2)
    num_classes = None if params is None else params[f"W{len(params) // 2}"].shape[1]
    check_labels(y_shard, y_name, n=x_shard.shape[0], num_classes=num_classes)
    if x_shard.shape[0] == 0:
        raise ValueError(f"{x_name} must hold at least one example")
    if params is not None and x_shard.shape[1] != params["W1"].shape[0]:
        raise ValueError(f"{x_name} must have shape (n, {params['W1'].shape[0]}) to match W1, got {x_shard.shape}")


def finite_sum(weights: list[float]) -> list[float]:
    """The weights, divided by the largest if their sum overflows (the normalised weights are the same)."""
    if np.isfinite(sum(weights)):
        return weights
    largest = max(weights)
    return [w / largest for w in weights]


def weights(weights, num: int) -> list[float]:
    """Non-negative weights, one per item, not all zero; uniform when None."""
    if weights is None:
        return [1.0] * num
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise TypeError(f"weights must be a sequence of {num} non-negative numbers, got {type(weights).__name__}")
    if len(weights) != num:
        raise ValueError(f"weights must have one entry per params dict ({num}), got {len(weights)}")
    weights = [check_real(w, f"weights[{k}]", low=0.0) for k, w in enumerate(weights)]
    if sum(weights) <= 0.0:
        raise ValueError("weights must not all be zero: they are normalised to sum to 1")
    return finite_sum(weights)


def params_list(items, name: str, reference=None, reference_name: str = "") -> None:
    check_sequence(items, name)
    for k, params in enumerate(items):
        check_params(params, f"{name}[{k}]")
        if reference is None:
            check_same_structure(items[0], params, f"{name}[0]", f"{name}[{k}]")
        else:
            check_same_structure(reference, params, reference_name, f"{name}[{k}]")


def eval_data(params, x, y, empty_message: str) -> None:
    check_float_array(x, "x", ndim=2)
    if x.shape[0] == 0:
        raise ValueError(empty_message)
    num_layers = check_mlp_params(params)
    if x.shape[1] != params["W1"].shape[0]:
        raise ValueError(f"x must have shape (n, {params['W1'].shape[0]}) to match W1, got {x.shape}")
    check_labels(y, "y", n=x.shape[0], num_classes=params[f"b{num_layers}"].shape[0])


# --- Part 1: model ---------------------------------------------------------------------------

def _sizes(layer_sizes, rng, dtype):
    return [int(s) for s in layer_sizes], np.dtype(dtype)


@checker(nested=_sizes)
def init_model_params(layer_sizes, rng, dtype):
    """Returns ``(sizes as ints, dtype as np.dtype)``."""
    check_generator(rng)
    if isinstance(layer_sizes, (str, bytes, Mapping, Set)) or not hasattr(layer_sizes, "__len__"):
        raise TypeError(f"layer_sizes must be a sequence of ints, got {type(layer_sizes).__name__}")
    if len(layer_sizes) < 2:
        raise ValueError(f"layer_sizes must have length >= 2 (d_in, ..., C), got {list(layer_sizes)}")
    sizes = [check_positive_int(s, f"layer_sizes[{i}]") for i, s in enumerate(layer_sizes)]
    if dtype is None:  # np.dtype(None) would quietly mean float64
        raise TypeError("dtype must be float32 or float64, got None")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be float32 or float64, got {shown(dtype)}") from None
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    num_params = sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True))
    check_fits_in_memory(num_params * dtype.itemsize, "layer_sizes", f"a model of {num_params:,} parameters")
    return sizes, dtype


@checker()
def relu(x):
    check_float_array(x, "x", finite=False)


@checker(nested=_num_layers)
def model_forward(params, x):
    """Returns the number of layers L."""
    num_layers = check_mlp_params(params)
    check_float_array(x, "x", ndim=2)
    if x.shape[1] != params["W1"].shape[0]:
        raise ValueError(f"x must have shape (n, {params['W1'].shape[0]}) to match W1, got {x.shape}")
    return num_layers


@checker()
def softmax(logits):
    # float16 logits are legal here (a row max, an exp of values <= 0 and a sum of C terms cannot
    # overflow): the result is float16 too. Training keeps refusing float16 (FLOAT_DTYPES).
    half = isinstance(logits, np.ndarray) and logits.dtype == np.float16
    check_float_array(logits.astype(np.float32) if half else logits, "logits")
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last axis, got shape {logits.shape}")


@checker()
def cross_entropy_loss(logits, labels):
    check_float_array(logits, "logits", ndim=2)
    if logits.shape[0] == 0:
        raise ValueError("logits must hold at least one row: the mean over an empty batch is undefined")
    if logits.shape[1] == 0:
        raise ValueError("logits must have at least one column (one per class), got shape (n, 0)")
    check_labels(labels, "labels", n=logits.shape[0], num_classes=logits.shape[1])


@checker(nested=_num_layers)
def model_backward(params, cache, labels):
    """Returns the number of layers L."""
    num_layers = check_mlp_params(params)
    if not isinstance(cache, STATE_TYPES["diloco.model.ForwardCache"]):
        raise TypeError(f"cache must be the ForwardCache returned by model_forward, got {type(cache).__name__}")
    if len(cache.pre_activations) != num_layers or len(cache.layer_inputs) != num_layers:
        raise ValueError(f"cache must hold {num_layers} layers to match params, got {len(cache.pre_activations)}")
    for layer in range(num_layers):
        weight = params[f"W{layer + 1}"]
        inputs, outputs = cache.layer_inputs[layer], cache.pre_activations[layer]
        if (getattr(inputs, "ndim", 0) != 2 or getattr(outputs, "ndim", 0) != 2 or inputs.shape[1] != weight.shape[0]
                or outputs.shape[1] != weight.shape[1] or inputs.shape[0] != outputs.shape[0]):
            raise ValueError(f"cache must come from model_forward with these params: layer {layer + 1} holds "
                             f"{getattr(inputs, 'shape', None)} -> {getattr(outputs, 'shape', None)}, W{layer + 1} is "
                             f"{weight.shape}")
        for part, array in (("layer_inputs", inputs), ("pre_activations", outputs)):
            if array.dtype != weight.dtype:  # an int array as logits, say: model_forward's are the params' dtype
                raise TypeError(f"cache.{part}[{layer}] must have dtype {weight.dtype} like params (as model_forward "
                                f"makes it), got {array.dtype}")
    logits = cache.pre_activations[-1]
    if logits.shape[0] == 0:
        raise ValueError("cache must come from a non-empty batch: the mean loss of zero rows is undefined")
    check_labels(labels, "labels", num_classes=logits.shape[1])
    if labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels must have one entry per row of the batch in cache ({logits.shape[0]}), "
                         f"got {labels.shape[0]}")
    return num_layers


# --- Part 2: AdamW ---------------------------------------------------------------------------

def _two_floats(_, first, second):
    return float(first), float(second)


@checker()
def init_adamw_state(params):
    check_params(params)


@checker(nested=lambda state, grads, beta1, beta2: (float(beta1), float(beta2)))
def update_adam_moments(state, grads, beta1, beta2):
    """Returns ``(beta1, beta2)`` as floats."""
    adamw_state(state)
    check_params(grads, "grads")
    check_same_structure(state.m, grads, "state.m", "grads")
    return check_probability(beta1, "beta1"), check_probability(beta2, "beta2")


@checker(nested=_two_floats)
def bias_correct_moments(state, beta1, beta2):
    """Returns ``(beta1, beta2)`` as floats."""
    adamw_state(state)
    beta1 = check_probability(beta1, "beta1")
    beta2 = check_probability(beta2, "beta2")
    if state.step == 0:
        raise ValueError("state.step must be >= 1: bias correction divides by 1 - beta**step, zero at step 0")
    return beta1, beta2


@checker(nested=lambda params, m_hat, v_hat, lr, eps: (float(lr), float(eps)))
def adam_param_step(params, m_hat, v_hat, lr, eps):
    """Returns ``(lr, eps)`` as floats."""
    check_params(params)
    check_params(m_hat, "m_hat")
    check_params(v_hat, "v_hat")
    check_same_structure(params, m_hat, "params", "m_hat")
    check_same_structure(params, v_hat, "params", "v_hat")
    if any(np.any(value < 0) for value in v_hat.values()):
        raise ValueError("v_hat must be >= 0 everywhere (it estimates a mean of squares)")
    return check_real(lr, "lr", low=0.0, low_open=True), check_real(eps, "eps", low=0.0, low_open=True)


@checker(nested=_two_floats)
def decoupled_weight_decay(params, lr, weight_decay):
    """Returns ``(lr, weight_decay)`` as floats."""
    check_params(params)
    lr = check_real(lr, "lr", low=0.0, low_open=True)
    weight_decay = check_real(weight_decay, "weight_decay", low=0.0)
    if lr * weight_decay >= 1.0:
        raise ValueError(f"weight_decay: lr * weight_decay must be < 1, got {lr} * {weight_decay}")
    return lr, weight_decay


# --- Part 3: parameter arithmetic ------------------------------------------------------------

@checker()
def clone_params(params):
    check_params(params, finite=False)


@checker(nested=lambda params, scalar: float(scalar))
def scale_params(params, scalar):
    """Returns ``scalar`` as a float."""
    check_params(params)
    return check_real(scalar, "scalar")


@checker()
def subtract_params(params_a, params_b):
    check_params(params_a, "params_a")
    check_params(params_b, "params_b")
    check_same_structure(params_a, params_b, "params_a", "params_b", any_order=True)  # a - b is taken key by key


@checker(nested=lambda items, w: [1.0] * len(items) if w is None else finite_sum([float(v) for v in w]))
def average_params(items, w):
    """Returns the weights as a list of floats (all 1.0 when None)."""
    params_list(items, "params_list")
    return weights(w, len(items))


# --- Part 4: sharding and the local worker ---------------------------------------------------

@checker(nested=lambda x, y, num_workers, rng: int(num_workers))
def iid_shard_dataset(x, y, num_workers, rng):
    """Returns ``num_workers`` as an int."""
    num_workers = dataset(x, y, num_workers)
    check_generator(rng)
    return num_workers


@checker(nested=lambda x, y, num_workers, rng, alpha: (int(num_workers), float(alpha)))
def noniid_shard_dataset(x, y, num_workers, rng, alpha):
    """Returns ``(num_workers, alpha)`` as an int and a float."""
    num_workers = dataset(x, y, num_workers)
    check_generator(rng)
    return num_workers, check_real(alpha, "alpha", low=0.0, low_open=True)


@checker(nested=lambda x_shard, y_shard, batch_size, rng: int(batch_size))
def sample_worker_batch(x_shard, y_shard, batch_size, rng):
    """Returns ``batch_size`` as an int."""
    shard(x_shard, y_shard)
    batch_size = check_positive_int(batch_size, "batch_size")
    check_fits_in_memory(batch_size * (x_shard.shape[1] * x_shard.dtype.itemsize + 16), "batch_size",
                         f"a batch of {batch_size} rows")
    check_generator(rng)
    return batch_size


@checker()
def local_train_step(params, adam_state, x_batch, y_batch, config):
    adamw_config(config)
    num_layers = check_mlp_params(params)
    adamw_state(adam_state, params, name="adam_state")
    # Checked here so the message names this function's arguments, not model_forward's.
    check_float_array(x_batch, "x_batch", ndim=2)
    if x_batch.shape[0] == 0 or x_batch.shape[1] != params["W1"].shape[0]:
        raise ValueError(
            f"x_batch must have shape (b >= 1, {params['W1'].shape[0]}) to match params['W1'], "
            f"got {x_batch.shape}"
        )
    check_labels(y_batch, "y_batch", n=x_batch.shape[0], num_classes=params[f"W{num_layers}"].shape[1])


@checker(nested=lambda params, adam_state, x_shard, y_shard, steps, batch_size, config, rng:
         (int(steps), int(batch_size)))
def inner_train_worker(params, adam_state, x_shard, y_shard, num_inner_steps, batch_size, config, rng):
    """Returns ``(num_inner_steps, batch_size)`` as ints."""
    num_inner_steps = check_nonneg_int(num_inner_steps, "num_inner_steps")
    check_fits_in_memory(8 * num_inner_steps, "num_inner_steps", f"the losses of {num_inner_steps} steps")
    batch_size = check_positive_int(batch_size, "batch_size")
    shard(x_shard, y_shard)
    check_fits_in_memory(batch_size * (x_shard.shape[1] * x_shard.dtype.itemsize + 16), "batch_size",
                         f"a batch of {batch_size} rows")
    check_generator(rng)
    adamw_config(config)
    num_layers = check_mlp_params(params)
    adamw_state(adam_state, params, name="adam_state")
    # Checked here: the steps this worker takes are nested calls that skip their checks.
    if x_shard.shape[1] != params["W1"].shape[0]:
        raise ValueError(f"x_shard must have shape (n, {params['W1'].shape[0]}) to match W1, got {x_shard.shape}")
    check_labels(y_shard, "y_shard", n=x_shard.shape[0], num_classes=params[f"W{num_layers}"].shape[1])
    return num_inner_steps, batch_size


# --- Part 5: outer optimizer -----------------------------------------------------------------

@checker()
def init_outer_optimizer(params):
    check_params(params)


@checker(nested=lambda state, outer_grad, momentum: float(momentum))
def update_outer_momentum(state, outer_grad, momentum):
    """Returns ``momentum`` as a float."""
    check_params(outer_grad, "outer_grad")
    outer_state(state, outer_grad, "outer_grad")
    return check_probability(momentum, "momentum")


@checker(nested=lambda params, outer_grad, state, lr, momentum, nesterov: (float(lr), float(momentum)))
def nesterov_param_update(params, outer_grad, state, lr, momentum, nesterov):
    """Returns ``(lr, momentum)`` as floats."""
    check_params(params)
    check_params(outer_grad, "outer_grad")
    check_same_structure(params, outer_grad, "params", "outer_grad")
    outer_state(state, params, "params")
    lr = check_real(lr, "lr", low=0.0, low_open=True)
    momentum = check_probability(momentum, "momentum")
    check_bool(nesterov, "nesterov")
    return lr, momentum


@checker()
def compute_outer_gradient(global_params, worker_params_list, w):
    check_params(global_params, "global_params")
    params_list(worker_params_list, "worker_params_list", global_params, "global_params")
    weights(w, len(worker_params_list))  # checked here: average_params is called nested


# --- Part 6: the round -----------------------------------------------------------------------

@checker(nested=lambda global_params, state, worker_states, shards, config, rng: config)
def run_diloco_round(global_params, state, worker_states, shards, config, rng):
    """Returns ``config``. Also checks what the round passes on to the workers."""
    config = diloco_config(config)
    check_mlp_params(global_params, "global_params")
    check_generator(rng)
    num_workers = config.num_workers
    for name, items in (("worker_states", worker_states), ("shards", shards)):
        check_sequence(items, name)
        if len(items) != num_workers:
            raise ValueError(f"{name} must have one entry per worker ({num_workers}), got {len(items)}")
    outer_state(state, global_params, "global_params")
    for k, worker_state in enumerate(worker_states):
        adamw_state(worker_state, global_params, "global_params", name=f"worker_states[{k}]")
    for k, item in enumerate(shards):
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise TypeError(f"shards[{k}] must be a pair (x_k, y_k), got {type(item).__name__}")
        shard(item[0], item[1], global_params, f"shards[{k}][0]", f"shards[{k}][1]")
    return config


def encoder(encode, raw_width: int, params=None) -> int:
    """``encode`` maps rows of ``raw_width`` columns to model inputs; returns its ``num_features``."""
    if not callable(encode):
        raise TypeError(f"encode must be callable (e.g. diloco.text.OneHot), got {type(encode).__name__}")
    widths = [getattr(encode, name, None) for name in ("input_width", "num_features")]
    if any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
        raise TypeError("encode must have positive int attributes input_width and num_features, as OneHot does")
    if widths[0] != raw_width:
        raise ValueError(f"encode takes rows of width {widths[0]}, but the data has {raw_width} columns")
    if params is not None and params["W1"].shape[0] != widths[1]:
        raise ValueError(f"encode makes {widths[1]} features, but W1 has {params['W1'].shape[0]} rows")
    return widths[1]


# --- Part 7: evaluation and communication ----------------------------------------------------

@checker()
def evaluate_loss(params, x, y):
    eval_data(params, x, y, "x must hold at least one example to evaluate on")


@checker()
def classification_accuracy(params, x, y, forward):
    """``forward`` is milestone 03, handed in by the caller (this module imports no milestone module)."""
    eval_data(params, x, y, "x must hold at least one example: accuracy of zero rows is undefined")
    logits, _ = forward(params, x)  # nested: unchecked, so NaN logits are seen here, not argmax-ed
    require_finite("classification_accuracy", "the logits", "params and x", [("", logits)])


def _sizes_of(num_params, num_workers, inner_steps, rounds, bytes_per_value, outer_bytes_per_value):
    outer = bytes_per_value if outer_bytes_per_value is None else outer_bytes_per_value
    return tuple(int(v) for v in (num_params, num_workers, inner_steps, rounds, bytes_per_value, outer))


@checker(nested=_sizes_of)
def communication_savings(num_params, num_workers, inner_steps, rounds, bytes_per_value, outer_bytes_per_value):
    """Returns the six sizes as ints (``outer_bytes_per_value`` defaults to ``bytes_per_value``)."""
    values = [_count(v, name) for v, name in (
        (num_params, "num_params"), (num_workers, "num_workers"), (inner_steps, "inner_steps"),
        (rounds, "rounds"), (bytes_per_value, "bytes_per_value"))]
    outer = values[-1] if outer_bytes_per_value is None else outer_bytes_per_value
    return (*values, _count(outer, "outer_bytes_per_value"))


def _count(value, name: str) -> int:
    """A positive int small enough that products of a few stay finite floats."""
    value = check_positive_int(value, name)
    if value >= 2**63:
        raise ValueError(f"{name} must be < 2**63, got {value:.3e}" if value < 10**300 else
                         f"{name} must be < 2**63, got an int of {len(str(value))} digits")
    return value

