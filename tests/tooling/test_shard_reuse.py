"""Reusing a seed's shards across runs (``diloco.core.shard_reuse``) changes no result.

Inside ``reusing()`` the same data, split, K and seed give back the same read-only arrays and
a generator in the state the split left; here every result is compared bit for bit with the
same call outside it (no memo), every input of the key is changed once to see that it
misses, the memo's bounds are checked, and a whole study is run with and without it.
"""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
from cli_helpers import run_cli

from diloco import DiLoCoConfig
from diloco.core import run_records, shard_reuse
from diloco.core.run_records import prepare_training, seeded_shards, shard_dataset
from diloco.corpus.shard_divergence import run_split_divergence
from diloco.data import load_digits_split
from diloco.loop import train_diloco
from diloco.text import char_windows
from diloco.tools.cli import main as cli_main
from diloco.tools.studies import ablations

pytestmark = pytest.mark.tooling

SPLITS = {"iid": {"iid": True}, "label": {"iid": False, "noniid_split": "label", "alpha": 0.3},
          "topic": {"iid": False, "noniid_split": "topic", "alpha": 0.3}}


@pytest.fixture(scope="module")
def digits():
    return load_digits_split(seed=0)


def _same(shards_a, shards_b) -> bool:
    return len(shards_a) == len(shards_b) and all(
        xa.dtype == xb.dtype and ya.dtype == yb.dtype and np.array_equal(xa, xb) and np.array_equal(ya, yb)
        for (xa, ya), (xb, yb) in zip(shards_a, shards_b, strict=True))


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_reused_shards_and_the_generator_after_them_equal_a_fresh_split(digits, split):
    config = DiLoCoConfig(num_workers=3, seed=7, **SPLITS[split])
    fresh, fresh_rng = seeded_shards(digits.x_train, digits.y_train, config)  # no reusing(): no memo
    assert shard_reuse.kept() == 0 and all(x_k.flags.writeable for x_k, _ in fresh)
    with shard_reuse.reusing():
        first, first_rng = seeded_shards(digits.x_train, digits.y_train, config)
        again, again_rng = seeded_shards(digits.x_train, digits.y_train, config)
        assert shard_reuse.kept() == 1, "the second call is a hit"
        assert all(a is b for shard_a, shard_b in zip(first, again, strict=True)
                   for a, b in zip(shard_a, shard_b, strict=True)), "a hit hands back the kept arrays"
    assert shard_reuse.kept() == 0, "the memo is emptied when the block ends"
    assert _same(fresh, first) and _same(fresh, again)
    draws = [rng.random(5).tolist() + rng.integers(0, 10**9, 3).tolist() for rng in (fresh_rng, first_rng, again_rng)]
    assert draws[0] == draws[1] == draws[2], "the generator continues where the split left it"
    direct = shard_dataset(digits.x_train, digits.y_train, config, np.random.default_rng(7))
    assert _same(fresh, direct), "seeded_shards is shard_dataset with default_rng(seed)"


def test_reused_shards_are_read_only_so_no_caller_changes_another_runs_copy(digits):
    config = DiLoCoConfig(num_workers=2, seed=0)
    with shard_reuse.reusing():
        shards, _ = seeded_shards(digits.x_train, digits.y_train, config)
        x_0, y_0 = shards[0]
        with pytest.raises(ValueError, match="read-only"):
            x_0[0, 0] = 123.0
        with pytest.raises(ValueError, match="read-only"):
            y_0 += 1
        shards.clear()  # the list is the caller's own: the kept set is untouched
        again, _ = seeded_shards(digits.x_train, digits.y_train, config)
        assert again[0][0] is x_0 and float(x_0[0, 0]) != 123.0


def test_every_input_of_the_key_is_a_different_set(digits):
    base = DiLoCoConfig(num_workers=3, seed=1, iid=False, alpha=0.5)
    x, y = digits.x_train.copy(), digits.y_train.copy()
    variants = [base.replace(seed=2), base.replace(num_workers=4), base.replace(alpha=0.6), base.replace(iid=True),
                base.replace(noniid_split="topic")]
    with shard_reuse.reusing():
        reference, _ = seeded_shards(x, y, base)
        for config in variants:
            fresh = shard_dataset(x, y, config, np.random.default_rng(config.seed))
            assert _same(seeded_shards(x, y, config)[0], fresh), config
        x[0, 0] += 1.0  # the same array object, changed in place: its content is the key, not its id
        changed = seeded_shards(x, y, base)[0]
        assert _same(changed, shard_dataset(x, y, base, np.random.default_rng(1)))
        assert not _same(changed, reference)
        as_float32 = seeded_shards(x.astype(np.float32), y, base)[0]
        assert as_float32[0][0].dtype == np.float32
        y[:2] = y[:2][::-1]  # labels swapped between two rows
        assert _same(seeded_shards(x, y, base)[0], shard_dataset(x, y, base, np.random.default_rng(1)))


def test_the_memo_is_bounded_in_sets_and_bytes(digits, monkeypatch):
    with shard_reuse.reusing():
        for seed in range(shard_reuse.MAX_ENTRIES + 3):
            seeded_shards(digits.x_train, digits.y_train, DiLoCoConfig(num_workers=2, seed=seed))
            assert shard_reuse.kept() <= shard_reuse.MAX_ENTRIES
        assert shard_reuse.kept() == shard_reuse.MAX_ENTRIES
    monkeypatch.setattr(shard_reuse, "MAX_BYTES", digits.x_train.nbytes // 2)
    x, y = shard_reuse.unwritable(digits.x_train), shard_reuse.unwritable(digits.y_train)
    with shard_reuse.reusing():
        seeded_shards(x, y, DiLoCoConfig(num_workers=2, seed=0))
        assert shard_reuse.kept() == 0, "a set larger than MAX_BYTES is built and not kept"
        assert not shard_reuse._DERIVED, "nor is data that large hashed"


def test_what_is_derived_from_a_shard_leaves_with_its_set(digits):
    x, y = shard_reuse.unwritable(digits.x_train), shard_reuse.unwritable(digits.y_train)
    with shard_reuse.reusing():
        first, _ = seeded_shards(x, y, DiLoCoConfig(num_workers=2, seed=0))
        column_sums = shard_reuse.derived(first[0][0], "column sums", lambda a: a.sum(axis=0))
        assert shard_reuse.derived(first[0][0], "column sums", lambda a: None) is column_sums
        for seed in range(1, shard_reuse.MAX_ENTRIES + 1):  # the first set leaves the memo
            seeded_shards(x, y, DiLoCoConfig(num_workers=2, seed=seed))
        held = [array for array, _ in shard_reuse._DERIVED.values()]
        assert not any(array is first[0][0] for array in held), "its values left with it"
        assert any(array is x for array in held), "the data's digest stays"


def test_a_callers_generator_is_never_looked_up(digits):
    config = DiLoCoConfig(num_workers=2, seed=3, hidden_sizes=(8,))
    with shard_reuse.reusing():
        _, rng, shards, params = prepare_training(digits.x_train, digits.y_train, config,
                                                  rng=np.random.default_rng(3))
        assert shard_reuse.kept() == 0 and shards[0][0].flags.writeable
        _, _, seeded, seeded_params = prepare_training(digits.x_train, digits.y_train, config)
        assert shard_reuse.kept() == 1
    assert _same(shards, seeded) and all(np.array_equal(params[k], seeded_params[k]) for k in params)


def test_training_inside_the_block_is_bit_identical_to_training_outside(digits):
    config = DiLoCoConfig(num_workers=3, inner_steps=3, rounds=2, hidden_sizes=(8,), batch_size=8, seed=4,
                          iid=False, alpha=0.2)
    args = (digits.x_train, digits.y_train, config)
    held_out = {"x_eval": digits.x_test, "y_eval": digits.y_test}
    plain = train_diloco(*args, **held_out)
    plain_divergence = run_split_divergence(digits.x_train, digits.y_train, config, text=False)
    with shard_reuse.reusing():
        runs = [train_diloco(*args, **held_out) for _ in range(2)]
        divergences = [run_split_divergence(digits.x_train, digits.y_train, config, text=False) for _ in range(2)]
    for result in runs:
        assert all(result.params[k].tobytes() == plain.params[k].tobytes() for k in plain.params)
        assert json.dumps(result.history) == json.dumps(plain.history)
    assert divergences == [plain_divergence, plain_divergence]


def test_a_one_hot_shards_columns_are_computed_once_and_read_only():
    pytest.importorskip("diloco.engine")
    from diloco.engine.fast import FastExecutor
    from diloco.text import OneHot

    x, y = char_windows(np.random.default_rng(0).integers(0, 5, 300), 4)
    x.setflags(write=False)
    y.setflags(write=False)
    config = DiLoCoConfig(num_workers=2, seed=0)
    encode = OneHot(5, 4)
    outside = FastExecutor(seeded_shards(x, y, config)[0], config, encode)
    with shard_reuse.reusing():
        shards, _ = seeded_shards(x, y, config)
        first, again = FastExecutor(shards, config, encode), FastExecutor(list(shards), config, encode)
    for (columns, labels), (kept, kept_labels), (same, _) in zip(outside.shards, first.shards, again.shards,
                                                                 strict=True):
        assert np.array_equal(columns, kept) and columns.dtype == kept.dtype and np.array_equal(labels, kept_labels)
        assert same is kept and not kept.flags.writeable


def test_a_read_only_copy_is_made_only_of_data_someone_could_write():
    data = np.arange(6.0).reshape(2, 3)
    copy = shard_reuse.unwritable(data)
    assert copy is not data and not copy.flags.writeable and data.flags.writeable
    assert np.array_equal(copy, data) and copy.dtype == data.dtype
    assert shard_reuse.unwritable(copy) is copy
    view = data[:, :2]
    view.setflags(write=False)
    assert shard_reuse.unwritable(view) is not view, "a read-only view of a writable array can still change"


def test_a_learner_workspace_never_reuses_shards(monkeypatch):
    monkeypatch.setattr(ablations, "fast_engine_available", lambda: False)
    with ablations.shared_shards():
        assert not shard_reuse.is_reusing()
    monkeypatch.setattr(ablations, "fast_engine_available", lambda: True)
    with ablations.shared_shards():
        assert shard_reuse.is_reusing()


def test_run_study_shares_shards_and_gives_what_it_gave_without_and_leaves_the_callers_data_writable(digits,
                                                                                                     monkeypatch):
    """``run_study``, the notebooks' call, opens ``shared_shards`` around its runs and hands them a
    read-only copy of writable data; its outcomes equal those of the runs without reuse."""
    config = DiLoCoConfig(num_workers=2, inner_steps=2, rounds=2, hidden_sizes=(8,), batch_size=8,
                          engine=ablations.default_engine())
    study = ablations.STUDIES["noniid"]

    def outcomes():
        return [{k: v for k, v in o.items() if k != "seconds"}
                for o in ablations.run_study(study, config, digits, [0, 1], ("0.5",))]

    reused = outcomes()
    monkeypatch.setattr(ablations, "shared_shards", contextlib.nullcontext)  # every run splits the data itself
    fresh = outcomes()
    assert len(reused) == 8 and reused == fresh
    assert digits.x_train.flags.writeable and digits.y_train.flags.writeable, "the caller's arrays are untouched"


STUDY = ["study", "noniid", "--values", "0.5", "--rounds", "2", "-H", "2", "-K", "2", "--seeds", "2",
         "--hidden-sizes", "8", "-q", "--no-plots"]


def test_a_study_with_reused_shards_equals_the_same_study_without(tmp_path, capsys, monkeypatch):
    """The command line reuses the shards within a command; without reuse every run splits
    the data itself. Every recorded number but the timings is the same."""
    outputs, splits, real = {}, [], run_records.iid_shard_dataset

    def counted(*args, **kwargs):
        splits.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(run_records, "iid_shard_dataset", counted)
    for name in ("reused", "fresh"):
        if name == "fresh":
            monkeypatch.setattr(cli_main, "shared_shards", contextlib.nullcontext)
        status, _, err = run_cli([*STUDY, "--runs-dir", tmp_path / name], capsys)
        assert status == 0, err
        outputs[name + " splits"], splits[:] = len(splits), []
        (run_dir,) = [p for p in (tmp_path / name).iterdir() if p.name.endswith("study-noniid")]
        lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
        outputs[name] = [{k: v for k, v in line.items() if k != "seconds"} for line in lines]
        outputs[name + " table"] = (run_dir / "study.md").read_text()
    assert len(outputs["reused"]) == 8 and outputs["reused"] == outputs["fresh"]
    assert outputs["reused table"] == outputs["fresh table"]
    # the IID shards: split once per seed with reuse; without, for every IID run's training and
    # again for its divergence (10 splits, counted when this test was written)
    assert outputs["reused splits"] == 2 and outputs["fresh splits"] >= 8, outputs


@pytest.mark.parametrize("make", [lambda: np.arange(12.0).reshape(3, 4), lambda: np.arange(12.0).reshape(3, 4)[:, ::2],
                                  lambda: np.arange(12, dtype=np.int8).reshape(4, 3).T, lambda: np.zeros((0, 3))],
                         ids=["contiguous", "strided", "transposed", "empty"])
def test_the_bytes_hashed_are_the_arrays_c_order_bytes_and_the_fingerprint_is_sha256_over_them(make):
    """``raw_bytes`` (shared by the shard key and the checkpoint's data fingerprint) against
    ``tobytes()``; the fingerprint against hashlib over a hand-built string of the same fields."""
    import hashlib

    from diloco.tools.runs.checkpoint_records import data_fingerprint

    array = make()
    assert bytes(shard_reuse.raw_bytes(array)) == array.tobytes(order="C")
    c = np.ascontiguousarray(array)
    by_hand = hashlib.sha256(f"{c.dtype.str}{c.shape};".encode() + c.tobytes() + b"none;").hexdigest()
    assert data_fingerprint(array, None) == by_hand
