"""Parameter dicts as one flat, contiguous vector per worker.

The fast engine keeps every per-worker quantity (parameters, gradients, AdamW moments)
as a 2-D array of shape ``(S, P)``: S workers side by side, each row the worker's P
parameters laid out key after key (``W1, b1, ..., WL, bL``, each row-major). One array
means one pass of NumPy over all of them, updated in place with ``out=``. The layers are
*views* into that array, shaped ``(S, fan_in, fan_out)`` and ``(S, fan_out)``, so the
batched matmul writes gradients straight into the flat buffer.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco.model import Params

__all__ = ["FlatLayout", "flat_layout", "layer_views", "pack", "unpack"]


class FlatLayout(NamedTuple):
    """Where each parameter lives in a flat vector.

    Attributes
    ----------
    keys : tuple of str
        ``("W1", "b1", ..., "WL", "bL")``, the order of the parameter dict.
    shapes : tuple of tuple of int
        Each parameter's shape.
    offsets : tuple of int
        Start of each parameter in the flat vector.
    size : int
        P, the total number of values.
    """

    keys: tuple
    shapes: tuple
    offsets: tuple
    size: int


def flat_layout(params: Params) -> FlatLayout:
    """The layout of ``params`` (a dict of arrays) in a flat vector, in dict order."""
    keys, shapes, offsets, size = [], [], [], 0
    for key, value in params.items():
        keys.append(key)
        shapes.append(tuple(value.shape))
        offsets.append(size)
        size += int(value.size)
    return FlatLayout(tuple(keys), tuple(shapes), tuple(offsets), size)


def layer_views(flat: np.ndarray, layout: FlatLayout) -> Params:
    """Views of ``flat`` (shape ``(..., P)``) as a parameter dict of shapes ``(..., *shape)``.

    Writing into a view writes into ``flat``; no memory is copied.
    """
    lead = flat.shape[:-1]
    return {key: flat[..., start:start + int(np.prod(shape, dtype=np.int64))].reshape(*lead, *shape)
            for key, shape, start in zip(layout.keys, layout.shapes, layout.offsets, strict=True)}


def pack(params: Params, out: np.ndarray, layout: FlatLayout) -> np.ndarray:
    """Copy a parameter dict into ``out`` (shape ``(P,)``, or ``(S, P)`` to fill every row)."""
    for key, view in layer_views(out, layout).items():
        view[...] = params[key]
    return out


def unpack(flat: np.ndarray, layout: FlatLayout) -> Params:
    """A parameter dict of fresh arrays (sharing no memory with ``flat``, shape ``(P,)``)."""
    return {key: view.copy() for key, view in layer_views(flat, layout).items()}
