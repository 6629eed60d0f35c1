"""Wire formats of outer gradients (diloco.core.quantize, wire, comm): bounds, idempotence,
special values, byte counts. Expected values come from the formats' definitions (the
E2M1 grid, IEEE bit patterns, exact fractions), never from the code under test."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco.core.comm import CommSpec, exchange_deltas
from diloco.core.quantize import (
    E2M1_GRID,
    FORMATS,
    bfloat16_bits,
    bfloat16_values,
    decode,
    encode,
    from_bytes,
    quantize,
    sign_prune_mask,
    to_bytes,
)

finite64 = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, allow_subnormal=True)
arrays64 = hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=40), elements=finite64)
blocks = st.sampled_from([0, 1, 3, 8, 32])


def _block_amax(x: np.ndarray, block: int) -> np.ndarray:
    """The largest magnitude of the block of every value of ``x`` (flat)."""
    flat = np.abs(x.ravel())
    unit = block or flat.size
    out = np.empty_like(flat)
    for start in range(0, flat.size, unit):
        out[start:start + unit] = flat[start:start + unit].max()
    return out


# --- error bounds ---------------------------------------------------------------------------

@given(arrays64, blocks)
def test_int8_error_is_at_most_half_a_step_of_amax_over_127(x, block):
    error = np.abs(quantize(x, "int8", block_size=block) - x).ravel()
    # step s = 2^ceil(log2(amax/127)) < 2 amax/127, so the rounding error s/2 < amax/127;
    # the smallest step is 2^-127 (the scale's exponent is clamped), so below it the error is 2^-128
    assert np.all(error <= np.maximum(_block_amax(x, block) / 127 * (1 + 1e-12), 2.0**-128))


@given(arrays64, blocks)
def test_fp4_values_are_the_nearest_grid_point_times_the_block_scale(x, block):
    encoded = encode(x, "fp4", block_size=block)
    unit = encoded.unit
    scales = np.repeat(np.ldexp(1.0, encoded.exponents.astype(int)), unit)[:x.size]
    q = decode(encoded).ravel() / scales
    v = x.ravel() / scales
    assert np.all(np.isin(np.abs(q), E2M1_GRID))
    assert np.all(np.abs(v) <= 6.0 + 1e-12)  # the scale leaves every value inside the grid: no saturation
    distance = np.abs(np.abs(v)[:, None] - E2M1_GRID[None, :])
    assert np.all(np.abs(np.abs(q) - np.abs(v)) <= distance.min(axis=1) + 1e-12)


@given(arrays64)
def test_float_formats_round_within_half_an_ulp(x):
    for fmt, mantissa_bits, smallest in (("float32", 23, 2.0**-149), ("float16", 10, 2.0**-24),
                                         ("bfloat16", 7, 2.0**-133)):
        x = np.clip(x, -65504.0, 65504.0)  # float16's range (saturation is tested below)
        error = np.abs(quantize(x, fmt) - x)
        assert np.all(error <= np.abs(x) * 2.0**-(mantissa_bits + 1) + smallest / 2), fmt


@given(st.floats(-3.0000000054977558e38, 3.0000000054977558e38, allow_nan=False, allow_subnormal=True, width=32))
def test_bfloat16_is_the_nearer_neighbour_ties_to_even(value):
    x = np.array([value], dtype=np.float32)
    bits = int(x.view(np.uint32)[0])
    toward_zero = bits & 0xFFFF0000
    neighbours = [toward_zero, toward_zero + 0x10000]
    exact = Fraction(float(value))
    got = int(bfloat16_bits(x)[0]) << 16
    assert got in neighbours
    other = neighbours[1] if got == neighbours[0] else neighbours[0]
    as_float = [Fraction(float(np.array([b], dtype=np.uint32).view(np.float32)[0])) for b in (got, other)]
    assert abs(as_float[0] - exact) <= abs(as_float[1] - exact)
    if abs(as_float[0] - exact) == abs(as_float[1] - exact):
        assert (got >> 16) % 2 == 0


def test_bfloat16_from_float64_rounds_once_not_twice():
    # 1 + 2^-8 + 2^-40: float32 rounding first would drop 2^-40 and leave an exact tie
    # (-> 1.0); the correct bfloat16 rounding is up, to 1 + 2^-7.
    x = np.array([1 + 2.0**-8 + 2.0**-40, 1 + 2.0**-8, 1 + 3 * 2.0**-8])
    assert bfloat16_values(bfloat16_bits(x), np.float64).tolist() == [1 + 2.0**-7, 1.0, 1 + 2.0**-6]


# --- idempotence and the wire ----------------------------------------------------------------

@given(arrays64, st.sampled_from(FORMATS), blocks, st.sampled_from([None, 0.5]))
def test_decoding_then_encoding_again_changes_nothing(x, fmt, block, prune):
    keep = None if prune is None else sign_prune_mask(x, prune)
    once = quantize(x, fmt, block_size=block, keep=keep)
    assert np.array_equal(quantize(once, fmt, block_size=block, keep=keep), once)


@given(arrays64, st.sampled_from(FORMATS), blocks, st.sampled_from([None, 0.25, 0.9]),
       st.sampled_from([np.float64, np.float32]))
def test_bytes_on_the_wire_equal_nbytes_and_parse_back(x, fmt, block, prune, dtype):
    x = x.astype(dtype)
    keep = None if prune is None else sign_prune_mask(x, prune)
    encoded = encode(x, fmt, block_size=block, keep=keep)
    payload = to_bytes(encoded)
    assert len(payload) == encoded.nbytes
    parsed, end = from_bytes(payload, fmt, x.shape, encoded.unit, sparse=keep is not None)
    assert end == len(payload)
    assert np.array_equal(decode(parsed, dtype), decode(encoded, dtype))
    assert decode(encoded, dtype).dtype == dtype  # receivers accumulate in the params' dtype


@pytest.mark.parametrize("fmt, block, expected", [
    ("float32", 0, 40), ("float16", 0, 20), ("bfloat16", 4, 20),
    ("int8", 0, 10 + 1), ("int8", 4, 10 + 3),    # codes + one scale byte per block
    ("fp4", 0, 5 + 1), ("fp4", 4, 2 + 2 + 1 + 3),  # per block: ceil(n_b / 2) code bytes + 1 scale
])
def test_encoded_sizes_by_hand(fmt, block, expected):
    x = np.linspace(-1.0, 1.0, 10)
    assert encode(x, fmt, block_size=block).nbytes == expected


def test_a_sparse_payload_carries_a_bitmap_and_only_the_kept_codes():
    x = np.arange(1.0, 17.0)  # 16 values, half pruned
    encoded = encode(x, "fp4", keep=sign_prune_mask(x, 0.5))
    assert encoded.nbytes == 16 // 8 + 1 + 8 // 2  # bitmap + scale + 8 codes of 4 bits


# --- special values --------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_all_zero_tensors_stay_zero(fmt):
    x = np.zeros((3, 4))
    assert np.array_equal(quantize(x, fmt, block_size=5), x)


@pytest.mark.parametrize("fmt", ["int8", "fp4"])
def test_denormal_tensors_lose_nothing_but_their_underflow(fmt):
    x = np.array([5e-324, -1e-310, 3e-315, 0.0])  # float64 subnormals: below 2^-127, the smallest scale
    q = quantize(x, fmt)
    assert np.all(np.isfinite(q)) and np.all(np.abs(q - x) <= np.abs(x))


def test_subnormals_of_the_float_formats_round_like_numpy():
    x = np.array([2.0**-20, 2.0**-24, 3 * 2.0**-26, 2.0**-130, -2.0**-140])
    assert np.array_equal(quantize(x, "float16"), x.astype(np.float16).astype(np.float64))
    assert quantize(np.array([2.0**-130], dtype=np.float32), "bfloat16")[0] == 2.0**-130  # a bfloat16 subnormal


@pytest.mark.parametrize("fmt, huge, largest", [("float16", 1e6, 65504.0), ("bfloat16", 1e39, 3.3895313892515355e38),
                                                ("float32", 1e300, float(np.finfo(np.float32).max))])
def test_overflow_saturates_instead_of_becoming_inf(fmt, huge, largest):
    assert quantize(np.array([huge, -huge]), fmt).tolist() == [largest, -largest]


def test_ties_round_to_even():
    # int8: amax 127 gives scale 1, so 2.5 -> 2 and 3.5 -> 4; fp4 (scale 1 for amax 6) on its grid's midpoints
    assert quantize(np.array([127.0, 2.5, 3.5, -2.5]), "int8").tolist() == [127.0, 2.0, 4.0, -2.0]
    mids = np.array([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert quantize(mids, "fp4").tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_outer_gradients_are_refused(fmt, bad):
    with pytest.raises(ValueError, match="finite"):
        encode(np.array([1.0, bad]), fmt)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="fmt"):
        encode(np.ones(3), "int4")
    with pytest.raises(ValueError, match="block_size"):
        encode(np.ones(3), "int8", block_size=-1)
    with pytest.raises(TypeError, match="x must be a floating"):
        encode([1.0, 2.0], "int8")
    with pytest.raises(ValueError, match="keep"):
        encode(np.ones(3), "int8", keep=np.ones(2, dtype=bool))
    with pytest.raises(ValueError, match="fraction"):
        sign_prune_mask(np.ones(3), 1.0)


# --- sign pruning and error feedback ---------------------------------------------------------

@given(arrays64, st.floats(0.0, 0.99))
def test_sign_pruning_keeps_the_largest_magnitudes(x, fraction):
    keep = sign_prune_mask(x, fraction)
    assert keep.sum() == x.size - math.floor(fraction * x.size)
    if keep.any() and (~keep).any():
        assert np.abs(x[keep]).min() >= np.abs(x[~keep]).max()


@given(hnp.arrays(np.float64, (3, 5), elements=st.floats(-1, 1)), st.sampled_from(["int8", "fp4"]))
def test_error_feedback_delays_the_quantisation_error_instead_of_losing_it(delta, fmt):
    # one worker: sum of what was applied + what is still owed == sum of the true outer gradients
    spec, residuals, applied = CommSpec(fmt, 4, 0.0, True), None, np.zeros_like(delta)
    for t in range(1, 5):
        result = exchange_deltas([{"W": delta * t}], spec, residuals)
        residuals, applied = result.residuals, applied + result.delta["W"]
    np.testing.assert_allclose(applied + residuals[0]["W"], delta * 10, atol=1e-12)


def test_the_disjoint_merge_drops_the_minority_sign():
    deltas = [{"W": np.array([1.0, -2.0, 4.0, 8.0])}, {"W": np.array([3.0, 1.0, -2.0, 8.0])}]
    merged = exchange_deltas(deltas, CommSpec("float32", 0, 0.25, False)).delta["W"]
    # kept per worker: 3 of 4 entries; sign of the sum elected; mean of the agreeing entries
    assert merged.tolist() == [3.0, -2.0, 4.0, 8.0]


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_exchange_bytes_follow_the_reduce_scatter_all_gather_model(workers):
    rng = np.random.default_rng(workers)
    deltas = [{"W": rng.normal(size=(6, 7)), "b": rng.normal(size=7)} for _ in range(workers)]
    result = exchange_deltas(deltas, CommSpec("fp4", 0, 0.0, False))
    payload = (21 + 1) + (4 + 1)  # per tensor: 42 and 7 fp4 codes, one scale each
    assert result.payload_bytes == payload
    assert result.bytes_sent == pytest.approx(2 * (workers - 1) / workers * payload)
    native = exchange_deltas(deltas, CommSpec(None))
    assert native.bytes_sent == pytest.approx(2 * (workers - 1) / workers * 49 * 8)


@pytest.mark.parametrize("other, merged_bytes", [
    ([0.1] * 8 + [8.0] * 8, 2 + 1 + 16 // 2),  # disjoint supports: the merged mean keeps all 16 values
    ([-8.0] * 8 + [0.1] * 8, 2 + 1 + 0),  # opposite signs cancel: the merged mean keeps none
], ids=["merged support larger", "merged support empty"])
def test_sign_pruned_bytes_count_the_all_gather_of_the_merged_mean_not_the_own_payload(other, merged_bytes):
    """Reduce-scatter of each worker's pruned payload, then all-gather of the merged (TIES) mean, pruned to
    its own support: ``(K-1)/K (|E(Delta_k)| + |E(merged)|)``. Each payload keeps 8 of 16 fp4 values: a
    2-byte bitmap, one scale byte and 4 code bytes. The merged support differs from a worker's, so
    counting the all-gather as the worker's own payload (7 bytes) is caught both ways."""
    deltas = [{"W": np.array([8.0] * 8 + [0.1] * 8)}, {"W": np.array(other)}]
    result = exchange_deltas(deltas, CommSpec("fp4", 0, 0.5, False))
    own = 2 + 1 + 8 // 2
    assert result.payload_bytes == own
    assert result.bytes_sent == pytest.approx((2 - 1) / 2 * (own + merged_bytes))
    assert np.count_nonzero(result.delta["W"]) == (merged_bytes - 3) * 2
