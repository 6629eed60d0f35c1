"""The character-level task (``diloco.text``, ``--data shakespeare``): windows, the one-hot
encoder, the held-out tail, perplexity, and the command line printing perplexity."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_helpers import only_run_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco.text import (
    SHAKESPEARE_SHA256,
    OneHot,
    bits_per_char,
    char_windows,
    load_shakespeare,
    load_shakespeare_text,
    perplexity,
)
from diloco.tools.cli.main import main

pytestmark = pytest.mark.tooling


def test_windows_are_the_context_and_the_next_character():
    x, y = char_windows(np.array([5, 1, 4, 2, 3]), 2)
    assert x.dtype == np.float32 and x.tolist() == [[5, 1], [1, 4], [4, 2]]
    assert y.tolist() == [4, 2, 3]
    with pytest.raises(ValueError, match="longer than context"):
        char_windows(np.array([1, 2]), 2)


def test_one_hot_puts_one_block_per_position():
    encode = OneHot(vocab_size=3, context=2)
    out = encode(np.array([[2.0, 0.0], [1.0, 1.0]]))
    assert out.shape == (2, 6) and encode.num_features == 6 and encode.input_width == 2
    assert out.tolist() == [[0, 0, 1, 1, 0, 0], [0, 1, 0, 0, 1, 0]]
    assert encode(np.array([[0, 1]]), np.float32).dtype == np.float32
    for bad in (np.array([[3, 0]]), np.array([[0.5, 0]]), np.array([[-1, 0]])):
        with pytest.raises(ValueError, match="integer character indices"):
            encode(bad)
    with pytest.raises(ValueError, match=r"shape \(b, 2\)"):
        encode(np.zeros((1, 3)))


def test_the_first_layer_adds_the_rows_the_characters_pick():
    encode = OneHot(vocab_size=3, context=2)
    weights = np.array([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0],  # position 0: characters 0, 1, 2
                        [4.0, 40.0], [5.0, 50.0], [6.0, 60.0]])  # position 1
    # [2, 0]: row 2 (3, 30) + row 3 (4, 40); [1, 1]: row 1 (2, 20) + row 4 (5, 50)
    assert encode.first_layer(np.array([[2.0, 0.0], [1.0, 1.0]]), weights).tolist() == [[7.0, 70.0], [7.0, 70.0]]
    assert encode.first_layer(np.array([[0, 2]]), weights.astype(np.float32)).dtype == np.float32
    with pytest.raises(ValueError, match=r"weights must have shape \(6, h\)"):
        encode.first_layer(np.array([[0, 1]]), weights[:5])
    with pytest.raises(ValueError, match="integer character indices"):
        encode.first_layer(np.array([[3, 0]]), weights)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_the_gathered_first_layer_equals_the_one_hot_product(vocab, context, rows, seed):
    rng = np.random.default_rng(seed)
    encode = OneHot(vocab, context)
    windows = rng.integers(0, vocab, (rows, context)).astype(np.float32)
    weights = rng.standard_normal((vocab * context, 7)) * 10.0 ** rng.integers(-3, 4)
    dense = encode(windows) @ weights
    np.testing.assert_allclose(encode.first_layer(windows, weights), dense, rtol=1e-12,
                               atol=1e-12 * np.abs(dense).max())


def test_held_out_metrics_gather_the_first_layer_and_match_the_dense_milestones():
    from diloco.core.run_records import EVAL_CHUNK, held_out_metrics
    from diloco.evaluation import classification_accuracy, evaluate_loss
    from diloco.model import init_model_params

    rng = np.random.default_rng(3)
    encode = OneHot(5, 3)
    windows = rng.integers(0, 5, (EVAL_CHUNK + 37, 3)).astype(np.float32)  # two chunks, the second short
    labels = rng.integers(0, 5, len(windows))
    for hidden in ((8,), (8, 6)):
        params = init_model_params([15, *hidden, 5], rng)
        dense = encode(windows)
        loss, accuracy = held_out_metrics(params, windows, labels, encode)
        assert loss == pytest.approx(evaluate_loss(params, dense, labels), rel=1e-12)
        assert accuracy == pytest.approx(classification_accuracy(params, dense, labels), abs=1e-12)


def test_the_bundled_text_is_the_published_one():
    text = load_shakespeare_text()
    assert len(text) == 1_115_394 and len(set(text)) == 65 and text.startswith("First Citizen:")
    assert SHAKESPEARE_SHA256.startswith("86c4e6aa")


def test_the_task_holds_out_the_tail_and_stays_compact():
    data = load_shakespeare(4, test_fraction=0.1, eval_windows=100)
    d = data.dataset
    assert data.encode == OneHot(65, 4) and len(data.vocabulary) == 65
    cut = round(1_115_394 * 0.9)
    assert len(d.y_train) == cut - 4, "every training window lies before the cut"
    assert d.x_test.shape == (100, 4) and d.x_train.dtype == np.float32
    assert d.x_train.nbytes < 20 * 1024**2, "index windows, never the dense (n, c V) one-hot matrix"
    text = load_shakespeare_text()
    first = "".join(data.vocabulary[int(i)] for i in d.x_test[0])
    assert first == text[cut:cut + 4] and data.vocabulary[int(d.y_test[0])] == text[cut + 4]


def test_perplexity_and_bits():
    assert perplexity(math.log(8.0)) == pytest.approx(8.0)
    assert bits_per_char(math.log(8.0)) == pytest.approx(3.0)


@pytest.mark.slow
def test_compare_on_shakespeare_prints_perplexity_for_both_algorithms(tmp_path, capsys):
    argv = ["compare", "--data", "shakespeare", "--rounds", "1", "-H", "2", "-K", "2", "--eval-windows", "64",
            "--context", "3", "--hidden-sizes", "8", "--no-plots", "-q", "--runs-dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("algorithm"))
    assert "perplexity" in header and "bits/char" in header
    rows = {}
    for line in out.splitlines()[out.splitlines().index(header) + 2:]:
        rows.setdefault(line.split()[0], line.split())  # the table's rows come first
    for name in ("DiLoCo", "sync"):
        loss, ppl, bits = (float(v) for v in rows[name][1:4])
        assert ppl == pytest.approx(math.exp(loss), rel=1e-3) and bits == pytest.approx(loss / math.log(2), rel=1e-3)
    line = next(line for line in out.splitlines() if line.startswith("n-gram baselines on the same held-out text"))
    losses = [float(word.rstrip(",")) for word in line.split(": ")[1].split()[1::2]]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2] > 0, line
    assert losses[0] == pytest.approx(unigram_oracle(load_shakespeare(3, eval_windows=64).dataset, last=True), abs=1e-4)


TINY_TRANSFORMER = ["--model", "transformer", "--d-model", "8", "--n-heads", "2", "--n-layers", "1"]


@pytest.mark.slow
@pytest.mark.parametrize("model", [[], TINY_TRANSFORMER])
def test_config_json_records_the_split_the_text_was_cut_with(model, tmp_path, capsys):
    """Runs recorded test_fraction 0.2 (the digits' default) while the text's tail was its last tenth."""
    argv = ["train", "--data", "shakespeare", "--algo", "sync", "--rounds", "1", "-H", "1", "--batch-size", "2",
            "--eval-windows", "8", "--context", "8", "--no-plots", "-q", "--runs-dir", str(tmp_path / "first"),
            *model]  # 8-character windows: the split's arithmetic holds for any context, at an eighth of the data
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads((only_run_dir(tmp_path / "first") / "config.json").read_text())["data"]
    # windows of c characters cut from the first round(N (1 - f)) characters: that many minus c
    assert data["num_train"] == round(len(load_shakespeare_text()) * (1 - data["test_fraction"])) - data["context"]
    assert data["split_seed"] is None  # no seeded split: the tail is held out
    config = str(only_run_dir(tmp_path / "first") / "config.json")
    assert main(["train", "--config", config, "--no-plots", "-q", "--runs-dir", str(tmp_path / "again")]) == 0
    assert json.loads((only_run_dir(tmp_path / "again") / "config.json").read_text())["data"] == data


def unigram_oracle(dataset, *, last: bool) -> float:
    """The Witten-Bell unigram from its definition: ``(c(w) + T/V) / (N + T)`` of the training text
    (the first window and every next character), scored on the held-out last (or every) character."""
    train = np.concatenate([dataset.x_train[0], dataset.y_train]).astype(int)
    counts, vocab = np.bincount(train, minlength=65), 65
    seen = np.count_nonzero(counts)
    prob = (counts + seen / vocab) / (train.size + seen)
    held = dataset.y_test if last else np.column_stack([dataset.x_test[:, 1:], dataset.y_test])
    return float(-np.log(prob[held.astype(int)]).mean())


def test_the_fast_engine_runs_the_char_lm(tmp_path, capsys):
    """Was refused; the fast executor encodes each batch into its input buffer."""
    argv = ["train", "--data", "shakespeare", "--engine", "fast", "--rounds", "1", "-H", "2", "-K", "2",
            "--eval-windows", "64", "--no-plots", "-q", "--runs-dir", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().err
