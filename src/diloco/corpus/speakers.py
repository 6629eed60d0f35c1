"""Non-IID shards by speaker: each worker reads the whole speeches of its own speakers.

Tiny Shakespeare is a run of speeches, each a speaker line ``NAME:`` after a blank line (or
at the start of the text) followed by the speech and the blank line that ends it::

    First Citizen:
    Before we proceed any further, hear me speak.

    All:
    Speak, speak.

The training text (the first 90%) holds 6,283 speeches by 283 speakers (a speech is its speaker line, its
lines and the blank line after it, so the speeches cover the text exactly). The speaker
split gives each of the K workers a disjoint set of speakers and every speech they make,
balanced by characters (``assign_speakers``). Unlike the topic split
(``diloco.text.topic_shard_dataset``), whose shards differ by where in the text they were
cut, a worker here reads only its own characters' words and names, which a language
model can see in a few characters of context.

The boundary between two speeches. The split acts on the text before windowing: worker
``k``'s text is its speeches concatenated in text order (``speaker_texts``), and its
windows are cut from that text (``diloco.text.char_windows``) at whatever context the
data set uses, so no window ever reads another worker's text. A window that crosses the
end of one of the worker's speeches sees the end of the worker's previous speech (of one
of its own speakers) where the real text has the previous speech of whoever spoke before;
every training character but each worker's first ``c`` is a target, as with IID shards.

There is no play split. Tiny Shakespeare has no play or act markers; the sequence of
speakers shows long runs of one play's cast (CORIOLANUS speaks only in about the first
154,000 characters, ROMEO only from about 449,000 to 566,000), but nothing in the package
says where a play ends, so a boundary guessed from a change of cast could not be checked,
and names cross the boundaries: GLOUCESTER, QUEEN MARGARET and KING EDWARD IV speak from about 154,000
to 710,000, in Richard III and in the third part of Henry VI with other plays between, and
generic speakers (Messenger, Servant, First Citizen) recur across the whole text. And
with the nine or so plays the casts suggest, some short (PROSPERO speaks only in the last
31,000 characters), a play split could neither balance K = 8 workers nor serve K > 9. The
speaker split is the finer cut, and it balances.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np

from diloco._validation import check_generator, check_positive_int
from diloco.text import char_windows, load_shakespeare_text, vocabulary_of

__all__ = ["Speeches", "SPEAKER_LINE", "split_speeches", "assign_speakers", "speaker_texts", "ids_from_windows",
           "speaker_shard_dataset"]

# A speaker line: a line ending in ":" at the start of the text or after a blank line. In
# Tiny Shakespeare every blank line is followed by one (7,222 of them); the 1,491 lines that
# end in ":" inside a speech ("and thus answer'd:") follow no blank line.
SPEAKER_LINE = re.compile(r"(?:^|(?<=\n\n))([^\n]+):\n")


class Speeches(NamedTuple):
    """The speeches of a text, in text order.

    Attributes
    ----------
    bounds : int64 ndarray of shape (m + 1,)
        Speech ``i`` is ``text[bounds[i]:bounds[i + 1]]``; ``bounds[0] = 0`` and
        ``bounds[m] = len(text)``, so the speeches cover the text exactly.
    speaker : int64 ndarray of shape (m,)
        The index into ``names`` of each speech's speaker.
    names : tuple of str
        The distinct speaker names, in order of first appearance. Text before the first
        speaker line (a text cut mid-speech) is a speech of the speaker ``""``.
    """

    bounds: np.ndarray
    speaker: np.ndarray
    names: tuple


def split_speeches(text: str) -> Speeches:
    """The speeches of ``text``: each runs from its speaker line to the next one.

    Raises
    ------
    ValueError
        ``text`` holds no speaker line (``NAME:`` at the start or after a blank line).
    """
    heads = list(SPEAKER_LINE.finditer(text))
    if not heads:
        raise ValueError("the text holds no speaker line (a 'NAME:' line at the start or after a blank line): "
                         "the speaker split needs Tiny Shakespeare's format")
    starts, names = [m.start() for m in heads], [m.group(1) for m in heads]
    if starts[0] > 0:  # text before the first speaker line: the end of an earlier speech
        starts, names = [0, *starts], ["", *names]
    index: dict[str, int] = {}
    speaker = np.array([index.setdefault(name, len(index)) for name in names], dtype=np.int64)
    return Speeches(np.array([*starts, len(text)], dtype=np.int64), speaker, tuple(index))


def assign_speakers(sizes: np.ndarray, num_workers: int, rng) -> np.ndarray:
    """The worker of each speaker: a random first fit, balanced by characters.

    Speakers are placed largest first (ties in random order); each goes to a worker drawn
    uniformly from those it fits in below the capacity ``ceil(sum(sizes) / K)``, or to the
    least loaded worker if it fits in none. Every worker's load then stays within one
    small speaker of the capacity (Tiny Shakespeare at K = 8: within 0.01%), and
    the seed changes which speakers go together.

    Parameters
    ----------
    sizes : ndarray of shape (s,), non-negative
        Characters of each speaker.
    num_workers : int, 1 <= K <= s
    rng : numpy.random.Generator

    Returns
    -------
    int64 ndarray of shape (s,), values in [0, K); every worker gets at least one speaker.

    Raises
    ------
    ValueError
        ``num_workers`` < 1 or more workers than speakers.
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    num_workers = check_positive_int(num_workers, "num_workers")
    if num_workers > sizes.shape[0]:
        raise ValueError(f"num_workers={num_workers} workers but the text has only {sizes.shape[0]} speakers: the "
                         f"speaker split (--noniid-split speaker) gives each worker at least one (use -K "
                         f"{sizes.shape[0]} or fewer)")
    rng = check_generator(rng)
    shuffled = rng.permutation(sizes.shape[0])
    order = shuffled[np.argsort(-sizes[shuffled], kind="stable")]
    capacity = np.ceil(sizes.sum() / num_workers)
    load = np.zeros(num_workers)
    owner = np.empty(sizes.shape[0], dtype=np.int64)
    for rank, speaker in enumerate(order):
        empty = np.flatnonzero(load == 0) if sizes.shape[0] - rank <= np.count_nonzero(load == 0) else None
        fits = empty if empty is not None else np.flatnonzero(load + sizes[speaker] <= capacity)
        worker = int(rng.choice(fits)) if fits.size else int(np.argmin(load))
        owner[speaker] = worker
        load[worker] += sizes[speaker]
    return owner


def speaker_texts(ids: np.ndarray, speeches: Speeches, owner: np.ndarray, num_workers: int) -> list[np.ndarray]:
    """Each worker's text: the speeches of its speakers, concatenated in text order.

    Parameters
    ----------
    ids : ndarray of shape (N,)
        The text (characters or their indices) ``speeches`` was found in.
    speeches : Speeches of that text
    owner : int ndarray of shape (len(speeches.names),), values in [0, K)
    num_workers : int, K

    Returns
    -------
    list of K ndarrays, together a permutation of ``ids`` by whole speeches.
    """
    lengths = np.diff(speeches.bounds)
    position_owner = np.repeat(np.asarray(owner)[speeches.speaker], lengths)  # (N,): the worker of each character
    return [ids[position_owner == worker] for worker in range(num_workers)]


def ids_from_windows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The text whose every window ``x`` and next character ``y`` are (``char_windows`` undone).

    Raises
    ------
    ValueError
        ``x`` and ``y`` are not the consecutive windows of one text, in order.
    """
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or x.shape[0] == 0 or y.shape != (x.shape[0],):
        raise ValueError(f"x must be (n, c) windows and y their (n,) next characters, got shapes {x.shape} "
                         f"and {y.shape}")
    ids = np.concatenate([x[:, 0], x[-1, 1:], y[-1:]]).astype(np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], x.shape[1])  # a view: no (n, c) copy
    if not (np.array_equal(windows, x) and np.array_equal(ids[x.shape[1]:], y)):
        raise ValueError("the speaker split (--noniid-split speaker) needs the character windows of one text in "
                         "text order (--data shakespeare): x is not")
    return ids


def speaker_shard_dataset(x: np.ndarray, y: np.ndarray, num_workers: int, rng, *,
                          vocabulary: str | None = None) -> list:
    """Non-IID shards by speaker: worker ``k`` gets the windows of its speakers' speeches.

    The text is rebuilt from the windows (``ids_from_windows``), cut into speeches
    (``split_speeches``), the speakers spread over the workers balanced by characters
    (``assign_speakers``), and each worker's windows cut from its own text
    (``speaker_texts``, then ``char_windows`` at the windows' context ``c``).

    Parameters
    ----------
    x : ndarray of shape (n, c)
        The training windows of one text in order (``diloco.text.load_shakespeare``).
    y : int ndarray of shape (n,)
    num_workers : int, 1 <= K <= number of speakers
    rng : numpy.random.Generator
    vocabulary : str, keyword-only
        The characters of the indices, in index order (None: Tiny Shakespeare's).

    Returns
    -------
    list of K tuples (x_k of shape (n_k, c), x's dtype; y_k of shape (n_k,), int64)
        ``sum(n_k) = n + c - K c``: every character a target once, but each worker's first ``c``.

    Raises
    ------
    ValueError
        Windows not of one text in order, no speaker line, more workers than speakers, or
        a worker whose text is no longer than ``c``.
    """
    ids = ids_from_windows(x, y)
    vocabulary = vocabulary_of(load_shakespeare_text()) if vocabulary is None else vocabulary
    if ids.max() >= len(vocabulary):
        raise ValueError(f"x holds index {ids.max()} but the vocabulary has {len(vocabulary)} characters")
    speeches = split_speeches("".join(np.array(list(vocabulary))[ids]))
    owner = assign_speakers(np.bincount(speeches.speaker, weights=np.diff(speeches.bounds)), num_workers, rng)
    context, shards = x.shape[1], []
    for worker, text in enumerate(speaker_texts(ids, speeches, owner, num_workers)):
        if text.shape[0] <= context:
            raise ValueError(f"the speaker split gave worker {worker} {text.shape[0]} characters, no more than the "
                             f"context c={context}: use fewer workers")
        x_k, y_k = char_windows(text, context)
        shards.append((x_k.astype(x.dtype), y_k))
    return shards
