"""Part 2 - the inner optimizer AdamW: milestones 07-11 (``src/diloco/adamw.py``).

Expected values come from the hand-worked fixtures ``tests/fixtures/m07.json`` ..
``m11.json``, from the formulas of the contract written out here in NumPy, and from a
``torch.optim.AdamW`` trajectory (``tests/fixtures/torch_adamw.npz``, made by
``scripts/make_torch_adamw_snapshot.py``). Tests of milestones 07-11 call only their own
function. The composed ``adamw_step`` (which calls 08-11) is tested under marker m19,
whose dependencies include 07-11.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import strategies as sts
from diloco.adamw import (
    AdamWState,
    adam_param_step,
    adamw_step,
    bias_correct_moments,
    decoupled_weight_decay,
    init_adamw_state,
    update_adam_moments,
)
from diloco.config import AdamWConfig
from helpers import (
    DTYPES,
    FIXTURES,
    adamw_oracle,
    adamw_state,
    as_params,
    assert_close,
    assert_no_shared_memory,
    assert_no_two_share,
    assert_params_close,
    assert_state_close,
    assert_unchanged,
    load_fixture,
    snapshot,
    tolerance,
)


def state_from(fixture_state, dtype=np.float64):
    return adamw_state(**fixture_state, dtype=dtype)


def assert_dtypes(tree, dtype, what):
    for key, value in tree.items():
        assert value.dtype == dtype, f"{what}[{key!r}]: expected dtype {np.dtype(dtype)}, got {value.dtype}"


@st.composite
def moment_states(draw, dtype=None):
    """``(state, grads)``: an AdamWState with ``v >= 0`` and matching finite grads."""
    params = draw(sts.param_dicts(dtype=dtype))
    m = draw(sts.arrays_like(params, 5.0))
    v = draw(sts.arrays_like(params, 25.0, nonneg=True))
    grads = draw(sts.arrays_like(params, 5.0))
    step = draw(st.integers(0, 100))
    return AdamWState(step, m, v), grads


# ---------------------------------------------------------------------------
# Milestone 07: init_adamw_state
# ---------------------------------------------------------------------------


@pytest.mark.m07
@pytest.mark.parametrize("dtype", DTYPES)
def test_init_state_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m07")
    params = as_params(fixture["inputs"]["params"], dtype)
    before = snapshot(params)
    state = init_adamw_state(params)
    assert isinstance(state, AdamWState), f"expected an AdamWState, got {type(state).__name__}"
    assert type(state.step) is int and state.step == fixture["expected"]["step"], f"step: got {state.step!r}"
    assert_params_close(state.m, as_params(fixture["expected"]["m"]), rtol=0.0, what="m")
    assert_params_close(state.v, as_params(fixture["expected"]["v"]), rtol=0.0, what="v")
    assert_dtypes(state.m, dtype, "m")
    assert_dtypes(state.v, dtype, "v")
    assert_unchanged(before, params, "params")
    assert_no_shared_memory(state, params, "init_adamw_state")


@pytest.mark.m07
@given(params=sts.param_dicts())
def test_init_state_zeros_like_params(params):
    before = snapshot(params)
    state = init_adamw_state(params)
    assert state.step == 0
    for name, moments in (("m", state.m), ("v", state.v)):
        assert list(moments) == list(params), f"{name}: expected keys {list(params)}, got {list(moments)}"
        for key, value in params.items():
            got = moments[key]
            assert got.shape == value.shape and got.dtype == value.dtype, (
                f"{name}[{key!r}]: expected {value.shape} {value.dtype}, got {got.shape} {got.dtype}"
            )
            assert np.all(got == 0), f"{name}[{key!r}] must be zeros"
    assert_unchanged(before, params, "params")
    assert_no_shared_memory(state, params, "init_adamw_state")


@pytest.mark.m07
def test_init_state_m_and_v_are_separate_arrays():
    """Writing into m must never change v (or another key): no shared zeros buffer."""
    params = {"W1": np.ones((2, 3)), "b1": np.ones(3), "W2": np.ones((2, 3)), "b2": np.ones(3)}
    state = init_adamw_state(params)
    assert_no_two_share((state.m, state.v), "m and v (every moment needs its own zeros array)")
    state.m["W1"][0, 0] = 5.0
    assert state.v["W1"][0, 0] == 0.0 and state.m["W2"][0, 0] == 0.0


@pytest.mark.m07
@pytest.mark.parametrize(
    "bad, error",
    [([np.zeros(2)], TypeError), ({}, ValueError), ({"w": np.zeros(2, dtype=np.int64)}, TypeError),
     ({"w": [0.0, 1.0]}, TypeError), ({"w": np.array([np.nan])}, ValueError)],
)
def test_init_state_rejects_bad_params(bad, error):
    with pytest.raises(error, match="params"):
        init_adamw_state(bad)


# ---------------------------------------------------------------------------
# Milestone 08: update_adam_moments
# ---------------------------------------------------------------------------


@pytest.mark.m08
@pytest.mark.parametrize("dtype", DTYPES)
def test_update_moments_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m08")
    inputs, expected = fixture["inputs"], fixture["expected"]
    state = state_from(inputs["state"], dtype)
    grads = as_params(inputs["grads"], dtype)
    before = snapshot((state, grads))
    new = update_adam_moments(state, grads, inputs["beta1"], inputs["beta2"])
    assert isinstance(new, AdamWState), f"expected an AdamWState, got {type(new).__name__}"
    assert new.step == expected["step"], f"step: expected {expected['step']}, got {new.step}"
    assert_params_close(new.m, as_params(expected["m"]), **tolerance(dtype, magnitude=0.0), what="m")
    assert_params_close(new.v, as_params(expected["v"]), **tolerance(dtype, magnitude=0.0), what="v")
    assert_dtypes(new.m, dtype, "m")
    assert_dtypes(new.v, dtype, "v")
    assert_unchanged(before, (state, grads), "state and grads")
    assert_no_shared_memory(new, (state, grads), "update_adam_moments")


@pytest.mark.m08
@given(state_grads=moment_states(), beta1=sts.betas, beta2=sts.betas)
def test_update_moments_ema_formula(state_grads, beta1, beta2):
    state, grads = state_grads
    before = snapshot((state, grads))
    new = update_adam_moments(state, grads, beta1, beta2)
    assert new.step == state.step + 1, f"step: expected {state.step + 1}, got {new.step}"
    dtype = next(iter(grads.values())).dtype.type
    for key in grads:
        m, v, g = (a[key].astype(np.float64) for a in (state.m, state.v, grads))
        assert_close(new.m[key], beta1 * m + (1 - beta1) * g, **tolerance(dtype), what=f"m[{key!r}]")
        assert_close(new.v[key], beta2 * v + (1 - beta2) * g**2, **tolerance(dtype), what=f"v[{key!r}]")
        assert new.m[key].dtype == dtype and new.v[key].dtype == dtype, "the moments must keep the params' dtype"
        assert np.all(new.v[key] >= 0)
    assert_unchanged(before, (state, grads), "state and grads")
    assert_no_shared_memory(new, (state, grads), "update_adam_moments")


@pytest.mark.m08
def test_update_moments_from_zero_with_constant_gradient():
    """From m = v = 0, t updates with the same g give m = (1 - b1^t) g and v = (1 - b2^t) g^2."""
    g = {"w": np.array([2.0, -3.0, 0.5])}
    state = AdamWState(0, {"w": np.zeros(3)}, {"w": np.zeros(3)})
    for t in range(1, 6):
        state = update_adam_moments(state, g, 0.9, 0.999)
        assert state.step == t
        assert_close(state.m["w"], (1 - 0.9**t) * g["w"], what=f"m after {t} updates")
        assert_close(state.v["w"], (1 - 0.999**t) * g["w"] ** 2, what=f"v after {t} updates")


@pytest.mark.m08
def test_update_moments_rejects_bad_inputs():
    state = AdamWState(0, {"w": np.zeros(2)}, {"w": np.zeros(2)})
    grads = {"w": np.ones(2)}
    with pytest.raises(ValueError, match="beta1"):
        update_adam_moments(state, grads, 1.0, 0.999)
    with pytest.raises(ValueError, match="beta2"):
        update_adam_moments(state, grads, 0.9, -0.1)
    with pytest.raises(ValueError, match="grads"):
        update_adam_moments(state, {"u": np.ones(2)}, 0.9, 0.999)
    with pytest.raises(ValueError, match="grads"):
        update_adam_moments(state, {"w": np.ones(3)}, 0.9, 0.999)
    with pytest.raises(ValueError, match="grads"):
        update_adam_moments(state, {"w": np.array([1.0, np.inf])}, 0.9, 0.999)
    with pytest.raises(TypeError, match="state"):
        update_adam_moments((0, state.m, state.v), grads, 0.9, 0.999)


# ---------------------------------------------------------------------------
# Milestone 09: bias_correct_moments
# ---------------------------------------------------------------------------


@pytest.mark.m09
@pytest.mark.parametrize("dtype", DTYPES)
def test_bias_correction_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m09")
    inputs, expected = fixture["inputs"], fixture["expected"]
    state = state_from(inputs["state"], dtype)
    before = snapshot(state)
    m_hat, v_hat = bias_correct_moments(state, inputs["beta1"], inputs["beta2"])
    assert_params_close(m_hat, as_params(expected["m_hat"]), **tolerance(dtype, magnitude=0.0), what="m_hat")
    assert_params_close(v_hat, as_params(expected["v_hat"]), **tolerance(dtype, magnitude=0.0), what="v_hat")
    assert_dtypes(m_hat, dtype, "m_hat")
    assert_dtypes(v_hat, dtype, "v_hat")
    assert_unchanged(before, state, "state")
    assert_no_shared_memory((m_hat, v_hat), state, "bias_correct_moments")


@pytest.mark.m09
@given(state_grads=moment_states(), step=st.integers(1, 200), beta1=sts.betas, beta2=sts.betas)
def test_bias_correction_formula(state_grads, step, beta1, beta2):
    state = state_grads[0]._replace(step=step)
    before = snapshot(state)
    m_hat, v_hat = bias_correct_moments(state, beta1, beta2)
    dtype = next(iter(state.m.values())).dtype.type
    assert list(m_hat) == list(state.m) and list(v_hat) == list(state.v)
    for key in state.m:
        assert_close(m_hat[key], state.m[key].astype(np.float64) / (1 - beta1**step), **tolerance(dtype),
                     what=f"m_hat[{key!r}]")
        assert_close(v_hat[key], state.v[key].astype(np.float64) / (1 - beta2**step), **tolerance(dtype),
                     what=f"v_hat[{key!r}]")
        assert m_hat[key].dtype == dtype and v_hat[key].dtype == dtype, "m_hat and v_hat keep the params' dtype"
    assert_unchanged(before, state, "state")
    assert_no_shared_memory((m_hat, v_hat), state, "bias_correct_moments")


@pytest.mark.m09
@pytest.mark.parametrize("step", [1, 2, 10, 1000])
def test_bias_correction_recovers_a_constant_gradient(step):
    """After t updates from zero with a constant g, m_hat = g and v_hat = g^2 exactly."""
    beta1, beta2 = 0.9, 0.999
    g = np.array([[0.5, -2.0], [3.0, 1e-3]])
    state = AdamWState(step, {"W1": (1 - beta1**step) * g}, {"W1": (1 - beta2**step) * g**2})
    m_hat, v_hat = bias_correct_moments(state, beta1, beta2)
    assert_close(m_hat["W1"], g, rtol=1e-12, what="m_hat")
    assert_close(v_hat["W1"], g**2, rtol=1e-12, what="v_hat")


@pytest.mark.m09
@pytest.mark.parametrize("beta2, step", [(0.999, 1), (0.9999, 1), (0.999, 3), (0.99, 2)])
def test_bias_correction_of_float32_moments_computes_the_correction_in_float64(beta2, step):
    """The correction term ``1 - beta2^t`` in float32 is off by up to 2e-4 relative
    (float32(0.9999) = 0.99989998): computed in float64, the float32 ``v_hat`` is
    rounded once, within two float32 ulps of the exact quotient."""
    v = np.array([1e-6, 0.5, 3.0, 7.25], dtype=np.float32)
    state = AdamWState(step, {"w": np.zeros(4, dtype=np.float32)}, {"w": v.copy()})
    _, v_hat = bias_correct_moments(state, 0.9, beta2)
    exact = v.astype(np.float64) / (1.0 - beta2**step)
    assert v_hat["w"].dtype == np.float32, "v_hat keeps the moments' dtype"
    assert_close(v_hat["w"], exact, rtol=2.5e-7, what=f"float32 v_hat at beta2={beta2}, t={step}")


@pytest.mark.m09
def test_bias_correction_at_step_zero_raises():
    state = AdamWState(0, {"w": np.zeros(2)}, {"w": np.zeros(2)})
    with pytest.raises(ValueError, match="step"):
        bias_correct_moments(state, 0.9, 0.999)


@pytest.mark.m09
def test_bias_correction_rejects_bad_inputs():
    state = AdamWState(1, {"w": np.ones(2)}, {"w": np.ones(2)})
    with pytest.raises(ValueError, match="beta1"):
        bias_correct_moments(state, 1.5, 0.999)
    with pytest.raises(ValueError, match="beta2"):
        bias_correct_moments(state, 0.9, 1.0)
    with pytest.raises(TypeError, match="state"):
        bias_correct_moments({"step": 1, "m": state.m, "v": state.v}, 0.9, 0.999)
    with pytest.raises(ValueError, match="step"):
        bias_correct_moments(state._replace(step=-1), 0.9, 0.999)


# ---------------------------------------------------------------------------
# Milestone 10: adam_param_step
# ---------------------------------------------------------------------------


@pytest.mark.m10
@pytest.mark.parametrize("dtype", DTYPES)
def test_adam_step_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m10")
    inputs = fixture["inputs"]
    params, m_hat, v_hat = (as_params(inputs[name], dtype) for name in ("params", "m_hat", "v_hat"))
    before = snapshot((params, m_hat, v_hat))
    new = adam_param_step(params, m_hat, v_hat, inputs["lr"], inputs["eps"])
    assert_params_close(new, as_params(fixture["expected"]), **tolerance(dtype, magnitude=0.0), what="params")
    assert_dtypes(new, dtype, "params")
    assert_unchanged(before, (params, m_hat, v_hat), "params, m_hat and v_hat")
    assert_no_shared_memory(new, (params, m_hat, v_hat), "adam_param_step")


@pytest.mark.m10
@given(data=st.data(), lr=sts.learning_rates, eps=st.sampled_from([1e-8, 1e-6, 1e-3, 0.5]))
def test_adam_step_formula(data, lr, eps):
    params = data.draw(sts.param_dicts())
    m_hat = data.draw(sts.arrays_like(params, 5.0))
    v_hat = data.draw(sts.arrays_like(params, 25.0, nonneg=True))
    before = snapshot((params, m_hat, v_hat))
    new = adam_param_step(params, m_hat, v_hat, lr, eps)
    dtype = next(iter(params.values())).dtype.type
    assert list(new) == list(params)
    for key in params:
        theta, m, v = (a[key].astype(np.float64) for a in (params, m_hat, v_hat))
        expected = theta - lr * m / (np.sqrt(v) + eps)
        # lr * m / eps can reach 5e8 when v_hat = 0: compare relative to the step size.
        scale = max(1.0, float(np.max(np.abs(expected))))
        assert_close(new[key], expected, **tolerance(dtype, magnitude=scale), what=f"params[{key!r}]")
        assert new[key].dtype == dtype
    assert_unchanged(before, (params, m_hat, v_hat), "params, m_hat and v_hat")
    assert_no_shared_memory(new, (params, m_hat, v_hat), "adam_param_step")


@pytest.mark.m10
def test_adam_step_size_is_about_lr_and_eps_guards_zero():
    params = {"w": np.array([1.0, 1.0, 1.0, 1.0])}
    m_hat = {"w": np.array([4.0, -1e-3, 0.0, 3.0])}
    v_hat = {"w": np.array([16.0, 1e-6, 0.0, 0.0])}
    new = adam_param_step(params, m_hat, v_hat, 0.01, 1e-8)
    # |m_hat| = sqrt(v_hat): a step of lr (up to eps); m_hat = v_hat = 0: no move; v_hat = 0: finite.
    assert_close(new["w"][:3], np.array([1 - 0.01 * 4 / (4 + 1e-8), 1 + 0.01 * 1e-3 / (1e-3 + 1e-8), 1.0]),
                 rtol=1e-14, what="params")
    assert np.isfinite(new["w"][3]) and new["w"][3] == pytest.approx(1 - 0.01 * 3 / 1e-8, rel=1e-12)


@pytest.mark.m10
def test_adam_step_rejects_bad_inputs():
    params = {"w": np.ones(2)}
    m_hat = {"w": np.ones(2)}
    v_hat = {"w": np.ones(2)}
    with pytest.raises(ValueError, match="v_hat"):
        adam_param_step(params, m_hat, {"w": np.array([1.0, -1.0])}, 0.1, 1e-8)
    with pytest.raises(ValueError, match="lr"):
        adam_param_step(params, m_hat, v_hat, 0.0, 1e-8)
    with pytest.raises(ValueError, match="eps"):
        adam_param_step(params, m_hat, v_hat, 0.1, 0.0)
    with pytest.raises(ValueError, match="m_hat"):
        adam_param_step(params, {"u": np.ones(2)}, v_hat, 0.1, 1e-8)
    with pytest.raises(TypeError, match="m_hat"):
        adam_param_step(params, {"w": np.ones(2, dtype=np.float32)}, v_hat, 0.1, 1e-8)
    with pytest.raises(TypeError, match="lr"):
        adam_param_step(params, m_hat, v_hat, "0.1", 1e-8)


# ---------------------------------------------------------------------------
# Milestone 11: decoupled_weight_decay
# ---------------------------------------------------------------------------


@pytest.mark.m11
@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_decay_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m11")
    inputs = fixture["inputs"]
    params = as_params(inputs["params"], dtype)
    before = snapshot(params)
    new = decoupled_weight_decay(params, inputs["lr"], inputs["weight_decay"])
    assert_params_close(new, as_params(fixture["expected"]), **tolerance(dtype, magnitude=0.0), what="params")
    assert_dtypes(new, dtype, "params")
    assert_unchanged(before, params, "params")
    assert_no_shared_memory(new, params, "decoupled_weight_decay")


@pytest.mark.m11
@given(params=sts.param_dicts(), lr=sts.learning_rates, weight_decay=st.floats(0.0, 0.99))
def test_weight_decay_formula(params, lr, weight_decay):
    before = snapshot(params)
    new = decoupled_weight_decay(params, lr, weight_decay)
    dtype = next(iter(params.values())).dtype.type
    assert list(new) == list(params)
    for key, value in params.items():
        assert_close(new[key], value.astype(np.float64) * (1 - lr * weight_decay), **tolerance(dtype),
                     what=f"params[{key!r}]")
        assert new[key].dtype == dtype
    assert_unchanged(before, params, "params")
    assert_no_shared_memory(new, params, "decoupled_weight_decay")


@pytest.mark.m11
@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_decay_zero_returns_a_copy(dtype):
    params = {"W1": np.array([[1.0, -2.0]], dtype=dtype), "b1": np.array([0.5], dtype=dtype)}
    new = decoupled_weight_decay(params, 0.1, 0.0)
    assert_params_close(new, params, rtol=0.0, what="params")
    assert_no_shared_memory(new, params, "decoupled_weight_decay with weight_decay = 0")
    new["W1"][0, 0] = 99.0
    assert params["W1"][0, 0] == 1.0


@pytest.mark.m11
@pytest.mark.parametrize(
    "lr, weight_decay, error, name",
    [(0.0, 0.1, ValueError, "lr"), (-0.1, 0.1, ValueError, "lr"), (0.1, -0.01, ValueError, "weight_decay"),
     (0.5, 2.0, ValueError, "weight_decay"), (1.0, 3.0, ValueError, "weight_decay"),
     (0.1, float("nan"), ValueError, "weight_decay"), (0.1, None, TypeError, "weight_decay")],
)
def test_weight_decay_rejects_bad_hyperparameters(lr, weight_decay, error, name):
    with pytest.raises(error, match=name):
        decoupled_weight_decay({"w": np.ones(2)}, lr, weight_decay)


@pytest.mark.m11
def test_weight_decay_rejects_bad_params():
    with pytest.raises(TypeError, match="params"):
        decoupled_weight_decay([np.ones(2)], 0.1, 0.1)
    with pytest.raises(ValueError, match="params"):
        decoupled_weight_decay({}, 0.1, 0.1)


# ---------------------------------------------------------------------------
# The composed AdamW step (adamw_step calls milestones 08-11). Marker m19: the local
# training step is one forward/backward plus this, and m19 depends on 07-11.
# ---------------------------------------------------------------------------


class TestComposedAdamWStep:
    """``adamw_step`` = update moments, bias-correct, decay the pre-step params, Adam step."""

    @pytest.mark.m19
    @pytest.mark.parametrize("config", [
        AdamWConfig(lr=0.1, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1),
        AdamWConfig(lr=1e-3, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.5),
        AdamWConfig(lr=0.05, beta1=0.0, beta2=0.5, eps=1e-8, weight_decay=0.0),
    ])
    def test_matches_closed_form_over_several_steps(self, config):
        rng = np.random.default_rng(11)
        params = {"W1": rng.standard_normal((3, 4)), "b1": rng.standard_normal(4),
                  "W2": rng.standard_normal((4, 2)), "b2": rng.standard_normal(2)}
        grads_sequence = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(6)]
        theta = expected = params
        state = expected_state = adamw_state(params)
        for t, grads in enumerate(grads_sequence):
            before = snapshot((theta, state, grads))
            new_theta, new_state = adamw_step(theta, state, grads, config)
            assert_unchanged(before, (theta, state, grads), "params, state and grads")
            assert_no_shared_memory((new_theta, new_state), (theta, state, grads), "adamw_step")
            expected, expected_state = adamw_oracle(expected, expected_state, grads, config)
            assert new_state.step == t + 1
            assert_params_close(new_theta, expected, rtol=1e-12, atol=1e-15, what=f"params after step {t + 1}")
            theta, state = new_theta, new_state
        assert_state_close(state, expected_state, rtol=1e-12, atol=1e-15)

    @pytest.mark.m19
    def test_reproduces_torch_adamw_trajectory(self):
        with np.load(FIXTURES / "torch_adamw.npz") as data:
            snap = {key: data[key] for key in data.files}
        lr, beta1, beta2, eps, weight_decay = (float(h) for h in snap["adamw_hyper"])
        config = AdamWConfig(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay)
        keys = ("W1", "b1")
        params = {k: snap[f"adamw_init_{k}"] for k in keys}
        state = adamw_state(params)
        num_steps = snap["adamw_grads_W1"].shape[0]
        for t in range(num_steps):
            grads = {k: snap[f"adamw_grads_{k}"][t] for k in keys}
            params, state = adamw_step(params, state, grads, config)
            assert_params_close(params, {k: snap[f"adamw_params_{k}"][t] for k in keys}, rtol=1e-12,
                                atol=1e-14, what=f"params vs torch.optim.AdamW after step {t + 1}")
            assert_params_close(state.m, {k: snap[f"adamw_m_{k}"][t] for k in keys}, rtol=1e-12, atol=1e-15,
                                what=f"m vs torch exp_avg after step {t + 1}")
            assert_params_close(state.v, {k: snap[f"adamw_v_{k}"][t] for k in keys}, rtol=1e-12, atol=1e-15,
                                what=f"v vs torch exp_avg_sq after step {t + 1}")

    @pytest.mark.m19
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_keeps_dtype_and_first_step_size_is_lr(self, dtype):
        """At step 1, m_hat / sqrt(v_hat) = sign(g): each parameter moves by about lr."""
        config = AdamWConfig(lr=0.01, weight_decay=0.0)
        params = {"w": np.array([1.0, -2.0, 3.0], dtype=dtype)}
        state = adamw_state(params)
        grads = {"w": np.array([1e-3, -5.0, 40.0], dtype=dtype)}
        new, new_state = adamw_step(params, state, grads, config)
        assert new["w"].dtype == dtype and new_state.m["w"].dtype == dtype and new_state.v["w"].dtype == dtype
        # m_hat = g and v_hat = g^2 at step 1, so each move is lr * |g| / (|g| + eps).
        expected = np.array([1 - 0.01 * 1e-3 / (1e-3 + 1e-8), -2 + 0.01 * 5 / (5 + 1e-8), 3 - 0.01 * 40 / (40 + 1e-8)])
        assert_close(new["w"], expected, **tolerance(dtype, magnitude=0.0), what="params after one step")
