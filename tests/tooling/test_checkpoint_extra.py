"""The family's part of a checkpoint (``pack_extra`` / ``unpack_extra``) round-trips every part it
holds: error-feedback residuals, fragments still to merge, eager outer copies, and asynchronous
DiLoCo's clock with delayed Nesterov's held deltas (which no resume test reaches at a round's end)."""

from __future__ import annotations

import json

import numpy as np

from diloco.outer import OuterState
from diloco.tools.runs.checkpoint_extra import pack_extra, unpack_extra


def _params(rng) -> dict:
    return {"W1": rng.standard_normal((2, 3)), "b1": rng.standard_normal(3)}


def _every_part(rng) -> dict:
    return {
        "residuals": {0: _params(rng), 1: _params(rng)},
        "pending": [(3, _params(rng), (0,)), (4, _params(rng), (0, 1))],
        "eager": {"thetas": {0: _params(rng), 1: _params(rng)},
                  "outer": {0: OuterState(_params(rng), _params(rng), 2), 1: OuterState(_params(rng), _params(rng), 5)},
                  "previous_local": {1: _params(rng)}, "previous_global": _params(rng)},
        "async": {"starts": {0: (4, _params(rng)), 1: (6, _params(rng))}, "version": 7, "now": 12.5,
                  "delayed": {"anchor": _params(rng), "arrivals": 2,
                              "pending": [(1, _params(rng)), (2, _params(rng))]}},
    }


def _same(mine, gold, where="extra") -> None:
    if isinstance(gold, dict):
        assert set(mine) == set(gold), f"{where}: keys mine {sorted(mine)}, expected {sorted(gold)}"
        for key in gold:
            _same(mine[key], gold[key], f"{where}[{key!r}]")
    elif isinstance(gold, (list, tuple)):
        assert len(mine) == len(gold), f"{where}: {len(mine)} items, expected {len(gold)}"
        for index, (a, b) in enumerate(zip(mine, gold, strict=True)):
            _same(a, b, f"{where}[{index}]")
    elif isinstance(gold, np.ndarray):
        np.testing.assert_array_equal(mine, gold, err_msg=where)
    else:
        assert mine == gold, f"{where}: mine {mine!r}, expected {gold!r}"


def test_every_part_of_the_familys_state_round_trips():
    extra = _every_part(np.random.default_rng(0))
    arrays, meta = pack_extra(extra)
    meta = json.loads(json.dumps(meta))  # as the manifest stores it
    back = unpack_extra(arrays, meta)
    _same(back, extra)


def test_an_empty_state_packs_to_nothing_and_back_to_empty():
    arrays, meta = pack_extra({})
    assert arrays == {} and unpack_extra(arrays, meta) == {"residuals": {}, "pending": []}
    assert unpack_extra({}, None) == {}
