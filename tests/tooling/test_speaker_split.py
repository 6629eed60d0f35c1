"""The speaker split (``diloco.corpus.speakers``) and the shards' KL divergence (``diloco.corpus.shard_divergence``).

The divergence fixtures are worked by hand in the comments; the speaker fixtures are a
four-speech text whose speeches, sizes and split are counted by hand.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_helpers import only_run_dir

from diloco import DiLoCoConfig
from diloco.core.run_records import shard_dataset
from diloco.corpus.shard_divergence import position_counts, shard_divergence, split_divergence, split_report
from diloco.corpus.speakers import assign_speakers, ids_from_windows, speaker_shard_dataset, split_speeches
from diloco.text import char_windows, load_shakespeare, vocabulary_of
from diloco.tools.cli.main import main

pytestmark = pytest.mark.tooling

# Speeches: "A:\nhi\n\n" (7 characters), "B:\nthus:\nyo\n\n" (13; "thus:" follows no blank
# line, so it is not a speaker line), "A:\nbye\n\n" (8), "C:\nok\n\n" (7). Speakers A = 15,
# B = 13, C = 7 characters; 35 in all.
TEXT = "A:\nhi\n\nB:\nthus:\nyo\n\nA:\nbye\n\nC:\nok\n\n"
VOCABULARY = vocabulary_of(TEXT)


def _windows(text: str, context: int):
    ids = np.array([VOCABULARY.index(ch) for ch in text])
    return char_windows(ids, context)


def _decode(ids) -> str:
    return "".join(VOCABULARY[int(i)] for i in ids)


# --- the divergence -------------------------------------------------------------------------------

def test_label_histogram_divergence_matches_the_hand_worked_value():
    # Shard A labels [0, 0, 1, 1]: p_A = (1/2, 1/2). Shard B [1, 1, 1, 1]: p_B = (0, 1).
    # Pooled counts (2, 6): p = (1/4, 3/4).
    # D_A = 1/2 ln((1/2)/(1/4)) + 1/2 ln((1/2)/(3/4)) = 1/2 ln(4/3);  D_B = 1 ln(1/(3/4)) = ln(4/3).
    got = shard_divergence([np.array([0, 0, 1, 1]), np.array([1, 1, 1, 1])])
    assert got == pytest.approx([0.5 * math.log(4 / 3), math.log(4 / 3)], rel=1e-12), f"mine {got}"
    shards = [(np.zeros((4, 2)), np.array([0, 0, 1, 1])), (np.zeros((4, 2)), np.array([1, 1, 1, 1]))]
    assert split_divergence(shards, text=False) == pytest.approx(0.75 * math.log(4 / 3), rel=1e-12)


def test_divergence_given_the_previous_character_matches_the_hand_worked_value():
    # Shard A: contexts [0, 0, 1, 1], labels [0, 1, 1, 1]. Shard B: contexts [0, 0, 0, 1], labels [0, 0, 0, 0].
    # Pooled: after 0, labels 0,1 (A) and 0,0,0 (B): p(.|0) = (4/5, 1/5); after 1, labels 1,1 (A), 0 (B):
    # p(.|1) = (1/3, 2/3).
    # D_A = 1/2 [1/2 ln((1/2)/(4/5)) + 1/2 ln((1/2)/(1/5))] + 1/2 [ln(1/(2/3))] = 1/2 ln(5/4) + 1/2 ln(3/2)
    #     = 1/2 ln(15/8) = 0.31430...
    # D_B = 3/4 ln(1/(4/5)) + 1/4 ln(1/(1/3)) = 3/4 ln(5/4) + 1/4 ln 3 = 0.44201...
    labels = [np.array([0, 1, 1, 1]), np.array([0, 0, 0, 0])]
    contexts = [np.array([0, 0, 1, 1]), np.array([0, 0, 0, 1])]
    expected = [0.5 * math.log(15 / 8), 0.75 * math.log(5 / 4) + 0.25 * math.log(3)]
    got = shard_divergence(labels, contexts)
    assert got == pytest.approx(expected, rel=1e-12), f"mine {got}, expected {expected}"
    # split_divergence takes the context from the window's last column
    shards = [(np.column_stack([np.full(4, 9), c]), v) for c, v in zip(contexts, labels, strict=True)]
    assert split_divergence(shards, text=True) == pytest.approx(np.mean(expected), rel=1e-12)


def test_divergence_over_every_position_matches_the_hand_worked_value():
    # Shard A: windows "01" then 0, "10" then 1: pairs 0->1, 1->0, 1->0, 0->1. Shard B: "01" then 1: 0->1, 1->1.
    # Pooled: after 0 only 1 (3 times): p(1|0) = 1; after 1: 0 twice, 1 once: p(.|1) = (2/3, 1/3).
    # D_A = 1/2 ln(1/1) + 1/2 ln(1/(2/3)) = 1/2 ln(3/2);  D_B = 1/2 ln(1/1) + 1/2 ln(1/(1/3)) = 1/2 ln 3.
    # The last position only: A contexts 1, 0, labels 0, 1; B context 1, label 1: p(.|1) = (1/2, 1/2),
    # D_A = 1/2 ln 2, D_B = ln 2 (mean 3/4 ln 2): the measure a transformer's shards are not trained on.
    shards = [(np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([0, 1])), (np.array([[0.0, 1.0]]), np.array([1]))]
    assert split_divergence(shards, text=True, every_position=True) == pytest.approx(
        (0.5 * math.log(1.5) + 0.5 * math.log(3)) / 2, rel=1e-12)
    assert split_divergence(shards, text=True) == pytest.approx(0.75 * math.log(2), rel=1e-12)
    with pytest.raises(ValueError, match="every_position needs a character-level task"):
        split_divergence(shards, text=False, every_position=True)


def test_position_counts_count_every_pair_of_every_window():
    rng = np.random.default_rng(5)
    x, y = char_windows(rng.integers(0, 4, 40), 5)
    expected = np.zeros((4, 4), dtype=int)
    for window, following in zip(x.astype(int).tolist(), y.tolist(), strict=True):  # by hand, pair by pair
        sequence = [*window, following]
        for before, after in zip(sequence, sequence[1:], strict=False):
            expected[before, after] += 1
    assert position_counts(x, y, 4).tolist() == expected.tolist()


def _pairs_by_hand(x, y, width: int) -> np.ndarray:
    """``n(c, v)`` counted one (character, next character) pair at a time: the plain reference."""
    counts = np.zeros((width, width), dtype=np.int64)
    for window, following in zip(np.asarray(x).tolist(), np.asarray(y).tolist(), strict=True):
        sequence = [int(v) for v in window] + [int(following)]
        for before, after in zip(sequence, sequence[1:], strict=False):
            counts[before, after] += 1
    return counts


# (n, c, width, the largest id drawn): one window, one character a window, a width with ids never
# drawn (rows and columns of zeros), a single id, and more windows than one block of COUNT_ROWS.
AWKWARD = [(1, 1, 3, 2), (1, 6, 5, 4), (7, 1, 9, 3), (5, 4, 12, 2), (3, 3, 1, 0), (4096 + 3, 2, 6, 5),
           (2 * 4096, 3, 4, 3)]


@pytest.mark.parametrize("n, c, width, top", AWKWARD)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_position_counts_equal_a_count_pair_by_pair_for_awkward_shapes(n, c, width, top, dtype):
    rng = np.random.default_rng(n * 31 + c)
    x, y = rng.integers(0, top + 1, (n, c)).astype(dtype), rng.integers(0, top + 1, n)
    got = position_counts(x, y, width)
    expected = _pairs_by_hand(x, y, width)
    assert got.dtype == np.int64 and got.shape == (width, width)
    assert np.array_equal(got, expected), f"mine {got.tolist()}, expected {expected.tolist()}"
    assert int(got.sum()) == n * c


def test_position_counts_of_no_windows_or_no_characters_are_zeros_and_bad_ids_are_refused():
    assert position_counts(np.zeros((0, 3)), np.zeros(0, dtype=int), 4).tolist() == [[0] * 4] * 4
    assert position_counts(np.zeros((2, 0)), np.array([1, 2]), 3).tolist() == [[0] * 3] * 3
    with pytest.raises(ValueError, match="contexts must hold non-negative integers"):
        position_counts(np.array([[-1.0, 1.0]]), np.array([0]), 3)
    with pytest.raises(ValueError, match="labels must hold non-negative integers"):
        position_counts(np.array([[0.0, 1.5]]), np.array([0]), 3)
    with pytest.raises(ValueError, match="labels must hold non-negative integers"):
        position_counts(np.array([[0.0, 1.0]]), np.array([-1]), 3)
    with pytest.raises(ValueError, match="windows with one label each"):
        position_counts(np.zeros((2, 2)), np.array([1]), 3)


def test_a_transformer_split_is_measured_at_every_position_where_label_skew_is_nearly_iid():
    """Label skew shards the windows by the character after them: at K = 4, alpha = 0.1 that
    character's distribution given the previous one differs by about 0.9 nats, but a sequence
    model trains on 16 positions a window here, 15 of them unskewed."""
    data = load_shakespeare(16, eval_windows=8).dataset
    x, y = data.x_train[::4], data.y_train[::4]  # a quarter of the windows: the test stays fast
    config = DiLoCoConfig(num_workers=4, iid=False, noniid_split="label", alpha=0.1, seed=0, model="transformer")
    report = split_report(x, y, config, text=True)
    last = split_divergence(shard_dataset(x, y, config, np.random.default_rng(0)), text=True)
    assert report["given"] == "previous character, every position"
    assert last > 0.5 and report["divergence"] < last / 10, (last, report)
    mlp = split_report(x, y, config.replace(model="mlp"), text=True)
    assert mlp["divergence"] == pytest.approx(last, rel=1e-12) and mlp["given"] == "previous character"


def test_divergence_is_zero_for_identical_shards_and_refuses_bad_input():
    same = [np.array([0, 1, 2, 2]), np.array([2, 1, 2, 0])]
    assert shard_divergence(same) == pytest.approx([0.0, 0.0], abs=1e-15)
    with pytest.raises(ValueError, match="at least one row"):
        shard_divergence([np.array([0, 1]), np.array([], dtype=int)])
    with pytest.raises(ValueError, match="non-negative integers"):
        shard_divergence([np.array([0.5, 1.0])])
    with pytest.raises(ValueError, match="one entry per row"):
        shard_divergence([np.array([0, 1])], [np.array([0])])


# --- the speeches and the speakers ----------------------------------------------------------------

def test_speeches_run_from_speaker_line_to_speaker_line():
    speeches = split_speeches(TEXT)
    assert speeches.bounds.tolist() == [0, 7, 20, 28, 35]
    assert speeches.speaker.tolist() == [0, 1, 0, 2] and speeches.names == ("A", "B", "C")
    cut = split_speeches(TEXT[4:])  # starts mid-speech: the fragment is the speaker ""'s
    assert cut.names == ("", "B", "A", "C") and cut.bounds.tolist() == [0, 3, 16, 24, 31]
    with pytest.raises(ValueError, match="no speaker line"):
        split_speeches("no speaker here\n")


def test_assign_speakers_balances_characters_and_is_fixed_by_the_seed():
    # sizes (15, 13, 7), K = 2, capacity ceil(35 / 2) = 18: A (15) goes to either worker, B (13)
    # fits only the empty one, C (7) fits neither (22, 20 > 18) and goes to the lighter, B's.
    for seed in range(5):
        owner = assign_speakers(np.array([15, 13, 7]), 2, np.random.default_rng(seed))
        assert owner[0] != owner[1] and owner[2] == owner[1]
    sizes = np.random.default_rng(0).integers(1, 1000, size=60)
    first = assign_speakers(sizes, 4, np.random.default_rng(3))
    assert np.array_equal(first, assign_speakers(sizes, 4, np.random.default_rng(3)))
    load = np.bincount(first, weights=sizes, minlength=4)
    assert load.max() - load.min() <= sizes.max(), f"loads {load}"
    assert len(set(first.tolist())) == 4
    # as many workers as speakers: one speaker each, however the sizes are
    assert sorted(assign_speakers(np.array([100, 1, 1]), 3, np.random.default_rng(0)).tolist()) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"only 3 speakers.*--noniid-split speaker"):
        assign_speakers(np.array([15, 13, 7]), 4, np.random.default_rng(0))


@pytest.mark.parametrize("context", [2, 5])
def test_speaker_shards_hold_whole_speeches_of_their_own_speakers(context):
    x, y = _windows(TEXT, context)
    shards = speaker_shard_dataset(x, y, 2, np.random.default_rng(1), vocabulary=VOCABULARY)
    texts = sorted(_decode(ids_from_windows(x_k, y_k)) for x_k, y_k in shards)
    # {A}: "A:\nhi\n\n" + "A:\nbye\n\n"; {B, C}: B's speech then C's, in text order
    assert texts == sorted(["A:\nhi\n\nA:\nbye\n\n", "B:\nthus:\nyo\n\nC:\nok\n\n"])
    # every character but each worker's first c is a target once
    assert sum(len(y_k) for _, y_k in shards) == len(TEXT) - 2 * context
    for x_k, _ in shards:
        assert x_k.dtype == x.dtype and x_k.shape[1] == context


def test_speaker_split_refuses_what_it_cannot_split():
    x, y = _windows(TEXT, 3)
    with pytest.raises(ValueError, match="text order"):
        speaker_shard_dataset(x[::-1], y[::-1], 2, np.random.default_rng(0), vocabulary=VOCABULARY)
    with pytest.raises(ValueError, match="only 3 speakers"):
        speaker_shard_dataset(x, y, 4, np.random.default_rng(0), vocabulary=VOCABULARY)
    with pytest.raises(ValueError, match="no more than the context"):
        speaker_shard_dataset(*_windows(TEXT, 14), 3, np.random.default_rng(0), vocabulary=VOCABULARY)
    with pytest.raises(ValueError, match="needs iid=False"):
        DiLoCoConfig(noniid_split="speaker")


# --- on Tiny Shakespeare --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shakespeare():
    return load_shakespeare(6, eval_windows=64).dataset


def test_speaker_split_of_tiny_shakespeare_is_balanced_disjoint_and_seeded(shakespeare):
    x, y = shakespeare.x_train, shakespeare.y_train
    config = DiLoCoConfig(num_workers=8, iid=False, noniid_split="speaker", seed=0)
    shards = shard_dataset(x, y, config, np.random.default_rng(0))
    sizes = [len(y_k) for _, y_k in shards]
    assert sum(sizes) == len(y) + 6 - 8 * 6
    assert max(sizes) - min(sizes) < 0.001 * np.mean(sizes), f"windows per worker {sizes}"
    vocabulary = vocabulary_of(_shakespeare_text())
    speakers = [set(split_speeches("".join(vocabulary[int(i)] for i in ids_from_windows(*s))).names) for s in shards]
    for k in range(8):
        for j in range(k):
            assert not speakers[k] & speakers[j], f"workers {j} and {k} share speakers"
    again = shard_dataset(x, y, config, np.random.default_rng(0))
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(shards, again, strict=True))
    other = shard_dataset(x, y, config.replace(seed=1), np.random.default_rng(1))
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(shards, other, strict=True))


def _shakespeare_text() -> str:
    from diloco.text import load_shakespeare_text

    return load_shakespeare_text()


def test_speaker_shards_are_measurably_more_divergent_than_iid_and_topic(shakespeare):
    """Measured at K = 8, seed 0, context 6: speaker 0.0489 nats, topic a=0.1 0.0126,
    IID 0.0046 (the finite-sample floor)."""
    x, y = shakespeare.x_train, shakespeare.y_train
    base = DiLoCoConfig(num_workers=8, seed=0)
    speaker = split_report(x, y, base.replace(iid=False, noniid_split="speaker"), text=True)
    topic = split_report(x, y, base.replace(iid=False, noniid_split="topic", alpha=0.1), text=True)
    assert speaker["iid_divergence"] == pytest.approx(0.0046, abs=5e-5)
    assert topic["divergence"] == pytest.approx(0.0126, abs=5e-5)
    assert speaker["divergence"] == pytest.approx(0.0489, abs=5e-5)
    assert speaker["divergence"] > 10 * speaker["iid_divergence"]
    assert speaker["divergence"] > 3 * topic["divergence"]
    # independent of the code: a multinomial sample of n_k rows sits about
    # (1 - 1/K)(cells - contexts) / (2 n_k) nats from its pool (the chi-square / 2 of its counts)
    pairs = np.unique(x[:, -1].astype(np.int64) * 65 + y)
    floor = (1 - 1 / 8) * (len(pairs) - len(np.unique(pairs // 65))) / (2 * len(y) / 8)
    assert speaker["iid_divergence"] == pytest.approx(floor, rel=0.1), f"mine {speaker['iid_divergence']}"


@pytest.mark.slow
def test_train_prints_and_records_the_split_divergence(tmp_path, capsys):
    argv = ["train", "--data", "shakespeare", "--noniid", "--noniid-split", "speaker", "-K", "4", "--rounds", "1",
            "-H", "1", "--hidden-sizes", "4", "--eval-windows", "16", "--no-plots", "--runs-dir", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("shards: speaker, K=4"))
    summary = json.loads(next(tmp_path.glob("*/summary.json")).read_text())
    split = summary["split"]
    assert split["split"] == "speaker" and split["num_workers"] == 4 and split["alpha"] is None
    assert f"{split['divergence']:.4f} nats (IID shards: {split['iid_divergence']:.4f})" in line
    assert split["divergence"] > 5 * split["iid_divergence"]
    config_file = next(tmp_path.glob("*/config.json"))
    assert json.loads(config_file.read_text())["split"] == split
    # the run's config.json, split section and all, starts the same run again
    assert main(["train", "--config", str(config_file), "--runs-dir", str(tmp_path / "again"), "-q"]) == 0
    again = json.loads(next((tmp_path / "again").glob("*/summary.json")).read_text())
    assert again["split"] == split


def test_alpha_with_the_speaker_split_is_refused(tmp_path, capsys):
    argv = ["train", "--data", "shakespeare", "--noniid", "--noniid-split", "speaker", "--alpha", "0.1",
            "--rounds", "1", "-H", "1", "--runs-dir", str(tmp_path), "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--alpha 0.1 has no effect with --noniid-split speaker" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir()), "refused before any run folder"


def test_the_speaker_split_on_other_data_is_refused_naming_the_flag(tmp_path, capsys):
    argv = ["train", "--data", "digits", "--noniid", "--noniid-split", "speaker", "--rounds", "1", "-H", "1",
            "--runs-dir", str(tmp_path), "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--noniid-split speaker" in err and "--data shakespeare" in err and "Traceback" not in err


def test_a_study_records_each_variants_divergence_beside_its_result(tmp_path, capsys):
    argv = ["study", "noniid", "--seeds", "1", "--values", "0.05", "--rounds", "1", "-H", "1", "-K", "4",
            "--hidden-sizes", "4", "--no-plots", "-q", "--runs-dir", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().err
    run_dir = only_run_dir(tmp_path)  # not the study's run cache beside it
    rows = {row["variant"]: row for row in json.loads((run_dir / "summary.json").read_text())["rows"]}
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert all(r["split_divergence"] is not None for r in results)
    iid, skewed = (rows[name]["split_divergence"] for name in ("IID", "alpha=0.05"))
    assert skewed > 10 * iid, f"label skew {skewed} against IID {iid}"
    table = (run_dir / "study.md").read_text()
    assert "shard KL (nats) |" in table and f"| {skewed:.4f} |" in table


def test_a_paper_study_arm_records_its_shards_divergence_cached_or_not(tmp_path):
    from diloco.corpus.shard_divergence import run_split_divergence
    from diloco.data import load_digits_split
    from diloco.tools.studies.paper_report import render_arms_table, summarise_arms
    from diloco.tools.studies.paper_runs import Arm, RunCache, run_arm

    data = load_digits_split(seed=0)
    base = DiLoCoConfig(num_workers=4, inner_steps=1, rounds=1, hidden_sizes=(4,), batch_size=8)
    arm = Arm("label a=0.1", "diloco", {"iid": False, "alpha": 0.1})
    cache = RunCache(tmp_path)
    fresh = run_arm(arm, base, 3, data, cache=cache, data_key="digits")
    expected = run_split_divergence(data.x_train, data.y_train, base.replace(iid=False, alpha=0.1, seed=3),
                                    text=False)
    assert fresh["split_divergence"] == pytest.approx(expected, rel=1e-12) and expected > 0.1
    stored = next(tmp_path.glob("*.json"))  # a run cached before the divergence was recorded
    stored.write_text(json.dumps({k: v for k, v in json.loads(stored.read_text()).items() if k != "split_divergence"}))
    cached = run_arm(arm, base, 3, data, cache=cache, data_key="digits")
    assert cached["cached"] and cached["split_divergence"] == pytest.approx(expected, rel=1e-12)
    row, = summarise_arms([fresh], [arm])
    assert row["split_divergence"] == pytest.approx(expected, rel=1e-12)
    header, _, line = render_arms_table({"task": "mnist1d", "rows": [row]}).splitlines()
    assert header.endswith("| shard KL (nats) |") and line.endswith(f"| {expected:.4f} |")
    older = render_arms_table({"task": "mnist1d", "rows": [{**row, "split_divergence": None}]})
    assert "shard KL" not in older, "a summary exported before the divergence was recorded renders as it did"


def test_a_study_over_a_non_iid_base_keeps_its_iid_variant_iid(tmp_path, capsys):
    """Was a traceback: the IID variant kept the base's --noniid-split topic, which needs iid=False."""
    argv = ["study", "noniid", "--noniid", "--noniid-split", "topic", "--seeds", "1", "--values", "0.5",
            "--rounds", "1", "-H", "1", "-K", "2", "--hidden-sizes", "4", "--no-plots", "-q",
            "--runs-dir", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().err
    argv[argv.index("topic")] = "speaker"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "sweeps alpha, which --noniid-split speaker does not use" in err and "Traceback" not in err
