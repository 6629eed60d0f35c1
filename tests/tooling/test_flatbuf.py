"""The MPI executor's flat buffers (``diloco.core.flatbuf``) and the codecs' wire bytes, without MPI."""

from __future__ import annotations

import numpy as np
import pytest

from diloco.config.sections import CommSpec
from diloco.core.codecs import codec_for
from diloco.core.flatbuf import chunk_bounds, flatten, pack, unflatten, unpack


def _params(rng, dtype=np.float64):
    return {"W1": rng.standard_normal((3, 4)).astype(dtype), "b1": rng.standard_normal(4).astype(dtype),
            "W2": rng.standard_normal((4, 2)).astype(dtype)}


def test_flatten_lays_the_keys_end_to_end_and_slices_across_them():
    params = _params(np.random.default_rng(0))
    whole = flatten(params, ("W1", "b1", "W2"))
    assert whole.tolist() == [*params["W1"].ravel(), *params["b1"], *params["W2"].ravel()]
    # values 10-16: the end of W1 (12 values), all of b1 (4), the start of W2
    assert flatten(params, ("W1", "b1", "W2"), 10, 17).tolist() == whole[10:17].tolist()
    back = unflatten(whole, params)
    assert list(back) == list(params) and all(back[k].tobytes() == v.tobytes() for k, v in params.items())
    with pytest.raises(ValueError, match="must hold 24 values"):
        unflatten(whole[:-1], params)


@pytest.mark.parametrize("size, parts, lengths", [(10, 3, [4, 3, 3]), (2, 3, [1, 1, 0]), (6, 1, [6])])
def test_chunks_cover_the_buffer_the_first_ones_longer(size, parts, lengths):
    assert np.diff(chunk_bounds(size, parts)).tolist() == lengths


def test_pack_carries_arrays_and_dicts_of_arrays_in_one_byte_buffer():
    rng = np.random.default_rng(1)
    items = {2: _params(rng, np.float32), 3: np.arange(4.0)}
    head, data = pack(items)
    assert data.dtype == np.uint8 and data.size == 4 * 24 + 8 * 4
    back = unpack(head, data)
    assert back[3].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert {k: (v.dtype, v.shape, v.tobytes()) for k, v in back[2].items()} == \
        {k: (v.dtype, v.shape, v.tobytes()) for k, v in items[2].items()}
    with pytest.raises(TypeError, match="arrays only"):
        pack({0: b"bytes"})


@pytest.mark.parametrize("spec", [CommSpec(), CommSpec(comm_dtype="fp4", comm_block=4),
                                  CommSpec(comm_dtype="int8", sign_prune=0.5), CommSpec(comm_dtype="bfloat16"),
                                  CommSpec(topk=0.25, topk_chunk=4)],
                         ids=["native", "fp4 blocks", "int8 pruned", "bfloat16", "top-k"])
def test_a_message_survives_its_wire_bytes_and_is_as_long_as_the_model_says(spec):
    rng = np.random.default_rng(2)
    base, item = _params(rng), _params(rng)
    codec = codec_for(spec, np.float64)
    message, _ = codec.encode(item, base, {})
    wire = codec.to_wire(message)
    _, payload_bytes = codec.bytes_sent([message, message], 0)
    assert len(wire) == payload_bytes  # the bytes that travel are the ones the byte model counts
    decoded, again = codec.decode(message, base), codec.decode(codec.from_wire(wire, base), base)
    assert all(again[k].tobytes() == v.tobytes() for k, v in decoded.items())
    assert codec.summable == (spec == CommSpec())


def test_every_slice_of_the_flat_buffer_is_the_plain_concatenations():
    """Every ``[start, stop)``, including slices that start in a later array (every MPI rank but
    the first reduces one), empty ones and ones past the end, against ``np.concatenate`` cut by
    hand (the one slice above starts inside the first array)."""
    params = _params(np.random.default_rng(1))
    keys = ("W1", "b1", "W2")
    plain = np.concatenate([params[k].ravel() for k in keys])
    for start in range(plain.size + 2):
        for stop in range(start, plain.size + 3):
            got = flatten(params, keys, start, stop)
            assert got.tobytes() == plain[start:stop].tobytes(), (start, stop)
    assert flatten(params, keys, 13).tobytes() == plain[13:].tobytes()  # to the end, from inside b1
