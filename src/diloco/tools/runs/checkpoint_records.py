"""The JSON records a checkpoint manifest carries besides its arrays.

``generator_state`` / ``restore_generator`` turn a ``numpy.random.Generator`` into a
JSON-ready record and back: the bit generator's state (the stream's position) and the
seed sequence's spawn count (``n_children_spawned``), which ``Generator.spawn`` moves
without touching the stream, so the workers of round ``r + 1`` draw the batches they
would have drawn without an interruption. ``data_fingerprint`` is the SHA-256 a
checkpoint records of the data it was made on. Re-exported by ``diloco.tools.runs.checkpoint``.
"""

from __future__ import annotations

import hashlib

import numpy as np

from diloco.core.shard_reuse import raw_bytes

__all__ = ["generator_state", "restore_generator", "data_fingerprint"]


def _json_state(value):
    if isinstance(value, dict):
        return {key: _json_state(item) for key, item in value.items()}
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.integer):
        return int(value)
    return value


def _array_state(value):
    if isinstance(value, dict):
        if set(value) == {"ndarray", "dtype"}:
            return np.array(value["ndarray"], dtype=np.dtype(value["dtype"]))
        return {key: _array_state(item) for key, item in value.items()}
    return value


def generator_state(rng: np.random.Generator) -> dict:
    """A JSON-ready record of ``rng``: its bit generator's state and its seed sequence's spawn count."""
    seed_seq = rng.bit_generator.seed_seq
    if not isinstance(seed_seq, np.random.SeedSequence):
        raise TypeError(f"rng must be seeded by a numpy.random.SeedSequence to be checkpointed, got "
                        f"{type(seed_seq).__name__}")
    entropy = seed_seq.entropy
    return {
        "bit_generator": type(rng.bit_generator).__name__,
        "state": _json_state(rng.bit_generator.state),
        "seed_sequence": {
            "entropy": [int(e) for e in entropy] if isinstance(entropy, (list, tuple, np.ndarray)) else entropy,
            "spawn_key": [int(k) for k in seed_seq.spawn_key],
            "pool_size": int(seed_seq.pool_size),
            "n_children_spawned": int(seed_seq.n_children_spawned),
        },
    }


def restore_generator(record: dict) -> np.random.Generator:
    """The generator ``generator_state`` described: same stream position, same spawn count."""
    name = record["bit_generator"]
    bit_generator_class = getattr(np.random, name, None)
    if not (isinstance(bit_generator_class, type) and issubclass(bit_generator_class, np.random.BitGenerator)):
        raise ValueError(f"unknown bit generator {name!r}")
    seq = record["seed_sequence"]
    seed_seq = np.random.SeedSequence(seq["entropy"], spawn_key=tuple(seq["spawn_key"]),
                                      pool_size=seq["pool_size"], n_children_spawned=seq["n_children_spawned"])
    bit_generator = bit_generator_class(seed_seq)
    bit_generator.state = _array_state(record["state"])
    return np.random.Generator(bit_generator)


def data_fingerprint(*arrays) -> str:
    """SHA-256 over the dtypes, shapes and bytes of ``arrays`` (None counts as absent)."""
    digest = hashlib.sha256()
    for array in arrays:
        if array is None:
            digest.update(b"none;")
            continue
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape};".encode())
        digest.update(raw_bytes(array))  # its bytes, not a copy
    return digest.hexdigest()
