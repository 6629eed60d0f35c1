"""Part 7 - held-out evaluation and the communication model: milestones 28-30.

Expected values are hand-worked (``tests/fixtures/m28.json`` .. ``m30.json``) or come
from plain-NumPy oracles (the forward pass and log-sum-exp of ``helpers``, the ring
all-reduce formula here), never from the package itself.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco.evaluation import CommunicationReport, classification_accuracy, communication_savings, evaluate_loss
from helpers import (
    DTYPES,
    as_params,
    assert_close,
    assert_unchanged,
    load_fixture,
    oracle_forward,
    oracle_loss,
    snapshot,
)
from strategies import mlp_and_batch, seeds

# --------------------------------------------------------------------------- helpers


def small_model(dtype=np.float64):
    """A 2-layer MLP (3 -> 4 -> 3) with fixed, moderate weights, and 6 labelled rows."""
    rng = np.random.default_rng(1234)
    params = {
        "W1": rng.normal(0.0, 0.8, (3, 4)).astype(dtype),
        "b1": rng.normal(0.0, 0.1, 4).astype(dtype),
        "W2": rng.normal(0.0, 0.8, (4, 3)).astype(dtype),
        "b2": rng.normal(0.0, 0.1, 3).astype(dtype),
    }
    x = rng.normal(0.0, 1.0, (6, 3)).astype(dtype)
    y = np.array([0, 1, 2, 2, 1, 0])
    return params, x, y


def big_held_out_set(n=1031):
    """``small_model``'s MLP and n rows (1031, a prime: no chunk size divides it); the last
    7 rows are scaled up and all labelled 0, so a chunked mean that drops or down-weights
    a short last chunk is visibly off."""
    params, _, _ = small_model()
    rng = np.random.default_rng(n)
    x = rng.normal(0.0, 1.0, (n, 3))
    x[-7:] *= 5.0
    y = rng.integers(0, 3, size=n)
    y[-7:] = 0
    return params, x, y


def ring_bytes(num_params, num_workers, bytes_per_value):
    """Bytes one worker sends in one ring all-reduce: reduce-scatter then all-gather."""
    return 2 * (num_workers - 1) / num_workers * num_params * bytes_per_value


# --------------------------------------------------------------------------- m28 evaluate_loss


@pytest.mark.m28
def test_evaluate_loss_matches_hand_worked_fixture():
    fixture = load_fixture("m28")
    inputs = fixture["inputs"]
    got = evaluate_loss(as_params(inputs["params"]), np.array(inputs["x"]), np.array(inputs["y"]))
    assert isinstance(got, float), f"evaluate_loss must return a Python float, got {type(got).__name__}"
    assert_close(got, fixture["expected"]["loss"], rtol=1e-12, what="held-out loss")


@pytest.mark.m28
@given(mlp_and_batch(dtype=np.float64))
def test_evaluate_loss_is_the_mean_cross_entropy_of_the_forward_pass(case):
    params, x, y = case
    assert_close(evaluate_loss(params, x, y), oracle_loss(params, x, y), rtol=1e-9, atol=1e-12,
                 what="evaluate_loss")


@pytest.mark.m28
@given(mlp_and_batch(dtype=np.float64, min_n=2), seeds())
def test_evaluate_loss_ignores_row_order(case, seed):
    params, x, y = case
    perm = np.random.default_rng(seed).permutation(len(y))
    assert_close(evaluate_loss(params, x[perm], y[perm]), evaluate_loss(params, x, y), rtol=1e-12, atol=1e-12,
                 what="loss of the shuffled rows")


@pytest.mark.m28
def test_evaluate_loss_is_a_mean_not_a_sum():
    """The loss of two parts joined is the size-weighted mean of the parts' losses."""
    params, x, y = small_model()
    first, second = evaluate_loss(params, x[:2], y[:2]), evaluate_loss(params, x[2:], y[2:])
    assert_close(evaluate_loss(params, x, y), (2 * first + 4 * second) / 6, rtol=1e-12, what="loss of all rows")


@pytest.mark.m28
def test_evaluate_loss_on_a_held_out_set_larger_than_any_chunk():
    """The mean over all 1031 rows: not a mean of per-chunk means, no row left out."""
    params, x, y = big_held_out_set()
    assert_close(evaluate_loss(params, x, y), oracle_loss(params, x, y), rtol=1e-12,
                 what="loss of 1031 held-out rows")


@pytest.mark.m28
@given(mlp_and_batch())
def test_evaluate_loss_is_pure(case):
    params, x, y = case
    before = snapshot((params, x, y))
    evaluate_loss(params, x, y)
    assert_unchanged(before, (params, x, y), what="params, x and y")


@pytest.mark.m28
def test_evaluate_loss_does_not_change_params_even_when_called_twice():
    params, x, y = small_model()
    first = evaluate_loss(params, x, y)
    assert evaluate_loss(params, x, y) == first, "evaluating twice must give the same loss"


@pytest.mark.m28
def test_evaluate_loss_float32_agrees_with_float64():
    params64, x64, y = small_model(np.float64)
    params32 = {key: value.astype(np.float32) for key, value in params64.items()}
    got = evaluate_loss(params32, x64.astype(np.float32), y)
    assert isinstance(got, float)
    assert_close(got, oracle_loss(params64, x64, y), rtol=1e-5, what="float32 loss")


@pytest.mark.m28
def test_evaluate_loss_is_finite_for_huge_logits():
    params = {"W1": np.array([[1e4, -1e4], [0.0, 0.0]]), "b1": np.zeros(2)}
    x, y = np.array([[1.0, 0.0], [1.0, 0.0]]), np.array([0, 1])
    # row 1 is right with margin 2e4 (loss ~0), row 2 wrong by 2e4 (loss 2e4): mean 1e4
    assert_close(evaluate_loss(params, x, y), 1e4, rtol=1e-12, what="loss for logits of 1e4")


@pytest.mark.m28
@pytest.mark.parametrize(
    "x, y, error, name",
    [
        (np.zeros((0, 3)), np.zeros(0, dtype=np.int64), ValueError, "x"),
        (np.zeros((6, 3)), np.zeros(5, dtype=np.int64), ValueError, "y"),
        (np.zeros((6, 3)), np.array([0, 1, 2, 3, 0, 1]), ValueError, "y"),
        (np.zeros((6, 3)), np.zeros(6), TypeError, "y"),
        (np.full((6, 3), np.nan), np.zeros(6, dtype=np.int64), ValueError, "x"),
        (np.zeros(3), np.zeros(1, dtype=np.int64), ValueError, "x"),
    ],
    ids=["empty", "length-mismatch", "label-out-of-range", "float-labels", "nan", "1-D-x"],
)
def test_evaluate_loss_rejects_bad_input(x, y, error, name):
    params, _, _ = small_model()
    with pytest.raises(error, match=name):
        evaluate_loss(params, x, y)


# --------------------------------------------------------------------------- m29 classification_accuracy


@pytest.mark.m29
def test_classification_accuracy_matches_hand_worked_fixture():
    fixture = load_fixture("m29")
    inputs = fixture["inputs"]
    got = classification_accuracy(as_params(inputs["params"]), np.array(inputs["x"]), np.array(inputs["y"]))
    assert isinstance(got, float), f"classification_accuracy must return a Python float, got {type(got).__name__}"
    assert_close(got, fixture["expected"]["accuracy"], rtol=0.0, what="accuracy")


@pytest.mark.m29
@given(mlp_and_batch(dtype=np.float64))
def test_classification_accuracy_is_the_fraction_of_correct_argmax(case):
    params, x, y = case
    got = classification_accuracy(params, x, y)
    assert 0.0 <= got <= 1.0, f"accuracy must lie in [0, 1], got {got}"
    assert_close(got * len(y), round(got * len(y)), atol=1e-9, what="accuracy * n (a whole count)")
    expected = float(np.mean(np.argmax(oracle_forward(params, x)[0], axis=1) == y))
    assert_close(got, expected, rtol=1e-12, what="accuracy")


@pytest.mark.m29
@given(mlp_and_batch(min_n=2), seeds())
def test_classification_accuracy_ignores_row_order(case, seed):
    params, x, y = case
    perm = np.random.default_rng(seed).permutation(len(y))
    assert classification_accuracy(params, x[perm], y[perm]) == classification_accuracy(params, x, y)


@pytest.mark.m29
def test_classification_accuracy_on_a_held_out_set_larger_than_any_chunk():
    """Correct rows over all 1031 rows: not a mean of per-chunk accuracies, no row left out."""
    params, x, y = big_held_out_set()
    correct = int(np.sum(np.argmax(oracle_forward(params, x)[0], axis=1) == y))
    assert classification_accuracy(params, x, y) == correct / 1031, (
        f"expected {correct}/1031 = {correct / 1031}, got {classification_accuracy(params, x, y)}")


@pytest.mark.m29
def test_classification_accuracy_is_one_for_argmax_labels_and_zero_for_argmin_labels():
    params, x, _ = small_model()
    logits = oracle_forward(params, x)[0]
    assert classification_accuracy(params, x, np.argmax(logits, axis=1)) == 1.0
    assert classification_accuracy(params, x, np.argmin(logits, axis=1)) == 0.0


@pytest.mark.m29
def test_classification_accuracy_breaks_ties_to_the_lowest_index():
    """Classes 0 and 1 tie: the arg-max is class 0, so label 1 is wrong, although its logit
    equals the largest (the docstring: ties go to the lowest index, as ``np.argmax`` does)."""
    params = {"W1": np.zeros((1, 3)), "b1": np.array([1.0, 1.0, 0.0])}
    x, y = np.ones((4, 1)), np.array([0, 1, 0, 2])
    assert classification_accuracy(params, x, y) == 0.5, "rows 0 and 2 are right, 1 (a tie) and 3 are wrong"


@pytest.mark.m29
@pytest.mark.parametrize("dtype", DTYPES)
def test_classification_accuracy_is_pure_in_both_dtypes(dtype):
    params, x, y = small_model(dtype)
    before = snapshot((params, x, y))
    got = classification_accuracy(params, x, y)
    assert_unchanged(before, (params, x, y), what="params, x and y")
    expected = float(np.mean(np.argmax(oracle_forward(params, x)[0], axis=1) == y))
    assert got == expected


def rounding_model(dtype):
    """An MLP whose two logits differ by 1 in float64 but tie in float32.

    ``x = [[1]]``, ``W1 = [[2^24, 2^24]]``, ``b1 = [0, 1]``: ``z1 = [2^24, 2^24 + 1]``.
    2^24 + 1 is not a float32 (the spacing there is 2) and the sum rounds to the even
    2^24. ``W2 = I``, ``b2 = [-2^24, -2^24]`` bring the logits back to ``[0, 1]`` in
    float64 and ``[0, 0]`` in float32, every other operation exact. Computed in the
    params' dtype (the contract: the floating dtype follows the params), a float32 model
    with label 1 has loss ``ln 2`` and arg-max 0 (ties go to the lowest index); the same
    float32 model evaluated in float64 has loss ``ln(1 + e^-1)`` and arg-max 1."""
    big = 2.0**24
    params = {"W1": np.array([[big, big]], dtype=dtype), "b1": np.array([0.0, 1.0], dtype=dtype),
              "W2": np.eye(2, dtype=dtype), "b2": np.array([-big, -big], dtype=dtype)}
    return params, np.array([[1.0]], dtype=dtype), np.array([1])


@pytest.mark.m28
def test_evaluate_loss_runs_in_the_params_dtype():
    params32, x32, y = rounding_model(np.float32)
    assert_close(evaluate_loss(params32, x32, y), math.log(2.0), rtol=1e-6,
                 what="float32 loss (logits 2^24 and 2^24 + 1 tie in float32: ln 2)")
    params64, x64, _ = rounding_model(np.float64)
    assert_close(evaluate_loss(params64, x64, y), math.log1p(math.exp(-1.0)), rtol=1e-12,
                 what="float64 loss (logits differ by 1: ln(1 + e^-1))")


@pytest.mark.m29
def test_classification_accuracy_runs_in_the_params_dtype():
    params32, x32, y = rounding_model(np.float32)
    assert classification_accuracy(params32, x32, y) == 0.0, (
        "float32 params: the logits tie in float32 and arg-max picks class 0, so the accuracy "
        f"for label 1 is 0.0, got {classification_accuracy(params32, x32, y)}")
    params64, x64, _ = rounding_model(np.float64)
    assert classification_accuracy(params64, x64, y) == 1.0


@pytest.mark.m29
def test_classification_accuracy_is_a_float64_fraction_for_float32_params():
    """1 correct row of 3 is 1/3 as a Python (float64) number: a mean taken in float32
    gives float32(1/3) = 0.3333333432..., off by 1e-8."""
    params = {"W1": np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32), "b1": np.zeros(2, dtype=np.float32)}
    x = np.array([[2.0, 1.0], [2.0, 1.0], [2.0, 1.0]], dtype=np.float32)  # arg-max 0 on every row
    got = classification_accuracy(params, x, np.array([0, 1, 1]))
    assert isinstance(got, float), f"classification_accuracy must return a Python float, got {type(got).__name__}"
    assert abs(got - 1.0 / 3.0) < 1e-15, f"expected 1/3 = {1.0 / 3.0!r} (computed in float64), got {got!r}"


@pytest.mark.m29
@pytest.mark.parametrize(
    "x, y, error, name",
    [
        (np.zeros((0, 3)), np.zeros(0, dtype=np.int64), ValueError, "x"),
        (np.zeros((6, 3)), np.zeros(4, dtype=np.int64), ValueError, "y"),
        (np.zeros((6, 3)), np.array([0, 1, 2, 3, 0, 1]), ValueError, "y"),
        (np.zeros((6, 3)), np.array([0, -1, 2, 2, 0, 1]), ValueError, "y"),
        (np.zeros((6, 3)), np.zeros(6), TypeError, "y"),
        ([[0.0, 0.0, 0.0]], np.zeros(1, dtype=np.int64), TypeError, "x"),
    ],
    ids=["empty", "length-mismatch", "label-too-large", "negative-label", "float-labels", "list-x"],
)
def test_classification_accuracy_rejects_bad_input(x, y, error, name):
    params, _, _ = small_model()
    with pytest.raises(error, match=name):
        classification_accuracy(params, x, y)


# --------------------------------------------------------------------------- m30 communication_savings


@pytest.mark.m30
def test_communication_savings_matches_hand_worked_fixture():
    fixture = load_fixture("m30")
    inputs, expected = fixture["inputs"], fixture["expected"]
    report = communication_savings(
        inputs["num_params"], inputs["num_workers"], inputs["inner_steps"], inputs["rounds"],
        bytes_per_value=inputs["bytes_per_value"],
    )
    assert isinstance(report, CommunicationReport)
    for field, value in expected.items():
        assert_close(getattr(report, field), value, rtol=1e-12, what=field)


@pytest.mark.m30
@given(
    num_params=st.integers(1, 10**9),
    num_workers=st.integers(1, 1024),
    inner_steps=st.integers(1, 1000),
    rounds=st.integers(1, 1000),
    bytes_per_value=st.sampled_from([1, 2, 4, 8]),
)
def test_communication_savings_is_inner_steps_at_equal_precision(num_params, num_workers, inner_steps, rounds,
                                                                 bytes_per_value):
    report = communication_savings(num_params, num_workers, inner_steps, rounds, bytes_per_value=bytes_per_value)
    per_all_reduce = ring_bytes(num_params, num_workers, bytes_per_value)
    assert report.sync_all_reduces == inner_steps * rounds
    assert report.diloco_all_reduces == rounds
    assert_close(report.sync_bytes_per_worker, inner_steps * rounds * per_all_reduce, rtol=1e-12,
                 what="sync_bytes_per_worker")
    assert_close(report.diloco_bytes_per_worker, rounds * per_all_reduce, rtol=1e-12,
                 what="diloco_bytes_per_worker")
    assert_close(report.savings_factor, inner_steps, rtol=1e-12, what="savings_factor")


@pytest.mark.m30
@given(num_params=st.integers(1, 10**6), inner_steps=st.integers(1, 500), rounds=st.integers(1, 50))
def test_a_single_worker_sends_nothing(num_params, inner_steps, rounds):
    report = communication_savings(num_params, 1, inner_steps, rounds)
    assert report.sync_bytes_per_worker == 0 and report.diloco_bytes_per_worker == 0, (
        f"with K = 1 there is nobody to talk to, got {report}"
    )
    assert_close(report.savings_factor, inner_steps, rtol=1e-12, what="savings_factor for K = 1")


@pytest.mark.m30
@given(
    num_params=st.integers(1, 10**6),
    num_workers=st.integers(2, 64),
    inner_steps=st.integers(1, 500),
    rounds=st.integers(1, 50),
    bytes_per_value=st.sampled_from([2, 4, 8]),
)
def test_int8_pseudo_gradients_multiply_the_savings_by_bytes_per_value(num_params, num_workers, inner_steps, rounds,
                                                                       bytes_per_value):
    report = communication_savings(num_params, num_workers, inner_steps, rounds,
                                   bytes_per_value=bytes_per_value, outer_bytes_per_value=1)
    assert_close(report.savings_factor, inner_steps * bytes_per_value, rtol=1e-12, what="savings_factor")
    assert_close(report.diloco_bytes_per_worker, rounds * ring_bytes(num_params, num_workers, 1), rtol=1e-12,
                 what="diloco_bytes_per_worker at 1 byte per value")
    assert_close(report.sync_bytes_per_worker, inner_steps * rounds * ring_bytes(num_params, num_workers,
                                                                                 bytes_per_value),
                 rtol=1e-12, what="sync_bytes_per_worker (unchanged by the outer precision)")


@pytest.mark.m30
@pytest.mark.parametrize(
    "num_params, num_workers, bytes_per_value, expected",
    [(1000, 2, 4, 4000.0), (1000, 8, 2, 3500.0), (6, 3, 8, 64.0)],
    ids=["K=2: N*b", "K=8: 2*7/8*N*b", "K=3: 2*2/3*6*8"],
)
def test_one_all_reduce_sends_two_k_minus_one_over_k_n_b(num_params, num_workers, bytes_per_value, expected):
    report = communication_savings(num_params, num_workers, 1, 1, bytes_per_value=bytes_per_value)
    assert_close(report.diloco_bytes_per_worker, expected, rtol=1e-12, what="bytes of one all-reduce")
    assert_close(report.sync_bytes_per_worker, expected, rtol=1e-12, what="bytes of one all-reduce (baseline)")


@pytest.mark.m30
@pytest.mark.parametrize(
    "args, kwargs, error, name",
    [
        ((0, 4, 5, 2), {}, ValueError, "num_params"),
        ((10, 0, 5, 2), {}, ValueError, "num_workers"),
        ((10, 4, 1.5, 2), {}, TypeError, "inner_steps"),
        ((10, 4, 5, -1), {}, ValueError, "rounds"),
        ((10, 4, 5, 2), {"bytes_per_value": 0}, ValueError, "bytes_per_value"),
        ((10, 4, 5, 2), {"outer_bytes_per_value": 0}, ValueError, "outer_bytes_per_value"),
        ((10, True, 5, 2), {}, TypeError, "num_workers"),
    ],
    ids=["N=0", "K=0", "H-float", "rounds<0", "bytes=0", "outer-bytes=0", "K-bool"],
)
def test_communication_savings_rejects_bad_counts(args, kwargs, error, name):
    with pytest.raises(error, match=name):
        communication_savings(*args, **kwargs)


@pytest.mark.m30
def test_communication_savings_counts_are_ints_and_paper_scale_is_sensible():
    # Paper-like setting: 150M-parameter model, K = 8, H = 500, float32: 500x less traffic.
    report = communication_savings(150_000_000, 8, 500, 10)
    assert isinstance(report.sync_all_reduces, int) and isinstance(report.diloco_all_reduces, int)
    assert report.sync_all_reduces == 5000 and report.diloco_all_reduces == 10
    assert_close(report.diloco_bytes_per_worker, 10 * 2 * 7 / 8 * 150e6 * 4, rtol=1e-12, what="DiLoCo bytes")
    assert math.isclose(report.savings_factor, 500.0)
