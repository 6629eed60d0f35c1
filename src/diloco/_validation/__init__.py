"""Input checks shared by the milestone functions.

Every check raises ``TypeError`` (wrong kind of object) or ``ValueError`` (right kind,
illegal value) with a message that names the argument and says what was expected. The
checks never copy or modify their input, so purity is preserved.

This module holds the building blocks and the call-tree bookkeeping (``milestone``,
``call_depth``); ``diloco._validation.check_args`` holds one checker per milestone,
which is what the milestone functions call.
"""

from __future__ import annotations

import contextvars
import functools
import numbers
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "FLOAT_DTYPES",
    "NonFiniteError",
    "milestone",
    "state_type",
    "STATE_TYPES",
    "call_depth",
    "check_seed",
    "check_bool",
    "available_memory",
    "check_fits_in_memory",
    "check_generator",
    "check_float_array",
    "check_labels",
    "check_params",
    "check_mlp_params",
    "check_same_structure",
    "check_positive_int",
    "check_nonneg_int",
    "check_real",
    "check_probability",
    "check_count",
    "shown",
    "MAX_COUNT",
]

# The largest step or round count a state may hold: an int64 (no run reaches it; a larger one
# is corrupt, and ``beta ** step`` of a Python int beyond the float range raises OverflowError).
MAX_COUNT = 2**63 - 1
_SHOWN = 200  # characters of a value echoed back in a message


def shown(value) -> str:
    """``repr(value)`` cut to 200 characters (its full length said): messages never echo
    a 50 MB string or a 400-digit int back whole."""
    text = repr(value)
    if len(text) <= _SHOWN:
        return text
    return f"{text[:_SHOWN]}...[{len(text):,} characters]"


# How many milestone functions are running in this call tree (a context variable, so
# threads and asyncio tasks each have their own count).
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("diloco_milestone_depth", default=0)


def call_depth() -> int:
    """How many milestone functions are running in the current call tree (0 outside any)."""
    return _DEPTH.get()


# Milestone name -> check of its result, registered by ``check_args`` (``result_check``).
RESULT_CHECKS: dict = {}

# The milestone modules' state types by module and name (``state_type``), so the checks can
# test them without importing the modules that import the checks.
STATE_TYPES: dict = {}


def state_type(cls):
    """Register a milestone module's state type (``AdamWState``, ``OuterState``, ``ForwardCache``)
    with the argument checks, which look it up by name; returns ``cls`` unchanged."""
    STATE_TYPES[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return cls


def milestone(function):
    """Mark a milestone function, so its checks run once per call tree.

    A direct call runs at depth 1 and its checker checks every argument. A milestone
    called by another milestone runs at depth 2 or more, and its checker skips the
    checks: the outer call has checked what flows in (see ``check_args``). The
    function itself, the learner's code, is what runs either way.

    A direct call's result is checked too, when ``check_args`` registered a check for it:
    finite inputs whose magnitudes are too large for the dtype can overflow to Inf or
    NaN, and that must be an error naming the inputs, never a silent result.
    """

    @functools.wraps(function)
    def call(*args, **kwargs):
        depth = _DEPTH.get()
        token = _DEPTH.set(depth + 1)
        try:
            result = function(*args, **kwargs)
        finally:
            _DEPTH.reset(token)
        check = RESULT_CHECKS.get(function.__name__) if depth == 0 else None
        if check is not None:
            check(result, *args, **kwargs)
        return result

    return call


def check_generator(rng, name: str = "rng") -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator (e.g. np.random.default_rng(0)), "
            f"got {type(rng).__name__}"
        )
    return rng


def check_positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {shown(value)}")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {shown(value)}")
    return int(value)


def check_nonneg_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative int, got {type(value).__name__} {shown(value)}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {shown(value)}")
    return int(value)


def check_count(value, name: str) -> int:
    """A non-negative int of at most ``MAX_COUNT`` (a step or round counter)."""
    value = check_nonneg_int(value, name)
    if value > MAX_COUNT:
        raise ValueError(f"{name} must be at most 2**63 - 1, got an int of {len(str(value)):,} digits")
    return value


def check_real(value, name: str, *, low=None, high=None, low_open=False, high_open=False) -> float:
    """A finite real scalar in an optional interval; returned as a Python float.

    Returning a Python float keeps NumPy's weak-scalar rule in force, so a float32 array
    times the result stays float32.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {shown(value)}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond every float (10**400)
        raise ValueError(f"{name} must be finite, got an int of {len(str(value)):,} digits") from None
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {shown(value)}")
    if low is not None and (value < low or (low_open and value == low)):
        bound = f"> {low}" if low_open else f">= {low}"
        raise ValueError(f"{name} must be {bound}, got {shown(value)}")
    if high is not None and (value > high or (high_open and value == high)):
        bound = f"< {high}" if high_open else f"<= {high}"
        raise ValueError(f"{name} must be {bound}, got {shown(value)}")
    return value


def check_bool(value, name: str) -> bool:
    """A bool (Python's or NumPy's); returned as a Python bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {shown(value)}")
    return bool(value)


def check_seed(value, name: str = "seed") -> int:
    """A non-negative integer seed below 2**64 (a Python or NumPy int); returned as a Python int.

    The bound is a uint64's: what NumPy's generators, the checkpoints' JSON readers and other
    tools take as a seed without a second thought. A larger seed is refused, not folded silently."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a non-negative int, got {type(value).__name__} {shown(value)}")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {shown(value)}")
    if value >= 2**64:
        raise ValueError(f"{name} must be below 2**64 (a 64-bit seed), got {shown(value)}")
    return int(value)


def available_memory() -> int | None:
    """Bytes a new allocation can get, or None if unknown: the kernel's ``MemAvailable``, and no
    more than this process's address-space limit (``ulimit -v``, ``prlimit --as``) or its
    cgroup's ``memory.max`` leave (a container's limit, minus what the cgroup already uses)."""
    limits = [_meminfo_available(), _address_space_left(), _cgroup_left()]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _address_space_left() -> int | None:
    """RLIMIT_AS minus the address space this process maps already (``/proc/self/statm``)."""
    try:
        import os
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit == resource.RLIM_INFINITY:
            return None
        with open("/proc/self/statm", encoding="ascii") as handle:
            mapped = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        return max(0, limit - mapped)
    except (ImportError, OSError, ValueError, IndexError):
        return None


def _cgroup_left() -> int | None:
    """cgroup v2: ``memory.max`` minus ``memory.current``, when the cgroup has a limit."""
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as handle:
            text = handle.read().strip()
        if text == "max":
            return None
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as handle:
            used = int(handle.read().strip())
        return max(0, int(text) - used)
    except (OSError, ValueError):
        return None


def check_fits_in_memory(num_bytes: int, name: str, what: str) -> None:
    """Refuse a size whose arrays cannot be allocated, before NumPy fails with an unclear message.

    ``num_bytes`` is a Python int (no overflow); refused beyond ``2**63`` bytes, or beyond
    the memory available when the platform says how much that is.
    """
    limit = available_memory()
    if num_bytes >= 2**63 or (limit is not None and num_bytes > limit):
        need = f"{num_bytes / 1e9:.3g} GB" if num_bytes < 10**30 else f"about 1e{len(str(num_bytes)) - 1} bytes"
        have = "" if limit is None else f", {limit / 1e9:.3g} GB available"
        raise ValueError(f"{name} is too large: {what} needs {need} of memory{have}")


def check_probability(value, name: str) -> float:
    """A value in [0, 1)."""
    return check_real(value, name, low=0.0, high=1.0, high_open=True)


FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))  # float16 loses too much, longdouble is not portable


class NonFiniteError(ValueError):
    """An array that must be finite holds a NaN or an Inf. Inside a training run it is what
    divergence produces mid-round (a pseudo-gradient that cannot be encoded, a delta), and
    the guard (``diloco.core.divergence.Guard.watch``) turns it into ``Diverged``."""


def check_float_array(x, name: str, *, ndim: int | None = None, finite: bool = True) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must have dtype float32 or float64, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    # Fast path: a finite sum proves every entry finite; only a NaN/Inf (or an overflowing
    # sum of finite values) pays for the element-wise check.
    if finite and not np.isfinite(x.sum()) and not np.isfinite(x).all():
        raise NonFiniteError(f"{name} must contain only finite values (no NaN or Inf)")
    return x


def check_labels(y, name: str, *, n: int | None = None, num_classes: int | None = None) -> np.ndarray:
    if not isinstance(y, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of integer labels, got {type(y).__name__}")
    if not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"{name} must have an integer dtype, got {y.dtype}")
    if y.ndim != 1:
        raise ValueError(f"{name} must be 1-D of shape (n,), got shape {y.shape}")
    if n is not None and y.shape[0] != n:
        raise ValueError(f"{name} must have {n} entries to match the inputs, got {y.shape[0]}")
    if y.size and y.min() < 0:
        raise ValueError(f"{name} must be non-negative class indices, got min {int(y.min())}")
    if num_classes is not None and y.size and y.max() >= num_classes:
        raise ValueError(
            f"{name} must be in [0, {num_classes}), got max {int(y.max())}"
        )
    return y


def check_params(params, name: str = "params", *, finite: bool = True) -> Mapping:
    """A non-empty dict of str -> floating ndarray, all of one dtype."""
    if not isinstance(params, Mapping):
        raise TypeError(f"{name} must be a dict of str -> numpy.ndarray, got {type(params).__name__}")
    if len(params) == 0:
        raise ValueError(f"{name} must not be empty")
    dtypes = set()
    for key, value in params.items():
        if not isinstance(key, str):
            raise TypeError(f"{name} keys must be str, got {type(key).__name__} {shown(key)}")
        check_float_array(value, f"{name}[{shown(key)}]", finite=finite)
        dtypes.add(value.dtype)
    if len(dtypes) > 1:
        raise TypeError(f"{name} arrays must share one dtype, got {sorted(map(str, dtypes))}")
    return params


def check_mlp_params(params, name: str = "params") -> int:
    """Check the MLP layout ``W1, b1, ..., WL, bL``; return the number of layers L."""
    check_params(params, name)
    if len(params) % 2 != 0:
        raise ValueError(f"{name} must hold pairs W1, b1, ..., WL, bL, got keys {list(params)}")
    num_layers = len(params) // 2
    expected = [k for layer in range(1, num_layers + 1) for k in (f"W{layer}", f"b{layer}")]
    if list(params) != expected:
        raise ValueError(f"{name} must have keys {expected} in that order, got {list(params)}")
    for layer in range(1, num_layers + 1):
        weight, bias = params[f"W{layer}"], params[f"b{layer}"]
        if weight.ndim != 2:
            raise ValueError(f"{name}['W{layer}'] must be 2-D (fan_in, fan_out), got shape {weight.shape}")
        if bias.shape != (weight.shape[1],):
            raise ValueError(
                f"{name}['b{layer}'] must have shape ({weight.shape[1]},) to match W{layer}, got {bias.shape}"
            )
        if layer > 1:
            previous = params[f"W{layer - 1}"]
            if weight.shape[0] != previous.shape[1]:
                raise ValueError(
                    f"{name}['W{layer}'] must have {previous.shape[1]} rows to follow W{layer - 1}, "
                    f"got shape {weight.shape}"
                )
    return num_layers


def check_same_structure(reference, other, ref_name: str, other_name: str, *, any_order: bool = False) -> None:
    """``other`` has exactly the keys, shapes and dtype of ``reference`` (the keys in the same order,
    unless ``any_order``: for a caller that reads ``other`` key by key)."""
    if (set(other) != set(reference) or len(other) != len(reference)) if any_order else list(other) != list(reference):
        raise ValueError(
            f"{other_name} must have the same keys as {ref_name} {list(reference)}, got {list(other)}"
        )
    for key in reference:
        if other[key].shape != reference[key].shape:
            raise ValueError(
                f"{other_name}[{shown(key)}] must have shape {reference[key].shape} like {ref_name}, "
                f"got {other[key].shape}"
            )
        if other[key].dtype != reference[key].dtype:
            raise TypeError(
                f"{other_name}[{shown(key)}] must have dtype {reference[key].dtype} like {ref_name}, "
                f"got {other[key].dtype}"
            )


def check_sequence(items, name: str) -> Sequence:
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise TypeError(f"{name} must be a list or tuple, got {type(items).__name__}")
    if len(items) == 0:
        raise ValueError(f"{name} must not be empty")
    return items
