"""Exercise x03 (optional, outside the 30): top-k with error feedback (SparseLoCo).

``_topk_flat`` (the top-k of every chunk, behind ``topk_mask`` and ``encode_sparse``) and the
error-feedback step of ``compress_with_feedback`` in ``diloco.methods.sparse`` are the
library's own. Expected values are hand-worked (``tests/fixtures/x03.json``) or come from
brute-force oracles written here, never from the package.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco.methods.sparse import (
    ErrorFeedbackState,
    SparseConfig,
    compress_with_feedback,
    decode_sparse,
    encode_sparse,
    init_error_feedback,
    topk_mask,
)
from helpers import (
    DTYPES,
    FEW_EXAMPLES,
    as_params,
    assert_close,
    assert_params_close,
    assert_unchanged,
    load_fixture,
    snapshot,
)

pytestmark = pytest.mark.x03


def kept_count(length: int, density: float) -> int:
    """k_L = min(L, max(1, ceil(density L))), as the module's docstring defines it."""
    return min(length, max(1, math.ceil(round(density * length, 9))))


# --------------------------------------------------------------------------- top-k


@pytest.mark.parametrize("dtype", DTYPES)
def test_topk_mask_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x03")
    inputs, expected = fixture["inputs"], fixture["expected"]
    config = SparseConfig(chunk=inputs["chunk"], density=inputs["density"])
    x = np.array(inputs["x"], dtype=dtype)
    mask = topk_mask(x, config)
    assert isinstance(mask, np.ndarray) and mask.dtype == bool and mask.shape == x.shape, (
        f"topk_mask must return a bool array of shape {x.shape}, got {getattr(mask, 'dtype', type(mask))}")
    assert mask.tolist() == expected["mask"], (
        f"top-2 of each chunk of 4 of {inputs['x']}:\n  expected {expected['mask']}\n       got {mask.tolist()}")
    ties = topk_mask(np.array(inputs["ties"], dtype=dtype), config)
    assert ties.tolist() == expected["ties_mask"], (
        f"ties go to the earlier index: expected {expected['ties_mask']}, got {ties.tolist()}")


def test_topk_chunks_run_over_the_flattened_tensor():
    """A (3, 3) tensor is chunked as its 9 values in C order, not row by row."""
    fixture = load_fixture("x03")
    config = SparseConfig(chunk=fixture["inputs"]["chunk"], density=fixture["inputs"]["density"])
    x = np.array(fixture["inputs"]["x"]).reshape(3, 3)
    mask = topk_mask(x, config)
    assert mask.shape == (3, 3) and mask.ravel().tolist() == fixture["expected"]["mask"], mask.tolist()


def test_topk_keeps_at_least_one_value_per_chunk():
    x = np.array([0.1, -0.5, 0.2, 0.3, 0.9, 0.0, 0.0])
    mask = topk_mask(x, SparseConfig(chunk=4, density=0.02))  # ceil(0.08) = 1 per chunk of 4, 1 of the last 3
    assert mask.tolist() == [False, True, False, False, True, False, False], mask.tolist()
    assert topk_mask(x, SparseConfig(chunk=4, density=1.0)).all(), "density 1 keeps everything"


@given(x=hnp.arrays(np.float64, st.integers(1, 60), elements=st.integers(-5, 5).map(float)),
       chunk=st.integers(1, 9), density=st.sampled_from([0.01, 0.1, 0.25, 0.5, 0.7, 1.0]))
def test_topk_keeps_the_largest_of_every_chunk(x, chunk, density):
    """Per chunk: exactly k_L kept, none smaller than a dropped one, and among equal
    magnitudes the earlier ones kept (small integers make ties common)."""
    mask = topk_mask(x, SparseConfig(chunk=chunk, density=density))
    assert mask.shape == x.shape and mask.dtype == bool
    for start in range(0, x.size, chunk):
        part, kept = np.abs(x[start:start + chunk]), mask[start:start + chunk]
        k = kept_count(part.size, density)
        assert kept.sum() == k, f"chunk at {start} of length {part.size}: expected {k} kept, got {kept.sum()}"
        if k < part.size:
            lowest_kept, highest_dropped = part[kept].min(), part[~kept].max()
            assert lowest_kept >= highest_dropped, f"chunk at {start}: kept {part[kept]}, dropped {part[~kept]}"
            ties = np.flatnonzero(part == lowest_kept)
            assert kept[ties].tolist() == sorted(kept[ties].tolist(), reverse=True), (
                f"chunk at {start}: among equal magnitudes keep the earlier, got {kept.tolist()} for {part.tolist()}")


def test_topk_mask_refuses_what_is_not_a_float_array():
    with pytest.raises(TypeError, match="x"):
        topk_mask([1.0, 2.0], SparseConfig(chunk=2, density=0.5))


# --------------------------------------------------------------------------- error feedback


def feedback_case(fixture, dtype=np.float64):
    f = fixture["inputs"]["feedback"]
    return SparseConfig(chunk=f["chunk"], density=f["density"]), as_params(f["delta1"], dtype), as_params(
        f["delta2"], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_error_feedback_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x03")
    config, delta1, delta2 = feedback_case(fixture, dtype)
    tol = dict(rtol=1e-6 if dtype == np.float32 else 1e-12)
    payloads, sent, state = compress_with_feedback(delta1, init_error_feedback(delta1), config)
    round1 = fixture["expected"]["round1"]
    assert_params_close(sent, as_params(round1["sent"], dtype), **tol, what="round 1 sent")
    assert isinstance(state, ErrorFeedbackState), f"the new state must be an ErrorFeedbackState, got {type(state)}"
    assert_params_close(state.residual, as_params(round1["residual"], dtype), **tol, what="round 1 residual")
    for key in delta1:
        assert_close(decode_sparse(payloads[key]), sent[key], rtol=0, what=f"decode_sparse(payloads[{key!r}])")
    _, sent, state2 = compress_with_feedback(delta2, state, config)
    round2 = fixture["expected"]["round2"]
    assert_params_close(sent, as_params(round2["sent"], dtype), **tol, what="round 2 sent (residual + delta)")
    assert_params_close(state2.residual, as_params(round2["residual"], dtype), **tol, what="round 2 residual")


def test_error_feedback_decays_the_residual_not_the_delta():
    fixture = load_fixture("x03")
    config, delta1, delta2 = feedback_case(fixture)
    _, _, state = compress_with_feedback(delta1, init_error_feedback(delta1), config)
    half = SparseConfig(chunk=config.chunk, density=config.density, decay=0.5)
    _, sent, state = compress_with_feedback(delta2, state, half)
    expected = fixture["expected"]["round2_decay_half"]
    assert_params_close(sent, as_params(expected["sent"]), what="sent with decay 0.5 (0.5 e + delta)")
    assert_params_close(state.residual, as_params(expected["residual"]), what="residual with decay 0.5")


def test_error_feedback_is_pure():
    fixture = load_fixture("x03")
    config, delta1, _ = feedback_case(fixture)
    state = ErrorFeedbackState({key: np.full_like(value, 0.25) for key, value in delta1.items()})
    before_delta, before_state = snapshot(delta1), snapshot(state.residual)
    compress_with_feedback(delta1, state, config)
    assert_unchanged(before_delta, delta1, "delta")
    assert_unchanged(before_state, state.residual, "state.residual")


def params_like(draw_data, dtype=np.float64):
    shapes = draw_data.draw(st.lists(st.tuples(st.integers(1, 4), st.integers(1, 5)), min_size=1, max_size=3))
    out = {}
    for layer, shape in enumerate(shapes, start=1):
        out[f"W{layer}"] = draw_data.draw(hnp.arrays(dtype, shape, elements=st.floats(-100, 100, width=64)))
    return out


@FEW_EXAMPLES
@given(data=st.data(), chunk=st.integers(1, 7), density=st.sampled_from([0.1, 0.3, 0.5, 1.0]),
       decay=st.sampled_from([1.0, 0.9, 0.5, 0.0]))
def test_nothing_is_lost_sent_plus_residual_is_the_buffer(data, chunk, density, decay):
    """``sent + e'' == decay e + delta`` exactly (top-k copies values, it does not round them),
    the two never overlap, and the payload decodes to what was sent."""
    delta = params_like(data)
    old = {key: data.draw(hnp.arrays(np.float64, value.shape, elements=st.floats(-100, 100, width=64)))
           for key, value in delta.items()}
    config = SparseConfig(chunk=chunk, density=density, decay=decay)
    payloads, sent, state = compress_with_feedback(delta, ErrorFeedbackState(old), config)
    for key in delta:
        buffer = decay * old[key] + delta[key]
        assert_close(sent[key] + state.residual[key], buffer, rtol=0, what=f"sent + residual [{key!r}]")
        assert np.all((sent[key] == 0) | (state.residual[key] == 0)), f"{key}: sent and residual overlap"
        assert np.array_equal(sent[key] != 0, topk_mask(buffer, config) & (buffer != 0)), (
            f"{key}: the values sent must be the top-k of the buffer decay e + delta")
        assert_close(decode_sparse(payloads[key]), sent[key], rtol=0, what=f"payload of {key!r}")


@FEW_EXAMPLES
@given(data=st.data(), rounds=st.integers(1, 4))
def test_over_rounds_everything_is_sent_eventually(data, rounds):
    """With decay 1 the sum of what was sent plus the last residual is the sum of the deltas."""
    config = SparseConfig(chunk=3, density=0.4)
    deltas = [params_like(data) for _ in range(1)]
    shapes = {key: value.shape for key, value in deltas[0].items()}
    for _ in range(rounds - 1):
        deltas.append({key: data.draw(hnp.arrays(np.float64, shape, elements=st.floats(-100, 100, width=64)))
                       for key, shape in shapes.items()})
    state = init_error_feedback(deltas[0])
    total_sent = {key: np.zeros(shape) for key, shape in shapes.items()}
    for delta in deltas:
        _, sent, state = compress_with_feedback(delta, state, config)
        total_sent = {key: total_sent[key] + sent[key] for key in shapes}
    for key in shapes:
        assert_close(total_sent[key] + state.residual[key], sum(d[key] for d in deltas), rtol=1e-9, atol=1e-9,
                     what=f"sent over {rounds} rounds + residual [{key!r}]")


def test_density_one_sends_everything():
    fixture = load_fixture("x03")
    _, delta1, _ = feedback_case(fixture)
    _, sent, state = compress_with_feedback(delta1, init_error_feedback(delta1), SparseConfig(chunk=2, density=1.0))
    assert_params_close(sent, delta1, rtol=0, what="sent with density 1")
    assert all(not value.any() for value in state.residual.values()), "nothing is left with density 1"


def test_error_feedback_refuses_a_state_of_another_structure():
    fixture = load_fixture("x03")
    config, delta1, _ = feedback_case(fixture)
    with pytest.raises(TypeError, match="state"):
        compress_with_feedback(delta1, {"W1": np.zeros((2, 2))}, config)
    with pytest.raises(ValueError, match="state.residual"):
        compress_with_feedback(delta1, ErrorFeedbackState({"W1": np.zeros((2, 2))}), config)
    with pytest.raises(ValueError, match="state.residual"):
        compress_with_feedback(delta1, ErrorFeedbackState({"W1": np.zeros((2, 3)), "b1": np.zeros(2)}), config)
    with pytest.raises((TypeError, ValueError), match="delta"):
        compress_with_feedback({"W1": [1.0]}, init_error_feedback(delta1), config)


def test_the_payload_is_the_top_k_of_the_buffer():
    """``encode_sparse`` keeps the same positions as ``topk_mask`` (both are the one top-k)."""
    fixture = load_fixture("x03")
    config = SparseConfig(chunk=fixture["inputs"]["chunk"], density=fixture["inputs"]["density"])
    x = np.array(fixture["inputs"]["x"])
    decoded = decode_sparse(encode_sparse(x, config))
    expected = np.where(np.array(fixture["expected"]["mask"]), x, 0.0)
    assert_close(decoded, expected, rtol=0, what="decode_sparse(encode_sparse(x))")


def top_k_positions(x: np.ndarray, chunk: int, density: float) -> list[list[int]]:
    """Brute force: per chunk, the in-chunk positions of the k largest |x|, ties to the earlier index, ascending."""
    flat, chosen = x.ravel(), []
    for start in range(0, flat.size, chunk):
        part = [abs(float(v)) for v in flat[start:start + chunk]]
        ranked = sorted(range(len(part)), key=lambda i: (-part[i], i))
        chosen.append(sorted(ranked[:kept_count(len(part), density)]))
    return chosen


@FEW_EXAMPLES
@given(data=st.data(), chunk=st.integers(17, 64), density=st.sampled_from([0.05, 0.25, 0.5]))
def test_ties_in_long_chunks_go_to_the_earlier_index_and_positions_ascend(data, chunk, density):
    """Values from a handful of magnitudes (ties everywhere) in chunks longer than 16, where
    NumPy's default sort stops being an insertion sort: the kept positions are the earliest of
    the tied values (a sort without ``kind="stable"``: planted, caught) and, in the payload,
    ascend within every chunk (planted without the final sort: caught)."""
    size = data.draw(st.integers(chunk, 3 * chunk + 5))
    x = np.array(data.draw(st.lists(st.sampled_from([-2.0, -1.0, 1.0, 2.0, 3.0]), min_size=size, max_size=size)))
    config = SparseConfig(chunk=chunk, density=density)
    want = top_k_positions(x, chunk, density)
    mask = topk_mask(x, config)
    got = [np.flatnonzero(mask[start:start + chunk]).tolist() for start in range(0, size, chunk)]
    assert got == want, f"kept positions per chunk: expected {want}, got {got}"
    payload = encode_sparse(x, config)
    counts = [len(c) for c in want]
    sent = np.split(np.asarray(payload.indices), np.cumsum(counts)[:-1])
    assert [s.tolist() for s in sent] == want, f"the payload's positions per chunk: expected {want}, got {sent}"
