"""The fast engine's in-place optimizers (``diloco.engine.optim``) against the milestones.

``adamw_update`` folds the bias corrections into two scalars, so its parameters may
differ from ``diloco.adamw.adamw_step``'s by a few roundings per step; over 200 steps
with weight decay they must stay within 1e-10 relative (float64), and the moments, whose
arithmetic is unchanged, must be equal to the last bit. The numba kernel (the ``fast``
extra) must equal the NumPy passes to the last bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco.adamw import adamw_step, init_adamw_state
from diloco.config import AdamWConfig
from diloco.engine import optim

KERNELS = ["numpy", pytest.param("numba", marks=pytest.mark.skipif(optim.importlib.util.find_spec("numba") is None,
                                                                     reason="the fast extra (numba) is missing"))]


def run_kernel(kernel, params, m, v, grads, step, config):
    if kernel == "numba":
        optim.adamw_update_numba(params, m, v, grads, step, config)
    else:
        optim.adamw_update_numpy(params, m, v, grads, step, config, optim.adamw_scratch(params.size, params.dtype))


def relative_gap(got, want) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def milestone_and_kernel(kernel, shape, steps, config, dtype="float64", seed=0):
    """Both trajectories from one start, gradients of varying scale; the worst relative gap and the final states."""
    rng = np.random.default_rng(seed)
    start = rng.standard_normal(shape).astype(dtype)
    want, state = {"w": start.copy()}, init_adamw_state({"w": start})
    params, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
    worst = 0.0
    for step in range(1, steps + 1):
        grads = (rng.standard_normal(shape) * rng.uniform(1e-3, 10.0)).astype(dtype)
        want, state = adamw_step(want, state, {"w": grads}, config)
        run_kernel(kernel, params, m, v, grads, step, config)
        worst = max(worst, relative_gap(params, want["w"]))
    return worst, (params, m, v), state


# With chunks of 64 values: P = 1, less than a chunk, one chunk and a bit, several chunks and a
# short last one (K x P = 600 = 9 x 64 + 24).
SHAPES = [(1, 1), (3, 7), (1, 65), (2, 300)]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", SHAPES)
def test_adamw_update_follows_the_milestones_for_200_steps(kernel, shape, monkeypatch):
    monkeypatch.setattr(optim, "CHUNK", 64)
    config = AdamWConfig(lr=3e-3, weight_decay=0.1)
    worst, (params, m, v), state = milestone_and_kernel(kernel, shape, 200, config)
    assert worst <= 1e-10, f"params drift {worst:.3g} relative from adamw_step"
    assert np.array_equal(m, state.m["w"]) and np.array_equal(v, state.v["w"]), "the moments' arithmetic is unchanged"
    assert state.step == 200


@pytest.mark.parametrize("kernel", KERNELS)
def test_adamw_update_without_decay_and_in_float32(kernel):
    worst, _, _ = milestone_and_kernel(kernel, (4, 33), 50, AdamWConfig(weight_decay=0.0))
    assert worst <= 1e-10
    worst, (params, _, _), _ = milestone_and_kernel(kernel, (4, 33), 50, AdamWConfig(weight_decay=0.05),
                                                    dtype="float32")
    assert params.dtype == np.float32 and worst <= 1e-5


def test_adamw_update_walks_every_chunk(monkeypatch):
    """A chunk of 4 values over 2 x 11: every value, the short last chunk included, gets its step."""
    monkeypatch.setattr(optim, "CHUNK", 4)
    config = AdamWConfig(weight_decay=0.1)
    worst, (params, m, _), state = milestone_and_kernel("numpy", (2, 11), 20, config)
    assert worst <= 1e-10 and np.array_equal(m, state.m["w"])
    assert optim.adamw_scratch(22, np.float64)[0].shape == (4,)


def test_first_step_by_hand():
    """t = 1: m = (1 - b1) g, v = (1 - b2) g^2, so m_hat / sqrt(v_hat) = sign(g) and theta moves by lr.

    (eps = 1e-12 moves the step by about 1e-12 of lr / |g|.)"""
    config = AdamWConfig(lr=0.1, beta1=0.9, beta2=0.99, eps=1e-12, weight_decay=0.5)
    params, grads = np.array([[2.0, -4.0, 1.0]]), np.array([[3.0, -0.5, 8.0]])
    m, v = np.zeros_like(params), np.zeros_like(params)
    run_kernel("numpy", params, m, v, grads, 1, config)
    np.testing.assert_allclose(m, 0.1 * grads, rtol=1e-15)
    np.testing.assert_allclose(v, 0.01 * grads**2, rtol=1e-15)
    np.testing.assert_allclose(params, [[2.0 * 0.95 - 0.1, -4.0 * 0.95 + 0.1, 0.95 - 0.1]], rtol=1e-11)


def test_adamw_scalars_fold_the_bias_corrections():
    config = AdamWConfig(lr=0.01, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.2)
    a, e, decay = optim.adamw_scalars(3, config)
    c1, c2 = 1 - 0.8**3, 1 - 0.9**3
    assert a == pytest.approx(0.01 * np.sqrt(c2) / c1, rel=1e-15)
    assert e == pytest.approx(1e-6 * np.sqrt(c2), rel=1e-15)
    assert decay == pytest.approx(1 - 0.01 * 0.2, rel=1e-15)


@pytest.mark.skipif(optim.importlib.util.find_spec("numba") is None, reason="the fast extra (numba) is missing")
@given(size=st.integers(1, 300), rows=st.integers(1, 3), step=st.integers(1, 10_000),
       lr=st.floats(1e-5, 0.5), weight_decay=st.sampled_from([0.0, 0.01, 1.0]), eps=st.sampled_from([1e-8, 1e-3]),
       dtype=st.sampled_from(["float64", "float32"]), seed=st.integers(0, 2**16))
def test_numba_kernel_equals_the_numpy_passes_bit_for_bit(size, rows, step, lr, weight_decay, eps, dtype, seed):
    config = AdamWConfig(lr=lr, weight_decay=weight_decay, eps=eps)
    rng = np.random.default_rng(seed)
    params, m, grads = (rng.standard_normal((rows, size)).astype(dtype) for _ in range(3))
    v = rng.uniform(0, 2, (rows, size)).astype(dtype)
    v[0, 0] = 0.0  # sqrt(0) + e: no division by zero when eps > 0
    grads[0, 0] = 0.0
    states = {kernel: [a.copy() for a in (params, m, v)] for kernel in ("numpy", "numba")}
    for kernel, (p, m_k, v_k) in states.items():
        run_kernel(kernel, p, m_k, v_k, grads, step, config)
    for mine, theirs in zip(states["numba"], states["numpy"], strict=True):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)


def test_kernel_choice_follows_the_environment(monkeypatch):
    for value, expected in (("numpy", "numpy"), ("numba", "numba"), ("auto", "auto"), ("", "auto"), ("x", "auto")):
        monkeypatch.setenv("DILOCO_ADAMW_KERNEL", value)
        assert optim._default_kernel() == expected
    monkeypatch.setattr(optim.importlib.util, "find_spec", lambda name: None)  # numba missing
    for value in ("numba", "auto", ""):
        monkeypatch.setenv("DILOCO_ADAMW_KERNEL", value)
        assert optim._default_kernel() == "numpy"
    with pytest.raises(ImportError, match="fast"):
        optim.adamw_update_numba(np.ones((1, 2)), np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), 1,
                                 AdamWConfig())


def test_auto_moves_to_the_compiled_loop_after_switch_values():
    assert optim.kernel_for("auto", 0) == "numpy"
    assert optim.kernel_for("auto", optim.SWITCH_VALUES - 1) == "numpy"
    assert optim.kernel_for("auto", optim.SWITCH_VALUES) == "numba"
    assert optim.kernel_for("numpy", 10 * optim.SWITCH_VALUES) == "numpy"
    assert optim.kernel_for("numba", 0) == "numba"


@pytest.mark.skipif(optim.importlib.util.find_spec("numba") is None, reason="the fast extra (numba) is missing")
def test_adamw_update_counts_values_and_switches_mid_run(monkeypatch):
    """A run that crosses the switch ends exactly where an all-NumPy run ends."""
    monkeypatch.setattr(optim, "KERNEL", "auto")
    monkeypatch.setattr(optim, "SWITCH_VALUES", 3 * 40)
    monkeypatch.setattr(optim, "_values_updated", 0)
    config, rng = AdamWConfig(weight_decay=0.1), np.random.default_rng(5)
    start = rng.standard_normal((2, 20))
    auto, plain = [[start.copy(), np.zeros_like(start), np.zeros_like(start)] for _ in range(2)]
    for step in range(1, 9):
        grads = rng.standard_normal((2, 20))
        optim.adamw_update(*auto, grads, step, config, optim.adamw_scratch(40, start.dtype))
        run_kernel("numpy", *plain, grads, step, config)
    assert optim._values_updated == 3 * 40  # three NumPy steps, then the loop (which is not counted)
    assert all(np.array_equal(a, b) for a, b in zip(auto, plain, strict=True))
