"""Part 1 - the model: milestones 01-06 (``src/diloco/model.py``).

Expected values come from the hand-worked fixtures ``tests/fixtures/m01.json`` ..
``m06.json``, from independent NumPy oracles written here (a naive softmax on moderate
inputs, central finite differences) and from a PyTorch snapshot
(``tests/fixtures/torch_adamw.npz``, see ``scripts/make_torch_adamw_snapshot.py``).
Nothing here computes an expected value by calling the package.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import strategies as sts
from diloco.model import (
    ForwardCache,
    cross_entropy_loss,
    init_model_params,
    model_backward,
    model_forward,
    relu,
    softmax,
)
from helpers import (
    DTYPES,
    FIXTURES,
    as_params,
    assert_close,
    assert_no_shared_memory,
    assert_no_two_share,
    assert_params_close,
    assert_unchanged,
    load_fixture,
    oracle_forward,
    oracle_loss,
    snapshot,
    tolerance,
)


def torch_snapshot():
    with np.load(FIXTURES / "torch_adamw.npz") as data:
        return {key: data[key] for key in data.files}


def torch_mlp(snap, dtype=np.float64):
    return {key: snap[f"mlp_{key}"].astype(dtype) for key in ("W1", "b1", "W2", "b2")}


def random_mlp(rng, sizes, dtype=np.float64):
    params = {}
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True), start=1):
        params[f"W{layer}"] = rng.standard_normal((fan_in, fan_out)).astype(dtype)
        params[f"b{layer}"] = (0.5 * rng.standard_normal(fan_out)).astype(dtype)
    return params


# ---------------------------------------------------------------------------
# Milestone 01: init_model_params
# ---------------------------------------------------------------------------


@pytest.mark.m01
@pytest.mark.parametrize("dtype", DTYPES)
def test_init_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m01")
    rng = np.random.default_rng(fixture["inputs"]["seed"])
    params = init_model_params(tuple(fixture["inputs"]["layer_sizes"]), rng, dtype=dtype)
    expected = as_params(fixture["expected"])
    for key, value in params.items():
        assert value.dtype == dtype, f"params[{key!r}]: expected dtype {np.dtype(dtype)}, got {value.dtype}"
    assert_params_close(params, expected, **tolerance(dtype, magnitude=0.01))


@pytest.mark.m01
def test_init_fixture_draws_are_numpy_default_rng():
    """The fixture's raw draws are what numpy itself gives (a check of the fixture)."""
    fixture = load_fixture("m01")
    rng = np.random.default_rng(fixture["inputs"]["seed"])
    draws = fixture["inputs"]["standard_normal_draws"]
    assert np.array_equal(rng.standard_normal((1, 2)), np.array(draws["z1"]))
    assert np.array_equal(rng.standard_normal((2, 2)), np.array(draws["z2"]))
    assert_close(np.array(fixture["expected"]["W1"]), np.array(draws["z1"]) * math.sqrt(2.0), rtol=1e-15)


@pytest.mark.m01
@given(sizes=sts.layer_sizes(), seed=sts.seeds(), dtype=sts.dtypes)
def test_init_shapes_keys_zero_biases(sizes, seed, dtype):
    layer_sizes = list(sizes)
    before = list(layer_sizes)
    params = init_model_params(layer_sizes, np.random.default_rng(seed), dtype=dtype)
    num_layers = len(sizes) - 1
    expected_keys = [k for layer in range(1, num_layers + 1) for k in (f"W{layer}", f"b{layer}")]
    assert list(params) == expected_keys, f"expected keys {expected_keys}, got {list(params)}"
    for layer in range(1, num_layers + 1):
        weight, bias = params[f"W{layer}"], params[f"b{layer}"]
        assert weight.shape == (sizes[layer - 1], sizes[layer]), f"W{layer}: got shape {weight.shape}"
        assert bias.shape == (sizes[layer],), f"b{layer}: got shape {bias.shape}"
        assert weight.dtype == dtype and bias.dtype == dtype, f"layer {layer}: got {weight.dtype}, {bias.dtype}"
        assert np.all(bias == 0), f"b{layer} must be zeros, got {bias}"
        assert np.all(np.isfinite(weight))
    assert layer_sizes == before, "layer_sizes was modified"
    assert_no_two_share(params, "init_model_params")


@pytest.mark.m01
@given(sizes=sts.layer_sizes(), seed=sts.seeds())
def test_init_same_seed_same_params_and_generator_advances(sizes, seed):
    first = init_model_params(sizes, np.random.default_rng(seed))
    again = init_model_params(sizes, np.random.default_rng(seed))
    assert_params_close(again, first, rtol=0.0, what="same seed")
    rng = np.random.default_rng(seed)
    one = init_model_params(sizes, rng)
    two = init_model_params(sizes, rng)  # the generator was advanced by the first call
    assert any(not np.array_equal(one[k], two[k]) for k in one if k.startswith("W")), (
        "two calls with one generator gave identical weights: draw from rng, do not reseed"
    )


@pytest.mark.m01
def test_init_variance_is_two_over_fan_in():
    """He init: Var(W_l) = 2 / fan_in, mean 0.

    Tolerance: for N i.i.d. normal draws the sample variance has relative standard
    deviation sqrt(2 / N). Layer 1 has N = 200,000 (0.32%), layer 2 has N = 4,000 (2.2%).
    We allow 3% and 12%, about 5-9 standard deviations (the seed is fixed, so the test is
    deterministic), while the usual mistakes are off by a factor of 2 or more
    (1/fan_in, 2/fan_out, sqrt(2)/fan_in, 2/(fan_in+fan_out)).
    """
    params = init_model_params((500, 400, 10), np.random.default_rng(12345))
    for key, fan_in, allowed in (("W1", 500, 0.03), ("W2", 400, 0.12)):
        weights = params[key]
        target = 2.0 / fan_in
        ratio = weights.var() / target
        assert abs(ratio - 1.0) < allowed, (
            f"{key}: sample variance {weights.var():.4g}, expected about 2/fan_in = {target:.4g}"
        )
        # Mean: standard error sqrt(target / N); allow 6 of them.
        assert abs(weights.mean()) < 6.0 * math.sqrt(target / weights.size), f"{key}: mean {weights.mean():.3g}"


@pytest.mark.m01
@pytest.mark.parametrize("bad_rng", [0, 42, np.random.RandomState(0), None])
def test_init_rejects_non_generator(bad_rng):
    with pytest.raises(TypeError, match="rng"):
        init_model_params((3, 2), bad_rng)


@pytest.mark.m01
@pytest.mark.parametrize(
    "sizes, error",
    [((3,), ValueError), ((), ValueError), ((3, 0), ValueError), ((3, -2, 2), ValueError),
     ((3, 2.5), TypeError), (5, TypeError)],
)
def test_init_rejects_bad_layer_sizes(sizes, error):
    with pytest.raises(error, match="layer_sizes"):
        init_model_params(sizes, np.random.default_rng(0))


# ---------------------------------------------------------------------------
# Milestone 02: relu
# ---------------------------------------------------------------------------


@pytest.mark.m02
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m02")
    x = np.asarray(fixture["inputs"]["x"], dtype=dtype)
    before = snapshot(x)
    y = relu(x)
    assert isinstance(y, np.ndarray) and y.dtype == dtype, f"expected a {np.dtype(dtype)} ndarray, got {y!r}"
    assert_close(y, np.asarray(fixture["expected"]["y"], dtype=dtype), rtol=0.0)
    assert_unchanged(before, x, "x")
    assert_no_shared_memory(y, x, "relu(x)")


@pytest.mark.m02
@given(x=st.one_of(sts.arrays(np.float32), sts.arrays(np.float64)))
def test_relu_elementwise_max_pure_new_array(x):
    before = snapshot(x)
    y = relu(x)
    assert isinstance(y, np.ndarray), f"relu must return an ndarray, got {type(y).__name__}"
    assert y.shape == x.shape and y.dtype == x.dtype, f"expected {x.shape} {x.dtype}, got {y.shape} {y.dtype}"
    assert_close(y, np.where(x > 0, x, 0.0).astype(x.dtype), rtol=0.0)
    assert np.all(y >= 0)
    assert_unchanged(before, x, "x")
    assert_no_shared_memory(y, x, "relu(x)")


@pytest.mark.m02
def test_relu_all_positive_input_still_copied():
    """Even when nothing is clipped the result is a new array."""
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    y = relu(x)
    assert_close(y, x, rtol=0.0)
    assert_no_shared_memory(y, x, "relu(x)")
    y[0, 0] = -100.0
    assert x[0, 0] == 1.0


@pytest.mark.m02
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_zero_and_0d_input(dtype):
    y = relu(np.array([-0.0, 0.0, -1e-30], dtype=dtype))
    assert np.all(y == 0)
    scalar = np.asarray(relu(np.array(-3.0, dtype=dtype)))  # a 0-d array or a NumPy scalar
    assert scalar.shape == () and scalar.dtype == dtype and scalar == 0, repr(scalar)


@pytest.mark.m02
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_keeps_infinities_and_the_largest_floats(dtype):
    """relu accepts non-finite input: relu(inf) = inf, relu(-inf) = 0, and the largest finite
    floats pass through (or clip to 0) exactly. ``x * (x > 0)`` gives -inf * 0 = nan, and
    ``(x + |x|) / 2`` gives inf - inf = nan and overflows 2 * max to inf."""
    big = np.finfo(dtype).max
    x = np.array([[np.inf, -np.inf, big], [-big, 1.5, -2.0]], dtype=dtype)
    with np.errstate(all="ignore"):  # the warnings are the learner's business; the values are not
        y = relu(x)
    assert y.dtype == dtype, f"expected dtype {np.dtype(dtype)}, got {y.dtype}"
    assert not np.isnan(y).any(), f"relu made NaN out of infinities: {y}"
    np.testing.assert_array_equal(y, np.array([[np.inf, 0.0, big], [0.0, 1.5, 0.0]], dtype=dtype),
                                  err_msg="relu of [[inf, -inf, max], [-max, 1.5, -2]]")


@pytest.mark.m02
@pytest.mark.parametrize("bad", [[1.0, -2.0], 3.0, np.array([1, -2])])
def test_relu_rejects_non_float_arrays(bad):
    with pytest.raises(TypeError, match="x"):
        relu(bad)


# ---------------------------------------------------------------------------
# Milestone 03: model_forward
# ---------------------------------------------------------------------------


@pytest.mark.m03
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m03")
    params = as_params(fixture["inputs"]["params"], dtype)
    x = np.asarray(fixture["inputs"]["x"], dtype=dtype)
    before = snapshot((params, x))
    logits, cache = model_forward(params, x)
    expected = fixture["expected"]
    assert logits.dtype == dtype
    assert_close(logits, np.array(expected["logits"], dtype=dtype), rtol=0.0, what="logits")
    assert isinstance(cache, ForwardCache), f"cache must be a ForwardCache, got {type(cache).__name__}"
    assert len(cache.layer_inputs) == 2 and len(cache.pre_activations) == 2
    assert_close(cache.layer_inputs[0], x, rtol=0.0, what="cache.layer_inputs[0] (x)")
    for got, name, what in ((cache.layer_inputs[1], "a1", "cache.layer_inputs[1] (a1)"),
                            (cache.pre_activations[0], "z1", "cache.pre_activations[0] (z1)"),
                            (cache.pre_activations[1], "logits", "cache.pre_activations[1] (logits)")):
        assert_close(got, np.array(expected[name], dtype=dtype), rtol=0.0, what=what)
    assert_unchanged(before, (params, x), "params and x")
    assert_no_shared_memory((logits, cache), (params, x), "model_forward")


@pytest.mark.m03
def test_forward_no_relu_on_logits():
    """A one-layer model is affine: its logits can (and here must) be negative."""
    params = {"W1": np.array([[-1.0, 2.0, -3.0]]), "b1": np.array([0.0, -5.0, 1.0])}
    x = np.array([[1.0], [2.0]])
    logits, cache = model_forward(params, x)
    assert_close(logits, np.array([[-1.0, -3.0, -2.0], [-2.0, -1.0, -5.0]]), rtol=0.0,
                 what="logits (is a ReLU applied after the last layer?)")
    assert len(cache.pre_activations) == 1 and len(cache.layer_inputs) == 1


@pytest.mark.m03
@given(data=st.data(), sizes=sts.layer_sizes(min_layers=1, max_layers=3), dtype=sts.dtypes)
def test_forward_matches_numpy_oracle_depth_1_to_3(data, sizes, dtype):
    params = data.draw(sts.mlp_params(sizes=sizes, dtype=dtype))
    n = data.draw(st.integers(1, 6))
    x = data.draw(sts.arrays(dtype, (n, sizes[0]), 3.0))
    before = snapshot((params, x))
    logits, cache = model_forward(params, x)
    expected, hidden = oracle_forward(params, x)
    assert logits.shape == (n, sizes[-1]) and logits.dtype == dtype
    tol = tolerance(dtype, magnitude=100.0)  # sums of up to 6 products of size 3 x 2, three layers deep
    assert_close(logits, expected, **tol, what="logits")
    num_layers = len(sizes) - 1
    assert len(cache.layer_inputs) == num_layers and len(cache.pre_activations) == num_layers
    for layer, z in enumerate(hidden):
        assert_close(cache.pre_activations[layer], z, **tol, what=f"z{layer + 1}")
        assert_close(cache.layer_inputs[layer + 1], np.maximum(z, 0), **tol, what=f"a{layer + 1}")
    assert_unchanged(before, (params, x), "params and x")
    assert_no_shared_memory((logits, cache), (params, x), "model_forward")


@pytest.mark.m03
@pytest.mark.parametrize("params_dtype, x_dtype", [(np.float64, np.float32), (np.float32, np.float64)])
def test_forward_casts_x_to_params_dtype(params_dtype, x_dtype):
    params = random_mlp(np.random.default_rng(0), (3, 4, 2), params_dtype)
    x = np.random.default_rng(1).standard_normal((5, 3)).astype(x_dtype)
    logits, cache = model_forward(params, x)
    assert logits.dtype == params_dtype, f"logits: expected {np.dtype(params_dtype)}, got {logits.dtype}"
    for i, array in enumerate(cache.layer_inputs + cache.pre_activations):
        assert array.dtype == params_dtype, f"cache array #{i}: expected {np.dtype(params_dtype)}, got {array.dtype}"


@pytest.mark.m03
def test_forward_matches_torch_logits():
    snap = torch_snapshot()
    logits, _ = model_forward(torch_mlp(snap), snap["mlp_x"])
    assert_close(logits, snap["mlp_logits"], rtol=1e-12, atol=1e-14, what="logits vs torch")


@pytest.mark.m03
@pytest.mark.parametrize(
    "make_x, error",
    [(lambda: np.ones((2, 4)), ValueError),  # wrong width
     (lambda: np.ones(3), ValueError),  # 1-D
     (lambda: np.array([[1.0, np.nan, 0.0]]), ValueError),
     (lambda: np.ones((2, 3), dtype=np.int64), TypeError),
     (lambda: [[1.0, 2.0, 3.0]], TypeError)],
)
def test_forward_rejects_bad_x(make_x, error):
    params = random_mlp(np.random.default_rng(0), (3, 4, 2))
    with pytest.raises(error, match="x"):
        model_forward(params, make_x())


@pytest.mark.m03
def test_forward_rejects_malformed_params():
    params = random_mlp(np.random.default_rng(0), (3, 4, 2))
    x = np.ones((2, 3))
    missing = {k: v for k, v in params.items() if k != "b1"}
    with pytest.raises(ValueError, match="params"):
        model_forward(missing, x)
    mismatched = dict(params, W2=np.ones((5, 2)))
    with pytest.raises(ValueError, match="params"):
        model_forward(mismatched, x)


# ---------------------------------------------------------------------------
# Milestone 04: softmax
# ---------------------------------------------------------------------------


@pytest.mark.m04
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m04")
    logits = np.asarray(fixture["inputs"]["logits"], dtype=dtype)
    before = snapshot(logits)
    with np.errstate(all="raise"):  # an overflow in exp is an error here
        probs = softmax(logits)
    assert probs.dtype == dtype
    assert_close(probs, np.array(fixture["expected"]["probs"]), **tolerance(dtype, magnitude=0.0), what="softmax")
    assert_unchanged(before, logits, "logits")
    assert_no_shared_memory(probs, logits, "softmax")


@pytest.mark.m04
@given(logits=st.one_of(sts.arrays(np.float32), sts.arrays(np.float64)))
def test_softmax_matches_naive_formula_on_moderate_logits(logits):
    before = snapshot(logits)
    probs = softmax(logits)
    assert probs.shape == logits.shape and probs.dtype == logits.dtype
    exp = np.exp(logits.astype(np.float64))  # |logits| <= 10: no overflow
    expected = exp / exp.sum(axis=-1, keepdims=True)
    tol = tolerance(logits.dtype, magnitude=1e-3)
    assert_close(probs, expected, **tol, what="softmax")
    assert np.all(probs >= 0)
    assert_close(probs.sum(axis=-1), np.ones(logits.shape[:-1]), **tol, what="row sums")
    assert_unchanged(before, logits, "logits")
    assert_no_shared_memory(probs, logits, "softmax")


@pytest.mark.m04
@given(data=st.data(), dtype=sts.dtypes)
def test_softmax_invariant_to_per_row_constant(data, dtype):
    rows = data.draw(st.integers(1, 5))
    cols = data.draw(st.integers(1, 5))
    logits = data.draw(sts.arrays(dtype, (rows, cols), 10.0))
    # |z + c| <= 60 keeps even an unshifted exp finite in float32 (it overflows past 88):
    # this test is about the invariance; overflow is test_softmax_finite_for_huge_logits's.
    shifts = data.draw(sts.arrays(dtype, (rows, 1), 50.0))
    atol = tolerance(dtype, magnitude=2.0)["atol"]
    assert_close(softmax(logits + shifts), softmax(logits), rtol=0.0, atol=atol, what="softmax(z + c)")


@pytest.mark.m04
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_finite_for_huge_logits(dtype):
    logits = np.array([[1e4, 0.0, -1e4], [1e4, 1e4, 1e4], [-1e4, -1e4, -1e4], [1e4, 1e4 - 1, 0]], dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        probs = softmax(logits)
    assert np.all(np.isfinite(probs)), f"softmax of huge logits must be finite, got {probs}"
    e = math.exp(-1.0)
    expected = np.array([[1, 0, 0], [1 / 3, 1 / 3, 1 / 3], [1 / 3, 1 / 3, 1 / 3], [1 / (1 + e), e / (1 + e), 0]])
    assert_close(probs, expected, **tolerance(dtype, magnitude=0.0), what="softmax")


@pytest.mark.m04
@pytest.mark.parametrize("shape", [(4,), (2, 3, 4), (1, 2, 1, 5)])
def test_softmax_acts_on_last_axis_of_any_rank(shape):
    logits = np.random.default_rng(7).standard_normal(shape)
    probs = softmax(logits)
    exp = np.exp(logits)
    assert_close(probs, exp / exp.sum(axis=-1, keepdims=True), rtol=1e-12, what=f"softmax of shape {shape}")


@pytest.mark.m04
@pytest.mark.parametrize(
    "bad, error",
    [([[1.0, 2.0]], TypeError), (np.array([[1, 2]]), TypeError), (np.array([[0.0, np.inf]]), ValueError),
     (np.array([[np.nan, 1.0]]), ValueError), (np.zeros((2, 0)), ValueError), (np.array(1.0), ValueError)],
)
def test_softmax_rejects_bad_logits(bad, error):
    with pytest.raises(error, match="logits"):
        softmax(bad)


# ---------------------------------------------------------------------------
# Milestone 05: cross_entropy_loss
# ---------------------------------------------------------------------------


@pytest.mark.m05
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m05")
    logits = np.asarray(fixture["inputs"]["logits"], dtype=dtype)
    labels = np.asarray(fixture["inputs"]["labels"])
    before = snapshot((logits, labels))
    loss = cross_entropy_loss(logits, labels)
    assert type(loss) is float, f"the loss must be a Python float, got {type(loss).__name__}"
    assert_close(loss, fixture["expected"]["loss"], **tolerance(dtype, magnitude=0.0), what="loss")
    assert_unchanged(before, (logits, labels), "logits and labels")


@pytest.mark.m05
@given(n=st.integers(1, 8), num_classes=st.integers(1, 7), value=st.sampled_from([0.0, -3.5, 7.0, 1e4, -1e4]),
       dtype=sts.dtypes)
def test_cross_entropy_equal_logits_is_log_num_classes(n, num_classes, value, dtype):
    logits = np.full((n, num_classes), value, dtype=dtype)
    labels = np.arange(n) % num_classes
    loss = cross_entropy_loss(logits, labels)
    # log-sum-exp adds log(C) to the row max and subtracts it again: the rounding of
    # numbers of size |value| (a few units of np.finfo(dtype).eps * |value|) is unavoidable.
    atol = 1e-12 + 4 * np.finfo(dtype).eps * max(abs(value), 1.0)
    assert_close(loss, math.log(num_classes), rtol=tolerance(dtype)["rtol"], atol=atol,
                 what=f"loss of equal logits ({value}) over {num_classes} classes")


@pytest.mark.m05
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_finite_for_huge_logits(dtype):
    logits = np.array([[1e4, 0.0], [1e4, 0.0], [-1e4, 1e4]], dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        right = cross_entropy_loss(logits[:1], np.array([0]))
        wrong = cross_entropy_loss(logits[1:2], np.array([1]))
        mixed = cross_entropy_loss(logits, np.array([0, 1, 0]))
    assert_close(right, 0.0, atol=1e-12, what="confidently right")
    assert_close(wrong, 1e4, rtol=1e-12, what="confidently wrong by 1e4")
    assert_close(mixed, (0.0 + 1e4 + 2e4) / 3, rtol=1e-12, what="mean of three rows")


@pytest.mark.m05
@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_shifts_each_row_by_its_own_max(dtype):
    # Both rows have loss log(1 + e) = 1.3132616875... (label 0, the other logit one higher).
    # Shifting by the max of the WHOLE array (1001) underflows row 0 to exp(-1001) = 0 and
    # gives log(0) = -inf; shifting each row by its own max keeps both finite.
    logits = np.array([[0.0, 1.0], [1000.0, 1001.0]], dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        loss = cross_entropy_loss(logits, np.array([0, 0]))
    # float32 spacing near 1001 is 6.1e-5, so lse - z_y of row 1 keeps only ~5e-5 (absolute).
    assert_close(loss, math.log(1.0 + math.e), **tolerance(dtype, magnitude=10.0),
                 what="loss with rows of very different scale")


@pytest.mark.m05
def test_cross_entropy_picks_one_entry_per_row():
    # Row i contributes logsumexp(z_i) - z_i[y_i]. Here lse = [log(1+e), log(1+e^2)] and the
    # picked logits are z_0[1] = 1 and z_1[0] = 0, so the mean is
    # (log(1+e) - 1 + log(1+e^2) - 0) / 2. Indexing whole columns, logits[:, labels], gives a
    # different number.
    logits = np.array([[0.0, 1.0], [0.0, 2.0]])
    expected = (math.log(1 + math.e) - 1.0 + math.log(1 + math.e**2)) / 2
    assert_close(cross_entropy_loss(logits, np.array([1, 0])), expected, rtol=1e-12, what="loss")


@pytest.mark.m05
@given(data=st.data(), dtype=sts.dtypes)
def test_cross_entropy_matches_naive_oracle(data, dtype):
    n = data.draw(st.integers(1, 10))
    num_classes = data.draw(st.integers(1, 6))
    logits = data.draw(sts.arrays(dtype, (n, num_classes), 10.0))
    labels = np.array(data.draw(st.lists(st.integers(0, num_classes - 1), min_size=n, max_size=n)), dtype=np.int64)
    before = snapshot((logits, labels))
    loss = cross_entropy_loss(logits, labels)
    z = logits.astype(np.float64)
    expected = float(np.mean(-np.log(np.exp(z[np.arange(n), labels]) / np.exp(z).sum(axis=1))))
    assert type(loss) is float, f"the loss must be a Python float, got {type(loss).__name__}"
    assert_close(loss, expected, **tolerance(dtype), what="loss")
    assert loss >= 0.0
    assert_unchanged(before, (logits, labels), "logits and labels")


@pytest.mark.m05
def test_cross_entropy_matches_torch():
    snap = torch_snapshot()
    loss = cross_entropy_loss(snap["mlp_logits"], snap["mlp_y"])
    assert_close(loss, float(snap["mlp_loss"]), rtol=1e-12, what="loss vs torch")


@pytest.mark.m05
def test_cross_entropy_empty_batch_raises():
    with pytest.raises(ValueError, match="logits"):
        cross_entropy_loss(np.zeros((0, 3)), np.zeros(0, dtype=np.int64))


@pytest.mark.m05
@pytest.mark.parametrize(
    "labels, error",
    [(np.array([0, 3]), ValueError), (np.array([0, -1]), ValueError), (np.array([0]), ValueError),
     (np.array([0.0, 1.0]), TypeError), ([0, 1], TypeError), (np.array([[0, 1]]), ValueError)],
)
def test_cross_entropy_rejects_bad_labels(labels, error):
    with pytest.raises(error, match="labels"):
        cross_entropy_loss(np.zeros((2, 3)), labels)


@pytest.mark.m05
def test_cross_entropy_rejects_bad_logits():
    with pytest.raises(ValueError, match="logits"):
        cross_entropy_loss(np.zeros(3), np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="logits"):
        cross_entropy_loss(np.array([[np.inf, 0.0]]), np.array([0]))


# ---------------------------------------------------------------------------
# Milestone 06: model_backward
# ---------------------------------------------------------------------------


def finite_difference_grads(params, x, labels, step=1e-6):
    """Central differences of the float64 oracle loss, one parameter entry at a time."""
    grads = {}
    for key, value in params.items():
        grad = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            plus = {k: v.copy() for k, v in params.items()}
            minus = {k: v.copy() for k, v in params.items()}
            plus[key][index] += step
            minus[key][index] -= step
            grad[index] = (oracle_loss(plus, x, labels) - oracle_loss(minus, x, labels)) / (2 * step)
        grads[key] = grad
    return grads


@pytest.mark.m06
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("m06")
    inputs = fixture["inputs"]
    params = as_params(inputs["params"], dtype)
    cache = ForwardCache(
        tuple(np.asarray(a, dtype=dtype) for a in inputs["cache"]["layer_inputs"]),
        tuple(np.asarray(z, dtype=dtype) for z in inputs["cache"]["pre_activations"]),
    )
    labels = np.asarray(inputs["labels"])
    before = snapshot((params, cache, labels))
    grads = model_backward(params, cache, labels)
    for key, value in grads.items():
        assert value.dtype == dtype, f"grads[{key!r}]: expected dtype {np.dtype(dtype)}, got {value.dtype}"
    assert_params_close(grads, as_params(fixture["expected"]), **tolerance(dtype, magnitude=0.01), what="grads")
    assert_unchanged(before, (params, cache, labels), "params, cache and labels")
    assert_no_shared_memory(grads, (params, cache, labels), "model_backward")


@pytest.mark.m06
@pytest.mark.parametrize("sizes", [(3, 4), (3, 5, 4), (2, 4, 3, 3)])
def test_backward_matches_finite_differences(sizes):
    rng = np.random.default_rng(sum(sizes))
    params = random_mlp(rng, sizes)
    x = rng.standard_normal((6, sizes[0]))
    labels = rng.integers(0, sizes[-1], size=6)
    logits, cache = model_forward(params, x)
    grads = model_backward(params, cache, labels)
    _, hidden = oracle_forward(params, x)
    assert all(np.abs(z).min() > 1e-3 for z in hidden), "test data sits on a ReLU kink; pick another seed"
    assert_params_close(grads, finite_difference_grads(params, x, labels), rtol=1e-6, atol=1e-8,
                        what="grads vs central differences")


@pytest.mark.m06
@given(seed=sts.seeds(), sizes=sts.layer_sizes(min_layers=2, max_layers=3, max_width=4), n=st.integers(2, 6))
def test_backward_matches_finite_differences_random_mlps(seed, sizes, n):
    rng = np.random.default_rng(seed)
    params = random_mlp(rng, sizes)
    x = rng.standard_normal((n, sizes[0]))
    labels = rng.integers(0, sizes[-1], size=n)
    _, hidden = oracle_forward(params, x)
    assume(all(np.abs(z).min() > 1e-3 for z in hidden))  # keep away from ReLU kinks
    before = snapshot(params)
    _, cache = model_forward(params, x)
    cache_before = snapshot(cache)
    grads = model_backward(params, cache, labels)
    assert_params_close(grads, finite_difference_grads(params, x, labels), rtol=1e-6, atol=1e-8,
                        what="grads vs central differences")
    assert_unchanged(before, params, "params")
    assert_unchanged(cache_before, cache, "cache")
    assert_no_shared_memory(grads, (params, cache), "model_backward")


@pytest.mark.m06
def test_backward_matches_torch_autograd():
    snap = torch_snapshot()
    params = torch_mlp(snap)
    _, cache = model_forward(params, snap["mlp_x"])
    grads = model_backward(params, cache, snap["mlp_y"])
    expected = {key: snap[f"mlp_grad_{key}"] for key in params}
    assert_params_close(grads, expected, rtol=1e-10, atol=1e-14, what="grads vs torch autograd")


@pytest.mark.m06
def test_backward_is_gradient_of_the_mean_not_the_sum():
    """Repeating the batch three times leaves the mean loss, so the gradient, unchanged."""
    rng = np.random.default_rng(3)
    params = random_mlp(rng, (3, 4, 3))
    x = rng.standard_normal((4, 3))
    labels = np.array([0, 1, 2, 1])
    grads_once = model_backward(params, model_forward(params, x)[1], labels)
    tripled = np.concatenate([x, x, x])
    grads_thrice = model_backward(params, model_forward(params, tripled)[1], np.tile(labels, 3))
    assert_params_close(grads_thrice, grads_once, rtol=1e-10, atol=1e-15, what="grads of the tripled batch")


@pytest.mark.m06
def test_backward_on_a_batch_larger_than_any_chunk():
    """1031 rows (a prime: 4 chunks of 256 and 7 left over, 1 chunk of 1024 and 7 left over):
    still the gradient of the mean over every row, checked against central differences.
    Averaging per-chunk means, or dropping the last partial chunk, is off by far more."""
    rng = np.random.default_rng(1031)
    params = random_mlp(rng, (3, 4, 3))
    x = rng.standard_normal((1031, 3))
    x[-7:] *= 4.0  # the leftover rows differ from the rest, so losing or down-weighting them shows
    labels = rng.integers(0, 3, size=1031)
    _, hidden = oracle_forward(params, x)
    assert np.abs(hidden[0]).min() > 1e-4, "test data sits on a ReLU kink; pick another seed"
    grads = model_backward(params, model_forward(params, x)[1], labels)
    assert_params_close(grads, finite_difference_grads(params, x, labels), rtol=1e-6, atol=1e-8,
                        what="grads of 1031 rows vs central differences")


@pytest.mark.m06
@given(seed=sts.seeds(), sizes=sts.layer_sizes(), dtype=sts.dtypes)
def test_backward_structure_dtype_and_bias_sums(seed, sizes, dtype):
    rng = np.random.default_rng(seed)
    params = random_mlp(rng, sizes, dtype)
    x = rng.standard_normal((5, sizes[0])).astype(dtype)
    labels = rng.integers(0, sizes[-1], size=5)
    _, cache = model_forward(params, x)
    grads = model_backward(params, cache, labels)
    assert list(grads) == list(params), f"expected keys {list(params)}, got {list(grads)}"
    for key in params:
        assert grads[key].shape == params[key].shape, f"grads[{key!r}]: shape {grads[key].shape}"
        assert grads[key].dtype == dtype, f"grads[{key!r}]: dtype {grads[key].dtype}"
    # Each row of softmax - onehot sums to 0, so the last bias gradient sums to 0.
    last = f"b{len(sizes) - 1}"
    assert abs(float(grads[last].astype(np.float64).sum())) < tolerance(dtype)["atol"]


@pytest.mark.m06
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_passes_no_gradient_through_a_pre_activation_of_exactly_zero(dtype):
    """Zero biases (as ``init_model_params`` leaves them) and an all-zero input row give
    ``z1 = 0`` exactly. The ReLU passes no gradient where ``z <= 0``, so ``dz1 = 0`` and
    ``db1 = 0``; a mask ``z >= 0`` (or ``sign``-based) lets ``da1`` through.

    By hand, one row ``x = [0, 0]``, label 0, two classes:
    ``z1 = a1 = [0, 0]``, ``logits = b2 = [0, 0]``, ``p = [1/2, 1/2]``,
    ``dz2 = p - onehot(0) = [-1/2, 1/2]`` (n = 1), ``dW2 = a1^T dz2 = 0``, ``db2 = dz2``,
    ``da1 = dz2 W2^T = [-1/2 * 1 + 1/2 * -2, -1/2 * -1 + 1/2 * 1/2] = [-3/2, 3/4]``,
    ``dz1 = da1 * [z1 > 0] = [0, 0]``, so ``dW1 = x^T dz1 = 0`` and ``db1 = 0``
    (with ``>=`` it would be ``[-3/2, 3/4]``)."""
    params = as_params({"W1": [[1.0, -1.0], [0.5, 2.0]], "b1": [0.0, 0.0],
                        "W2": [[1.0, -2.0], [-1.0, 0.5]], "b2": [0.0, 0.0]}, dtype)
    x = np.zeros((1, 2), dtype=dtype)
    _, cache = model_forward(params, x)
    grads = model_backward(params, cache, np.array([0]))
    expected = as_params({"W1": [[0.0, 0.0], [0.0, 0.0]], "b1": [0.0, 0.0],
                          "W2": [[0.0, 0.0], [0.0, 0.0]], "b2": [-0.5, 0.5]})
    assert_params_close(grads, expected, rtol=0, atol=1e-7, what="grads at a pre-activation of exactly 0")
    # The same zero row beside a row with positive pre-activations: the zero row still adds
    # nothing to db1. Row 2, x = [1, 1]: z1 = [1.5, 1] > 0, logits = [0.5, -2.5], label 1,
    # p = [s(3), 1 - s(3)] with s(t) = 1/(1 + e^-t); dz2 = (p - [0, 1]) / 2 and the zero row's
    # dz2 = ([1/2, 1/2] - [1, 0]) / 2; db1 is row 2's dz2 W2^T only.
    x2 = np.array([[0.0, 0.0], [1.0, 1.0]], dtype=dtype)
    _, cache2 = model_forward(params, x2)
    grads2 = model_backward(params, cache2, np.array([0, 1]))
    s3 = 1.0 / (1.0 + math.exp(-3.0))
    dz2_row2 = np.array([s3, 1.0 - s3 - 1.0]) / 2
    da1_row2 = dz2_row2 @ np.array([[1.0, -2.0], [-1.0, 0.5]]).T
    assert_close(grads2["b1"], da1_row2, rtol=0, atol=1e-6, what="db1 with a zero row in the batch")


@pytest.mark.m06
def test_backward_rejects_bad_inputs():
    rng = np.random.default_rng(0)
    params = random_mlp(rng, (3, 4, 2))
    _, cache = model_forward(params, rng.standard_normal((3, 3)))
    with pytest.raises(ValueError, match="labels"):
        model_backward(params, cache, np.array([0, 1]))  # 2 labels for 3 rows
    with pytest.raises(ValueError, match="labels"):
        model_backward(params, cache, np.array([0, 1, 2]))  # class 2 of 2
    with pytest.raises(TypeError, match="labels"):
        model_backward(params, cache, np.array([0.0, 1.0, 1.0]))
    with pytest.raises(TypeError, match="cache"):
        model_backward(params, tuple(cache), np.array([0, 1, 1]))
    one_layer = random_mlp(rng, (3, 2))
    with pytest.raises(ValueError, match="cache"):
        model_backward(one_layer, cache, np.array([0, 1, 1]))
