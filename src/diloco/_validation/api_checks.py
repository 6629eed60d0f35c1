"""Argument checks of the public functions beyond the milestones.

``check_args`` holds one checker per milestone; this module does the same for the rest
of the public API that ``tests/tooling/test_api_fuzz.py`` found open: the wire formats
(``diloco.core.quantize``), the simulated network (``diloco.core.netsim``,
``diloco.core.comm``), the paper's mechanisms (``diloco.core.mechanisms``), the character
task (``diloco.text``) and the data split (``diloco.data``). Each function calls its
checker on its first line. As everywhere in ``diloco._validation``: ``TypeError`` for
the wrong kind of object, ``ValueError`` for a wrong value, the argument named, a value
echoed back cut to 200 characters (``shown``), and the input never copied or changed.
Checks that cost a pass over an array run only on a direct call (``call_depth() == 0``),
never per step inside training.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from diloco._validation import (
    FLOAT_DTYPES,
    call_depth,
    check_count,
    check_fits_in_memory,
    check_float_array,
    check_generator,
    check_params,
    check_positive_int,
    check_real,
    check_sequence,
    shown,
)
from diloco.config import DiLoCoConfig
from diloco.config.sections import PATTERNS

__all__ = ["encode", "bfloat16_bits", "bfloat16_values", "decode", "unit_bounds", "wire_text",
           "all_reduce_seconds", "native_bytes", "clip_by_global_norm", "inner_lr", "draw_dropped",
           "mean_pairwise_cosine", "mean_loss", "char_windows", "stratified_split", "float_dtype",
           "fragment_layers", "fragment_keys", "sync_offsets", "sync_steps", "eager_outer_gradient", "choose_layout"]


def float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """``dtype`` as float32 or float64 (None is refused: ``np.dtype(None)`` would mean float64)."""
    if dtype is None:
        raise TypeError(f"{name} must be float32 or float64, got None")
    try:
        value = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} must be float32 or float64, got {shown(dtype)}") from None
    if value not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {value}")
    return value


# --- diloco.core.quantize -------------------------------------------------------------------

def encode(x, fmt, block_size) -> None:
    del x, fmt  # encode checks x (type, dtype, finite) and fmt (one of FORMATS) itself
    check_count(block_size, "block_size")


def bfloat16_bits(x) -> None:
    check_float_array(x, "x", finite=False)  # +-inf and NaN have bfloat16 codes too


def bfloat16_values(codes, dtype) -> None:
    if not isinstance(codes, np.ndarray) or codes.dtype != np.uint16:
        got = codes.dtype if isinstance(codes, np.ndarray) else type(codes).__name__
        raise TypeError(f"codes must be a numpy.ndarray of uint16 bfloat16 codes, got {got}")
    float_dtype(dtype)


def decode(encoded, dtype) -> None:
    del encoded  # decode checks it is an Encoded itself (diloco.core.quantize owns the class)
    float_dtype(dtype)


def unit_bounds(size, unit) -> None:
    check_count(size, "size")
    check_positive_int(unit, "unit")
    check_count(unit, "unit")


# --- diloco.core.netsim, comm ---------------------------------------------------------------------

def wire_text(text, what: str) -> None:
    """``parse_bandwidth`` / ``parse_duration``: a str (``what`` names it in the message)."""
    if not isinstance(text, str):
        raise TypeError(f"text (the {what}) must be a str such as '1Gbit' or '50ms', got {type(text).__name__}")


def all_reduce_seconds(bytes_sent, num_workers, bandwidth, latency) -> None:
    check_real(bytes_sent, "bytes_sent", low=0.0)
    check_positive_int(num_workers, "num_workers")
    check_count(num_workers, "num_workers")
    check_real(bandwidth, "bandwidth", low=0.0, low_open=True)
    check_real(latency, "latency", low=0.0)


def native_bytes(num_values, num_workers, itemsize) -> None:
    check_count(num_values, "num_values")
    check_positive_int(num_workers, "num_workers")
    check_count(num_workers, "num_workers")
    check_positive_int(itemsize, "itemsize")
    check_count(itemsize, "itemsize")


# --- diloco.core.mechanisms -------------------------------------------------------------------------------

def _nonempty_mapping(params, name: str) -> None:
    if not isinstance(params, Mapping):
        raise TypeError(f"{name} must be a dict of str -> numpy.ndarray, got {type(params).__name__}")
    if not params:
        raise ValueError(f"{name} must not be empty")


def clip_by_global_norm(grads, max_norm) -> None:
    _nonempty_mapping(grads, "grads")
    if call_depth() == 0:  # a direct call; inside training the divergence guard sees a NaN gradient
        check_params(grads, "grads")
    if max_norm is not None:
        check_real(max_norm, "max_norm", low=0.0, low_open=True)


def _config(config) -> None:
    if not isinstance(config, DiLoCoConfig):
        raise TypeError(f"config must be a DiLoCoConfig, got {type(config).__name__}")


def inner_lr(config, step) -> None:
    _config(config)
    check_count(step, "step")


def draw_dropped(rng, config) -> None:
    check_generator(rng, "rng")
    _config(config)


def mean_pairwise_cosine(global_params, worker_params_list) -> None:
    _nonempty_mapping(global_params, "global_params")
    check_sequence(worker_params_list, "worker_params_list")
    if call_depth() == 0:
        check_params(global_params, "global_params")
        for index, params in enumerate(worker_params_list):
            check_params(params, f"worker_params_list[{index}]")
            if set(params) != set(global_params):
                raise ValueError(f"worker_params_list[{index}] must have the keys of global_params, "
                                 f"got {shown(sorted(params))}")


def mean_loss(value, name: str = "mean_cross_entropy") -> None:
    """A mean cross-entropy: a real >= 0. NaN and +Inf are let through: ``perplexity`` and
    ``bits_per_char`` map them to NaN and +Inf (IEEE), as a diverged run's loss must show."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {shown(value)}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0 (a cross-entropy), got {shown(value)}")


# --- diloco.text, diloco.data ---------------------------------------------------------------------------

def char_windows(ids, context) -> None:
    if not isinstance(ids, np.ndarray) or not np.issubdtype(ids.dtype, np.integer) or ids.ndim != 1:
        got = f"{ids.dtype} of shape {ids.shape}" if isinstance(ids, np.ndarray) else type(ids).__name__
        raise TypeError(f"ids must be a 1-D numpy.ndarray of integer character ids, got {got}")
    if ids.size and ids.min() < 0:
        raise ValueError(f"ids must be non-negative character ids, got min {int(ids.min())}")
    check_positive_int(context, "context")


def stratified_split(x, y) -> None:
    check_float_array(x, "x", ndim=2)
    if x.shape[0] == 0:
        raise ValueError("x must have at least one row (example), got shape (0, ...)")
    if not isinstance(y, np.ndarray):
        raise TypeError(f"y must be a numpy.ndarray of integer labels, got {type(y).__name__}")


# --- the one training core's schedule, eager rule and layout rule -----------------------------------
# Each function's first line
# calls its checker (diloco.core.schedule, diloco.core.sync, diloco.engine.layout).

def _pattern(pattern) -> None:
    if not isinstance(pattern, str) or pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {shown(pattern)}")


def fragment_layers(num_layers, fragments, pattern) -> None:
    num_layers = check_count(check_positive_int(num_layers, "num_layers"), "num_layers")
    fragments = check_positive_int(fragments, "fragments")
    if fragments > num_layers:
        raise ValueError(f"fragments must be between 1 and num_layers ({num_layers}), got {fragments}")
    _pattern(pattern)


def fragment_keys(params, fragments, pattern) -> None:
    _nonempty_mapping(params, "params")
    if len(params) % 2:
        raise ValueError(f"params must hold W1, b1, ..., WL, bL (an even number of arrays), got {len(params)}")
    fragments = check_positive_int(fragments, "fragments")
    if fragments > len(params) // 2:
        raise ValueError(f"fragments must be between 1 and the {len(params) // 2} layers of params, got {fragments}")
    _pattern(pattern)


def sync_offsets(fragments, inner_steps) -> None:
    check_count(check_positive_int(fragments, "fragments"), "fragments")
    check_count(check_positive_int(inner_steps, "inner_steps"), "inner_steps")


def sync_steps(fragment, fragments, inner_steps, total_steps) -> None:
    sync_offsets(fragments, inner_steps)
    fragment = check_count(fragment, "fragment")
    if fragment >= fragments:
        raise ValueError(f"fragment must be below fragments ({fragments}), got {fragment}")
    total_steps = check_count(total_steps, "total_steps")
    check_fits_in_memory(8 * total_steps, "total_steps", f"a pass over {total_steps:,} steps")


def eager_outer_gradient(local_now, share) -> None:
    check_params(local_now, "local_now")  # once per round: a pass over the parameters
    check_real(share, "share", low=0.0, high=1.0)


def choose_layout(num_workers, num_values, layout, itemsize) -> None:
    del layout  # choose_layout checks it against its LAYOUTS itself
    for value, name in ((num_workers, "num_workers"), (num_values, "num_values"), (itemsize, "itemsize")):
        check_count(check_positive_int(value, name), name)
