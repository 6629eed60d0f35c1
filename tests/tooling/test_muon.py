"""Muon (diloco.methods.muon): the Newton-Schulz iteration worked by hand, its properties,
the optimizer step on gradients whose orthogonalisation is known, purity, dtypes, bad
input, and PyTorch's reference implementation when torch is importable (never a dependency)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco.config import AdamWConfig
from diloco.methods.muon import MuonConfig, MuonState, init_muon, muon_step, newton_schulz, shape_scale

A, B, C = 3.4445, -4.7750, 2.0315


def quintic(x: float, steps: int) -> float:
    """The iteration on one singular value: x -> a x + b x^3 + c x^5."""
    for _ in range(steps):
        x = A * x + B * x**3 + C * x**5
    return x


def test_one_step_on_a_2x2_matrix_worked_by_hand():
    # G = [[1, 2], [0, 2]], ||G||_F = 3, so X0 = G / 3 (eps = 0).
    # A = X0 X0^T = [[5/9, 4/9], [4/9, 4/9]], A^2 = [[41/81, 36/81], [36/81, 32/81]],
    # A X0 = [[5/27, 18/27], [4/27, 16/27]], A^2 X0 = [[41/243, 154/243], [36/243, 136/243]],
    # X1 = a X0 + b A X0 + c A^2 X0.
    expected = np.array([
        [A / 3 + B * 5 / 27 + C * 41 / 243, A * 2 / 3 + B * 18 / 27 + C * 154 / 243],
        [0.0 + B * 4 / 27 + C * 36 / 243, A * 2 / 3 + B * 16 / 27 + C * 136 / 243],
    ])
    mine = newton_schulz(np.array([[1.0, 2.0], [0.0, 2.0]]), steps=1, eps=0.0)
    np.testing.assert_allclose(mine, expected, rtol=1e-13, atol=1e-15, err_msg="mine vs hand-worked X1")


@pytest.mark.parametrize("matrix, diagonal", [
    (np.diag([3.0, 4.0]), (0.6, 0.8)),
    (np.array([[3.0, 0.0], [0.0, 4.0], [0.0, 0.0]]), (0.6, 0.8)),  # tall: transposed inside
    (np.array([[0.0, 5.0, 0.0]]), (1.0,)),                        # one row
])
def test_five_steps_on_diagonal_matrices_follow_the_scalar_quintic(matrix, diagonal):
    mine = newton_schulz(matrix, eps=0.0)
    expected = np.zeros_like(matrix)
    rows, cols = np.nonzero(matrix)
    expected[rows, cols] = [quintic(x, 5) for x in diagonal]
    np.testing.assert_allclose(mine, expected, rtol=1e-12, atol=1e-15)


def test_the_iteration_improves_orthogonality():
    rng = np.random.default_rng(0)
    for shape in [(4, 4), (3, 7), (8, 2), (16, 16)]:
        g = rng.standard_normal(shape)
        small = min(shape)
        before = g / np.linalg.norm(g)
        after = newton_schulz(g)
        gram = (lambda x: x @ x.T) if shape[0] <= shape[1] else (lambda x: x.T @ x)
        error_before = np.linalg.norm(gram(before) - np.eye(small))
        error_after = np.linalg.norm(gram(after) - np.eye(small))
        assert error_after < error_before, (shape, error_before, error_after)
        # Every singular value lands in the band the coefficients were tuned for, however
        # small it started (0.017 for the 16 x 16 matrix).
        singular = np.linalg.svd(after, compute_uv=False)
        assert 0.6 < singular.min() and singular.max() < 1.2, (shape, singular)


matrices = st.tuples(st.integers(1, 6), st.integers(1, 6), st.sampled_from([np.float32, np.float64])).flatmap(
    lambda spec: hnp.arrays(spec[2], spec[:2], elements=st.floats(-10, 10, width=32 if spec[2] == np.float32 else 64)))


@given(matrices)
def test_keeps_the_singular_vectors_dtype_and_transposes(g):
    x = newton_schulz(g)
    assert x.shape == g.shape and x.dtype == g.dtype
    if g.shape[0] != g.shape[1]:  # the tall case transposes to the wide one, bit for bit
        assert np.array_equal(newton_schulz(np.ascontiguousarray(g.T)), x.T)
    # X = U f(S) V^T with f > 0, so G^T X = V S f(S) V^T is symmetric positive semi-definite.
    product = g.astype(np.float64).T @ x.astype(np.float64)
    tol = (1e-3 if g.dtype == np.float32 else 1e-9) * (1.0 + np.abs(g).max())
    np.testing.assert_allclose(product, product.T, atol=tol)
    assert np.linalg.eigvalsh((product + product.T) / 2).min() >= -tol


def test_a_zero_matrix_stays_zero():
    assert np.array_equal(newton_schulz(np.zeros((3, 2))), np.zeros((3, 2)))


def test_shape_scales():
    assert shape_scale((2, 8)) == 2.0 and shape_scale((8, 2)) == 1.0  # sqrt(max(1, fan_out / fan_in))
    assert shape_scale((2, 8), "moonlight") == pytest.approx(0.2 * np.sqrt(8))


def rotation(angle: float) -> np.ndarray:
    return np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])


def test_first_step_on_a_rotation_gradient_and_adamw_on_the_bias():
    lr, mu, wd = 0.1, 0.9, 0.5
    config = MuonConfig(lr=lr, momentum=mu, weight_decay=wd)
    params = {"W1": np.array([[1.0, 2.0], [3.0, 4.0]]), "b1": np.array([0.5, -0.5])}
    q = rotation(0.3)
    grads = {"W1": 2.0 * q, "b1": np.array([0.2, -4.0])}
    new, state = muon_step(params, init_muon(params), grads, config, AdamWConfig(lr=0.01, weight_decay=0.1))
    # Nesterov direction (1 + mu) 2 Q has Frobenius norm (1 + mu) 2 sqrt(2); every singular
    # value of X0 is x0 = 2 (1 + mu) / (2 (1 + mu) sqrt(2) + 1e-7), then five quintic steps.
    x0 = 2 * (1 + mu) / (2 * (1 + mu) * np.sqrt(2) + 1e-7)
    expected_w = params["W1"] * (1 - lr * wd) - lr * 1.0 * quintic(x0, 5) * q
    np.testing.assert_allclose(new["W1"], expected_w, rtol=1e-12)
    # AdamW's first step: m_hat = g, v_hat = g^2, so b' = b (1 - lr wd) - lr g / (|g| + eps).
    g = grads["b1"]
    np.testing.assert_allclose(new["b1"], params["b1"] * (1 - 0.01 * 0.1) - 0.01 * g / (np.abs(g) + 1e-8), rtol=1e-12)
    assert state.step == 1 and np.array_equal(state.momentum["W1"], grads["W1"]) and state.adam.step == 1


def test_momentum_accumulates_and_heavy_ball_orthogonalises_the_buffer():
    rng = np.random.default_rng(1)
    params = {"W1": rng.standard_normal((3, 5)), "b1": np.zeros(5)}
    g1 = {"W1": rng.standard_normal((3, 5)), "b1": rng.standard_normal(5)}
    g2 = {"W1": rng.standard_normal((3, 5)), "b1": rng.standard_normal(5)}
    config = MuonConfig(lr=0.05, momentum=0.8, nesterov=False)
    p1, s1 = muon_step(params, init_muon(params), g1, config)
    p2, s2 = muon_step(p1, s1, g2, config)
    buffer = 0.8 * g1["W1"] + g2["W1"]
    np.testing.assert_array_equal(s2.momentum["W1"], buffer)
    scale = np.sqrt(5 / 3)
    np.testing.assert_allclose(p2["W1"], p1["W1"] - 0.05 * scale * newton_schulz(buffer), rtol=1e-12)
    nesterov, _ = muon_step(p1, s1, g2, MuonConfig(lr=0.05, momentum=0.8))
    np.testing.assert_allclose(nesterov["W1"], p1["W1"] - 0.05 * scale * newton_schulz(g2["W1"] + 0.8 * buffer))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pure_and_dtype_preserving(dtype):
    rng = np.random.default_rng(2)
    params = {"W1": rng.standard_normal((4, 3)).astype(dtype), "b1": rng.standard_normal(3).astype(dtype),
              "W2": rng.standard_normal((3, 2)).astype(dtype), "b2": np.zeros(2, dtype)}
    grads = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in params.items()}
    state = init_muon(params)
    before = copy.deepcopy((params, state, grads))
    new, new_state = muon_step(params, state, grads, MuonConfig(weight_decay=0.1))
    for old, kept in zip((params, grads), before[::2], strict=True):
        assert all(np.array_equal(old[k], kept[k]) for k in old)
    assert all(np.array_equal(state.momentum[k], before[1].momentum[k]) for k in state.momentum)
    assert list(new) == list(params) and list(new_state.momentum) == ["W1", "W2"]
    for key, value in new.items():
        assert value.dtype == dtype and not np.shares_memory(value, params[key])
        assert not np.array_equal(value, params[key])
    assert all(v.dtype == dtype for v in (*new_state.momentum.values(), *new_state.adam.m.values()))


def test_config_keys_choose_the_matrices():
    params = {"W1": np.ones((2, 2)), "b1": np.ones(2), "W2": np.ones((2, 2)), "b2": np.ones(2)}
    state = init_muon(params, MuonConfig(keys=("W2",)))
    assert list(state.momentum) == ["W2"] and list(state.adam.m) == ["W1", "b1", "b2"]
    assert init_muon({"W1": np.ones((2, 2))}).adam is None


def test_bad_input_names_the_argument():
    params = {"W1": np.ones((2, 3)), "b1": np.zeros(3)}
    state, config = init_muon(params), MuonConfig()
    with pytest.raises(ValueError, match="grads"):
        muon_step(params, state, {"W1": np.ones((2, 3))}, config)
    with pytest.raises(ValueError, match="grads"):
        muon_step(params, state, {"W1": np.full((2, 3), np.nan), "b1": np.zeros(3)}, config)
    with pytest.raises(TypeError, match="state"):
        muon_step(params, (0, {}, None), params, config)
    with pytest.raises(TypeError, match="config"):
        muon_step(params, state, params, AdamWConfig())
    with pytest.raises(TypeError, match="adam"):
        muon_step(params, state, params, config, MuonConfig())
    with pytest.raises(ValueError, match="state.momentum"):
        muon_step(params, MuonState(0, {}, state.adam), params, config)
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(np.ones(3))
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(np.ones((2, 2, 2, 2)))
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(np.array([[1.0, np.inf]]))
    with pytest.raises(TypeError, match="matrix"):
        newton_schulz(np.ones((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="steps"):
        newton_schulz(np.ones((2, 2)), steps=0)
    with pytest.raises(ValueError, match="MuonConfig.lr"):
        MuonConfig(lr=0.0)
    with pytest.raises(ValueError, match="MuonConfig.momentum"):
        MuonConfig(momentum=1.0)
    with pytest.raises(ValueError, match="MuonConfig.scale"):
        MuonConfig(scale="adam")
    with pytest.raises(ValueError, match="MuonConfig.weight_decay"):
        MuonConfig(lr=0.5, weight_decay=2.0)
    with pytest.raises(ValueError, match="MuonConfig.ns_steps"):
        MuonConfig(ns_steps=0)
    with pytest.raises(TypeError, match="MuonConfig.keys"):
        MuonConfig(keys="W1")
    with pytest.raises(ValueError, match="MuonConfig.keys"):
        init_muon(params, MuonConfig(keys=("b1",)))


def test_matches_the_pytorch_reference_implementation():
    torch = pytest.importorskip("torch")

    def reference_ns(g, steps=5, eps=1e-7):  # the Muon reference's zeropower_via_newtonschulz5, in float64
        a, b, c = (3.4445, -4.7750, 2.0315)
        x = g / (g.norm() + eps)
        if g.size(0) > g.size(1):
            x = x.T
        for _ in range(steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        return x.T if g.size(0) > g.size(1) else x

    rng = np.random.default_rng(3)
    for shape in [(5, 3), (3, 5), (4, 4)]:
        g = rng.standard_normal(shape)
        np.testing.assert_allclose(newton_schulz(g), reference_ns(torch.from_numpy(g)).numpy(), rtol=1e-10, atol=1e-12)
    # One step of the reference's update on a PyTorch (out, in) weight, our (in, out) transposed.
    weight, grad, buf = (rng.standard_normal((3, 5)) for _ in range(3))
    t_buf = torch.from_numpy(buf.T.copy()) * 0.95 + torch.from_numpy(grad.T.copy())
    update = torch.from_numpy(grad.T.copy()) + 0.95 * t_buf
    t_weight = torch.from_numpy(weight.T.copy()) * (1 - 0.02 * 0.1)
    t_weight -= 0.02 * max(1, update.size(-2) / update.size(-1)) ** 0.5 * reference_ns(update)
    params, grads = {"W1": weight}, {"W1": grad}
    new, _ = muon_step(params, MuonState(0, {"W1": buf}, None), grads, MuonConfig(weight_decay=0.1))
    np.testing.assert_allclose(new["W1"], t_weight.numpy().T, rtol=1e-10, atol=1e-12)


def test_the_reference_implementations_ema_form_is_the_same_step():
    """The Muon reference's current form (``momentum.lerp_(grad, 1 - beta)``, ``grad.lerp_(momentum,
    beta)``) keeps B' = beta B + (1 - beta) G and orthogonalises (1 - beta) G + beta B'. With
    B_ema = (1 - beta) B_sum that is (1 - beta) (G + beta B_sum'): our direction times a positive
    scalar, which the Frobenius normalisation removes (up to eps). Written out here in NumPy."""
    rng = np.random.default_rng(7)
    beta, lr = 0.95, 0.02
    weight = rng.standard_normal((3, 5))
    params, state = {"W1": weight}, init_muon({"W1": weight})
    ema = np.zeros((3, 5))
    for _ in range(4):
        grad = rng.standard_normal((3, 5))
        ema = ema + (1 - beta) * (grad - ema)                # momentum.lerp_(grad, 1 - beta)
        update = grad + beta * (ema - grad)                  # grad.lerp_(momentum, beta)
        weight = weight - lr * np.sqrt(max(1, 5 / 3)) * newton_schulz(update, eps=0.0)
        params, state = muon_step(params, state, {"W1": grad}, MuonConfig(lr=lr, momentum=beta))
    np.testing.assert_allclose(params["W1"], weight, rtol=1e-6, atol=1e-6)


def test_a_stack_is_its_matrices_one_by_one():
    rng = np.random.default_rng(8)
    for shape in [(3, 4, 6), (2, 7, 3), (1, 5, 5)]:
        stack = rng.standard_normal(shape)
        each = np.stack([newton_schulz(m) for m in stack])
        np.testing.assert_allclose(newton_schulz(stack), each, rtol=1e-12, atol=1e-14)
    stack = rng.standard_normal((2, 3, 3)).astype(np.float32)
    assert newton_schulz(stack).dtype == np.float32
