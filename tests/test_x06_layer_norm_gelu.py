"""Exercise x06 (optional, outside the 30): LayerNorm and GELU, forward and backward.

``layer_norm``, ``layer_norm_backward``, ``gelu`` and ``gelu_backward`` in
``diloco.models.layers`` are the transformer's own (three LayerNorms and one GELU per block).
Expected values are hand-worked (``tests/fixtures/x06.json``), or come from the row-by-row
oracles of ``tests/transformer_oracles.py`` and their central finite differences in float64,
never from the package. The backward tests build the forward's cache with the oracle, so a
slip in a forward fails its own test only.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import transformer_oracles as oracle
from diloco.models.layers import gelu, gelu_backward, layer_norm, layer_norm_backward
from helpers import DTYPES, assert_close, load_fixture

pytestmark = pytest.mark.x06


def tol(dtype):
    return dict(rtol=2e-6, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)


def rows(seed, n=5, d=6, spread=3.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * spread + rng.standard_normal((n, 1)) * 4
    return x, 1.0 + 0.5 * rng.standard_normal(d), 0.5 * rng.standard_normal(d), rng.standard_normal((n, d))


# --------------------------------------------------------------------------- LayerNorm


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x06")
    inputs, expected = fixture["inputs"], fixture["expected"]
    out, (x_hat, inv_std) = layer_norm(*(np.array(inputs[key], dtype=dtype) for key in ("x", "gain", "bias")))
    assert_close(out, np.array(expected["out"]), **tol(dtype), what="LayerNorm(x)")
    assert_close(x_hat, np.array(expected["x_hat"]), **tol(dtype), what="x_hat (cached)")
    assert_close(inv_std, np.array(expected["inv_std"]), **tol(dtype), what="inv_std (cached, (N, 1))")
    assert out.dtype == x_hat.dtype == inv_std.dtype == dtype


def test_layer_norm_divides_by_the_biased_variance():
    """Row (1, 2, 3, 6): deviations (-2, -1, 0, 3), variance 14 / 4 = 3.5 (divide by d, not d - 1)."""
    out, (_, inv_std) = layer_norm(np.array([[1.0, 2.0, 3.0, 6.0]]), np.ones(4), np.zeros(4))
    assert_close(inv_std, [[1 / np.sqrt(3.5)]], rtol=1e-4, what="inv_std = 1 / sqrt(3.5 + eps), about 1 / sqrt(3.5)")
    assert_close(out, np.array([[-2.0, -1.0, 0.0, 3.0]]) / np.sqrt(3.5), rtol=1e-4, what="LayerNorm")


def test_eps_sits_inside_the_square_root():
    """A constant row has variance 0: 1 / sqrt(0 + eps) = 316.2, where 1 / (sqrt(0) + eps) = 100000."""
    out, (x_hat, inv_std) = layer_norm(np.array([[0.5, 0.5, 0.5, 0.5]]), np.ones(4), np.full(4, 0.25))
    assert_close(inv_std, [[1 / np.sqrt(1e-5)]], rtol=1e-10, what="inv_std of a constant row = 1 / sqrt(eps)")
    assert_close(out, np.full((1, 4), 0.25), rtol=1e-12, what="LayerNorm of a constant row (the bias)")


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 6), d=st.integers(2, 9), shift=st.floats(-100, 100))
def test_layer_norm_matches_the_oracle_and_ignores_a_row_shift(seed, n, d, shift):
    x, gain, bias, _ = rows(seed, n, d)
    out, (x_hat, inv_std) = layer_norm(x, gain, bias)
    expected, expected_hat, expected_inv = oracle.layer_norm(x, gain, bias)
    assert_close(out, expected, rtol=1e-10, atol=1e-12, what="LayerNorm(x)")
    assert_close(x_hat, expected_hat, rtol=1e-10, atol=1e-12, what="x_hat")
    assert_close(inv_std, expected_inv, rtol=1e-10, what="inv_std")
    shifted, _ = layer_norm(x + shift, gain, bias)
    assert_close(shifted, out, rtol=1e-7, atol=1e-8, what="LayerNorm(x + c)")


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_backward_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x06")
    inputs, expected = fixture["inputs"], fixture["expected"]
    cache = (np.array(expected["x_hat"], dtype=dtype), np.array(expected["inv_std"], dtype=dtype))
    dx, dgain, dbias = layer_norm_backward(np.array(inputs["dy"], dtype=dtype), np.array(inputs["gain"], dtype=dtype),
                                           cache)
    assert_close(dx, np.array(expected["dx"]), **tol(dtype), what="dx")
    assert_close(dgain, np.array(expected["dgain"]), **tol(dtype), what="dgain")
    assert_close(dbias, np.array(expected["dbias"]), **tol(dtype), what="dbias")
    assert dx.dtype == dgain.dtype == dbias.dtype == dtype


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layer_norm_backward_matches_finite_differences(seed):
    x, gain, bias, dy = rows(seed)
    _, x_hat, inv_std = oracle.layer_norm(x, gain, bias)
    dx, dgain, dbias = layer_norm_backward(dy, gain, (x_hat, inv_std))
    loss = lambda x_, g_, b_: float(np.sum(dy * oracle.layer_norm(x_, g_, b_)[0]))  # noqa: E731
    assert_close(dx, oracle.numeric_grad(lambda v: loss(v, gain, bias), x), rtol=1e-6, atol=1e-8, what="dx")
    assert_close(dgain, oracle.numeric_grad(lambda v: loss(x, v, bias), gain), rtol=1e-6, atol=1e-8, what="dgain")
    assert_close(dbias, oracle.numeric_grad(lambda v: loss(x, gain, v), bias), rtol=1e-6, atol=1e-8, what="dbias")


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 6), d=st.integers(2, 9))
def test_layer_norm_dx_sums_to_zero_in_every_row(seed, n, d):
    """LayerNorm ignores a constant added to a row, so each row of dx sums to 0 (the mean(dx_hat) term)."""
    x, gain, bias, dy = rows(seed, n, d)
    _, x_hat, inv_std = oracle.layer_norm(x, gain, bias)
    dx, _, _ = layer_norm_backward(dy, gain, (x_hat, inv_std))
    scale = np.abs(dx).max() + 1.0
    assert_close(dx.sum(axis=1) / scale, np.zeros(n), atol=1e-12, what="row sums of dx (relative)")


def test_layer_norm_permuting_rows_permutes_everything_and_float32_stays_float32():
    x, gain, bias, dy = (a.astype(np.float32) for a in rows(4))
    before = x.copy()
    out, (x_hat, inv_std) = layer_norm(x, gain, bias)
    assert out.dtype == x_hat.dtype == inv_std.dtype == np.float32 and np.array_equal(x, before)
    order = np.array([3, 1, 4, 0, 2])
    permuted, _ = layer_norm(x[order], gain, bias)
    assert_close(permuted, out[order], rtol=1e-6, atol=1e-6, what="LayerNorm of permuted rows")
    dx, dgain, dbias = layer_norm_backward(dy, gain, (x_hat, inv_std))
    assert dx.dtype == dgain.dtype == dbias.dtype == np.float32
    dx_p, dgain_p, _ = layer_norm_backward(dy[order], gain, (x_hat[order], inv_std[order]))
    assert_close(dx_p, dx[order], rtol=1e-5, atol=1e-6, what="dx of permuted rows")
    assert_close(dgain_p, dgain, rtol=1e-5, atol=1e-5, what="dgain of permuted rows")


# --------------------------------------------------------------------------- GELU


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x06")
    inputs, expected = fixture["inputs"], fixture["expected"]
    out, s = gelu(np.array(inputs["u"], dtype=dtype))
    assert_close(out, np.array(expected["gelu"]), **tol(dtype), what="GELU(u), tanh form")
    assert_close(s, np.array(expected["gelu_s"]), **tol(dtype), what="s = (1 + tanh z) / 2 (cached)")
    du = gelu_backward(np.array(inputs["gelu_dy"], dtype=dtype), np.array(inputs["u"], dtype=dtype),
                       np.array(expected["gelu_s"], dtype=dtype))
    assert_close(du, np.array(expected["gelu_du"]), **tol(dtype), what="dy * GELU'(u)")
    assert out.dtype == s.dtype == du.dtype == dtype


@given(u=hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(-8, 8)))
def test_gelu_matches_the_tanh_form(u):
    out, s = gelu(u)
    expected, expected_s = oracle.gelu(u)
    assert_close(out, expected, rtol=1e-12, atol=1e-14, what="GELU(u)")
    assert_close(s, expected_s, rtol=1e-12, atol=1e-14, what="s")


@given(u=hnp.arrays(np.float64, st.integers(1, 30), elements=st.floats(-6, 6)), seed=st.integers(0, 2**32 - 1))
def test_gelu_backward_matches_finite_differences(u, seed):
    dy = np.random.default_rng(seed).standard_normal(u.shape)
    _, s = oracle.gelu(u)
    expected = oracle.numeric_grad(lambda v: float(np.sum(dy * oracle.gelu(v)[0])), u)
    assert_close(gelu_backward(dy, u, s), expected, rtol=1e-6, atol=1e-8, what="dy * GELU'(u)")


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_is_finite_far_from_zero(dtype):
    """GELU(u) -> u for large u and -> 0 for very negative u, with no overflow escaping."""
    u = np.array([[-60.0, -20.0, 20.0, 60.0]], dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out, s = gelu(u)
        du = gelu_backward(np.ones_like(u), u, s)
    assert_close(out, [[0.0, 0.0, 20.0, 60.0]], rtol=1e-6, atol=1e-6, what="GELU far from 0")
    assert_close(du, [[0.0, 0.0, 1.0, 1.0]], rtol=1e-6, atol=1e-6, what="GELU' far from 0")
    assert out.dtype == dtype and du.dtype == dtype
