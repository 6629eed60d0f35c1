"""The n-gram baselines (``diloco.corpus.ngram``): a hand-worked fixture, an independent oracle and
the properties Witten-Bell smoothing guarantees."""

from __future__ import annotations

import io
import math
import re
from collections import Counter
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco.corpus.ngram import (
    baseline_sentence,
    fit_ngrams,
    next_char_distribution,
    ngram_baselines,
    ngram_cross_entropy,
    ngram_log_probs,
)

pytestmark = pytest.mark.tooling

# The fixture: vocabulary a, b, c (V = 3), training text "aabab" (N = 5).
#   unigram: c(a) = 3, c(b) = 2, c(c) = 0; T = 2 characters seen
#     P1(a) = (3 + 2/3) / (5 + 2) = 11/21,  P1(b) = (2 + 2/3) / 7 = 8/21,  P1(c) = (2/3) / 7 = 2/21
#   bigrams aa, ab, ba, ab: after a: c(aa) = 1, c(ab) = 2, c(a.) = 3, T(a) = 2; after b: c(ba) = 1, T(b) = 1
#     P2(a|a) = (1 + 2 * 11/21) / (3 + 2) = 43/105,  P2(b|a) = (2 + 2 * 8/21) / 5 = 58/105,
#     P2(c|a) = (2 * 2/21) / 5 = 4/105;  P2(a|b) = (1 + 11/21) / 2 = 16/21;  c was never a context: P2(.|c) = P1
#   trigrams aab, aba, bab: after aa only b, once: c(aa.) = 1, T(aa) = 1
#     P3(b|aa) = (1 + 1 * 58/105) / (1 + 1) = 163/210,  P3(c|aa) = (0 + 4/105) / 2 = 2/105
A, B, C = 0, 1, 2
TRAIN = np.array([A, A, B, A, B])


def test_the_hand_worked_fixture():
    counts = fit_ngrams(TRAIN, 3, 3)
    for order, context, expected in ((1, [], [11 / 21, 8 / 21, 2 / 21]),
                                     (2, [A], [43 / 105, 58 / 105, 4 / 105]),
                                     (2, [B], [16 / 21, 4 / 21, 1 / 21]),  # (0 + 8/21) / 2, (0 + 2/21) / 2
                                     (2, [C], [11 / 21, 8 / 21, 2 / 21]),  # an unseen context: the unigram
                                     (3, [A, A], [(0 + 43 / 105) / 2, 163 / 210, 2 / 105]),
                                     (3, [C, C], [11 / 21, 8 / 21, 2 / 21])):  # unseen cc, unseen c: the unigram
        np.testing.assert_allclose(next_char_distribution(counts, np.array(context, dtype=int), order), expected,
                                   rtol=1e-14, err_msg=f"order {order} after {context}")


def test_the_fixture_held_out_cross_entropy_every_position_and_last_only():
    # held out: the window "aa" followed by "b". Every position: a after a, then b after aa.
    counts = fit_ngrams(TRAIN, 3, 3)
    windows, following = np.array([[A, A]], dtype=np.float32), np.array([B])
    expected_every = {1: -(math.log(11 / 21) + math.log(8 / 21)) / 2,
                      2: -(math.log(43 / 105) + math.log(58 / 105)) / 2,
                      3: -(math.log(43 / 105) + math.log(163 / 210)) / 2}  # position 1 has one character before it
    expected_last = {1: -math.log(8 / 21), 2: -math.log(58 / 105), 3: -math.log(163 / 210)}
    for order in (1, 2, 3):
        assert ngram_cross_entropy(counts, windows, following, every_position=True, order=order) == pytest.approx(
            expected_every[order], rel=1e-14)
        assert ngram_cross_entropy(counts, windows, following, every_position=False, order=order) == pytest.approx(
            expected_last[order], rel=1e-14)
    assert ngram_baselines(TRAIN, windows, following, 3, every_position=True) == pytest.approx(expected_every,
                                                                                                rel=1e-14)


def _oracle_probability(text, vocab, order, context, target):
    """Witten-Bell from its definition, with dictionaries (no code shared with diloco.corpus.ngram)."""
    if order == 1:
        unigrams = Counter(text)
        return (unigrams[target] + len(unigrams) / vocab) / (len(text) + len(unigrams))
    lower = _oracle_probability(text, vocab, order - 1, context[1:], target)
    history = tuple(context[-(order - 1):])
    followers = Counter(tuple(text[i + order - 1:i + order]) for i in range(len(text) - order + 1)
                        if tuple(text[i:i + order - 1]) == history)
    total = sum(followers.values())
    if total == 0:
        return lower
    return (followers[(target,)] + len(followers) * lower) / (total + len(followers))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 30), st.integers(0, 2**32 - 1))
def test_matches_an_independent_oracle(vocab, order, length, seed):
    rng = np.random.default_rng(seed)
    text = rng.integers(0, vocab, length)
    held = rng.integers(0, vocab, (5, order))  # contexts of order - 1 characters, then the target
    counts = fit_ngrams(text, order, vocab)
    got = np.exp(ngram_log_probs(counts, held[:, :-1], held[:, -1]))
    expected = [_oracle_probability(text.tolist(), vocab, order, row[:-1].tolist(), int(row[-1])) for row in held]
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 60), st.integers(0, 5), st.integers(0, 2**32 - 1))
def test_every_context_gives_a_distribution_over_the_whole_vocabulary(vocab, order, length, context_length, seed):
    rng = np.random.default_rng(seed)
    counts = fit_ngrams(rng.integers(0, vocab, length), order, vocab)
    context = rng.integers(0, vocab, context_length)  # seen or not, shorter or longer than order - 1
    distribution = next_char_distribution(counts, context)
    assert distribution.shape == (vocab,) and (distribution > 0).all()  # finite loss for every character
    assert distribution.sum() == pytest.approx(1.0, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(2, 5), st.integers(2, 80), st.integers(0, 2**32 - 1))
def test_a_higher_order_is_never_worse_on_the_training_text(vocab, order, length, seed):
    rng = np.random.default_rng(seed)
    text = rng.integers(0, vocab, length) if seed % 2 else np.tile(rng.integers(0, vocab, 3), length)[:length]
    counts = fit_ngrams(text, order, vocab)
    whole = text[None, :-1].astype(np.float32), text[-1:]  # the training text as one window: every position
    losses = [ngram_cross_entropy(counts, *whole, every_position=True, order=n) for n in range(1, order + 1)]
    assert (np.diff(losses) <= 1e-12).all(), losses


def test_only_the_contexts_inside_a_window_are_used():
    # The window "ba" then "b": at position 1 the bigram sees a; the trigram has only "b" before it too.
    counts = fit_ngrams(TRAIN, 3, 3)
    assert ngram_cross_entropy(counts, np.array([[B, A]]), np.array([B]), every_position=True, order=3) == \
        pytest.approx(-(math.log(16 / 21) + math.log((1 + 1 * 58 / 105) / 2)) / 2, rel=1e-14)  # P2(a|b), P3(b|ba)


def test_bad_input_is_refused_in_one_line():
    counts = fit_ngrams(TRAIN, 2, 3)
    with pytest.raises(ValueError, match="at least one character"):
        fit_ngrams(np.array([], dtype=int), 2, 3)
    with pytest.raises(ValueError, match=r"ids must hold integer character ids in \[0, 3\)"):
        fit_ngrams(np.array([0, 3]), 2, 3)
    with pytest.raises(ValueError, match="order=3 is more than the 2"):
        ngram_log_probs(counts, np.zeros((1, 2), dtype=int), np.array([0]), 3)
    with pytest.raises(ValueError, match="overflow"):
        fit_ngrams(TRAIN, 12, 65)
    with pytest.raises(ValueError, match="one row per target"):
        ngram_log_probs(counts, np.zeros((2, 1), dtype=int), np.array([0]))
    with pytest.raises(ValueError, match="windows must be"):
        ngram_cross_entropy(counts, np.zeros(3), np.zeros(3), every_position=True)
    with pytest.raises(ValueError, match="windows must hold integer"):
        ngram_cross_entropy(counts, np.array([[0.5, 0.0]]), np.array([1]), every_position=True)


def test_the_sentence_names_each_order():
    line = baseline_sentence({1: 3.3422, 2: 2.50131, 3: 2.0535, 4: 1.8})
    assert "unigram 3.3422, bigram 2.5013, trigram 2.0535, 4-gram 1.8000 nats/char" in line


RESULTS_PAGES = sorted((Path(__file__).resolve().parents[2] / "docs").glob("results*.md"))
SHOWN = re.compile(r'^\.venv/bin/python -c "(from diloco\.corpus\.ngram import [^"]*)"$', re.M)


@pytest.mark.slow
def test_every_results_page_shows_what_its_n_gram_commands_print():
    shown = 0
    for page in RESULTS_PAGES:
        text = page.read_text(encoding="utf-8")
        for match in SHOWN.finditer(text):
            printed = io.StringIO()
            with redirect_stdout(printed):
                exec(match.group(1), {})  # the command as the page shows it, without the interpreter start-up
            line = printed.getvalue().strip()
            assert f"\n{line}\n" in text, f"{page.name}: the page does not show what {match.group(0)!r} prints: {line}"
            shown += 1
    assert shown >= 4, "the transformer page, results.md and the beyond page show their n-gram baselines"
