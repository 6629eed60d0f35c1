"""Assertions that print the learner's value beside the expected one ("mine vs gold")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from hypothesis import settings

FIXTURES = Path(__file__).parent / "fixtures"


def load_fixture(marker: str) -> dict:
    """The hand-worked fixture ``tests/fixtures/<marker>.json`` (e.g. ``"m07"``)."""
    with open(FIXTURES / f"{marker}.json") as handle:
        return json.load(handle)


# The costliest properties (several dicts or training runs per example) run half the
# profile's count, at least 20 (so the `thorough` profile still gets 250).
HALF_EXAMPLES = settings(max_examples=max(20, settings.default.max_examples // 2))


def as_params(tree, dtype=np.float64):
    """Fixture lists -> a dict of new arrays."""
    return {key: np.array(value, dtype=dtype) for key, value in tree.items()}


def tolerance(dtype):
    """(rtol, atol) for results that went through a few roundings in ``dtype``."""
    return (1e-5, 1e-5) if np.dtype(dtype) == np.float32 else (1e-12, 1e-12)


def assert_close(got, expected, *, rtol=1e-12, atol=0.0, what="value"):
    """``got`` equals ``expected`` to tolerance; the message shows both and the worst gap."""
    got_arr = np.asarray(got)
    exp_arr = np.asarray(expected)
    if got_arr.shape != exp_arr.shape:
        raise AssertionError(f"{what}: expected shape {exp_arr.shape}, got shape {got_arr.shape}")
    if not np.allclose(got_arr, exp_arr, rtol=rtol, atol=atol, equal_nan=False):
        diff = np.abs(got_arr.astype(np.float64) - exp_arr.astype(np.float64))
        diff = np.where(np.isnan(diff), np.inf, diff)  # a NaN is the worst difference of all
        worst = tuple(int(i) for i in np.unravel_index(np.argmax(diff), diff.shape)) if diff.shape else ()
        gap = "NaN or Inf" if not np.isfinite(diff.max()) else f"{diff.max():.3g}"
        raise AssertionError(
            f"{what}: expected {np.array2string(exp_arr, precision=10)}\n"
            f"{' ' * len(what)}       got {np.array2string(got_arr, precision=10)}\n"
            f"largest difference {gap} at index {worst} (rtol={rtol}, atol={atol})"
        )


def assert_params_close(got: dict, expected: dict, *, rtol=1e-12, atol=0.0, what="params"):
    """Same keys in the same order, each array close."""
    if list(got) != list(expected):
        raise AssertionError(f"{what}: expected keys {list(expected)}, got keys {list(got)}")
    for key in expected:
        assert_close(got[key], expected[key], rtol=rtol, atol=atol, what=f"{what}[{key!r}]")


def snapshot(tree):
    """A deep copy of a (nested) structure of dicts, lists, tuples and arrays."""
    if isinstance(tree, np.ndarray):
        return tree.copy()
    if isinstance(tree, dict):
        return {k: snapshot(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # NamedTuple
        return type(tree)(*(snapshot(v) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(snapshot(v) for v in tree)
    return tree


def arrays_in(tree):
    """Every ndarray inside a nested structure."""
    if isinstance(tree, np.ndarray):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from arrays_in(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from arrays_in(v)


def assert_unchanged(before, after, what="input"):
    """``after`` (the argument after the call) equals ``before`` (its snapshot) exactly."""
    b, a = list(arrays_in(before)), list(arrays_in(after))
    assert len(a) == len(b), f"{what}: its structure changed during the call"
    for i, (x, y) in enumerate(zip(b, a)):
        if not np.array_equal(x, y, equal_nan=True):
            raise AssertionError(f"{what}: array #{i} was modified in place (the function must be pure)")


def assert_no_shared_memory(outputs, inputs, what="output"):
    """No array in ``outputs`` shares memory with any array in ``inputs``."""
    for i, out in enumerate(arrays_in(outputs)):
        for j, inp in enumerate(arrays_in(inputs)):
            if np.shares_memory(out, inp):
                raise AssertionError(
                    f"{what}: array #{i} of the result shares memory with input array #{j}; "
                    "return new arrays (e.g. .copy()) so callers cannot corrupt each other"
                )
