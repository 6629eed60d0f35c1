"""N-gram baselines for the character-level task: what character statistics alone predict.

A model of the next character has learnt something beyond character pairs only if its
held-out cross-entropy is below the bigram's, and beyond character triples only below the
trigram's. This module fits interpolated Witten-Bell n-gram models (Witten and Bell 1991;
Chen and Goodman 1998, section 2.6) on the training text and measures them on the same
held-out predictions a model is scored on.

With ``c(h w)`` the count of context ``h`` followed by character ``w`` in the training
text, ``c(h) = sum_w c(h w)``, ``T(h)`` the number of distinct characters seen after ``h``
and ``h'`` the context ``h`` without its oldest character, the order-``n`` probability is::

    P_n(w | h) = (c(h w) + T(h) P_{n-1}(w | h')) / (c(h) + T(h))       if c(h) > 0
    P_n(w | h) = P_{n-1}(w | h')                                        if c(h) = 0
    P_1(w)     = (c(w) + T / V) / (N + T)

for ``N`` training characters, ``T`` of the ``V`` vocabulary characters seen: the unigram is
mixed with the uniform distribution, so every character of the vocabulary has a
probability > 0 after every context, seen or not, and the cross-entropy of any held-out
text is finite. Each ``P_n(. | h)`` sums to 1 over the vocabulary.

A prediction whose window holds fewer than ``n - 1`` characters before it (the first
positions of a transformer's window) uses the longest context it has, as the model does.

On the training text itself a higher order is never worse: per context, the mixture's
log-likelihood is at least ``lambda`` times the empirical distribution's plus ``1 - lambda``
times the lower order's (concavity of ``log``), and the empirical distribution's is at least
the lower order's (Gibbs' inequality), with ``lambda = c(h) / (c(h) + T(h))``.

Counts are kept as sorted base-``V`` codes of the n-grams (``code = sum_i s_i V^(n-1-i)``),
so a fit is one ``numpy.unique`` per order and a lookup one ``searchsorted``: the 1.0M
training characters of Tiny Shakespeare fit to order 5 in about a second.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import check_bool, check_positive_int

__all__ = ["NGramCounts", "fit_ngrams", "ngram_log_probs", "next_char_distribution", "ngram_cross_entropy",
           "ngram_baselines", "dataset_baselines", "shakespeare_baselines",
           "baseline_sentence", "BASELINE_ORDERS"]

# The orders the command line and the results pages report: unigram, bigram, trigram.
BASELINE_ORDERS = (1, 2, 3)


class NGramCounts(NamedTuple):
    """The counts of every n-gram of a text up to ``order``.

    Attributes
    ----------
    order : int
        The longest n-gram counted.
    vocab_size : int
        V: characters are the integers ``0 .. V - 1``.
    grams : tuple of ``order`` pairs (codes, counts)
        For ``n = 1 .. order``: the sorted base-V codes of the distinct n-grams,
        int64 ndarray of shape (m_n,), and their counts ``c(h w)``, int64 (m_n,).
    contexts : tuple of ``order`` triples (codes, totals, types)
        For ``n = 1 .. order``: the sorted codes of the distinct contexts ``h`` of
        ``n - 1`` characters, their ``c(h)`` and their ``T(h)``, each int64 (h_n,)
        (``n = 1``: the one empty context, code 0).
    """

    order: int
    vocab_size: int
    grams: tuple
    contexts: tuple


def fit_ngrams(ids, order: int, vocab_size: int) -> NGramCounts:
    """Count every n-gram of the text ``ids`` for ``n = 1 .. order``.

    Parameters
    ----------
    ids : integer ndarray of shape (N,), values in [0, V), N >= 1
    order : int >= 1
    vocab_size : int >= 1, V

    Raises
    ------
    ValueError
        An empty text, characters outside [0, V), or ``V ** order`` beyond an int64 code.
    """
    order, vocab_size = check_positive_int(order, "order"), check_positive_int(vocab_size, "vocab_size")
    ids = _check_ids(ids, vocab_size, "ids")
    if ids.shape[0] == 0:
        raise ValueError("ids must hold at least one character")
    if order * np.log2(max(vocab_size, 2)) >= 62:
        raise ValueError(f"order={order} with vocab_size={vocab_size}: n-gram codes would overflow int64")
    grams, contexts = [], []
    for n in range(1, order + 1):
        codes, counts = np.unique(_codes(ids, n, vocab_size), return_counts=True)
        heads, first = np.unique(codes // vocab_size, return_index=True)
        totals = np.add.reduceat(counts, first) if codes.size else counts
        grams.append((codes, counts.astype(np.int64)))
        contexts.append((heads, totals.astype(np.int64), np.diff(np.append(first, codes.size)).astype(np.int64)))
    return NGramCounts(order, vocab_size, tuple(grams), tuple(contexts))


def ngram_log_probs(counts: NGramCounts, contexts, targets, order: int | None = None) -> np.ndarray:
    """``log P_n(target | context)`` (nats) of each row, Witten-Bell (module docstring).

    Parameters
    ----------
    counts : NGramCounts
    contexts : integer ndarray of shape (m, L), values in [0, V)
        The characters before each target, oldest first; only the last ``n - 1`` are
        used, and fewer when ``L < n - 1``.
    targets : integer ndarray of shape (m,), values in [0, V)
    order : int in [1, counts.order] or None
        n (None: ``counts.order``).

    Returns
    -------
    float64 ndarray of shape (m,), each finite and <= 0.
    """
    order = counts.order if order is None else check_positive_int(order, "order")
    if order > counts.order:
        raise ValueError(f"order={order} is more than the {counts.order} the counts were fitted to")
    vocab = counts.vocab_size
    targets = _check_ids(targets, vocab, "targets")
    contexts = _check_ids(contexts, vocab, "contexts", ndim=2)
    if contexts.shape[0] != targets.shape[0]:
        raise ValueError(f"contexts must have one row per target, got shapes {contexts.shape} and {targets.shape}")
    gram_codes, gram_counts = counts.grams[0]
    _, total, types = counts.contexts[0]
    seen = _lookup(gram_codes, gram_counts, targets)
    prob = (seen + types[0] / vocab) / (total[0] + types[0])
    context_code = np.zeros(targets.shape[0], dtype=np.int64)
    for n in range(2, min(order, contexts.shape[1] + 1) + 1):
        context_code += contexts[:, contexts.shape[1] - n + 1] * vocab ** (n - 2)  # one character further back
        head_codes, head_totals, head_types = counts.contexts[n - 1]
        c_h, t_h = _lookup(head_codes, head_totals, context_code), _lookup(head_codes, head_types, context_code)
        c_hw = _lookup(*counts.grams[n - 1], context_code * vocab + targets)
        prob = np.where(c_h > 0, (c_hw + t_h * prob) / np.maximum(c_h + t_h, 1), prob)
    return np.log(prob)


def next_char_distribution(counts: NGramCounts, context, order: int | None = None) -> np.ndarray:
    """``P_n(. | context)`` over the V characters: float64 ndarray of shape (V,), summing to 1.

    ``context`` is an integer ndarray of shape (L,), the characters before, oldest first.
    """
    context = np.asarray(context)
    if context.ndim != 1:
        raise ValueError(f"context must be 1-D (L,), got shape {context.shape}")
    vocab = np.arange(counts.vocab_size)
    return np.exp(ngram_log_probs(counts, np.tile(context, (counts.vocab_size, 1)), vocab, order))


def ngram_cross_entropy(counts: NGramCounts, windows, next_chars, *, every_position: bool,
                        order: int | None = None) -> float:
    """Mean ``-log P_n`` (nats per character) of held-out predictions, as a model is scored.

    Parameters
    ----------
    counts : NGramCounts
    windows : integer-valued ndarray of shape (m, c), values in [0, V)
        ``diloco.text``'s held-out windows (float32 index windows are accepted).
    next_chars : integer ndarray of shape (m,)
        The character after each window.
    every_position : bool, keyword-only
        True: predict every character of each window after its first and the next one,
        ``m c`` predictions, each from the window's characters before it (the
        transformer's held-out loss). False: only ``next_chars`` from the whole window
        (the MLP's).
    order : int or None
        n (None: ``counts.order``).
    """
    every_position = check_bool(every_position, "every_position")
    windows, next_chars = np.asarray(windows), np.asarray(next_chars)
    if windows.ndim != 2 or windows.shape[0] == 0 or next_chars.shape != (windows.shape[0],):
        raise ValueError(f"windows must be (m, c) with m >= 1 and next_chars (m,), got shapes {windows.shape} "
                         f"and {next_chars.shape}")
    text = _check_ids(np.column_stack([windows, next_chars]), counts.vocab_size, "windows", ndim=2)
    order = counts.order if order is None else check_positive_int(order, "order")
    width, need = text.shape[1] - 1, order - 1
    first = 1 if every_position else width  # the first predicted position of the row [window, next]
    start = max(first, need)  # positions from here on have n - 1 characters before them in the window
    total = 0.0
    for position in range(first, min(start, width + 1)):  # a window's first positions: shorter contexts
        total += float(ngram_log_probs(counts, text[:, :position], text[:, position], order).sum())
    if start <= width:
        rows = np.lib.stride_tricks.sliding_window_view(text[:, start - need:], need + 1, axis=1)
        rows = rows.reshape(-1, need + 1)
        total += float(ngram_log_probs(counts, rows[:, :need], rows[:, need], order).sum())
    return -total / (text.shape[0] * (width - first + 1))


def ngram_baselines(train_ids, windows, next_chars, vocab_size: int, *, every_position: bool,
                    orders=BASELINE_ORDERS) -> dict:
    """``{n: ngram_cross_entropy}`` for each order ``n``, fitted once on ``train_ids``."""
    orders = tuple(check_positive_int(n, "order") for n in orders)
    if not orders:
        raise ValueError("orders must name at least one order")
    counts = fit_ngrams(train_ids, max(orders), vocab_size)
    return {n: ngram_cross_entropy(counts, windows, next_chars, every_position=every_position, order=n)
            for n in orders}


def dataset_baselines(dataset, vocab_size: int, *, every_position: bool, orders=BASELINE_ORDERS) -> dict:
    """``ngram_baselines`` of a character-level ``Dataset`` (``diloco.text.load_shakespeare``'s):
    fitted on the text its training windows cut, measured on its held-out windows.

    Raises
    ------
    ValueError
        Training windows that are not those of one text in order (``diloco.corpus.speakers.ids_from_windows``).
    """
    from diloco.corpus.speakers import ids_from_windows

    train_ids = ids_from_windows(dataset.x_train, dataset.y_train)
    return ngram_baselines(train_ids, dataset.x_test, dataset.y_test, vocab_size, every_position=every_position,
                           orders=orders)


def shakespeare_baselines(context: int, eval_windows: int | None, *, every_position: bool,
                          orders=BASELINE_ORDERS) -> dict:
    """``dataset_baselines`` of ``diloco.text.load_shakespeare(context, eval_windows=eval_windows)``:
    the baselines a results page quotes beside a char-LM's table (``every_position`` for the transformer)."""
    from diloco.text import load_shakespeare

    text = load_shakespeare(context, eval_windows=eval_windows)
    return dataset_baselines(text.dataset, text.encode.vocab_size, every_position=every_position, orders=orders)


_NAMES = {1: "unigram", 2: "bigram", 3: "trigram"}


def baseline_sentence(baselines: dict) -> str:
    """One line for ``ngram_baselines``: ``n-gram baselines on the same held-out text: unigram 3.3412, ...``."""
    parts = ", ".join(f"{_NAMES.get(n, f'{n}-gram')} {loss:.4f}" for n, loss in sorted(baselines.items()))
    return f"n-gram baselines on the same held-out text (Witten-Bell, fitted on the training text): {parts} nats/char"


def _codes(ids: np.ndarray, n: int, vocab_size: int) -> np.ndarray:
    """The base-V code of every n-gram of ``ids``, in text order: int64 (N - n + 1,), empty if N < n."""
    count = ids.shape[0] - n + 1
    codes = np.zeros(max(count, 0), dtype=np.int64)
    for offset in range(n if count > 0 else 0):
        codes = codes * vocab_size + ids[offset:offset + count]
    return codes


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray) -> np.ndarray:
    """``values`` at ``query``'s position in the sorted ``keys``; 0 where ``query`` is absent."""
    if keys.size == 0:
        return np.zeros(query.shape, dtype=np.int64)
    where = np.minimum(np.searchsorted(keys, query), keys.size - 1)
    return np.where(keys[where] == query, values[where], 0)


def _check_ids(values, vocab_size: int, name: str, ndim: int = 1) -> np.ndarray:
    """``values`` as int64 character ids in [0, V) of ``ndim`` dimensions (integer-valued floats allowed)."""
    array = np.asarray(values)
    if array.ndim != ndim or array.dtype.kind not in "iuf":
        raise ValueError(f"{name} must be a {ndim}-D array of character ids, got {array.dtype} of shape {array.shape}")
    ids = array.astype(np.int64)
    if array.size and (ids.min() < 0 or ids.max() >= vocab_size or not np.array_equal(ids, array)):
        raise ValueError(f"{name} must hold integer character ids in [0, {vocab_size})")
    return ids
