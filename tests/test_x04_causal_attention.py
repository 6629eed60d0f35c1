"""Exercise x04 (optional, outside the 30): causal multi-head self-attention, forward.

``causal_mask``, ``softmax``, ``causal_softmax``, ``masked_scores`` and ``causal_attention`` in
``diloco.models.layers`` are the transformer's own (``diloco.models.transformer`` calls them
in every block). Expected values are hand-worked (``tests/fixtures/x04.json``) or come from
the per-position oracle of ``tests/transformer_oracles.py``, never from the package.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import transformer_oracles as oracle
from diloco.models.layers import causal_attention, causal_mask, causal_softmax, masked_scores, row_blocks, softmax
from helpers import DTYPES, assert_close, load_fixture

pytestmark = pytest.mark.x04


def random_qkv(rng, batch, length, n_heads, head_dim, scale=1.0, dtype=np.float64):
    return (rng.standard_normal((batch * length, 3 * n_heads * head_dim)) * scale).astype(dtype)


def check_attention(qkv_flat, batch, n_heads, rtol=1e-10, atol=1e-12, what="attention"):
    """``causal_attention`` against the oracle: the output and every row block of P."""
    out, qkv, probs = causal_attention(qkv_flat, batch, n_heads)
    expected_out, expected_p = oracle.attention(qkv_flat, batch, n_heads)
    assert_close(out, expected_out, rtol=rtol, atol=atol, what=f"{what}: out")
    blocks = row_blocks(qkv_flat.shape[0] // batch)
    assert isinstance(probs, tuple) and len(probs) == len(blocks), (
        f"probs must be a tuple of {len(blocks)} row blocks (row_blocks), got {type(probs).__name__} of "
        f"{len(probs)}")
    for (start, stop), got, want in zip(blocks, probs, oracle.in_blocks(expected_p, blocks), strict=True):
        assert_close(got, want, rtol=rtol, atol=atol, what=f"{what}: P rows {start}..{stop - 1}")
    assert_close(qkv, oracle.heads_of(qkv_flat, batch, n_heads), rtol=0, what=f"{what}: qkv (3, B, h, T, d_h)")


# --------------------------------------------------------------------------- the hand-worked case


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x04")
    inputs, expected = fixture["inputs"], fixture["expected"]
    qkv_flat = np.array(inputs["qkv_flat"], dtype=dtype)
    out, qkv, probs = causal_attention(qkv_flat, inputs["batch"], inputs["n_heads"])
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    assert_close(out, np.array(expected["out"]), **tol, what="out (3 positions x [head 0 | head 1])")
    assert len(probs) == 1, f"T = 3 is one row block, got {len(probs)}"
    assert_close(probs[0], np.array(expected["probs"]), **tol, what="P (1, 2, 3, 3)")
    assert out.dtype == dtype and probs[0].dtype == dtype and qkv.dtype == dtype


def test_the_first_position_attends_to_itself_only():
    """Row 0 sees column 0 and nothing else: ``P_00 = 1`` in every head, and no NaN from an empty row."""
    qkv_flat = random_qkv(np.random.default_rng(1), 2, 5, 2, 3)
    out, _, probs = causal_attention(qkv_flat, 2, 2)
    assert np.all(np.isfinite(out)), "a row with nothing to see gives NaN: the mask hides the diagonal too"
    assert_close(probs[0][:, :, 0, 0], np.ones((2, 2)), rtol=1e-12, what="P[:, :, 0, 0]")
    assert np.all(probs[0][:, :, 0, 1:] == 0), f"row 0 must see no later column, got P row 0 = {probs[0][0, 0, 0]}"


@pytest.mark.parametrize("length", [2, 5, 16, 17])
def test_the_mask_hides_exactly_the_later_positions(length):
    """``P_ts > 0`` for every ``s <= t`` and ``P_ts == 0`` for every ``s > t`` (checked on small scores,
    where no probability rounds to 0), in every row block."""
    rng = np.random.default_rng(length)
    qkv_flat = random_qkv(rng, 1, length, 1, 2, scale=0.1)
    _, _, probs = causal_attention(qkv_flat, 1, 1)
    for (start, stop), block in zip(row_blocks(length), probs, strict=True):
        for row in range(start, stop):
            seen = block[0, 0, row - start]
            assert np.all(seen[:row + 1] > 0), f"position {row} must see positions 0..{row}, got P = {seen}"
            assert np.all(seen[row + 1:] == 0), f"position {row} must not see positions > {row}, got P = {seen}"


def test_the_scale_is_one_over_sqrt_of_the_head_width():
    """4 heads of width 4 (d = 16), q = k = v in every head: position 0 holds a = (2, 0, 0, 0), position 1
    b = (1, 1, 1, 1); row 1's scores are (b . a, b . b) / sqrt(4) = (1, 2), not / sqrt(16) = (0.5, 1)."""
    head = np.array([[2.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    qkv_flat = np.tile(head, (1, 12))  # [q | k | v], each 4 identical heads
    _, _, probs = causal_attention(qkv_flat, 1, 4)
    weight = math.e / (math.e + math.e**2)  # P_10 for the scores (1, 2)
    assert_close(probs[0][0, :, 1], np.tile([weight, 1.0 - weight], (4, 1)), rtol=1e-12,
                 what="P row 1 of every head, scores (1, 2)")


def test_heads_are_split_and_concatenated_in_order():
    """q = k = 0, and each head's v the same at every position (100 b + 10 j, then its negative): every
    head's output is its own v, whatever it averages. Head j's v sits in columns ``2d + j d_h ..`` of the
    input, its output in columns ``j d_h ..``."""
    batch, length, n_heads, head_dim = 2, 4, 3, 2
    d = n_heads * head_dim
    qkv_flat = np.zeros((batch * length, 3 * d))
    expected = np.zeros((batch * length, d))
    for b in range(batch):
        for t in range(length):
            for j in range(n_heads):
                value = [100 * b + 10 * j + 1, -(100 * b + 10 * j + 1)]
                qkv_flat[b * length + t, 2 * d + j * head_dim:2 * d + (j + 1) * head_dim] = value
                expected[b * length + t, j * head_dim:(j + 1) * head_dim] = value
    out, _, _ = causal_attention(qkv_flat, batch, n_heads)
    assert_close(out, expected, rtol=1e-12, what="out (head j of sequence b holds 100 b + 10 j + 1)")


@given(batch=st.integers(1, 3), length=st.integers(1, 20), n_heads=st.integers(1, 3), head_dim=st.integers(1, 4),
       seed=st.integers(0, 2**32 - 1))
def test_attention_matches_the_per_position_oracle(batch, length, n_heads, head_dim, seed):
    qkv_flat = random_qkv(np.random.default_rng(seed), batch, length, n_heads, head_dim, scale=2.0)
    check_attention(qkv_flat, batch, n_heads)


@given(length=st.integers(2, 20), cut=st.integers(1, 19), seed=st.integers(0, 2**32 - 1))
def test_a_later_position_never_moves_an_earlier_output(length, cut, seed):
    """Changing q, k, v of positions >= cut leaves the outputs of positions < cut unchanged."""
    cut = min(cut, length - 1)
    rng = np.random.default_rng(seed)
    qkv_flat = random_qkv(rng, 2, length, 2, 3)
    changed = qkv_flat.copy()
    for b in range(2):
        changed[b * length + cut:(b + 1) * length] += rng.standard_normal((length - cut, 18)) * 5
    before, _, _ = causal_attention(qkv_flat, 2, 2)
    after, _, _ = causal_attention(changed, 2, 2)
    for b in range(2):
        assert_close(after[b * length:b * length + cut], before[b * length:b * length + cut], rtol=1e-13,
                     atol=1e-13, what=f"sequence {b}, positions < {cut}, after changing positions >= {cut}")


def test_permuting_the_batch_permutes_the_output():
    rng = np.random.default_rng(7)
    batch, length = 4, 6
    qkv_flat = random_qkv(rng, batch, length, 2, 2)
    order = np.array([2, 0, 3, 1])
    permuted = qkv_flat.reshape(batch, length, -1)[order].reshape(batch * length, -1)
    out, _, _ = causal_attention(qkv_flat, batch, 2)
    out_permuted, _, _ = causal_attention(permuted, batch, 2)
    assert_close(out_permuted, out.reshape(batch, length, -1)[order].reshape(batch * length, -1), rtol=1e-13,
                 what="out of the permuted sequences")


def test_float32_in_float32_out_and_the_input_is_unchanged():
    qkv_flat = random_qkv(np.random.default_rng(3), 2, 17, 2, 4, dtype=np.float32)
    before = qkv_flat.copy()
    out, qkv, probs = causal_attention(qkv_flat, 2, 2)
    assert out.dtype == qkv.dtype == np.float32 and {p.dtype for p in probs} == {np.dtype(np.float32)}, (
        f"float32 in, float32 out: got out {out.dtype}, qkv {qkv.dtype}, P {[p.dtype for p in probs]}")
    assert np.array_equal(qkv_flat, before), "causal_attention must not change qkv_flat"
    scores = masked_scores(qkv, 0, 17)
    assert scores.dtype == np.float32, f"masked_scores of float32 q, k: float32, got {scores.dtype}"
    assert softmax(scores).dtype == np.float32, "softmax of float32 scores: float32"


def test_large_scores_stay_finite():
    """A score 500 above its row's diagonal overflows exp in float32 unless the row's softmax is shifted."""
    qkv_flat = np.zeros((3, 3), dtype=np.float32)
    qkv_flat[2, 0] = 100.0  # q_2
    qkv_flat[0, 1], qkv_flat[2, 1] = 5.0, -5.0  # k_0, k_2: scores 500, 0, -500 in row 2
    qkv_flat[:, 2] = [1.0, 2.0, 3.0]
    with np.errstate(over="raise", invalid="raise"):
        out, _, _ = causal_attention(qkv_flat, 1, 1)
    assert_close(out[:, 0], [1.0, 1.5, 1.0], rtol=1e-6, what="out with scores up to 500")


# --------------------------------------------------------------------------- the softmaxes


def finite_rows(dtype=np.float64):
    return hnp.arrays(dtype, st.tuples(st.integers(1, 5), st.integers(1, 7)),
                      elements=st.floats(-50, 50, width=64 if dtype == np.float64 else 32))


@given(scores=finite_rows(), shift=st.floats(-1e3, 1e3))
def test_softmax_rows_sum_to_one_and_ignore_a_row_shift(scores, shift):
    probs = softmax(scores)
    assert_close(probs.sum(axis=-1), np.ones(scores.shape[0]), rtol=1e-12, what="row sums of softmax")
    shifted = softmax(scores + np.arange(scores.shape[0])[:, None] * shift)
    assert_close(shifted, probs, rtol=1e-9, atol=1e-12, what="softmax(scores + c_row)")
    expected = np.array([[math.exp(s - max(row)) / sum(math.exp(r - max(row)) for r in row) for s in row]
                         for row in scores.tolist()])
    assert_close(probs, expected, rtol=1e-12, atol=1e-15, what="softmax")


def test_softmax_is_stable_tolerates_minus_infinity_and_keeps_its_input():
    scores = np.array([[1000.0, 1000.0, -np.inf], [-1000.0, 0.0, -np.inf]], dtype=np.float32)
    before = scores.copy()
    with np.errstate(over="raise", invalid="raise"):
        probs = softmax(scores)
    assert probs.dtype == np.float32
    assert_close(probs, [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]], rtol=1e-6, what="softmax of huge and -inf scores")
    assert np.array_equal(scores, before), "softmax(scores) must not change scores (in_place=False)"


@pytest.mark.parametrize("rows, cols", [(4, 4), (2, 5), (1, 3)])
def test_causal_softmax_matches_softmax_on_causal_scores(rows, cols):
    """Rows of positions cols - rows .. cols - 1: the masked entries come in as -inf and leave as 0."""
    rng = np.random.default_rng(rows * 10 + cols)
    scores = rng.standard_normal((2, 3, rows, cols)) * 3
    for r in range(rows):
        scores[:, :, r, cols - rows + r + 1:] = -np.inf
    expected = np.zeros_like(scores)
    for index in np.ndindex(2, 3, rows):
        seen = scores[index][:cols - rows + index[2] + 1]
        expected[index][:seen.size] = np.exp(seen - seen.max()) / np.exp(seen - seen.max()).sum()
    got = causal_softmax(scores.copy())
    assert got is not None, "scores within a few units of the diagonal never overflow"
    assert_close(got, expected, rtol=1e-12, atol=1e-15, what="causal_softmax")


def test_causal_softmax_gives_none_where_a_row_would_overflow():
    """A score 100 above the diagonal: exp(100) overflows float32, so the caller takes the row-wise softmax."""
    scores = np.array([[[[0.0, -np.inf], [100.0, 0.0]]]], dtype=np.float32)
    assert causal_softmax(scores.copy()) is None
    fine = np.array([[[[0.0, -np.inf], [1.0, 0.0]]]], dtype=np.float32)
    got = causal_softmax(fine.copy())
    assert got is not None and got.dtype == np.float32
    assert_close(got[0, 0, 1], [math.e / (1 + math.e), 1 / (1 + math.e)], rtol=1e-6, what="row 1")


# --------------------------------------------------------------------------- the mask and the scores


def test_causal_mask_marks_exactly_the_later_columns():
    """Rows of positions cols - rows .. cols - 1 against columns 0 .. cols - 1: True where the column is later."""
    assert causal_mask(3, 3).tolist() == [[False, True, True], [False, False, True], [False, False, False]], (
        causal_mask(3, 3).tolist())
    assert causal_mask(2, 4).tolist() == [[False, False, False, True], [False, False, False, False]], (
        f"rows of positions 2, 3 against columns 0..3: got {causal_mask(2, 4).tolist()}")
    assert causal_mask(1, 1).tolist() == [[False]]


def test_masked_scores_are_scaled_by_the_head_width():
    """The fixture's head 1: ``q_t . k_s = 2s`` over width 4, so ``S_ts = 2s / sqrt(4) = s`` (checked below
    the diagonal, which every mask leaves alone)."""
    fixture = load_fixture("x04")
    qkv = oracle.heads_of(np.array(fixture["inputs"]["qkv_flat"]), 1, 2)
    scores = masked_scores(qkv, 0, 3)
    assert scores.shape == (1, 2, 3, 3), f"expected (B, h, 3, 3), got {scores.shape}"
    below = np.tril_indices(3, k=-1)
    assert_close(scores[0, 1][below], [0.0, 0.0, 1.0], rtol=1e-12, what="S_10, S_20, S_21 of head 1")
    lower = masked_scores(qkv, 1, 3)  # rows of positions 1, 2 against columns 0..2
    assert lower.shape == (1, 2, 2, 3), f"rows 1..2 against 3 columns: expected (1, 2, 2, 3), got {lower.shape}"
    assert_close(lower[0, 1, 1, :2], [0.0, 1.0], rtol=1e-12, what="S_20, S_21 of head 1 (rows 1..2 only)")


def test_masked_scores_are_minus_infinity_exactly_after_the_diagonal():
    qkv = oracle.heads_of(random_qkv(np.random.default_rng(4), 2, 5, 2, 2), 2, 2)
    for start in (0, 2):
        scores = masked_scores(qkv, start, 5)
        later = np.array([[s > t for s in range(5)] for t in range(start, 5)])
        assert np.all(np.isneginf(scores) == later), (
            f"rows {start}..4: -inf exactly where the column is later, got {np.isneginf(scores)[0, 0].tolist()}")
