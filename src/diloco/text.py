"""Character-level language modelling on Tiny Shakespeare, the paper's task in miniature.

The DiLoCo paper trains language models and reports perplexity. Here the same MLP
predicts the next character from the ``c`` characters before it: the context is one-hot
encoded (``c * V`` inputs for a vocabulary of ``V = 65`` characters), the output is a
softmax over the ``V`` characters, and the metrics are perplexity ``exp(mean CE)`` and
bits per character ``mean CE / ln 2``.

Memory: a dense one-hot matrix of every window of the 1.1M-character text would hold
``1.1e6 * 6 * 65`` floats (3.5 GB in float64). Instead the data set stores each window as
its ``c`` character indices (``x`` of shape ``(n, c)``, float32: 24 bytes a window, 27 MB
for the whole text) and ``OneHot`` expands a mini-batch to ``(b, c * V)`` floats just
before the model sees it. Index windows are ordinary ``(x, y)`` arrays, so sharding
(milestones 16-17) and batch sampling (18) work on them unchanged; the loop applies the
encoder per batch (``diloco.core.driver.train(..., encode=OneHot(...))``) and the
evaluation per chunk (``diloco.core.run_records.finish_record``).

The text ships inside the package (``diloco/_datasets/tinyshakespeare.txt.gz``, 434 kB):
Karpathy's char-rnn ``tinyshakespeare/input.txt``, plays by William Shakespeare (public
domain). Its SHA-256 is checked on every load. The held-out part is the tail of the text.
"""

from __future__ import annotations

import gzip
import hashlib
from importlib import resources
from typing import NamedTuple

import numpy as np

from diloco._validation import api_checks, check_positive_int, check_real
from diloco.data import Dataset

__all__ = ["SHAKESPEARE_PROVENANCE", "SHAKESPEARE_SHA256", "SHAKESPEARE_TEST_FRACTION", "OneHot", "TextData",
           "load_shakespeare_text", "vocabulary_of", "char_windows", "load_shakespeare", "perplexity", "bits_per_char",
           "TOPIC_SEGMENTS", "topic_segments", "topic_shard_dataset"]

SHAKESPEARE_PROVENANCE = (
    "Tiny Shakespeare: 1,115,394 characters of plays by William Shakespeare (public domain), "
    "the data/tinyshakespeare/input.txt of the char-rnn repository (karpathy/char-rnn), gzip-compressed."
)
SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
# The held-out tail: the last tenth of the text (``load_shakespeare``'s default, and what the
# command line loads and records as ``test_fraction`` in a run's config.json).
SHAKESPEARE_TEST_FRACTION = 0.1

# Evaluate on at most this many held-out windows, evenly spaced over the tail: the
# held-out loss is computed after every round, and 8,192 windows keep that below a
# tenth of a round's cost at the study settings while the paired comparisons (the same
# windows for every arm) stay tight.
DEFAULT_EVAL_WINDOWS = 8192


class OneHot:
    """Expands index windows ``(b, c)`` into one-hot model inputs ``(b, c * V)``.

    Column ``j * V + v`` of the output is 1 where character ``j`` of the window is ``v``,
    so the first layer's weights hold one ``(V, h)`` block per context position and the
    MLP is the same as on any other features.

    Parameters
    ----------
    vocab_size : int >= 1
        V.
    context : int >= 1
        c, characters per window.

    Attributes
    ----------
    vocab_size, context : int
    input_width : int
        Columns of the raw index windows, ``c``.
    num_features : int
        Columns after encoding, ``c * V``: the model's input width.
    """

    def __init__(self, vocab_size: int, context: int) -> None:
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.context = check_positive_int(context, "context")
        self.input_width = self.context
        self.num_features = self.context * self.vocab_size

    def __call__(self, windows: np.ndarray, dtype=np.float64) -> np.ndarray:
        """One-hot rows for ``windows`` of shape ``(b, c)`` holding indices in ``[0, V)``.

        Returns
        -------
        ndarray of shape (b, c * V), ``dtype``
            A new array.

        Raises
        ------
        ValueError
            Wrong width, or an index that is not an integer in ``[0, V)``.
        """
        columns = self.columns(windows)
        out = np.zeros((columns.shape[0], self.num_features), dtype=dtype)
        np.put_along_axis(out, columns, 1.0, axis=1)
        return out

    def columns(self, windows: np.ndarray) -> np.ndarray:
        """The one hot column of each position: ``windows + p V`` at position ``p``, shape ``(b, c)``.

        Raises
        ------
        ValueError
            Wrong width, or an index that is not an integer in ``[0, V)``.
        """
        windows = np.asarray(windows)
        if windows.ndim != 2 or windows.shape[1] != self.context:
            raise ValueError(f"windows must have shape (b, {self.context}), got {windows.shape}")
        index = windows.astype(np.intp)
        if windows.size and (index.min() < 0 or index.max() >= self.vocab_size or not np.array_equal(index, windows)):
            raise ValueError(f"windows must hold integer character indices in [0, {self.vocab_size})")
        return index + np.arange(self.context) * self.vocab_size

    def first_layer(self, windows: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """``self(windows) @ weights`` without the one-hot matrix: the sum of the ``c`` rows of
        ``weights`` the windows' characters pick, position by position.

        Each output row adds ``c`` rows of ``weights``, where the dense product adds ``c V``
        terms of which all but ``c`` are zero: about ``V`` times less work for the held-out
        evaluation. The products with the one-hot zeros are exact zeros, so the two agree
        to rounding (the test holds them within 1e-12 relative).

        Parameters
        ----------
        windows : ndarray of shape (b, c), character indices in [0, V)
        weights : ndarray of shape (c V, h), floating

        Returns
        -------
        ndarray of shape (b, h), ``weights``' dtype

        Raises
        ------
        ValueError
            Bad ``windows`` (as ``columns``), or ``weights`` not of ``c V`` rows.
        """
        weights = np.asarray(weights)
        if weights.ndim != 2 or weights.shape[0] != self.num_features:
            raise ValueError(f"weights must have shape ({self.num_features}, h), got {weights.shape}")
        columns = self.columns(windows)
        out = weights[columns[:, 0]]
        for position in range(1, self.context):
            out += weights[columns[:, position]]
        return out

    def __repr__(self) -> str:
        return f"OneHot(vocab_size={self.vocab_size}, context={self.context})"

    def __eq__(self, other) -> bool:
        return isinstance(other, OneHot) and (self.vocab_size, self.context) == (other.vocab_size, other.context)

    def __hash__(self) -> int:
        return hash((self.vocab_size, self.context))


class TextData(NamedTuple):
    """A character-level task: index windows, labels and the encoder the model needs.

    Attributes
    ----------
    dataset : Dataset
        ``x_*`` float32 index windows of shape (n, c); ``y_*`` int64 next characters (n,).
    encode : OneHot
        Turns a batch of windows into model inputs.
    vocabulary : str
        The V characters, in index order.
    """

    dataset: Dataset
    encode: OneHot
    vocabulary: str


def load_shakespeare_text() -> str:
    """The bundled Tiny Shakespeare text, checked against its SHA-256.

    Raises
    ------
    ValueError
        The bundled file does not match the published checksum.
    """
    with resources.files("diloco._datasets").joinpath("tinyshakespeare.txt.gz").open("rb") as handle:
        raw = gzip.decompress(handle.read())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != SHAKESPEARE_SHA256:
        raise ValueError(f"tinyshakespeare.txt.gz: SHA-256 {digest} does not match {SHAKESPEARE_SHA256}")
    return raw.decode("utf-8")


def vocabulary_of(text: str) -> str:
    """The distinct characters of ``text``, sorted: character ``vocabulary[i]`` has index ``i``."""
    return "".join(sorted(set(text)))


def char_windows(ids: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Every window of ``context`` characters and the character that follows it.

    ``x[i] = ids[i : i + c]`` and ``y[i] = ids[i + c]`` for ``i = 0 .. N - c - 1``.

    Parameters
    ----------
    ids : integer ndarray of shape (N,)
    context : int >= 1

    Returns
    -------
    x : float32 ndarray of shape (N - c, c)
        Index windows (exact small integers), ``4 c`` bytes per window.
    y : int64 ndarray of shape (N - c,)

    Raises
    ------
    ValueError
        ``context`` < 1 or a text no longer than ``context``.
    """
    api_checks.char_windows(ids, context)
    context = check_positive_int(context, "context")
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.shape[0] <= context:
        raise ValueError(f"ids must be 1-D and longer than context={context}, got shape {ids.shape}")
    windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], context)  # a view: no copy yet
    return windows.astype(np.float32), ids[context:].astype(np.int64)


def load_shakespeare(context: int = 6, *, test_fraction: float = SHAKESPEARE_TEST_FRACTION,
                     eval_windows: int | None = DEFAULT_EVAL_WINDOWS) -> TextData:
    """Next-character prediction on Tiny Shakespeare, the tail of the text held out.

    The text's characters, sorted, are the vocabulary (V = 65). The first
    ``1 - test_fraction`` of the text gives the training windows, the rest the held-out
    ones; no window crosses the cut. With ``eval_windows``, the held-out part keeps that
    many windows, evenly spaced over the tail (deterministic).

    Parameters
    ----------
    context : int >= 1
        c, characters the model sees.
    test_fraction : float in (0, 1), keyword-only
    eval_windows : int >= 1 or None, keyword-only
        Held-out windows kept (None: all of them).

    Returns
    -------
    TextData(dataset, encode, vocabulary)

    Raises
    ------
    ValueError
        Bad ``context``, ``test_fraction`` or ``eval_windows``.
    """
    context = check_positive_int(context, "context")
    test_fraction = check_real(test_fraction, "test_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
    text = load_shakespeare_text()
    vocabulary = vocabulary_of(text)
    lookup = np.zeros(max(map(ord, vocabulary)) + 1, dtype=np.uint8)
    lookup[[ord(ch) for ch in vocabulary]] = np.arange(len(vocabulary), dtype=np.uint8)
    ids = lookup[np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)]
    cut = int(round(len(ids) * (1.0 - test_fraction)))
    x_train, y_train = char_windows(ids[:cut], context)
    x_test, y_test = char_windows(ids[cut:], context)
    if eval_windows is not None:
        eval_windows = check_positive_int(eval_windows, "eval_windows")
        if eval_windows < len(y_test):
            keep = np.linspace(0, len(y_test) - 1, eval_windows).round().astype(np.intp)
            x_test, y_test = x_test[keep], y_test[keep]
    return TextData(Dataset(x_train, y_train, x_test, y_test), OneHot(len(vocabulary), context), vocabulary)


# Contiguous segments the topic split cuts the training rows into: for Tiny Shakespeare's
# 1.0M training windows, about 15,700 characters each, the length of a long scene.
TOPIC_SEGMENTS = 64


def topic_segments(n: int, segments: int = TOPIC_SEGMENTS) -> np.ndarray:
    """The segment of each of ``n`` rows: ``floor(i * segments / n)``, so ``segments``
    contiguous runs whose lengths differ by at most one (fewer when ``n < segments``)."""
    n, segments = check_positive_int(n, "n"), check_positive_int(segments, "segments")
    return (np.arange(n, dtype=np.int64) * segments) // n


def topic_shard_dataset(x: np.ndarray, y: np.ndarray, num_workers: int, rng, *, alpha: float = 0.5,
                        segments: int = TOPIC_SEGMENTS) -> list:
    """Non-IID shards by topic: contiguous segments of the rows, spread by Dirichlet(``alpha``).

    The rows are cut into ``segments`` contiguous runs (``topic_segments``); for the
    char-LM's index windows, which are in text order, a run is a stretch of a play.
    Each segment then plays the part of a label in milestone 17's label skew
    (``diloco.sharding.noniid_shard_dataset``, called unchanged on the row indices with
    the segment as label): its rows are split over the workers in proportions drawn
    from ``Dirichlet(alpha * 1_K)``. Small ``alpha`` gives each segment to about one
    worker, so each worker reads a few stretches of the text; large ``alpha`` approaches
    IID. Each worker's rows keep their text order.

    Returns
    -------
    list of K tuples (x_k, y_k), disjoint, together exactly the dataset.
    """
    from diloco.sharding import noniid_shard_dataset

    x, y = np.asarray(x), np.asarray(y)
    if x.ndim < 1 or y.shape != (x.shape[0],):
        raise ValueError(f"x and y must have the same number of rows, got shapes {x.shape} and {y.shape}")
    rows = np.arange(x.shape[0], dtype=np.float64)[:, None]
    shards = noniid_shard_dataset(rows, topic_segments(x.shape[0], segments), num_workers, rng, alpha=alpha)
    out = []
    for index_column, _ in shards:
        index = np.sort(index_column[:, 0].astype(np.intp))
        out.append((x[index], y[index]))
    return out


def perplexity(mean_cross_entropy: float) -> float:
    """``exp(L)`` of a mean cross-entropy ``L`` in nats: the effective number of equally
    likely next characters. ``L`` must be a real >= 0; NaN gives NaN and +Inf gives +Inf (IEEE)."""
    api_checks.mean_loss(mean_cross_entropy)
    return float(np.exp(mean_cross_entropy))


def bits_per_char(mean_cross_entropy: float) -> float:
    """``L / ln 2``: the mean cross-entropy in bits (per character for the char-LM).
    ``L`` must be a real >= 0; NaN gives NaN and +Inf gives +Inf (IEEE)."""
    api_checks.mean_loss(mean_cross_entropy)
    return float(mean_cross_entropy / np.log(2.0))
