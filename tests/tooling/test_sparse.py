"""Sparse outer gradients (diloco.methods.sparse): the kept set, the 2-bit codes and the DCT
worked by hand, the byte count, the round trip of the wire format, error feedback's
conservation, the reduction to DiLoCo at k = 100%, and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco.methods.sparse import (
    SparseConfig,
    chunked_dct,
    chunked_idct,
    compress_with_feedback,
    dct_matrix,
    decode_sparse,
    encode_sparse,
    encoded_nbytes,
    from_bytes,
    init_error_feedback,
    kept_per_chunk,
    to_bytes,
    topk_mask,
)


def tensors(max_side=9):
    dtype = st.sampled_from([np.float32, np.float64])
    shape = hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=max_side)
    return st.tuples(dtype, shape).flatmap(lambda spec: hnp.arrays(
        spec[0], spec[1], elements=st.floats(-100, 100, width=32 if spec[0] == np.float32 else 64)))


configs = st.builds(SparseConfig, chunk=st.integers(1, 12), density=st.sampled_from([0.01, 0.1, 0.25, 0.5, 1.0]),
                    bits=st.sampled_from([None, 2]), transform=st.sampled_from(["none", "dct"]),
                    decay=st.sampled_from([1.0, 0.9]))


def test_kept_set_codes_and_bytes_worked_by_hand():
    x = np.array([0.1, -0.9, 0.3, 0.0, 2.0, 0.5, -0.5, 0.4, 1.0, -3.0])
    config = SparseConfig(chunk=4, density=0.5)  # chunks of 4, 4, 2: keep 2, 2, 1
    assert kept_per_chunk(x.size, config).tolist() == [2, 2, 1]
    assert kept_per_chunk(25, SparseConfig(chunk=10, density=0.25)).tolist() == [3, 3, 2]  # ceil(2.5), ceil(1.25)
    payload = encode_sparse(x, config)
    # chunk 0 keeps -0.9 (index 1) and 0.3 (index 2); chunk 1 keeps 2.0 (0) and 0.5 (1): the tie
    # of |0.5| and |-0.5| goes to the earlier index; chunk 2 keeps -3.0 (1).
    assert payload.indices.tolist() == [1, 2, 0, 1, 1]
    assert payload.values.tolist() == [-0.9, 0.3, 2.0, 0.5, -3.0]
    assert decode_sparse(payload).tolist() == [0, -0.9, 0.3, 0, 2.0, 0.5, 0, 0, 0, -3.0]
    # 5 indices of ceil(log2 4) = 2 bits (2 bytes) + 5 float64 values (40 bytes).
    assert encoded_nbytes(x.size, config, np.float64) == 42 == len(to_bytes(payload))
    # 2-bit: levels {-s, -s/3, s/3, s} with s the chunk's largest kept magnitude.
    quantised = encode_sparse(x, SparseConfig(chunk=4, density=0.5, bits=2))
    assert quantised.scales.tolist() == [0.9, 2.0, 3.0]
    assert quantised.values.tolist() == [0, 2, 3, 2, 0]  # -0.9 -> -s; 0.3 -> s/3; 2 -> s; 0.5 -> s/3; -3 -> -s
    np.testing.assert_allclose(decode_sparse(quantised), [0, -0.9, 0.3, 0, 2.0, 2 / 3, 0, 0, 0, -3.0])
    # 3 float64 scales (24 bytes) + indices (2 bytes) + 5 codes of 2 bits (2 bytes).
    assert encoded_nbytes(x.size, quantised.config, np.float64) == 28 == len(to_bytes(quantised))
    assert encoded_nbytes(x.size, quantised.config, np.float32) == 16
    # Index widths: ceil(log2 C) bits, none when C = 1. Ten indices of 2 bits are 3 bytes.
    assert encoded_nbytes(10, SparseConfig(chunk=4, density=1.0), np.float32) == 3 + 40
    assert encoded_nbytes(10, SparseConfig(chunk=5, density=1.0), np.float32) == 4 + 40  # 3 bits each
    assert encoded_nbytes(3, SparseConfig(chunk=1, density=1.0), np.float64) == 24


def test_dct_worked_by_hand():
    s = 1 / np.sqrt(2)
    np.testing.assert_allclose(dct_matrix(2), [[s, s], [s, -s]], atol=1e-15)
    np.testing.assert_allclose(chunked_dct(np.array([3.0, 1.0]), 2), [4 * s, 2 * s], atol=1e-15)
    # A constant chunk of 4 has only its first (DC) coefficient, sqrt(4) times the value.
    np.testing.assert_allclose(chunked_dct(np.array([1.0, 1, 1, 1, 5]), 4), [2, 0, 0, 0, 5], atol=1e-15)
    for n in (1, 3, 8, 64):
        np.testing.assert_allclose(dct_matrix(n) @ dct_matrix(n).T, np.eye(n), atol=1e-13)
    with pytest.raises(ValueError):
        dct_matrix(4)[0, 0] = 1.0  # the cached matrix is read-only


@given(tensors(), configs)
def test_the_kept_set_is_the_top_magnitudes_of_every_chunk(x, config):
    mask = topk_mask(x, config)
    flat, kept = np.abs(x.ravel()), mask.ravel()
    for number, count in enumerate(kept_per_chunk(x.size, config)):
        part = slice(number * config.chunk, (number + 1) * config.chunk)
        chosen, rest = flat[part][kept[part]], flat[part][~kept[part]]
        assert chosen.size == count
        assert rest.size == 0 or chosen.min() >= rest.max()


@given(tensors(), configs)
def test_the_wire_format_round_trips_exactly_the_counted_bytes(x, config):
    payload = encode_sparse(x, config)
    wire = to_bytes(payload)
    assert len(wire) == encoded_nbytes(x.size, config, x.dtype)
    back = from_bytes(wire, x.shape, config, x.dtype)
    for field in ("indices", "values", "scales"):
        assert np.array_equal(getattr(back, field), getattr(payload, field)), field
        assert getattr(back, field).dtype == getattr(payload, field).dtype, field
    assert back.shape == payload.shape and back.dtype == payload.dtype
    assert np.array_equal(decode_sparse(back), decode_sparse(payload))
    assert decode_sparse(payload).dtype == x.dtype


@given(tensors(), tensors(), configs)
def test_error_feedback_conserves_what_is_owed(delta, old, config):
    if old.shape != delta.shape or old.dtype != delta.dtype:
        old = np.resize(old, delta.shape).astype(delta.dtype)
    state = init_error_feedback({"p": delta})._replace(residual={"p": old})
    payloads, sent, new = compress_with_feedback({"p": delta}, state, config)
    owed = old + delta if config.decay == 1.0 else config.decay * old + delta
    if config.bits is None and config.transform == "none":
        assert np.array_equal(sent["p"] + new.residual["p"], owed)  # sent entries are copied, the rest stays
        assert np.array_equal(sent["p"] == 0, ~topk_mask(owed, config) | (owed == 0))
    else:
        tol = (1e-4 if delta.dtype == np.float32 else 1e-12) * (1 + np.abs(owed).max())
        np.testing.assert_allclose(sent["p"] + new.residual["p"], owed, atol=tol)
    assert np.array_equal(sent["p"], decode_sparse(payloads["p"]))
    assert np.array_equal(old, state.residual["p"])  # the input state is untouched


def test_full_density_without_quantisation_is_diloco():
    rng = np.random.default_rng(0)
    config = SparseConfig(chunk=7, density=1.0)
    for dtype in (np.float32, np.float64):
        deltas = [{"W1": rng.standard_normal((5, 3)).astype(dtype), "b1": rng.standard_normal(3).astype(dtype)}
                  for _ in range(3)]
        sent = []
        for delta in deltas:
            _, decoded, state = compress_with_feedback(delta, init_error_feedback(delta), config)
            assert all(np.array_equal(decoded[k], delta[k]) and decoded[k].dtype == dtype for k in delta)
            assert all(not state.residual[k].any() for k in delta)
            sent.append(decoded)
        for key in deltas[0]:  # so the receivers average exactly DiLoCo's pseudo-gradients
            assert np.array_equal(sum(s[key] for s in sent) / 3, sum(d[key] for d in deltas) / 3)


def test_dct_at_full_density_is_the_identity_up_to_rounding_and_sparse_dct_keeps_low_frequencies():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(50)
    np.testing.assert_allclose(chunked_idct(chunked_dct(x, 8), 8), x, atol=1e-13)
    np.testing.assert_allclose(decode_sparse(encode_sparse(x, SparseConfig(chunk=8, density=1.0, transform="dct"))),
                               x, atol=1e-13)
    smooth = np.cos(np.linspace(0, np.pi, 64))  # one slow wave: its energy sits in few coefficients
    sent = decode_sparse(encode_sparse(smooth, SparseConfig(chunk=64, density=4 / 64, transform="dct")))
    assert np.linalg.norm(sent - smooth) < 0.05 * np.linalg.norm(smooth)
    plain = decode_sparse(encode_sparse(smooth, SparseConfig(chunk=64, density=4 / 64)))
    assert np.linalg.norm(plain - smooth) > 0.5 * np.linalg.norm(smooth)


def test_bad_input_names_the_argument():
    x = np.ones(10)
    for field, value in (("chunk", 0), ("density", 0.0), ("density", 1.5), ("bits", 4), ("transform", "fft"),
                         ("decay", 1.1)):
        with pytest.raises((TypeError, ValueError), match=f"SparseConfig.{field}"):
            SparseConfig(**{field: value})
    with pytest.raises(ValueError, match="SparseConfig.chunk"):
        SparseConfig(chunk=4096, transform="dct")
    with pytest.raises(ValueError, match="x"):
        encode_sparse(np.array([1.0, np.nan]), SparseConfig())
    with pytest.raises(TypeError, match="x"):
        encode_sparse(np.arange(3), SparseConfig())
    config = SparseConfig(chunk=4, density=0.5)
    wire = to_bytes(encode_sparse(x, config))
    with pytest.raises(ValueError, match="buffer"):
        from_bytes(wire[:-1], x.shape, config, x.dtype)
    corrupt = wire[:1] + bytes([wire[1] | 0x03]) + wire[2:]  # the 5th index, 3, in a chunk of 2
    with pytest.raises(ValueError, match="outside"):
        from_bytes(corrupt, x.shape, config, x.dtype)
    nan = to_bytes(encode_sparse(x, config))[:2] + np.full(5, np.nan).tobytes()
    with pytest.raises(ValueError, match="not finite"):
        from_bytes(nan, x.shape, config, x.dtype)
    with pytest.raises(ValueError, match="state.residual"):
        compress_with_feedback({"a": x}, init_error_feedback({"b": x}), config)
