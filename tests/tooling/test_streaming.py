"""Streaming DiLoCo (diloco.core.synchronisers.FragmentSync): the schedule, the reduction to DiLoCo, bytes."""

from __future__ import annotations

import numpy as np
import pytest

from diloco import DiLoCoConfig, train_diloco
from diloco.config.sections import FamilyConfig
from diloco.core.driver import train
from diloco.core.quantize import encode
from diloco.core.schedule import fragment_keys, fragment_layers, sync_offsets, sync_steps
from diloco.core.trainers import train_streaming
from diloco.data import load_digits_split


@pytest.fixture(scope="module")
def digits():
    return load_digits_split(seed=0)


def _train(data, config, family=None):
    return train_streaming(data.x_train, data.y_train, config, family, x_eval=data.x_test, y_eval=data.y_test)


# --- the schedule ------------------------------------------------------------------------------

def test_strided_fragments_interleave_layers_and_sequential_ones_are_contiguous():
    assert fragment_layers(6, 3) == [[1, 4], [2, 5], [3, 6]]
    assert fragment_layers(6, 3, "sequential") == [[1, 2], [3, 4], [5, 6]]
    assert fragment_layers(5, 2) == [[1, 3, 5], [2, 4]]
    params = {f"{kind}{layer}": np.zeros(1) for layer in range(1, 5) for kind in "Wb"}
    assert fragment_keys(params, 2) == [("W1", "b1", "W3", "b3"), ("W2", "b2", "W4", "b4")]


def test_fragment_p_syncs_every_h_steps_offset_by_p_h_over_p():
    assert sync_offsets(4, 100) == [0, 25, 50, 75]
    assert sync_steps(0, 4, 100, 300) == [100, 200, 300]
    assert sync_steps(1, 4, 100, 300) == [25, 125, 225]
    assert sync_steps(3, 4, 100, 300) == [75, 175, 275]
    # every window of H steps holds exactly one sync of every fragment
    all_steps = sorted(t for p in range(4) for t in sync_steps(p, 4, 100, 300))
    assert np.all(np.diff(all_steps) == 25)


@pytest.mark.parametrize("bad, match", [((4, 5, "strided"), "fragments"), ((2, 2, "random"), "pattern"),
                                        ((2, 0, "strided"), "fragments")])
def test_bad_fragment_arguments_are_refused(bad, match):
    with pytest.raises(ValueError, match=match):
        fragment_layers(*bad)


# --- the reduction -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("workers, hidden", [(3, (16,)), (2, (8, 8))])
def test_one_fragment_no_overlap_full_mix_is_diloco_bit_for_bit(digits, dtype, workers, hidden):
    config = DiLoCoConfig(num_workers=workers, inner_steps=5, rounds=3, hidden_sizes=hidden, dtype=dtype, seed=7)
    data = digits
    if dtype == "float32":
        data = digits._replace(x_train=digits.x_train.astype(np.float32), x_test=digits.x_test.astype(np.float32))
    reference = train_diloco(data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test)
    streamed = _train(data, config, FamilyConfig(fragments=1, overlap=0, mix=1.0))
    for key in reference.params:
        assert reference.params[key].tobytes() == streamed.params[key].tobytes(), key
    for ours, theirs in zip(streamed.history, reference.history, strict=True):
        assert {key: ours[key] for key in theirs} == theirs


def test_non_iid_shards_weight_by_shard_size_as_diloco_does(digits):
    config = DiLoCoConfig(num_workers=3, inner_steps=4, rounds=2, hidden_sizes=(16,), iid=False, alpha=0.3)
    reference = train("diloco", digits.x_train, digits.y_train, config)  # the driver, milestones 14-24 inside
    streamed = train_streaming(digits.x_train, digits.y_train, config, FamilyConfig())
    assert all(reference.params[k].tobytes() == streamed.params[k].tobytes() for k in reference.params)


def test_fragments_overlap_and_mixing_each_change_the_result(digits):
    config = DiLoCoConfig(num_workers=2, inner_steps=6, rounds=2, hidden_sizes=(8, 8))
    base = _train(digits, config).params
    for family in (FamilyConfig(fragments=3), FamilyConfig(overlap=2), FamilyConfig(mix=0.5),
                   FamilyConfig(fragments=3, pattern="sequential", overlap=1)):
        changed = _train(digits, config, family).params
        assert any(not np.array_equal(base[k], changed[k]) for k in base), family


def test_the_global_fragment_changes_only_at_its_own_sync(digits):
    # With P = H = 2 fragments over 2 layers, fragment 0 (layer 1) syncs at step 2 only and
    # fragment 1 (layer 2) at step 1 only in round 1: round 1's record holds one sync of each.
    config = DiLoCoConfig(num_workers=2, inner_steps=2, rounds=1, hidden_sizes=(8,))
    history = _train(digits, config, FamilyConfig(fragments=2)).history
    assert [s[0] for s in history[0]["syncs"]] == [1, 2]


# --- bytes -------------------------------------------------------------------------------------

def test_peak_bytes_per_sync_drop_with_fragments_and_total_bytes_do_not(digits):
    config = DiLoCoConfig(num_workers=4, inner_steps=8, rounds=2, hidden_sizes=(32, 32, 32))
    sizes = {}
    for fragments in (1, 2, 4):
        history = _train(digits, config, FamilyConfig(fragments=fragments)).history
        sizes[fragments] = (history[-1]["peak_sync_bytes"], history[-1]["bytes_sent"],
                            history[-1]["bytes_per_step"], history[-1]["all_reduces"])
    assert [sizes[p][3] for p in (1, 2, 4)] == [1, 2, 4]
    assert sizes[1][1] == sizes[2][1] == sizes[4][1]  # the same values travel, in pieces
    assert sizes[1][2] == sizes[1][1] / 8
    params = _train(digits, config.replace(rounds=1)).params
    fragment_values = [sum(params[k].size for k in keys) for keys in fragment_keys(params, 4)]
    expected_peak = 2 * 3 / 4 * max(fragment_values) * 8  # ring all-reduce of the largest fragment
    assert sizes[4][0] == pytest.approx(expected_peak)
    assert sizes[4][0] < sizes[1][0] / 2


def test_fp4_fragments_send_their_encoded_size(digits):
    config = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=1, hidden_sizes=(8, 8))
    result = _train(digits, config, FamilyConfig(fragments=3, comm_dtype="fp4", comm_block=16))
    zeros = {k: np.zeros_like(v) for k, v in result.params.items()}
    # offsets 0, 1, 2 of H = 4: fragments 1 and 2 sync at steps 1 and 2, fragment 0 at step 4
    fragments = fragment_keys(zeros, 3)
    for (_step, sent, _tau), keys in zip(result.history[0]["syncs"], [fragments[1], fragments[2], fragments[0]],
                                         strict=True):
        payload = sum(encode(zeros[k], "fp4", block_size=16).nbytes for k in keys)
        assert sent == pytest.approx(2 * 1 / 2 * payload)  # (K-1)/K of the payload, twice


# --- overlap: a merge due inside the round is applied in that round --------------------------------

class _States:
    """A hook that keeps each round's RunState (what a checkpoint would hold)."""

    def __init__(self):
        self.states = []

    def finished(self, record, get_state):
        self.states.append(get_state())


@pytest.mark.parametrize("tau", [1, 2, 4])
def test_a_merge_due_inside_its_round_is_applied_and_never_left_pending(digits, tau):
    """P = 2, H = 10: fragment 1 syncs after step 5 and is merged after step 5 + tau, inside
    the round; fragment 0 syncs after step 10 and is merged tau steps into the next round.
    So at every round's end exactly one merge is pending (fragment 0's), due at step
    ``round * H + tau``. Before the fix, fragment 1's merges were never applied and the
    pending list grew by one every round."""
    config = DiLoCoConfig(num_workers=2, inner_steps=10, rounds=4, hidden_sizes=(8,), seed=1)
    hook = _States()
    train("diloco", digits.x_train, digits.y_train, config.replace(family=FamilyConfig(fragments=2, overlap=tau)),
          hooks=[hook])
    for round_index, state in enumerate(hook.states, start=1):
        due = [item[0] for item in state.extra["pending"]]
        assert due == [round_index * 10 + tau], f"round {round_index}: pending merges due at {due}"
