"""Exercise x05 (optional, outside the 30): attention's backward pass.

``attention_backward`` in ``diloco.models.layers`` is the transformer's own (every block's
backward calls it). Its inputs (q, k, v by head and P in row blocks) are made here by the
per-position oracle of ``tests/transformer_oracles.py``, so these tests never run your
``causal_attention`` (exercise x04). Expected values are hand-worked
(``tests/fixtures/x05.json``) or central finite differences of that oracle, in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import transformer_oracles as oracle
from diloco.models.layers import attention_backward, row_blocks
from helpers import DTYPES, assert_close, load_fixture

pytestmark = pytest.mark.x05


def case(seed, batch, length, n_heads, head_dim, dtype=np.float64, scale=1.0):
    """``(qkv_flat, qkv, probs, dout)`` of a random attention, the forward's values by the oracle."""
    rng = np.random.default_rng(seed)
    qkv_flat = rng.standard_normal((batch * length, 3 * n_heads * head_dim)) * scale
    _, probs = oracle.attention(qkv_flat, batch, n_heads)
    qkv = oracle.heads_of(qkv_flat, batch, n_heads)
    dout = rng.standard_normal((batch * length, n_heads * head_dim))
    blocks = oracle.in_blocks(probs, row_blocks(length))
    return (qkv_flat.astype(dtype), qkv.astype(dtype), tuple(b.astype(dtype) for b in blocks), dout.astype(dtype))


def finite_differences(qkv_flat, dout, batch, n_heads):
    """``d/d qkv_flat`` of ``sum(dout * out(qkv_flat))``, out by the oracle."""
    return oracle.numeric_grad(lambda x: float(np.sum(dout * oracle.attention(x, batch, n_heads)[0])), qkv_flat)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_backward_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x05")
    inputs = fixture["inputs"]
    qkv_flat = np.array(inputs["qkv_flat"], dtype=dtype)
    qkv = oracle.heads_of(qkv_flat, inputs["batch"], inputs["n_heads"]).astype(dtype)
    probs = (np.array(inputs["probs"], dtype=dtype),)
    dqkv = attention_backward(np.array(inputs["dout"], dtype=dtype), qkv, probs)
    tol = dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-15)
    assert_close(dqkv, np.array(fixture["expected"]["dqkv"]), **tol, what="dqkv rows [dq | dk | dv]")
    assert dqkv.dtype == dtype


@pytest.mark.parametrize("batch, length, n_heads, head_dim", [(1, 1, 1, 1), (2, 5, 2, 3), (1, 16, 2, 2),
                                                              (2, 17, 1, 2)])
def test_attention_backward_matches_finite_differences(batch, length, n_heads, head_dim):
    """From T = 16 on P comes in two row blocks: the first half's dk and dv get the second half's rows too."""
    qkv_flat, qkv, probs, dout = case(length, batch, length, n_heads, head_dim)
    expected = finite_differences(qkv_flat, dout, batch, n_heads)
    assert_close(attention_backward(dout, qkv, probs), expected, rtol=1e-6, atol=1e-8,
                 what=f"dqkv (B={batch}, T={length}, h={n_heads}, d_h={head_dim}) against finite differences")


@given(seed=st.integers(0, 2**32 - 1), length=st.integers(1, 20), n_heads=st.integers(1, 3))
def test_the_keys_gradient_sums_to_zero_over_positions(seed, length, n_heads):
    """Adding one vector to every key adds a constant to each row of scores, which softmax
    ignores: so ``sum_s dk_s = 0`` in every head (the row-sum term of dS makes it so)."""
    _, qkv, probs, dout = case(seed, 2, length, n_heads, 3, scale=2.0)
    dqkv = attention_backward(dout, qkv, probs).reshape(2, length, 3, n_heads, 3)
    assert_close(dqkv[:, :, 1].sum(axis=1), np.zeros((2, n_heads, 3)), atol=1e-10,
                 what="sum over positions of dk, per sequence and head")


@given(seed=st.integers(0, 2**32 - 1), length=st.integers(2, 20), t=st.integers(0, 19))
def test_an_output_sends_no_gradient_to_later_positions(seed, length, t):
    """With ``dO`` nonzero at position t only: dq is zero except at t, dk and dv zero after t."""
    t = min(t, length - 1)
    _, qkv, probs, dout = case(seed, 1, length, 2, 2)
    only_t = np.zeros_like(dout)
    only_t[t] = dout[t]
    dqkv = attention_backward(only_t, qkv, probs).reshape(length, 3, 4)
    assert np.all(dqkv[:t, 0] == 0) and np.all(dqkv[t + 1:, 0] == 0), f"dq must be 0 off position {t}"
    assert np.all(dqkv[t + 1:, 1:] == 0), f"dk and dv must be 0 after position {t}, got {dqkv[t + 1:, 1:]}"


def test_permuting_the_batch_permutes_the_gradient():
    batch, length = 3, 6
    qkv_flat, qkv, probs, dout = case(11, batch, length, 2, 2)
    order = np.array([2, 0, 1])
    dqkv = attention_backward(dout, qkv, probs)
    permuted = attention_backward(dout.reshape(batch, length, -1)[order].reshape(batch * length, -1),
                                  qkv[:, order], tuple(p[order] for p in probs))
    assert_close(permuted, dqkv.reshape(batch, length, -1)[order].reshape(batch * length, -1), rtol=1e-13,
                 what="dqkv of the permuted sequences")


def test_float32_in_float32_out_and_the_inputs_are_unchanged():
    qkv_flat, qkv, probs, dout = case(5, 2, 17, 2, 2, dtype=np.float32)
    before = (qkv.copy(), [p.copy() for p in probs], dout.copy())
    dqkv = attention_backward(dout, qkv, probs)
    assert dqkv.dtype == np.float32 and dqkv.shape == qkv_flat.shape, (
        f"dqkv: expected float32 {qkv_flat.shape}, got {dqkv.dtype} {dqkv.shape}")
    assert np.array_equal(qkv, before[0]) and np.array_equal(dout, before[2]), "qkv and dout must stay unchanged"
    assert all(np.array_equal(p, q) for p, q in zip(probs, before[1], strict=True)), "P must stay unchanged"
    expected = attention_backward(dout.astype(np.float64), qkv.astype(np.float64),
                                  tuple(p.astype(np.float64) for p in probs))
    assert_close(dqkv, expected, rtol=1e-4, atol=1e-5, what="float32 dqkv against float64")


def test_the_values_gradient_is_p_transposed_times_dout():
    """``dv = P^T dO``: with P uniform over 0..t (all scores 0) and dO = 1, dv_s = sum_{t >= s} 1 / (t + 1)."""
    length = 4
    qkv_flat = np.zeros((length, 3))
    qkv_flat[:, 2] = 1.0
    _, probs = oracle.attention(qkv_flat, 1, 1)
    dqkv = attention_backward(np.ones((length, 1)), oracle.heads_of(qkv_flat, 1, 1),
                              oracle.in_blocks(probs, row_blocks(length)))
    expected = [sum(1.0 / (t + 1) for t in range(s, length)) for s in range(length)]
    assert_close(dqkv[:, 2], expected, rtol=1e-12, what="dv with uniform P and dO = 1")
    assert_close(dqkv[:, :2], np.zeros((length, 2)), atol=1e-15, what="dq, dk (equal v: dP is constant per row)")


def test_one_position_sends_its_whole_gradient_to_its_value():
    """T = 1: P = (1) whatever the scores, so dS = 0: dq = dk = 0 and dv = dO, in every head."""
    _, qkv, probs, dout = case(9, 3, 1, 2, 2)
    dqkv = attention_backward(dout, qkv, probs)
    assert_close(dqkv[:, 8:], dout, rtol=1e-15, what="dv with one position")
    assert_close(dqkv[:, :8], np.zeros((3, 8)), atol=1e-15, what="dq, dk with one position")
