"""What the milestone tests share: fixtures, builders, oracles, tolerances, assertions.

Assertions print the learner's value beside the expected one ("mine vs gold"). The
oracles are written out here in plain NumPy from the formulas of the contract; none of
them calls the package.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"

# The floating dtypes every milestone supports (`strategies.dtypes` draws from them).
DTYPES = (np.float32, np.float64)

# The costliest properties run a fraction of the Hypothesis profile's examples (applied by
# tests/conftest.py): several parameter dicts or training steps per example ...
HALF_EXAMPLES = pytest.mark.examples(0.5)
# ... or a whole training run per example (12 of the `ci` profile's 40).
FEW_EXAMPLES = pytest.mark.examples(0.3)


def load_fixture(marker: str) -> dict:
    """The hand-worked fixture ``tests/fixtures/<marker>.json`` (e.g. ``"m07"``)."""
    with open(FIXTURES / f"{marker}.json") as handle:
        return json.load(handle)


# --------------------------------------------------------------------------- builders


def as_params(tree, dtype=None) -> dict:
    """A dict of new arrays from fixture lists or arrays.

    ``dtype`` None: a floating array keeps its dtype, anything else becomes float64.
    """
    def convert(value):
        if dtype is not None:
            return np.array(value, dtype=dtype)
        if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating):
            return value.copy()
        return np.array(value, dtype=np.float64)

    return {key: convert(value) for key, value in tree.items()}


def adamw_state(like=None, *, step=0, m=0.0, v=0.0, dtype=None):
    """An ``AdamWState`` built in the test (never by ``init_adamw_state``).

    ``m`` and ``v`` are each a dict (fixture lists or arrays, converted by ``as_params``)
    or a number that fills arrays shaped and typed like ``like``: ``adamw_state(params)``
    is the fresh state of ``params``, ``adamw_state(params, step=7, m=0.2, v=0.5)`` a warm one,
    ``adamw_state(step=s["step"], m=s["m"], v=s["v"])`` a fixture's.
    """
    from diloco.adamw import AdamWState  # here, so a broken adamw.py breaks only the tests that use it

    def moments(value):
        if isinstance(value, dict):
            return as_params(value, dtype)
        return {key: np.full(a.shape, value, dtype=dtype or a.dtype) for key, a in like.items()}

    return AdamWState(step, moments(m), moments(v))


# --------------------------------------------------------------------------- oracles


def adamw_oracle(params, state, grads, config):
    """One ``torch.optim.AdamW`` step in float64: ``(new_params, (step, m, v))``.

    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``, bias-corrected with the new
    step ``t``; the decay acts on the pre-step parameters:
    ``theta - lr wd theta - lr m_hat / (sqrt(v_hat) + eps)``.
    """
    from diloco.adamw import AdamWState

    step = state.step + 1
    new_params, new_m, new_v = {}, {}, {}
    for key, value in params.items():
        theta, g = value.astype(np.float64), grads[key].astype(np.float64)
        new_m[key] = config.beta1 * state.m[key].astype(np.float64) + (1 - config.beta1) * g
        new_v[key] = config.beta2 * state.v[key].astype(np.float64) + (1 - config.beta2) * g * g
        m_hat = new_m[key] / (1 - config.beta1**step)
        v_hat = new_v[key] / (1 - config.beta2**step)
        new_params[key] = theta - config.lr * config.weight_decay * theta - config.lr * m_hat / (
            np.sqrt(v_hat) + config.eps)
    return new_params, AdamWState(step, new_m, new_v)


def oracle_forward(params, x):
    """The MLP in float64: ``(logits, hidden pre-activations z_1 .. z_{L-1})``."""
    num_layers = len(params) // 2
    activation = np.asarray(x, dtype=np.float64)
    pre = []
    for layer in range(1, num_layers + 1):
        z = activation @ params[f"W{layer}"].astype(np.float64) + params[f"b{layer}"].astype(np.float64)
        pre.append(z)
        activation = np.where(z > 0, z, 0.0)
    return pre[-1], pre[:-1]


def oracle_loss(params, x, labels):
    """Mean cross-entropy of the MLP in float64: ``mean_i (logsumexp(z_i) - z_i[y_i])``."""
    logits, _ = oracle_forward(params, x)
    top = logits.max(axis=1)
    log_norm = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
    return float(np.mean(log_norm - logits[np.arange(len(labels)), labels]))


# --------------------------------------------------------------------------- tolerances and assertions


def tolerance(dtype, magnitude=1.0) -> dict:
    """The suite's one tolerance rule, as ``dict(rtol=..., atol=...)`` for ``assert_close``.

    A result that went through a handful of roundings in ``dtype``: rtol 1e-5 in float32,
    1e-12 in float64 (some hundreds of units in the last place). ``magnitude`` is the size
    of the values that cancelled on the way (atol = rtol * magnitude): a result near zero
    made of terms of size 100 is only known to about 100 * rtol.
    """
    rtol = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    return {"rtol": rtol, "atol": rtol * magnitude}


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


def assert_state_close(got, expected, *, rtol=1e-12, atol=0.0):
    """An ``AdamWState`` with ``expected``'s step and moments close to its."""
    from diloco.adamw import AdamWState

    assert isinstance(got, AdamWState), f"expected an AdamWState, got {type(got).__name__}"
    assert got.step == expected.step, f"state.step: expected {expected.step}, got {got.step}"
    assert_params_close(got.m, expected.m, rtol=rtol, atol=atol, what="state.m")
    assert_params_close(got.v, expected.v, rtol=rtol, atol=atol, what="state.v")


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
    for i, (x, y) in enumerate(zip(b, a, strict=True)):
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


def assert_no_two_share(outputs, what="output"):
    """No two arrays inside ``outputs`` share memory (each is its own new array)."""
    found = list(arrays_in(outputs))
    for i in range(len(found)):
        for j in range(i + 1, len(found)):
            assert not np.shares_memory(found[i], found[j]), (
                f"{what}: arrays #{i} and #{j} share memory; each must be its own new array"
            )
