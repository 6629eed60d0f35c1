"""Part 5 - the outer optimizer: milestones 21-24.

PyTorch ``SGD(lr, momentum=mu, nesterov=True)`` semantics, written out in NumPy here::

    buf = mu * buf + g          # milestone 22 (dampening 0)
    update = g + mu * buf       # milestone 23 (nesterov=False: update = buf)
    p = p - lr * update

Expected values are hand-worked (``tests/fixtures/m21.json`` .. ``m24.json``) or come
from plain-NumPy oracles written here, never from the package itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from diloco.outer import (
    OuterState,
    compute_outer_gradient,
    init_outer_optimizer,
    nesterov_param_update,
    update_outer_momentum,
)
from helpers import (
    HALF_EXAMPLES,
    as_params,
    assert_close,
    assert_no_shared_memory,
    assert_params_close,
    assert_unchanged,
    load_fixture,
    snapshot,
    tolerance,
)
from strategies import learning_rates, momenta, param_dict_family, param_dicts


def assert_close_in_dtype(got, expected, what):
    """Dict of arrays: same keys, shapes and dtypes as ``expected`` and close to it."""
    assert list(got) == list(expected), f"{what}: expected keys {list(expected)}, got {list(got)}"
    for key in expected:
        assert got[key].dtype == expected[key].dtype, (
            f"{what}[{key!r}]: expected dtype {expected[key].dtype}, got {got[key].dtype}")
        tol = tolerance(expected[key].dtype)
        assert_close(got[key], expected[key], **tol, what=f"{what}[{key!r}]")


def family_with_momentum(family):
    """(params, outer_grad, momentum buffer) from a family of three same-shaped dicts."""
    return family[0], family[1], OuterState(momentum=family[2])


# --------------------------------------------------------------------------- m21 init_outer_optimizer


@pytest.mark.m21
def test_init_outer_optimizer_fixture():
    fixture = load_fixture("m21")
    state = init_outer_optimizer(as_params(fixture["inputs"]["params"]))
    assert isinstance(state, OuterState), f"expected an OuterState, got {type(state).__name__}"
    assert_params_close(state.momentum, as_params(fixture["expected"]["momentum"]), rtol=0, what="momentum")


@pytest.mark.m21
@given(params=param_dicts())
def test_init_outer_optimizer_zeros_shaped_like_params(params):
    before = snapshot(params)
    state = init_outer_optimizer(params)
    assert_unchanged(before, params, "params")
    assert_no_shared_memory(state, params, "init_outer_optimizer")
    assert isinstance(state, OuterState)
    assert list(state.momentum) == list(params), f"momentum keys {list(state.momentum)} != {list(params)}"
    for key, value in params.items():
        assert state.momentum[key].shape == value.shape and state.momentum[key].dtype == value.dtype, (
            f"momentum[{key!r}]: expected {value.shape} {value.dtype}, "
            f"got {state.momentum[key].shape} {state.momentum[key].dtype}")
        assert np.all(state.momentum[key] == 0.0), f"momentum[{key!r}] must start at 0"


@pytest.mark.m21
def test_init_outer_optimizer_buffer_is_independent_of_params():
    params = {"W1": np.ones((2, 2), np.float32), "b1": np.ones(2, np.float32)}
    state = init_outer_optimizer(params)
    state.momentum["W1"][...] = 5.0
    assert np.all(params["W1"] == 1.0), "writing to the momentum buffer changed params"
    assert state.momentum["b1"].dtype == np.float32


@pytest.mark.m21
def test_init_outer_optimizer_calls_are_independent():
    params = {"W1": np.array([[1.0, -2.0]]), "b1": np.array([3.0])}
    first, second = init_outer_optimizer(params), init_outer_optimizer(params)
    first.momentum["W1"][...] = 7.0
    assert np.all(second.momentum["W1"] == 0.0), "two outer states share one buffer (a cached dict?)"
    assert_no_shared_memory(first, second, "init_outer_optimizer called twice")


@pytest.mark.m21
def test_init_outer_optimizer_rejects_bad_input():
    with pytest.raises(ValueError, match="params"):
        init_outer_optimizer({})
    with pytest.raises(TypeError, match="params"):
        init_outer_optimizer([np.ones(2)])
    with pytest.raises(TypeError, match="params"):
        init_outer_optimizer({"W1": np.ones(2, dtype=np.int32)})


# --------------------------------------------------------------------------- m22 update_outer_momentum


@pytest.mark.m22
def test_update_outer_momentum_fixture():
    fixture = load_fixture("m22")
    inputs = fixture["inputs"]
    state = OuterState(momentum=as_params(inputs["outer_state"]["momentum"]))
    got = update_outer_momentum(state, as_params(inputs["outer_grad"]), inputs["momentum"])
    assert isinstance(got, OuterState), f"expected an OuterState, got {type(got).__name__}"
    assert_params_close(got.momentum, as_params(fixture["expected"]["momentum"]), what="momentum")


@pytest.mark.m22
@given(family=param_dict_family(count=2), mu=momenta)
@HALF_EXAMPLES
def test_update_outer_momentum_matches_formula(family, mu):
    buffer, outer_grad = family
    state = OuterState(momentum=buffer)
    before = snapshot((state, outer_grad))
    got = update_outer_momentum(state, outer_grad, mu)
    assert_unchanged(before, (state, outer_grad), "outer_state, outer_grad")
    assert_no_shared_memory(got, (state, outer_grad), "update_outer_momentum")
    expected = {k: buffer[k] * buffer[k].dtype.type(mu) + outer_grad[k] for k in buffer}
    assert_close_in_dtype(got.momentum, expected, "momentum")


@pytest.mark.m22
@given(outer_grad=param_dicts())
def test_update_outer_momentum_from_zero_is_the_gradient(outer_grad):
    zeros = OuterState(momentum={k: np.zeros_like(v) for k, v in outer_grad.items()})
    for mu in (0.0, 0.9):
        got = update_outer_momentum(zeros, outer_grad, mu)
        assert_params_close(got.momentum, outer_grad, rtol=0, what=f"first buffer (mu={mu}, no dampening)")
        assert_no_shared_memory(got, outer_grad, "update_outer_momentum")


@pytest.mark.m22
def test_update_outer_momentum_over_several_rounds_matches_pytorch():
    # PyTorch SGD with dampening 0: buf_1 = g_1, buf_t = mu buf_{t-1} + g_t,
    # so buf_T = sum_t mu^(T - t) g_t.
    rng = np.random.default_rng(0)
    grads = [{"W1": rng.normal(size=(3, 2)), "b1": rng.normal(size=2)} for _ in range(5)]
    mu = 0.9
    state = OuterState(momentum={k: np.zeros_like(v) for k, v in grads[0].items()})
    for t, g in enumerate(grads, start=1):
        state = update_outer_momentum(state, g, mu)
        closed_form = {k: sum(mu ** (t - s) * grads[s - 1][k] for s in range(1, t + 1)) for k in g}
        assert_params_close(state.momentum, closed_form, rtol=1e-12, atol=1e-14, what=f"buffer after round {t}")


@pytest.mark.m22
@pytest.mark.parametrize("mu", [0.5, np.float64(0.5), np.float32(0.5)])
def test_update_outer_momentum_keeps_float32(mu):
    state = OuterState(momentum={"W1": np.array([[1.0, -2.0]], np.float32)})
    got = update_outer_momentum(state, {"W1": np.array([[0.5, 0.5]], np.float32)}, mu)
    assert got.momentum["W1"].dtype == np.float32, f"expected float32, got {got.momentum['W1'].dtype}"
    assert_close(got.momentum["W1"], np.array([[1.0, -0.5]]), rtol=0, what="momentum['W1']")


@pytest.mark.m22
def test_update_outer_momentum_rejects_bad_input():
    grad = {"W1": np.ones((2, 2))}
    state = OuterState(momentum={"W1": np.zeros((2, 2))})
    with pytest.raises(ValueError, match="momentum"):
        update_outer_momentum(state, grad, 1.0)
    with pytest.raises(ValueError, match="momentum"):
        update_outer_momentum(state, grad, -0.1)
    with pytest.raises(TypeError, match="outer_state"):
        update_outer_momentum({"W1": np.zeros((2, 2))}, grad, 0.9)
    with pytest.raises(ValueError, match="outer_state"):
        update_outer_momentum(OuterState(momentum={"W1": np.zeros((2, 3))}), grad, 0.9)
    with pytest.raises(ValueError, match="outer_grad"):
        update_outer_momentum(state, {"W1": np.full((2, 2), np.nan)}, 0.9)


# Keys in no sorted order: a result built from sorted keys shows here (W1, b1 are sorted already).
UNSORTED = ("b2", "W2", "b1", "W1")


def unsorted(value: float) -> dict:
    return {key: np.full(2, value) for key in UNSORTED}


@pytest.mark.m22
def test_update_outer_momentum_keeps_the_key_order_of_the_pseudo_gradient():
    state = update_outer_momentum(OuterState(momentum=unsorted(1.0)), unsorted(2.0), 0.5)
    assert list(state.momentum) == list(UNSORTED), (
        f"momentum keys: expected the order of outer_grad {list(UNSORTED)}, got {list(state.momentum)}")
    assert_close(state.momentum["b2"], np.full(2, 2.5), rtol=0, what="0.5 * 1 + 2")


# --------------------------------------------------------------------------- m23 nesterov_param_update


@pytest.mark.m23
def test_nesterov_param_update_fixture():
    fixture = load_fixture("m23")
    inputs = fixture["inputs"]
    got = nesterov_param_update(as_params(inputs["params"]), as_params(inputs["outer_grad"]),
                                OuterState(momentum=as_params(inputs["outer_state"]["momentum"])),
                                inputs["lr"], inputs["momentum"])
    assert_params_close(got, as_params(fixture["expected"]["params"]), what="new params")


@pytest.mark.m23
@given(family=param_dict_family(count=3), lr=learning_rates, mu=momenta)
@HALF_EXAMPLES
def test_nesterov_param_update_matches_formula(family, lr, mu):
    params, outer_grad, state = family_with_momentum(family)
    before = snapshot((params, outer_grad, state))
    nesterov = nesterov_param_update(params, outer_grad, state, lr, mu)
    heavy_ball = nesterov_param_update(params, outer_grad, state, lr, mu, nesterov=False)
    assert_unchanged(before, (params, outer_grad, state), "params, outer_grad, outer_state")
    assert_no_shared_memory([nesterov, heavy_ball], (params, outer_grad, state), "nesterov_param_update")
    dtype = params[next(iter(params))].dtype.type
    lr_, mu_ = dtype(lr), dtype(mu)
    buffer = state.momentum
    assert_close_in_dtype(nesterov, {k: params[k] - lr_ * (outer_grad[k] + mu_ * buffer[k]) for k in params},
                          "Nesterov step theta - lr (delta + mu m)")
    assert_close_in_dtype(heavy_ball, {k: params[k] - lr_ * buffer[k] for k in params},
                          "heavy-ball step theta - lr m")


@pytest.mark.m23
@given(family=param_dict_family(count=3), lr=learning_rates)
@HALF_EXAMPLES
def test_nesterov_param_update_without_momentum_is_sgd(family, lr):
    params, outer_grad, state = family_with_momentum(family)
    got = nesterov_param_update(params, outer_grad, state, lr, 0.0)
    dtype = params[next(iter(params))].dtype.type
    assert_close_in_dtype(got, {k: params[k] - dtype(lr) * outer_grad[k] for k in params}, "mu = 0 step")


@pytest.mark.m23
@given(family=param_dict_family(count=4))
@HALF_EXAMPLES
def test_nesterov_param_update_fedavg(family):
    # Outer lr 1 and momentum 0 make the new global params the workers' average. The
    # pseudo-gradient is computed here in NumPy, so this test uses milestone 23 only.
    global_params, workers = family[0], family[1:]
    average = {k: np.mean([w[k].astype(np.float64) for w in workers], axis=0) for k in global_params}
    outer_grad = {k: (global_params[k] - average[k]).astype(global_params[k].dtype) for k in global_params}
    buffer = OuterState(momentum={k: v.copy() for k, v in outer_grad.items()})  # m = 0 m + delta
    got = nesterov_param_update(global_params, outer_grad, buffer, 1.0, 0.0)
    for key in global_params:
        assert_close(got[key], average[key], **tolerance(global_params[key].dtype), what=f"FedAvg params[{key!r}]")


@pytest.mark.m23
@pytest.mark.parametrize("nesterov", [True, False])
def test_nesterov_param_update_over_several_rounds_matches_pytorch_sgd(nesterov):
    # torch.optim.SGD(lr, momentum=mu, nesterov=...), dampening 0, written out step by step.
    # The buffer is maintained here in NumPy (milestone 22's job) and handed to milestone 23.
    rng = np.random.default_rng(1)
    lr, mu = 0.7, 0.9
    params = {"W1": rng.normal(size=(3, 2)), "b1": rng.normal(size=2)}
    expected = {k: v.copy() for k, v in params.items()}
    buffer = {k: np.zeros_like(v) for k, v in params.items()}
    for round_ in range(6):
        grad = {k: rng.normal(size=v.shape) for k, v in params.items()}
        buffer = {k: mu * buffer[k] + grad[k] for k in grad}
        update = {k: grad[k] + mu * buffer[k] if nesterov else buffer[k] for k in grad}
        expected = {k: expected[k] - lr * update[k] for k in grad}
        params = nesterov_param_update(params, grad, OuterState(momentum=buffer), lr, mu, nesterov=nesterov)
        assert_params_close(params, expected, rtol=1e-12, atol=1e-13, what=f"params after round {round_ + 1}")


@pytest.mark.m23
def test_nesterov_param_update_keeps_float32():
    params = {"W1": np.array([[1.0, 2.0]], np.float32)}
    grad = {"W1": np.array([[0.5, -1.0]], np.float32)}
    state = OuterState(momentum={"W1": np.array([[1.0, -1.0]], np.float32)})
    for lr, mu in ((0.5, 0.5), (np.float64(0.5), np.float64(0.5))):
        got = nesterov_param_update(params, grad, state, lr, mu)
        assert got["W1"].dtype == np.float32, f"expected float32, got {got['W1'].dtype}"
        assert_close(got["W1"], np.array([[0.5, 2.75]]), rtol=0, what="params['W1']")


@pytest.mark.m23
def test_nesterov_param_update_rejects_bad_input():
    params = {"W1": np.ones((2, 2))}
    grad = {"W1": np.ones((2, 2))}
    state = OuterState(momentum={"W1": np.zeros((2, 2))})
    with pytest.raises(ValueError, match="lr"):
        nesterov_param_update(params, grad, state, 0.0, 0.9)
    with pytest.raises(ValueError, match="momentum"):
        nesterov_param_update(params, grad, state, 0.7, 1.5)
    with pytest.raises(TypeError, match="nesterov"):
        nesterov_param_update(params, grad, state, 0.7, 0.9, nesterov="yes")
    with pytest.raises(ValueError, match="outer_grad"):
        nesterov_param_update(params, {"W1": np.ones((1, 2))}, state, 0.7, 0.9)
    with pytest.raises(TypeError, match="outer_state"):
        nesterov_param_update(params, grad, {"W1": np.zeros((2, 2))}, 0.7, 0.9)


@pytest.mark.m23
@pytest.mark.parametrize("nesterov", [True, False])
def test_nesterov_param_update_keeps_the_key_order_of_params(nesterov):
    got = nesterov_param_update(unsorted(1.0), unsorted(0.5), OuterState(momentum=unsorted(1.0)), 0.5, 0.5,
                                nesterov=nesterov)
    assert list(got) == list(UNSORTED), f"keys: expected the order of params {list(UNSORTED)}, got {list(got)}"


# --------------------------------------------------------------------------- m24 compute_outer_gradient


def oracle_pseudo_gradient(global_params, workers, weights=None):
    weights = np.ones(len(workers)) if weights is None else np.asarray(weights, dtype=np.float64)
    weights = weights / weights.sum()
    return {k: sum(w * (global_params[k].astype(np.float64) - worker[k])
                   for w, worker in zip(weights, workers, strict=True))
            for k in global_params}


@pytest.mark.m24
def test_compute_outer_gradient_fixture():
    fixture = load_fixture("m24")
    inputs = fixture["inputs"]
    got = compute_outer_gradient(as_params(inputs["global_params"]),
                                 [as_params(w) for w in inputs["worker_params_list"]])
    assert_params_close(got, as_params(fixture["expected"]["outer_grad"]), atol=1e-15, what="pseudo-gradient")


@pytest.mark.m24
def test_compute_outer_gradient_is_old_minus_new():
    global_params = {"W1": np.zeros((2, 2)), "b1": np.zeros(2)}
    moved_up = {k: v + 1.0 for k, v in global_params.items()}
    got = compute_outer_gradient(global_params, [moved_up])
    for key in got:
        assert np.all(got[key] == -1.0), (
            f"a worker that moved +1 gives delta = old - new = -1, got {got[key]} for {key!r}")


@pytest.mark.m24
@given(family=param_dict_family())
@HALF_EXAMPLES
def test_compute_outer_gradient_uniform_by_default(family):
    global_params, workers = family[0], family[1:]
    before = snapshot((global_params, workers))
    got = compute_outer_gradient(global_params, workers)
    assert_unchanged(before, (global_params, workers), "global_params, worker_params_list")
    assert_no_shared_memory(got, (global_params, workers), "compute_outer_gradient")
    expected = oracle_pseudo_gradient(global_params, workers)
    assert_close_in_dtype(got, {k: expected[k].astype(global_params[k].dtype) for k in expected},
                          "pseudo-gradient")
    explicit = compute_outer_gradient(global_params, workers, [1.0] * len(workers))
    assert_close_in_dtype(explicit, got, "pseudo-gradient with explicit uniform weights")


@pytest.mark.m24
@given(family=param_dict_family(count=4))
@HALF_EXAMPLES
def test_compute_outer_gradient_weighted_and_normalised(family):
    global_params, workers = family[0], family[1:]
    weights = [1.0, 0.0, 3.0]
    got = compute_outer_gradient(global_params, workers, weights)
    expected = oracle_pseudo_gradient(global_params, workers, weights)
    assert_close_in_dtype(got, {k: expected[k].astype(global_params[k].dtype) for k in expected},
                          "weighted pseudo-gradient")
    tripled = compute_outer_gradient(global_params, workers, [3.0 * w for w in weights])
    assert_close_in_dtype(tripled, got, "pseudo-gradient with weights x3")


@pytest.mark.m24
@given(family=param_dict_family(count=2))
@HALF_EXAMPLES
def test_compute_outer_gradient_single_worker(family):
    global_params, worker = family
    got = compute_outer_gradient(global_params, [worker])
    for key in global_params:
        assert np.array_equal(got[key], global_params[key] - worker[key]), (
            f"one worker: delta[{key!r}] must be global - worker, got {got[key]}")
        assert got[key].dtype == global_params[key].dtype


@pytest.mark.m24
@given(family=param_dict_family(count=4))
@HALF_EXAMPLES
def test_compute_outer_gradient_fedavg_identity(family):
    # global - delta is the workers' average: the FedAvg step with outer lr 1, momentum 0.
    global_params, workers = family[0], family[1:]
    got = compute_outer_gradient(global_params, workers)
    for key in global_params:
        average = np.mean([w[key].astype(np.float64) for w in workers], axis=0)
        tol = tolerance(global_params[key].dtype)
        assert_close(global_params[key] - got[key], average, **tol, what=f"global - delta[{key!r}]")


@pytest.mark.m24
@given(params=param_dicts())
@HALF_EXAMPLES
def test_compute_outer_gradient_of_unmoved_workers_is_zero(params):
    workers = [{k: v.copy() for k, v in params.items()} for _ in range(3)]
    got = compute_outer_gradient(params, workers)
    for key in params:
        tol = tolerance(params[key].dtype)
        assert_close(got[key], np.zeros_like(params[key]), **tol, what=f"delta[{key!r}]")


@pytest.mark.m24
def test_compute_outer_gradient_rejects_bad_input():
    global_params = {"W1": np.ones((2, 2))}
    with pytest.raises(ValueError, match="worker_params_list"):
        compute_outer_gradient(global_params, [])
    with pytest.raises(ValueError, match=r"worker_params_list\[1\]"):
        compute_outer_gradient(global_params, [global_params, {"W1": np.ones((2, 3))}])
    with pytest.raises(TypeError, match="worker_params_list"):
        compute_outer_gradient(global_params, global_params)
    with pytest.raises(ValueError, match="weights"):
        compute_outer_gradient(global_params, [global_params, global_params], [1.0, -1.0])
    with pytest.raises(TypeError, match="global_params"):
        compute_outer_gradient(None, [global_params])
