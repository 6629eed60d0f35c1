"""Part 3 - parameter arithmetic: milestones 12-15.

Expected values are hand-worked (``tests/fixtures/m12.json`` .. ``m15.json``) or come
from one-line NumPy oracles written here, never from the package itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco.params import average_params, clone_params, scale_params, subtract_params
from helpers import (
    DTYPES,
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
from strategies import param_dict_family, param_dicts


def assert_same_layout(got, reference, what="result"):
    assert list(got) == list(reference), f"{what}: expected keys {list(reference)}, got {list(got)}"
    for key in reference:
        assert isinstance(got[key], np.ndarray), f"{what}[{key!r}] must be an ndarray, got {type(got[key])}"
        assert got[key].shape == reference[key].shape, (
            f"{what}[{key!r}]: expected shape {reference[key].shape}, got {got[key].shape}")
        assert got[key].dtype == reference[key].dtype, (
            f"{what}[{key!r}]: expected dtype {reference[key].dtype}, got {got[key].dtype}")


# --------------------------------------------------------------------------- m12 clone_params


@pytest.mark.m12
def test_clone_params_fixture():
    fixture = load_fixture("m12")
    params = as_params(fixture["inputs"]["params"])
    clone = clone_params(params)
    assert_params_close(clone, as_params(fixture["expected"]["clone"]), rtol=0, what="clone")
    clone["W1"][0, 0] = 99.0
    assert_params_close(params, as_params(fixture["expected"]["params_after_setting_clone_W1_00_to_99"]),
                        rtol=0, what="original after mutating the clone")


@pytest.mark.m12
@given(params=param_dicts())
def test_clone_params_is_deep(params):
    before = snapshot(params)
    clone = clone_params(params)
    assert_same_layout(clone, params, "clone")
    for key in params:
        assert np.array_equal(clone[key], params[key]), f"clone[{key!r}] differs from the input"
    for key in clone:  # mutate every array of the result in place
        clone[key] += 1.0
        clone[key][...] = -7.0
    assert_unchanged(before, params, "params after mutating the clone")


@pytest.mark.m12
@given(params=param_dicts())
def test_clone_params_shares_no_memory_and_is_pure(params):
    before = snapshot(params)
    clone = clone_params(params)
    assert_unchanged(before, params, "params")
    assert_no_shared_memory(clone, params, "clone_params")


@pytest.mark.m12
def test_clone_params_returns_a_new_dict():
    params = {"W1": np.ones((2, 3)), "b1": np.zeros(3)}
    clone = clone_params(params)
    assert clone is not params, "clone_params returned the input dict itself"
    clone["extra"] = np.ones(1)
    del clone["W1"]
    assert list(params) == ["W1", "b1"], "adding or removing a key of the clone changed the input dict"


@pytest.mark.m12
@pytest.mark.parametrize("dtype", DTYPES)
def test_clone_params_keeps_dtype_and_key_order(dtype):
    params = {"b2": np.arange(3, dtype=dtype), "W1": np.ones((2, 2), dtype=dtype), "a": np.full(1, 0.1, dtype)}
    clone = clone_params(params)
    assert_same_layout(clone, params, "clone")
    assert_params_close(clone, params, rtol=0, what="clone")


@pytest.mark.m12
def test_clone_params_rejects_bad_input():
    with pytest.raises(TypeError, match="params"):
        clone_params([np.ones(2)])
    with pytest.raises(ValueError, match="params"):
        clone_params({})
    with pytest.raises(TypeError, match="params"):
        clone_params({"W1": np.ones((2, 2), dtype=np.int64)})


# --------------------------------------------------------------------------- m13 scale_params


@pytest.mark.m13
def test_scale_params_fixture():
    fixture = load_fixture("m13")
    params = as_params(fixture["inputs"]["params"])
    got = scale_params(params, fixture["inputs"]["scalar"])
    assert_params_close(got, as_params(fixture["expected"]["params"]), what="scale_params")


@pytest.mark.m13
@given(params=param_dicts())
def test_scale_params_by_zero_one_minus_one(params):
    zero, one, minus = scale_params(params, 0.0), scale_params(params, 1), scale_params(params, -1.0)
    for got in (zero, one, minus):
        assert_same_layout(got, params, "scale_params")
    for key in params:
        assert np.all(zero[key] == 0.0), f"0 * params[{key!r}] must be all zeros, got {zero[key]}"
        assert np.array_equal(one[key], params[key]), f"1 * params[{key!r}] must equal params[{key!r}]"
        assert np.array_equal(minus[key], -params[key]), f"-1 * params[{key!r}] must be -params[{key!r}]"


@pytest.mark.m13
@given(params=param_dicts(), scalar=st.floats(-5.0, 5.0, allow_nan=False))
def test_scale_params_matches_elementwise_product(params, scalar):
    before = snapshot(params)
    got = scale_params(params, scalar)
    assert_unchanged(before, params, "params")
    assert_no_shared_memory(got, params, "scale_params")
    assert_same_layout(got, params, "scale_params")
    for key in params:
        expected = params[key] * params[key].dtype.type(scalar)
        tol = tolerance(params[key].dtype)
        assert_close(got[key], expected, **tol, what=f"scale_params[{key!r}]")


@pytest.mark.m13
@pytest.mark.parametrize("scalar", [0.5, np.float64(0.5), 2, np.float32(0.5)])
def test_scale_params_keeps_float32(scalar):
    params = {"W1": np.array([[1.0, -2.0]], dtype=np.float32), "b1": np.array([4.0], dtype=np.float32)}
    got = scale_params(params, scalar)
    for key in params:
        assert got[key].dtype == np.float32, (
            f"a float32 model times {type(scalar).__name__} must stay float32, got {got[key].dtype}")
    assert_close(got["W1"], np.array([[1.0, -2.0]]) * float(scalar), rtol=1e-7, what="scale_params['W1']")


@pytest.mark.m13
def test_scale_params_by_one_returns_new_arrays():
    params = {"W1": np.ones((2, 2)), "b1": np.zeros(2)}
    got = scale_params(params, 1.0)
    assert_no_shared_memory(got, params, "scale_params(params, 1)")
    got["W1"][0, 0] = 5.0
    assert params["W1"][0, 0] == 1.0


@pytest.mark.m13
def test_scale_params_rejects_bad_scalar():
    params = {"W1": np.ones((2, 2))}
    with pytest.raises(ValueError, match="scalar"):
        scale_params(params, float("nan"))
    with pytest.raises(ValueError, match="scalar"):
        scale_params(params, np.inf)
    with pytest.raises(TypeError, match="scalar"):
        scale_params(params, "2")
    with pytest.raises(TypeError, match="scalar"):
        scale_params(params, np.ones(2))
    with pytest.raises(TypeError, match="params"):
        scale_params([np.ones(2)], 2.0)


# Keys in no sorted order: a result built from sorted keys (or from a set) shows here, where
# params of W1, b1 (already sorted) cannot tell.
UNSORTED = ("b2", "W2", "b1", "W1")


def unsorted_params(scale: float = 1.0) -> dict:
    return {key: np.full((2,), scale * (k + 1)) for k, key in enumerate(UNSORTED)}


@pytest.mark.m13
def test_scale_params_keeps_the_key_order_of_params():
    got = scale_params(unsorted_params(), 2.0)
    assert list(got) == list(UNSORTED), f"keys: expected the order of params {list(UNSORTED)}, got {list(got)}"
    assert_close(got["W1"], np.full(2, 8.0), rtol=0, what="2 * params['W1']")


# --------------------------------------------------------------------------- m14 subtract_params


@pytest.mark.m14
def test_subtract_params_fixture():
    fixture = load_fixture("m14")
    params_a = as_params(fixture["inputs"]["params_a"])
    params_b = as_params(fixture["inputs"]["params_b"])
    got = subtract_params(params_a, params_b)
    assert_params_close(got, as_params(fixture["expected"]["params"]), what="subtract_params")


@pytest.mark.m14
@given(params=param_dicts())
def test_subtract_params_self_is_zero(params):
    got = subtract_params(params, params)
    assert_same_layout(got, params, "a - a")
    for key in params:
        assert np.all(got[key] == 0.0), f"(a - a)[{key!r}] must be 0, got {got[key]}"
    assert_no_shared_memory(got, params, "subtract_params")


@pytest.mark.m14
@given(family=param_dict_family(count=2))
@HALF_EXAMPLES
def test_subtract_params_is_antisymmetric_and_elementwise(family):
    params_a, params_b = family
    before = snapshot(family)
    a_minus_b = subtract_params(params_a, params_b)
    b_minus_a = subtract_params(params_b, params_a)
    assert_unchanged(before, family, "params_a, params_b")
    assert_no_shared_memory([a_minus_b, b_minus_a], family, "subtract_params")
    assert_same_layout(a_minus_b, params_a, "a - b")
    for key in params_a:
        assert np.array_equal(a_minus_b[key], params_a[key] - params_b[key]), (
            f"(a - b)[{key!r}]: expected {params_a[key] - params_b[key]}, got {a_minus_b[key]}")
        assert np.array_equal(a_minus_b[key], -b_minus_a[key]), f"a - b must equal -(b - a) at {key!r}"


@pytest.mark.m14
@pytest.mark.parametrize("dtype", DTYPES)
def test_subtract_params_keeps_dtype_and_order_of_a(dtype):
    params_a = {"W1": np.array([[3.0, 1.0]], dtype), "b1": np.array([1.0], dtype)}
    params_b = {"W1": np.array([[1.0, 4.0]], dtype), "b1": np.array([0.25], dtype)}
    got = subtract_params(params_a, params_b)
    assert_same_layout(got, params_a, "a - b")
    assert_close(got["W1"], np.array([[2.0, -3.0]]), rtol=0, what="(a - b)['W1']")
    assert_close(got["b1"], np.array([0.75]), rtol=0, what="(a - b)['b1']")


@pytest.mark.m14
def test_subtract_params_keys_follow_params_a_not_a_sorted_order():
    got = subtract_params(unsorted_params(3.0), unsorted_params(1.0))
    assert list(got) == list(UNSORTED), f"keys: expected the order of params_a {list(UNSORTED)}, got {list(got)}"
    assert_close(got["b2"], np.full(2, 2.0), rtol=0, what="(a - b)['b2']")


@pytest.mark.m14
def test_subtract_params_rejects_mismatched_structures():
    params_a = {"W1": np.ones((2, 2)), "b1": np.ones(2)}
    with pytest.raises(ValueError, match="params_b"):
        subtract_params(params_a, {"W1": np.ones((2, 2))})
    with pytest.raises(ValueError, match="params_b"):
        subtract_params(params_a, {"W1": np.ones((2, 2)), "c1": np.ones(2)})
    with pytest.raises(ValueError, match="params_b"):
        subtract_params(params_a, {"W1": np.ones((2, 3)), "b1": np.ones(2)})
    with pytest.raises(TypeError, match="params_b"):
        subtract_params(params_a, {"W1": np.ones((2, 2), np.float32), "b1": np.ones(2, np.float32)})
    with pytest.raises(TypeError, match="params_a"):
        subtract_params(None, params_a)


# --------------------------------------------------------------------------- m15 average_params


def weighted_mean(family, weights):
    """NumPy oracle: sum_k w_k theta_k with w normalised, in float64."""
    weights = np.asarray(weights, dtype=np.float64)
    weights = weights / weights.sum()
    return {key: np.tensordot(weights, np.stack([p[key].astype(np.float64) for p in family]), axes=1)
            for key in family[0]}


nonneg_weights = st.floats(0.0, 4.0, allow_nan=False)


@pytest.mark.m15
def test_average_params_fixture():
    fixture = load_fixture("m15")
    params_list = [as_params(p) for p in fixture["inputs"]["params_list"]]
    got = average_params(params_list, fixture["inputs"]["weights"])
    assert_params_close(got, as_params(fixture["expected"]["params"]), atol=1e-15, what="average_params")


@pytest.mark.m15
@given(family=param_dict_family())
@HALF_EXAMPLES
def test_average_params_uniform_by_default(family):
    before = snapshot(family)
    got = average_params(family)
    assert_unchanged(before, family, "params_list")
    assert_no_shared_memory(got, family, "average_params")
    assert_same_layout(got, family[0], "average_params")
    expected = weighted_mean(family, [1.0] * len(family))
    for key in got:
        tol = tolerance(got[key].dtype)
        assert_close(got[key], expected[key], **tol, what=f"average[{key!r}]")


@pytest.mark.m15
@given(family=param_dict_family(), data=st.data())
@HALF_EXAMPLES
def test_average_params_weighted_and_permutation_invariant(family, data):
    weights = data.draw(st.lists(nonneg_weights, min_size=len(family), max_size=len(family))
                        .filter(lambda w: sum(w) > 0.1))
    order = data.draw(st.permutations(range(len(family))))
    got = average_params(family, weights)
    shuffled = average_params([family[k] for k in order], [weights[k] for k in order])
    expected = weighted_mean(family, weights)
    for key in got:
        tol = tolerance(got[key].dtype)
        assert_close(got[key], expected[key], **tol, what=f"weighted average[{key!r}]")
        assert_close(shuffled[key], got[key], **tol,
                     what=f"average of the reordered workers[{key!r}]")


@pytest.mark.m15
@given(params=param_dicts(), count=st.integers(1, 6))
@HALF_EXAMPLES
def test_average_params_of_identical_dicts_is_that_dict(params, count):
    family = [{key: value.copy() for key, value in params.items()} for _ in range(count)]
    got = average_params(family)
    assert_same_layout(got, params, "average_params")
    assert_no_shared_memory(got, family, "average_params")
    for key in params:
        tol = tolerance(params[key].dtype)
        assert_close(got[key], params[key], **tol, what=f"average of copies[{key!r}]")


@pytest.mark.m15
@given(family=param_dict_family(count=3), scale=st.sampled_from([3.0, 0.5, 1e3]))
@HALF_EXAMPLES
def test_average_params_normalises_weights(family, scale):
    weights = [1.0, 2.0, 5.0]
    got = average_params(family, weights)
    scaled = average_params(family, [scale * w for w in weights])
    for key in got:
        tol = tolerance(got[key].dtype)
        assert_close(scaled[key], got[key], **tol, what=f"average with weights x{scale}[{key!r}]")


@pytest.mark.m15
@given(family=param_dict_family(count=3))
@HALF_EXAMPLES
def test_average_params_zero_weight_ignores_member(family):
    poisoned = [family[0], {key: value + 1e3 for key, value in family[1].items()}, family[2]]
    got = average_params(poisoned, [1.0, 0.0, 3.0])
    expected = weighted_mean([family[0], family[2]], [1.0, 3.0])
    for key in got:
        tol = tolerance(got[key].dtype)
        assert_close(got[key], expected[key], **tol, what=f"average with a zero weight[{key!r}]")


@pytest.mark.m15
def test_average_params_single_member_is_a_copy():
    params = {"W1": np.array([[1.0, 2.0]]), "b1": np.array([3.0])}
    got = average_params([params])
    assert_params_close(got, params, rtol=0, what="average of one dict")
    assert_no_shared_memory(got, params, "average_params([params])")


@pytest.mark.m15
@pytest.mark.parametrize("weights", [None, [1.0, 3.0], np.array([0.25, 0.75]), (1, 3)])
def test_average_params_keeps_float32(weights):
    family = [{"W1": np.array([[1.0, 2.0]], np.float32)}, {"W1": np.array([[3.0, 6.0]], np.float32)}]
    got = average_params(family, weights)
    assert got["W1"].dtype == np.float32, f"a float32 average must stay float32, got {got['W1'].dtype}"
    expected = [[2.0, 4.0]] if weights is None else [[2.5, 5.0]]
    assert_close(got["W1"], np.array(expected), rtol=1e-6, what="average['W1']")


@pytest.mark.m15
def test_average_params_rejects_bad_input():
    params = {"W1": np.ones((2, 2))}
    with pytest.raises(ValueError, match="params_list"):
        average_params([])
    with pytest.raises(ValueError, match="weights"):
        average_params([params, params], [1.0, -0.5])
    with pytest.raises(ValueError, match="weights"):
        average_params([params, params], [0.0, 0.0])
    with pytest.raises(ValueError, match="weights"):
        average_params([params, params], [1.0])
    with pytest.raises(ValueError, match="weights"):
        average_params([params, params], [1.0, float("nan")])
    with pytest.raises(ValueError, match=r"params_list\[1\]"):
        average_params([params, {"W1": np.ones((2, 3))}])
    with pytest.raises(TypeError, match="params_list"):
        average_params(params)


@pytest.mark.m15
def test_average_params_keys_follow_the_first_dict_not_a_sorted_order():
    got = average_params([unsorted_params(1.0), unsorted_params(3.0)], [1.0, 1.0])
    assert list(got) == list(UNSORTED), (
        f"keys: expected the order of params_list[0] {list(UNSORTED)}, got {list(got)}")
    assert_close(got["W2"], np.full(2, 4.0), rtol=0, what="average['W2']")
