"""Exercise x01 (optional, outside the 30): the fp4 (E2M1) quantiser with per-block scales.

``scale_exponents`` and ``fp4_codes`` in ``diloco.core.quantize`` are the library's own
(``encode(x, "fp4")`` and ``"int8"`` call them). Expected values are hand-worked
(``tests/fixtures/x01.json``) or come from brute-force oracles written here (the nearest of
all 15 signed grid values, the smallest exponent that fits), never from the package.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco.core.quantize import E2M1_GRID, decode, encode, fp4_codes, quantize, scale_exponents
from helpers import DTYPES, assert_close, load_fixture

pytestmark = pytest.mark.x01

GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1's magnitudes, written out (not read from the package)


def finite_arrays(dtype=np.float64, max_size=40, magnitude=1e6):
    return hnp.arrays(dtype, st.integers(1, max_size),
                      elements=st.floats(-magnitude, magnitude, allow_nan=False, width=np.dtype(dtype).itemsize * 8))


def values_of(codes: np.ndarray) -> np.ndarray:
    """What the codes stand for (before the scale), by the format's definition."""
    magnitude = np.array(GRID)[codes & 7]
    return np.where(codes >> 3 == 1, -magnitude, magnitude)


# --------------------------------------------------------------------------- fp4_codes


@pytest.mark.parametrize("dtype", DTYPES)
def test_fp4_codes_match_hand_worked_fixture(dtype):
    fixture = load_fixture("x01")
    scaled = np.array(fixture["inputs"]["codes_of"], dtype=dtype)
    codes = fp4_codes(scaled)
    assert isinstance(codes, np.ndarray) and codes.dtype == np.uint8, (
        f"fp4_codes must return uint8 codes, got {getattr(codes, 'dtype', type(codes))}")
    assert codes.shape == scaled.shape, f"codes: expected shape {scaled.shape}, got {codes.shape}"
    assert codes.tolist() == fixture["expected"]["codes"], (
        f"codes of {scaled.tolist()}:\n  expected {fixture['expected']['codes']}\n       got {codes.tolist()}")


def test_fp4_codes_ties_go_to_the_even_index():
    """Each midpoint between two grid values goes to the one with the even index."""
    midpoints = [(GRID[i] + GRID[i + 1]) / 2 for i in range(7)]
    expected = [i if i % 2 == 0 else i + 1 for i in range(7)]
    got = fp4_codes(np.array(midpoints)).tolist()
    assert got == expected, f"midpoints {midpoints}:\n  expected indices {expected}\n       got {got}"
    assert fp4_codes(-np.array(midpoints)).tolist() == [8 + i for i in expected], "the negative midpoints"


def test_fp4_codes_keep_the_sign_of_negative_zero_and_clip_above_6():
    codes = fp4_codes(np.array([-0.0, 0.0, 6.5, -100.0, 1e300]))
    assert codes.tolist() == [8, 0, 7, 15, 7], f"expected [8, 0, 7, 15, 7], got {codes.tolist()}"


def test_fp4_codes_keep_the_shape():
    scaled = np.array([[0.3, -2.5], [6.0, 0.0], [1.0, -1.0]])
    codes = fp4_codes(scaled)
    assert codes.shape == (3, 2) and codes.tolist() == [[1, 12], [7, 0], [2, 10]], codes.tolist()


@given(scaled=finite_arrays(magnitude=6.0))
def test_fp4_codes_pick_the_nearest_grid_value(scaled):
    """Brute force: no signed grid value is nearer to ``scaled`` than the one its code stands for."""
    codes = fp4_codes(scaled)
    assert codes.shape == scaled.shape and codes.dtype == np.uint8
    assert np.all(codes < 16), f"codes must be 4 bits, got {codes.max()}"
    candidates = np.concatenate([np.array(GRID), -np.array(GRID)])
    best = np.abs(scaled[:, None] - candidates[None, :]).min(axis=1)
    chosen = np.abs(scaled - values_of(codes))
    worst = int(np.argmax(chosen - best))
    assert np.all(chosen == best), (
        f"{scaled[worst]!r} became {values_of(codes)[worst]!r}, but a grid value {best[worst]:.3g} away exists")
    assert np.all((codes >> 3 == 1) == np.signbit(scaled)), "the sign bit must be the sign of scaled"


@given(scaled=finite_arrays(magnitude=6.0))
def test_fp4_codes_are_odd_symmetric(scaled):
    codes, flipped = fp4_codes(scaled), fp4_codes(-scaled)
    assert np.array_equal(flipped & 7, codes & 7), "x and -x must get the same magnitude index"
    assert np.array_equal(flipped >> 3, 1 - (codes >> 3)), "x and -x must get opposite sign bits"


def test_fp4_codes_refuse_what_is_not_a_float_array():
    with pytest.raises(TypeError, match="scaled"):
        fp4_codes([0.5, 1.0])
    with pytest.raises(TypeError, match="scaled"):
        fp4_codes(np.array([1, 2]))


# --------------------------------------------------------------------------- scale_exponents


def test_scale_exponents_match_hand_worked_fixture():
    fixture = load_fixture("x01")
    case = fixture["inputs"]["exponents_of"]
    got = scale_exponents(np.array(case["values"]), np.array(case["unit_ids"]), case["units"], case["qmax"])
    assert isinstance(got, np.ndarray) and got.dtype == np.int16, (
        f"scale_exponents must return int16, got {getattr(got, 'dtype', type(got))}")
    assert got.tolist() == fixture["expected"]["exponents"], (
        f"exponents: expected {fixture['expected']['exponents']}, got {got.tolist()}")
    int8 = scale_exponents(np.array([1.5]), np.array([0]), 1, 127.0)
    assert int8.tolist() == [fixture["expected"]["int8_exponent_of_1.5"]], f"int8: expected [-6], got {int8.tolist()}"


def test_scale_exponents_at_an_exact_power_of_two():
    """amax / qmax = 2^k exactly: e = k (amax / 2^k = qmax fits); e = k + 1 wastes a bit."""
    values = np.array([6.0, 3.0, 0.75, 12.0 * 2.0**-20])
    got = scale_exponents(values, np.arange(4), 4, 6.0).tolist()
    assert got == [0, -1, -3, -19], f"expected [0, -1, -3, -19], got {got}"


@pytest.mark.parametrize("qmax", [6.0, 127.0])
def test_scale_exponents_at_every_power_of_two_boundary_and_one_ulp_either_side(qmax):
    """amax = 2^k qmax and its neighbours one ulp below and above, for every k the exponents reach:
    exactly at the boundary e = k, one ulp above e = k + 1 (or a code saturates), one ulp below
    e = k. Brute force, as above. ``ceil(log2(amax / qmax))`` in floating point gives k one ulp
    above (6144.000000000002 with qmax 6: log2 rounds to 10.0) and saturates a code."""
    wrong = []
    for k in range(-126, 127):
        edge = float(np.ldexp(qmax, k))
        for amax in (float(np.nextafter(edge, 0.0)), edge, float(np.nextafter(edge, np.inf))):
            fits = [e for e in range(-127, 128) if amax / 2.0**e <= qmax]
            got = int(scale_exponents(np.array([amax]), np.array([0]), 1, qmax)[0])
            if got != fits[0]:
                wrong.append(f"amax {amax!r}: expected {fits[0]}, got {got}")
    assert not wrong, f"{len(wrong)} boundaries wrong, first: {wrong[:3]}"


def test_scale_exponents_are_clamped_to_plus_minus_127():
    got = scale_exponents(np.array([1e-300, 1e300, 6.0 * 2.0**-127, 6.0 * 2.0**-128]), np.arange(4), 4, 6.0).tolist()
    assert got == [-127, 127, -127, -127], f"expected [-127, 127, -127, -127], got {got}"


@given(data=st.data())
def test_scale_exponent_is_the_smallest_that_fits(data):
    """Brute force over every exponent: ``amax / 2^e <= qmax`` and ``amax / 2^(e-1) > qmax``."""
    values = data.draw(finite_arrays(magnitude=1e30))
    units = data.draw(st.integers(1, 5))
    unit_ids = np.array(data.draw(st.lists(st.integers(0, units - 1), min_size=values.size,
                                           max_size=values.size)), dtype=np.int64)
    qmax = data.draw(st.sampled_from([6.0, 127.0]))
    got = scale_exponents(values, unit_ids, units, qmax)
    assert got.shape == (units,) and got.dtype == np.int16
    for unit in range(units):
        amax = float(np.abs(values[unit_ids == unit]).max()) if np.any(unit_ids == unit) else 0.0
        fits = [e for e in range(-127, 128) if amax / 2.0**e <= qmax]
        expected = fits[0] if amax > 0 else -127
        assert got[unit] == expected, f"unit {unit} (amax {amax!r}, qmax {qmax}): expected {expected}, got {got[unit]}"


def test_scale_exponents_refuse_bad_arguments():
    values, ids = np.array([1.0, 2.0]), np.array([0, 0])
    with pytest.raises(TypeError, match="values"):
        scale_exponents([1.0, 2.0], ids, 1, 6.0)
    with pytest.raises(TypeError, match="unit_ids"):
        scale_exponents(values, np.array([0.0, 0.0]), 1, 6.0)
    with pytest.raises(TypeError, match="unit_ids"):
        scale_exponents(values, np.array([0]), 1, 6.0)
    with pytest.raises(ValueError, match="units"):
        scale_exponents(values, ids, -1, 6.0)
    with pytest.raises(ValueError, match="qmax"):
        scale_exponents(values, ids, 1, 0.0)


# --------------------------------------------------------------------------- through encode / quantize


@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_fp4_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x01")
    case, expected = fixture["inputs"]["quantize"], fixture["expected"]["quantize"]
    x = np.array(case["x"], dtype=dtype)
    encoded = encode(x, "fp4", block_size=case["block_size"])
    assert encoded.exponents.tolist() == expected["exponents"], (
        f"block exponents: expected {expected['exponents']}, got {encoded.exponents.tolist()}")
    assert encoded.codes.tolist() == expected["codes"], (
        f"codes: expected {expected['codes']}, got {encoded.codes.tolist()}")
    got = quantize(x, "fp4", block_size=case["block_size"])
    assert got.dtype == dtype, f"quantize must keep the dtype {np.dtype(dtype)}, got {got.dtype}"
    assert_close(got, np.array(expected["values"], dtype=dtype), rtol=0, what="quantize(x, 'fp4', block_size=4)")


@given(x=finite_arrays(max_size=30, magnitude=1e4), block=st.sampled_from([0, 1, 3, 4, 8]))
def test_quantize_fp4_is_the_nearest_representable_value_of_its_block(x, block):
    """Each value becomes the nearest of ``+-grid * 2^e`` with its block's e, the smallest e
    whose scale lets the block's largest magnitude fit (no code saturates)."""
    encoded = encode(x, "fp4", block_size=block)
    got = decode(encoded, x.dtype)
    unit = block or x.size
    for start in range(0, x.size, unit):
        part, out = x[start:start + unit], got[start:start + unit]
        amax = float(np.abs(part).max())
        e = next(e for e in range(-127, 128) if amax / 2.0**e <= 6.0) if amax > 0 else -127
        candidates = np.concatenate([np.array(GRID), -np.array(GRID)]) * 2.0**e
        best = np.abs(part[:, None] - candidates[None, :]).min(axis=1)
        assert np.all(np.abs(part - out) == best), (
            f"block at {start} (amax {amax!r}, e {e}): {part.tolist()} became {out.tolist()}")


@given(x=finite_arrays(max_size=30), block=st.sampled_from([0, 2, 5]))
def test_quantize_fp4_is_idempotent(x, block):
    """A decoded tensor is on the grid of its own scales, so it encodes to itself."""
    once = quantize(x, "fp4", block_size=block)
    assert np.array_equal(quantize(once, "fp4", block_size=block), once), "quantize(quantize(x)) != quantize(x)"


_ORDINARY = st.one_of(st.just(0.0), st.floats(1e-20, 1e3), st.floats(-1e3, -1e-20))  # exponents far from +-127


@given(x=hnp.arrays(np.float64, st.integers(1, 20), elements=_ORDINARY), shift=st.integers(-20, 20))
def test_quantize_fp4_commutes_with_powers_of_two(x, shift):
    """Scaling a block by 2^k scales its exponent by k and nothing else (away from the clamp at 2^-127)."""
    scaled = quantize(x * 2.0**shift, "fp4", block_size=4)
    assert np.array_equal(scaled, quantize(x, "fp4", block_size=4) * 2.0**shift), "quantize(2^k x) != 2^k quantize(x)"


def test_sparse_fp4_payload_scales_only_the_kept_values():
    """With a keep mask the block's scale comes from its kept values only (0 if none is kept)."""
    x = np.array([100.0, 1.5, 0.75, -3.0, 0.3, 0.1])
    keep = np.array([False, True, True, True, False, False])
    encoded = encode(x, "fp4", block_size=3, keep=keep)
    assert encoded.exponents.tolist() == [-2, -1], f"expected exponents [-2, -1], got {encoded.exponents.tolist()}"
    assert_close(decode(encoded), np.array([0.0, 1.5, 0.75, -3.0, 0.0, 0.0]), rtol=0, what="sparse fp4")


def test_int8_shares_the_scale_exponents():
    x = np.array([1.5, -0.7, 0.0, 0.3])  # e = -6 (see the fixture): codes rint(x * 64)
    encoded = encode(x, "int8")
    assert encoded.exponents.tolist() == [-6] and encoded.codes.tolist() == [96, -45, 0, 19], encoded
    assert E2M1_GRID.tolist() == list(GRID)
