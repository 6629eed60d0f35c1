"""The sandbox wire format, part 2: values as JSON items (no pickle, no arbitrary classes).

A value is itself when it is ``None``, a bool, an int, a float or a str (exact types),
else a tagged object ``{"t": tag, ...}``; the arrays go in the frame's ``.npy`` blobs
(``wire``):

====  ===========================================================================
tag   value
====  ===========================================================================
L T   list, tuple: ``v`` the items
D     dict: ``k`` the keys, ``v`` the values
C     a record class of the project (``wire_names.RECORDS``): ``n`` its listed name,
      e.g. ``adamw.AdamWState``, ``f`` its fields by name, rebuilt by its constructor
A     ndarray of numbers: ``b`` its blob; ``h`` the handle of its root buffer, ``n`` that
      buffer's size, ``o`` and ``s`` its byte offset and strides in it, ``w`` writeable
G R   numpy Generator / RandomState: ``s`` its ``bit_generator.state`` (a dict)
S     numpy scalar (a 0-d blob ``b``);  Y  a numpy scalar type or builtin type;  Z  a dtype
X B E complex ``[re, im]``, bytes (base64), set / frozenset (``f``)
F O   a callable of the caller (``attrs``: its simple attributes), an object that
      cannot cross (requests only)
@     the message's object ``i`` again;  =  the caller's request object ``a``, unchanged
====  ===========================================================================

Containers, arrays and generators carry their index ``i`` in the message, so an object
that occurs twice arrives as one object. In a reply, ``a`` marks the caller's own request
object: the caller applies the new contents to that very object, so in-place mutation
shows and a Generator's state advances as it would have in-process.
"""

from __future__ import annotations

import base64

import numpy as np

from .wire import ARRAY_KINDS, Registry, WireError, blob_of, byte_bounds, root_of
from .wire_decode import Decoder, Opaque
from .wire_names import BUILTIN_TYPES, Names, qualified_name

__all__ = ["Names", "Encoder", "Decoder", "Opaque", "snapshot"]


class Encoder:
    """Values to JSON items plus ``blobs``; ``objects`` lists the shared objects by index.

    ``lenient`` (the caller's side) sends callables and any other object as a stand-in;
    the sandbox's side refuses them. ``args`` and ``snapshots`` (the sandbox's reply)
    are the request's objects and the bytes of its arrays before the call: an argument
    that comes back is marked ``a``, and an unchanged array is sent without its data.
    """

    def __init__(self, registry: Registry, names: Names, *, lenient: bool = False, args=(), snapshots=None):
        self.registry, self.names, self.lenient = registry, names, lenient
        self.blobs: list[bytes] = []
        self.objects: list = []
        self._memo: dict[int, int] = {}
        self._args = {id(obj): k for k, obj in enumerate(args)}
        self._snapshots = snapshots or {}
        self.callables: set[int] = set()  # the indices of the F items: what a callback may call

    def _new(self, value, tag: str) -> dict:
        item = {"t": tag, "i": len(self.objects)}
        self._memo[id(value)] = len(self.objects)
        self.objects.append(value)
        if id(value) in self._args:
            item["a"] = self._args[id(value)]
        return item

    def _add(self, blob: bytes) -> int:
        self.blobs.append(blob)
        return len(self.blobs) - 1

    def encode(self, value):
        """``value`` as a JSON item (its arrays added to ``blobs``); ``WireError`` when it may not cross."""
        cls = type(value)
        if value is None or cls in (bool, int, float, str):
            return value
        if id(value) in self._memo:
            return {"t": "@", "i": self._memo[id(value)]}
        if isinstance(value, np.ndarray):
            return self._array(value)
        if isinstance(value, np.generic):
            return {"t": "S", "b": self._add(blob_of(np.asarray(value)))}
        if isinstance(value, (dict, list)):
            return self._container(value)
        name = self.names.name_of(cls)
        if name is not None:
            return self._record(value, cls, name)
        return self._unnamed(value, cls)

    def _container(self, value: dict | list) -> dict:
        item = self._new(value, "D" if isinstance(value, dict) else "L")
        if isinstance(value, dict):
            item["k"] = [self.encode(key) for key in value]
        item["v"] = [self.encode(v) for v in (value.values() if isinstance(value, dict) else value)]
        return item

    def _record(self, value, cls: type, name: str) -> dict:
        """A listed record: its listed name and its listed fields, nothing else."""
        item = self._new(value, "C")
        item["n"] = name
        item["f"] = {field: self.encode(getattr(value, field)) for field in self.names.fields(cls, name)}
        return item

    def _unnamed(self, value, cls: type) -> dict:
        """A value that is no listed record: refused (strictly) if it is one of the project's
        classes, else a tuple, a generator, a request object sent back, or ``_other``."""
        unlisted = self.names.unlisted(cls)
        if unlisted is not None and not self.lenient:
            raise WireError(f"{unlisted!r} is not a record class of the project (wire_names.RECORDS)")
        if cls is tuple:
            item = self._new(value, "T")
            item["v"] = [self.encode(v) for v in value]
            return item
        if isinstance(value, (np.random.Generator, np.random.RandomState)):
            return self._generator(value)
        if id(value) in self._args:  # a callable or stand-in the caller sent: it stays the caller's
            return self._new(value, "=")
        return self._other(value, cls)

    def _generator(self, value: np.random.Generator | np.random.RandomState) -> dict:
        """Its state, and a Generator's ``SeedSequence`` (what ``Generator.spawn`` draws from)."""
        generator = isinstance(value, np.random.Generator)
        item = self._new(value, "G" if generator else "R")
        item["s"] = self.encode(value.bit_generator.state if generator else value.get_state(legacy=False))
        seeds = getattr(value.bit_generator, "seed_seq", None) if generator else None
        if isinstance(seeds, np.random.SeedSequence):
            item["q"] = {"entropy": self.encode(seeds.entropy), "spawn_key": list(seeds.spawn_key),
                         "pool_size": seeds.pool_size, "n_children_spawned": seeds.n_children_spawned}
        return item

    def _other(self, value, cls):
        """A plain value of ``_plain``; else, on the lenient side only, a callable or a stand-in."""
        item = self._plain(value, cls)
        if item is not None:
            return item
        if not self.lenient:
            raise WireError(f"a value of type {qualified_name(value)} cannot cross the sandbox boundary")
        if callable(value) and not isinstance(value, type):
            return self._callable(value)
        return self._stand_in(value)

    def _plain(self, value, cls) -> dict | None:
        """A complex, bytes, set, NumPy scalar or builtin type, or a plain dtype; else None."""
        if cls is complex:
            return {"t": "X", "v": [value.real, value.imag]}
        if cls is bytes:
            return {"t": "B", "v": base64.b64encode(value).decode("ascii")}
        if cls in (set, frozenset):
            return {"t": "E", "f": cls is frozenset, "v": [self.encode(v) for v in value]}
        if isinstance(value, type) and issubclass(value, np.generic) and getattr(np, value.__name__, None) is value:
            return {"t": "Y", "v": f"numpy.{value.__name__}"}
        if isinstance(value, type) and BUILTIN_TYPES.get(value.__name__) is value:
            return {"t": "Y", "v": f"builtins.{value.__name__}"}
        if isinstance(value, np.dtype) and value.kind in ARRAY_KINDS and value.fields is None:
            return {"t": "Z", "v": value.str}
        return None

    def _callable(self, value) -> dict:
        """The caller's callable, by index (what a callback may call), with its simple attributes."""
        item = self._new(value, "F")
        self.callables.add(item["i"])
        try:  # the simple attributes travel with it (an encoder's input_width, say)
            item["attrs"] = {k: v for k, v in vars(value).items() if type(v) in (int, float, str, bool)}
        except TypeError:  # no __dict__: a function's attributes are not its contract
            pass
        return item

    def _stand_in(self, value) -> dict:
        """An object that cannot cross: its type's name and (at most 200 characters of) its repr."""
        item = self._new(value, "O")
        try:
            text = repr(value)[:200]
        except Exception:  # noqa: BLE001 - a repr is only decoration
            text = "?"
        item.update(type=qualified_name(value), repr=text)
        return item

    def _array(self, array: np.ndarray):
        item = self._new(array, "A")
        before = self._snapshots.get(item.get("a"))
        if before is not None and before == (array.shape, array.dtype.str, array.tobytes()):
            return {"t": "=", "i": item["i"], "a": item["a"]}
        item["b"] = self._add(blob_of(array))
        item["w"] = bool(array.flags.writeable)
        if array.size:
            root = root_of(array)
            low, high = byte_bounds(root)
            item.update(h=self.registry.handle(root), n=high - low,
                        o=array.__array_interface__["data"][0] - low, s=list(array.strides))
        return item


def snapshot(array: np.ndarray) -> tuple:
    """What ``Encoder`` compares to tell an unchanged argument array."""
    return (array.shape, array.dtype.str, array.tobytes())
