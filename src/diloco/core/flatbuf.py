"""Flat buffers for the MPI executor's collectives: one contiguous buffer per rank, no pickle.

Pure NumPy (no MPI here), so the layouts are tested on their own:

* ``flatten(params, keys, start, stop)``: values ``[start, stop)`` of the arrays of
  ``keys`` laid end to end in that fixed order (C order within each array);
  ``unflatten(flat, like)`` gives the dict back as views of ``flat``;
* ``chunk_bounds(size, parts)``: the near-equal contiguous chunks a reduce-scatter
  hands its owners (the first ``size % parts`` one value longer);
* ``pack(items)`` / ``unpack(head, data)``: a dict keyed by worker of arrays or of dicts
  of arrays as a small JSON head (keys, shapes, dtypes) and one byte buffer, for the
  all-gathers of anything that is not an outer gradient (step losses, the cosine's
  parameters, the baseline's gradients). JSON, unlike pickle, runs no code on receipt.
"""

from __future__ import annotations

import json

import numpy as np

__all__ = ["flatten", "unflatten", "chunk_bounds", "pack", "unpack"]


def flatten(params: dict, keys, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Values ``[start, stop)`` of ``params[key].ravel()`` for ``key`` in ``keys``, end to end (a new array)."""
    parts, offset = [], 0
    for key in keys:
        flat = params[key].ravel()
        low, high = max(start - offset, 0), flat.size if stop is None else min(stop - offset, flat.size)
        if low < high:
            parts.append(flat[low:high])
        offset += flat.size
    dtype = next(iter(params.values())).dtype
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def unflatten(flat: np.ndarray, like: dict) -> dict:
    """``flat`` cut into arrays shaped like ``like``'s, in its key order (views of ``flat``)."""
    bounds = np.cumsum([0] + [value.size for value in like.values()])
    if bounds[-1] != flat.size:
        raise ValueError(f"flat must hold {bounds[-1]} values for these arrays, got {flat.size}")
    return {key: flat[bounds[i]:bounds[i + 1]].reshape(value.shape) for i, (key, value) in enumerate(like.items())}


def chunk_bounds(size: int, parts: int) -> np.ndarray:
    """Offsets ``[0, ..., size]`` of ``parts`` contiguous chunks, the first ``size % parts`` one longer."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    lengths = np.full(parts, size // parts, dtype=np.int64)
    lengths[:size % parts] += 1
    return np.concatenate([[0], np.cumsum(lengths)])


def pack(items: dict) -> tuple[bytes, np.ndarray]:
    """``items`` (worker -> ndarray, or -> dict of str -> ndarray) as ``(JSON head, uint8 data)``."""
    layout, parts = [], []
    for worker, value in items.items():
        arrays = value if isinstance(value, dict) else {"": value}
        for array in arrays.values():
            if not isinstance(array, np.ndarray):
                raise TypeError(f"the MPI gather carries arrays only, got {type(array).__name__} for worker {worker}")
        layout.append([int(worker), isinstance(value, dict),
                       [[key, list(array.shape), array.dtype.str] for key, array in arrays.items()]])
        parts += [np.ascontiguousarray(array).reshape(-1).view(np.uint8) for array in arrays.values()]
    data = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint8)
    return json.dumps(layout).encode(), data


def unpack(head: bytes, data: np.ndarray) -> dict:
    """The dict ``pack`` was given (arrays as copies out of ``data``)."""
    out, offset = {}, 0
    for worker, is_dict, arrays in json.loads(head):
        value = {}
        for key, shape, dtype in arrays:
            dtype = np.dtype(dtype)
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            value[key] = data[offset:offset + nbytes].copy().view(dtype).reshape(shape)
            offset += nbytes
        out[worker] = value if is_dict else value[""]
    return out
