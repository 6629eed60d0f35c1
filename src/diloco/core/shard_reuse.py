"""Reusing a seed's shards across the runs of one process: a study's arms, seeds and tuning points.

Every run of ``config`` starts from the shards that ``default_rng(config.seed)`` cuts from
the training data (``diloco.core.run_records.prepare_training``), and a run's record
measures them again (``diloco.corpus.shard_divergence.run_split_divergence``); a study's
arms share a seed and its data, so the same shards were cut many times over. Inside
``reusing()`` (opened for one command of the command line, and by ``ablations.run_study`` for
one study, through ``ablations.shared_shards``) ``seeded_shards`` keeps the last few shard
sets, keyed on everything they are a function of:

* the splitting function itself and its options (``alpha``; milestone 16's or 17's rule,
  topic or speaker segments), as ``run_records.shard_dataset`` chooses them;
* the number of workers and the seed (an int: the generator is ``default_rng(seed)``,
  created here, never a caller's ``Generator`` whose state the key could not name);
* the data: the dtype, shape and SHA-256 of the bytes of ``x`` and of ``y``, so a changed
  or rebuilt array is a different key, whatever object holds it.

Two smaller memos sit beside it, for what a run computes from those arrays: ``of_shards``
keeps a value of a kept shard set (its split divergence, measured once for every run that
starts from it), and ``derived`` a value of one read-only array (a shard's one-hot columns in
the fast engine; the data's SHA-256 above, so the data a command loaded is hashed once).

A hit hands back the same arrays, made read-only (``setflags(write=False)``) when they were
built, so no caller can change a copy another run reads; and the generator after the split,
its state restored to the one the split left (``bit_generator.state``), so the draws that
follow (the initial model, the workers' batches) are those of a run that split the data
itself. Milestones 16 and 17 are pure functions of their arguments and the generator's state,
which is what makes this exact. The memo holds at most ``MAX_ENTRIES`` shard sets and
``MAX_BYTES`` bytes (data larger than that is split every time, never hashed), is emptied
when the outermost ``reusing()`` ends, and is per process: a forked or spawned worker
process starts from its own copy or an empty one. Outside ``reusing()`` nothing is kept and
the shards are writable, as the splitting functions return them.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict

import numpy as np

__all__ = ["reusing", "is_reusing", "seeded_shards", "of_shards", "derived", "unwritable", "kept", "raw_bytes",
           "MAX_ENTRIES", "MAX_BYTES", "MAX_DERIVED"]

# A study keeps one data set: its seeds' and tuning seeds' shards (x2 for a split's IID
# counterpart) fit; Tiny Shakespeare's training windows at context 6 in float64 are 56 MB a set.
MAX_ENTRIES = 4
MAX_BYTES = 1 << 30

_LOCK = threading.Lock()
# key -> (shards: tuple of (x_k, y_k), rng state after the split, {name: of_shards' value})
_MEMO: OrderedDict = OrderedDict()
_DERIVED: OrderedDict = OrderedDict()  # (id(array), name) -> (array, what derived() computed from it)
MAX_DERIVED = 32
_DEPTH = [0]  # open reusing() scopes


@contextlib.contextmanager
def reusing():
    """Within this block (nestable), ``seeded_shards`` reuses the shard sets it built; the memo is
    emptied when the outermost block ends."""
    with _LOCK:
        _DEPTH[0] += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH[0] -= 1
            if _DEPTH[0] == 0:
                _MEMO.clear()
                _DERIVED.clear()


def is_reusing() -> bool:
    """Whether a ``reusing()`` block is open."""
    return _DEPTH[0] > 0


def kept() -> int:
    """How many shard sets the memo holds now."""
    return len(_MEMO)


def seeded_shards(x, y, num_workers: int, seed: int, split, options: dict) -> tuple[list, np.random.Generator]:
    """``split(x, y, num_workers, rng, **options)`` with ``rng = default_rng(seed)``, and ``rng`` after it.

    Inside ``reusing()``, a call with the same key as an earlier one (module doc) returns
    that call's read-only arrays and a new generator in the state the split left.

    Returns
    -------
    (shards, rng)
        A new list of K tuples ``(x_k, y_k)``, and the ``numpy.random.Generator`` positioned
        after the split's draws.
    """
    rng = np.random.default_rng(seed)
    if not is_reusing() or _nbytes(x) + _nbytes(y) > MAX_BYTES:  # shards as large as the data: never kept
        return split(x, y, num_workers, rng, **options), rng
    key = (split, tuple(sorted(options.items())), int(num_workers), int(seed), _fingerprint(x), _fingerprint(y))
    with _LOCK:
        entry = _MEMO.get(key)
        if entry is not None:
            _MEMO.move_to_end(key)
    if entry is None:
        shards = tuple(tuple(_read_only(np.asarray(part)) for part in shard)
                       for shard in split(x, y, num_workers, rng, **options))
        entry = (shards, rng.bit_generator.state, {})
        _keep(key, entry)
    else:
        rng.bit_generator.state = entry[1]
    return list(entry[0]), rng


def of_shards(shards, name, compute):
    """``compute(shards)``, kept with the shard set when ``shards`` are the very arrays a kept set
    holds (read-only, so the same content): the next call with them and ``name`` returns it again.
    ``name`` says what ``compute`` computes besides the shards. Without such a set: ``compute(shards)``."""
    with _LOCK:
        entry = next((e for e in _MEMO.values() if _same_arrays(e[0], shards)), None)
        if entry is not None and name in entry[2]:
            return entry[2][name]
    value = compute(shards)
    if entry is not None:
        with _LOCK:
            entry[2][name] = value
    return value


def _same_arrays(kept_shards, shards) -> bool:
    return len(kept_shards) == len(shards) and all(
        len(a) == len(b) and all(p is q for p, q in zip(a, b, strict=True)) for a, b in zip(kept_shards, shards,
                                                                                          strict=True))


def _keep(key, entry) -> None:
    """Store ``entry``, the least recently used ones leaving to stay within both limits."""
    size = _entry_bytes(entry)
    if size > MAX_BYTES:
        return
    with _LOCK:
        if not is_reusing():  # the block ended while the split ran (another thread's)
            return
        _MEMO[key] = entry
        while len(_MEMO) > MAX_ENTRIES or sum(_entry_bytes(e) for e in _MEMO.values()) > MAX_BYTES:
            _, (gone, _, _) = _MEMO.popitem(last=False)
            _forget(gone)


def _forget(shards) -> None:
    """Drop the ``derived`` values of a shard set that left the memo, and with them the shards."""
    parts = {id(part) for shard in shards for part in shard}
    for key in [key for key, (array, _) in _DERIVED.items() if id(array) in parts]:
        del _DERIVED[key]


def _entry_bytes(entry) -> int:
    return sum(part.nbytes for shard in entry[0] for part in shard)


def _read_only(value):
    if isinstance(value, np.ndarray):
        value.setflags(write=False)
    return value


def _nbytes(value) -> int:
    return value.nbytes if isinstance(value, np.ndarray) else 0


def derived(array, name, compute):
    """``compute(array)``; inside ``reusing()``, for an array no one can write through
    (``_unwritable``: a shard this module returned, data the command line loaded), made read-only
    and kept, so the next call with the same array object and ``name`` returns it again.

    ``name`` says what ``compute`` computes: everything it depends on besides the array (an
    unhashable ``name`` is computed every time). The array is held while its entry is kept, so
    its ``id`` cannot pass to another array; the entries of a shard leave with its set (the
    arrays held are then the kept shards and the caller's own data). At most ``MAX_DERIVED``
    entries and ``MAX_BYTES`` bytes of values, emptied with the shard sets.
    """
    if not (is_reusing() and _unwritable(array) and _hashable(name)):
        return compute(array)
    key = (id(array), name)
    with _LOCK:
        entry = _DERIVED.get(key)
        if entry is not None:
            _DERIVED.move_to_end(key)
            return entry[1]
    value = _read_only(compute(array))
    with _LOCK:
        if is_reusing():
            _DERIVED[key] = (array, value)
            while len(_DERIVED) > MAX_DERIVED or sum(_nbytes(v) for _, v in _DERIVED.values()) > MAX_BYTES:
                _DERIVED.popitem(last=False)
    return value


def unwritable(array) -> np.ndarray:
    """``array`` itself when no one can write through it (``_unwritable``), else a read-only copy (same
    dtype, values and memory order): what a study hands its runs inside ``reusing()``, so that
    ``seeded_shards`` hashes the data once, not at every run."""
    array = np.asarray(array)
    if _unwritable(array):
        return array
    copy = np.array(array, order="K")
    copy.setflags(write=False)
    return copy


def _hashable(name) -> bool:
    try:
        hash(name)
    except TypeError:
        return False
    return True


def _unwritable(array) -> bool:
    """``array`` and every array it is a view of are read-only, down to the owner of the memory (or an
    immutable ``bytes``). That proves the content fixed when they were made read-only before any other
    view of them was taken, as ``seeded_shards`` does with the shards and ``load_dataset`` (the command
    line's) with the data; otherwise only a deliberate ``setflags(write=True)`` could change it."""
    while isinstance(array, np.ndarray):
        if array.flags.writeable:
            return False
        array = array.base
    return array is None or isinstance(array, bytes)


def _fingerprint(array) -> tuple:
    """What an array's content is, as a key: dtype, shape and the SHA-256 of its bytes (C order),
    computed once per unwritable array (``derived``)."""
    array = np.asarray(array)
    return array.dtype.str, array.shape, derived(array, "sha256", _digest)


def _digest(array) -> str:
    return hashlib.sha256(raw_bytes(array)).hexdigest() if np.size(array) else ""


def raw_bytes(array) -> memoryview | bytes:
    """The bytes of ``array`` in C order, a view without a copy when it is already contiguous
    (what ``_digest`` and ``checkpoint_records.data_fingerprint`` hash)."""
    array = np.ascontiguousarray(array)
    return memoryview(array.reshape(-1)).cast("B") if array.size else b""
