"""How non-IID a split is: the KL divergence of each shard's next-token distribution from the whole's.

For shard ``k`` with counts ``n_k(c, v)`` of label (next character) ``v`` after context
``c``, and the pooled counts ``n(c, v) = sum_k n_k(c, v)``::

    p_k(c, v) = n_k(c, v) / n_k          p_k(v | c) = n_k(c, v) / n_k(c)       p(v | c) = n(c, v) / n(c)

    D_k = sum_{c, v} p_k(c, v) log( p_k(v | c) / p(v | c) )        (nats)

the KL divergence of the shard's conditional next-token distribution from the pooled
one, averaged over the shard's own contexts. ``p(v | c) > 0`` wherever ``p_k(v | c) > 0``
(the pool holds the shard), so ``D_k`` is finite, and ``D_k = 0`` exactly when the shard
predicts like the whole. Without contexts (one context for every row) ``D_k`` is the
KL divergence of the shard's label histogram from the pooled one: label skew.

``split_divergence`` is the mean of ``D_k`` over the K shards. For the char-LM the context
is the window's last character (``x[:, -1]``), so ``D`` says how differently the shards
continue the same character; for other data it is the label histogram. A transformer
trains on every position of a window, not only the last, so its shards are measured over
every (character, next character) pair of their windows (``every_position``,
``position_counts``): a split that skews the character after each window (label skew)
moves one of those ``c`` pairs and is nearly IID for it. A finite sample
is never exactly IID: IID shards of ``n_k`` rows measure about
``(1 - 1/K) (cells - contexts) / (2 n_k)`` for the ``cells`` (context, label) pairs that
occur (Tiny Shakespeare's training text: 1,380 pairs after 65 characters, so 0.0046 nats
at K = 8, 0.0020 at K = 4; measured 0.0046 and 0.0021), which is why every report prints
IID shards' value at the same K beside the split's (``split_report``).
"""

from __future__ import annotations

import numpy as np

from diloco.core.model_seam import model_kind

__all__ = ["shard_divergence", "joint_divergence", "position_counts", "split_divergence", "run_split_divergence",
           "split_report", "split_sentence", "GIVEN"]


def shard_divergence(labels, contexts=None) -> np.ndarray:
    """``D_k`` of each shard (module docstring), in nats.

    Parameters
    ----------
    labels : sequence of K integer ndarrays of shape (n_k,), values >= 0, each n_k >= 1
    contexts : None or sequence of K integer ndarrays of shape (n_k,), values >= 0
        The context of each row (None: one context for all).

    Returns
    -------
    float64 ndarray of shape (K,), each >= 0 (up to rounding).

    Raises
    ------
    ValueError
        No shards, an empty shard, negative or non-integer values, mismatched shapes.
    """
    labels = [_counts_index(v, "labels") for v in labels]
    if not labels or any(v.shape[0] == 0 for v in labels):
        raise ValueError("labels must hold at least one shard, each with at least one row")
    contexts = [np.zeros_like(v) for v in labels] if contexts is None else [_counts_index(c, "contexts")
                                                                           for c in contexts]
    if [c.shape for c in contexts] != [v.shape for v in labels]:
        raise ValueError("contexts must have one entry per row of labels, shard by shard")
    width = 1 + max(int(v.max()) for v in labels)
    cells = 1 + max(int(c.max()) for c in contexts)
    joint = np.stack([np.bincount(c * width + v, minlength=cells * width).reshape(cells, width)
                      for c, v in zip(contexts, labels, strict=True)])  # (K, C, V)
    return joint_divergence(joint)


def joint_divergence(joint) -> np.ndarray:
    """``D_k`` of each shard (module docstring) from its counts ``n_k(c, v)``, in nats.

    Parameters
    ----------
    joint : ndarray of shape (K, C, V), counts >= 0, each shard's sum > 0

    Returns
    -------
    float64 ndarray of shape (K,)
    """
    joint = np.asarray(joint, dtype=np.float64)
    if joint.ndim != 3 or (joint < 0).any() or not (joint.sum(axis=(1, 2)) > 0).all():
        raise ValueError(f"joint must be (K, C, V) non-negative counts, each shard's > 0, got shape {joint.shape}")
    pooled = joint.sum(axis=0)
    pooled_given = pooled / np.maximum(pooled.sum(axis=1, keepdims=True), 1.0)  # p(v | c)
    shard_given = joint / np.maximum(joint.sum(axis=2, keepdims=True), 1.0)  # p_k(v | c)
    weight = joint / joint.sum(axis=(1, 2), keepdims=True)  # p_k(c, v)
    seen = joint > 0
    ratio = np.where(seen, shard_given, 1.0) / np.where(seen, pooled_given, 1.0)
    return np.sum(weight * np.log(ratio), axis=(1, 2))


# Windows counted at a time by ``position_counts``: a (rows, c + 1) int64 buffer that stays in
# the cache (measured: 250,000 windows of 64 characters counted 6x faster than a column at a time).
COUNT_ROWS = 1 << 12


def position_counts(x, y, width: int) -> np.ndarray:
    """``n(c, v)`` over every position a sequence model trains on: character ``x[:, t]``
    followed by ``x[:, t + 1]`` (by ``y`` at the last position), for each ``t < c``.

    ``COUNT_ROWS`` windows at a time: each window and its label as one row of ``c + 1``
    character ids, the ``c`` cells ``row[t] V + row[t + 1]`` of every row counted by one
    ``bincount``.

    Parameters
    ----------
    x : ndarray of shape (n, c), integer-valued character ids in [0, width)
    y : integer ndarray of shape (n,), values in [0, width)
    width : int, V

    Returns
    -------
    int64 ndarray of shape (V, V): ``n c`` pairs in all.
    """
    x, y = np.asarray(x), _counts_index(y, "labels")
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(f"x must be (n, c) windows with one label each, got shapes {x.shape} and {y.shape}")
    (n, c), counts = x.shape, np.zeros(width * width, dtype=np.int64)
    chars = np.empty((min(n, COUNT_ROWS), c + 1), dtype=np.int64)  # a block's windows, then their labels
    for start in range(0, n if c else 0, COUNT_ROWS):
        block = x[start:start + COUNT_ROWS]
        rows = chars[:block.shape[0]]
        _windows_into(block, rows[:, :c])
        rows[:, c] = y[start:start + COUNT_ROWS]
        cells = rows[:, :c] * width
        cells += rows[:, 1:]
        counts += np.bincount(cells.reshape(-1), minlength=width * width)
    return counts.reshape(width, width)


def _windows_into(block, out) -> None:
    """``out[...] = block.astype(int64)``, refused as ``_counts_index`` refuses a column: a negative or
    non-integer id (named "contexts" in the first column, where the old column-by-column count met it
    first, else "labels"). A float id is compared in its own dtype, where its truncation is exact."""
    np.copyto(out, block, casting="unsafe")
    if not block.size:
        return
    same = np.array_equal(out.astype(block.dtype), block) if block.dtype.kind == "f" else np.array_equal(out, block)
    if out.min() < 0 or not same:
        _counts_index(block[:, 0], "contexts")  # raises if the first column is a bad one
        raise ValueError("labels must hold non-negative integers")


def _counts_index(values, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D per shard, got shape {array.shape}")
    index = array.astype(np.int64)
    if array.size and (index.min() < 0 or not np.array_equal(index, array)):
        raise ValueError(f"{name} must hold non-negative integers")
    return index


def split_divergence(shards, *, text: bool, every_position: bool = False) -> float:
    """The mean over shards of ``D_k``: given the previous character for a character-level
    task (``text``), of the label histogram otherwise.

    For a character-level task the pairs are each window's last character and the next
    one (``x[:, -1]``, ``y``: what the MLP predicts), or, with ``every_position``, every
    (character, next character) pair of every window (``position_counts``: what a
    sequence model such as the transformer trains on, ``c`` predictions a window).

    Parameters
    ----------
    shards : list of K tuples (x_k of shape (n_k, c), y_k of shape (n_k,))
    text : bool, keyword-only
    every_position : bool, keyword-only
        Only with ``text``.
    """
    if every_position and not text:
        raise ValueError("every_position needs a character-level task (text=True)")
    if every_position:
        width = 1 + max(max(int(np.max(x_k)), int(np.max(y_k))) for x_k, y_k in shards)
        return float(np.mean(joint_divergence(np.stack([position_counts(x_k, y_k, width) for x_k, y_k in shards]))))
    contexts = [x_k[:, -1] for x_k, _ in shards] if text else None
    return float(np.mean(shard_divergence([y_k for _, y_k in shards], contexts)))


def run_split_divergence(x, y, config, *, text: bool) -> float:
    """``split_divergence`` of the shards a run of ``config`` starts from: those of
    ``diloco.core.run_records.shard_dataset`` with ``default_rng(config.seed)``, whose first
    draws they are in ``prepare_training`` (``seeded_shards``: inside
    ``diloco.core.shard_reuse.reusing()`` the run's own shards, not a second split, and their
    divergence measured once for all the runs that share them, ``of_shards``). A sequence model
    (a transformer, ``model_kind``) trains on every position of a window, so its shards are
    measured there (``every_position``)."""
    from diloco.core import shard_reuse
    from diloco.core.run_records import seeded_shards

    shards, _ = seeded_shards(x, y, config)
    every_position = text and model_kind(config).sequence_model
    return shard_reuse.of_shards(shards, ("split_divergence", text, every_position),
                                 lambda s: split_divergence(s, text=text, every_position=every_position))


# What a split's divergence is conditioned on, by (character-level task, measured at every position).
GIVEN = {(False, False): "nothing (label histogram)", (True, False): "previous character",
         (True, True): "previous character, every position"}
_MEASURED = {"previous character": "next character given the previous one",
             "previous character, every position": "next character given the previous one at every position"}


def split_report(x, y, config, *, text: bool) -> dict:
    """The divergence of ``config``'s split of ``(x, y)`` and of IID shards at the same K and seed.

    The shards are those every trainer starts from (``run_split_divergence``).

    Returns
    -------
    dict
        ``split`` ("iid", "label", "topic" or "speaker"), ``alpha`` (None where unused),
        ``num_workers``, ``divergence`` and ``iid_divergence`` (nats), ``given``
        ("previous character"; "previous character, every position" for a transformer,
        ``run_split_divergence``; or "nothing (label histogram)").
    """
    divergence = run_split_divergence(x, y, config, text=text)
    iid = divergence if config.iid else run_split_divergence(x, y, config.replace(iid=True, noniid_split="label"),
                                                              text=text)
    split = "iid" if config.iid else config.noniid_split
    return {"split": split, "alpha": None if split in ("iid", "speaker") else config.alpha,
            "num_workers": config.num_workers, "divergence": divergence, "iid_divergence": iid,
            "given": GIVEN[(text, text and model_kind(config).sequence_model)]}



def split_sentence(report: dict) -> str:
    """One line for a ``split_report``: the split, its divergence and IID shards' beside it."""
    split = report["split"] + ("" if report["alpha"] is None else f" a={report['alpha']:g}")
    what = _MEASURED.get(report["given"], "label histogram")
    return (f"shards: {split}, K={report['num_workers']}; mean KL of a shard's {what} from the whole's "
            f"{report['divergence']:.4f} nats (IID shards: {report['iid_divergence']:.4f})")
