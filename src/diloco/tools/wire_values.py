"""The sandbox wire format, part 2: values as JSON items (no pickle, no arbitrary classes).

A value is itself when it is ``None``, a bool, an int, a float or a str (exact types),
else a tagged object ``{"t": tag, ...}``; the arrays go in the frame's ``.npy`` blobs
(``wire``):

====  ===========================================================================
tag   value
====  ===========================================================================
L T   list, tuple: ``v`` the items
D     dict: ``k`` the keys, ``v`` the values
N C P a record class of the project (``Names``): a NamedTuple (``v`` its fields in
      order), a dataclass (``f`` its init fields by name, rebuilt by its constructor) or a
      plain object (``f`` its ``__dict__``); ``n`` names it, e.g. ``adamw.AdamWState``
A     ndarray: ``b`` its blob; ``h`` the handle of its root buffer, ``n`` that buffer's
      size, ``o`` and ``s`` its byte offset and strides in it, ``w`` writeable
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
import dataclasses

import numpy as np

from .wire import _ARRAY_KINDS, MAX_ROOT, Registry, WireError, _blob, _flat_bytes, _load, _root, byte_bounds

_BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
_BUILTIN_TYPES = {"float": float, "int": int, "bool": bool, "complex": complex, "str": str, "bytes": bytes}


def _kind(cls) -> str | None:
    """``"N"`` NamedTuple, ``"C"`` dataclass, ``"P"`` plain object with a ``__dict__``, else None."""
    if not isinstance(cls, type):
        return None
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return "N"
    if dataclasses.is_dataclass(cls):
        return "C"
    if cls.__bases__ == (object,) and "__slots__" not in vars(cls) and "__dict__" in vars(cls):
        return "P"
    return None


class Names:
    """The project's record classes on one side, by name (``"loop.RoundResult"``).

    A class crosses as data when it is defined at the top level of a ``diloco`` module and
    is a NamedTuple, a dataclass or a plain object (``__dict__`` only, no base class but
    ``object``). ``module(name)`` gives ``diloco.<name>`` or None: the grader only looks at
    modules it has already imported, the sandbox imports the graded package's.
    """

    def __init__(self, module):
        self._module = module

    def name_of(self, cls) -> str | None:
        module = getattr(cls, "__module__", "") or ""
        if not module.startswith("diloco.") or _kind(cls) is None:
            return None
        name = f"{module[len('diloco.'):]}.{cls.__qualname__}"
        try:
            return name if self.class_of(name) is cls else None
        except WireError:
            return None

    def class_of(self, name) -> type:
        module_name, _, attribute = str(name).rpartition(".")
        try:
            module = self._module(module_name) if module_name else None
        except Exception:  # noqa: BLE001 - a module that does not import has no classes to offer
            module = None
        cls = getattr(module, attribute, None) if attribute.isidentifier() else None
        if _kind(cls) is None or cls.__module__ != f"diloco.{module_name}":
            raise WireError(f"{name!r} is not a record class of the project")
        return cls


def _type_name(value) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"


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
        cls = type(value)
        if value is None or cls in (bool, int, float, str):
            return value
        if id(value) in self._memo:
            return {"t": "@", "i": self._memo[id(value)]}
        if isinstance(value, np.ndarray):
            return self._array(value)
        if isinstance(value, np.generic):
            return {"t": "S", "b": self._add(_blob(np.asarray(value)))}
        if isinstance(value, (dict, list)):
            item = self._new(value, "D" if isinstance(value, dict) else "L")
            if isinstance(value, dict):
                item["k"] = [self.encode(key) for key in value]
            item["v"] = [self.encode(v) for v in (value.values() if isinstance(value, dict) else value)]
            return item
        name = self.names.name_of(cls)
        if name is not None:
            item = self._new(value, _kind(cls))
            item["n"] = name
            if item["t"] == "C":
                item["f"] = {f.name: self.encode(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
            elif item["t"] == "P":
                item["f"] = {str(key): self.encode(v) for key, v in vars(value).items()}
            else:
                item["v"] = [self.encode(v) for v in value]
            return item
        if cls is tuple:
            item = self._new(value, "T")
            item["v"] = [self.encode(v) for v in value]
            return item
        if isinstance(value, (np.random.Generator, np.random.RandomState)):
            generator = isinstance(value, np.random.Generator)
            item = self._new(value, "G" if generator else "R")
            item["s"] = self.encode(value.bit_generator.state if generator else value.get_state(legacy=False))
            seeds = getattr(value.bit_generator, "seed_seq", None) if generator else None
            if isinstance(seeds, np.random.SeedSequence):  # what Generator.spawn draws from
                item["q"] = {"entropy": self.encode(seeds.entropy), "spawn_key": list(seeds.spawn_key),
                             "pool_size": seeds.pool_size, "n_children_spawned": seeds.n_children_spawned}
            return item
        if id(value) in self._args:  # a callable or stand-in the caller sent: it stays the caller's
            item = self._new(value, "=")
            return item
        return self._other(value, cls)

    def _other(self, value, cls):
        if cls is complex:
            return {"t": "X", "v": [value.real, value.imag]}
        if cls is bytes:
            return {"t": "B", "v": base64.b64encode(value).decode("ascii")}
        if cls in (set, frozenset):
            return {"t": "E", "f": cls is frozenset, "v": [self.encode(v) for v in value]}
        if isinstance(value, type) and issubclass(value, np.generic) and getattr(np, value.__name__, None) is value:
            return {"t": "Y", "v": f"numpy.{value.__name__}"}
        if isinstance(value, type) and _BUILTIN_TYPES.get(value.__name__) is value:
            return {"t": "Y", "v": f"builtins.{value.__name__}"}
        if isinstance(value, np.dtype) and value.kind in _ARRAY_KINDS and value.fields is None:
            return {"t": "Z", "v": value.str}
        if not self.lenient:
            raise WireError(f"a value of type {_type_name(value)} cannot cross the sandbox boundary")
        if callable(value) and not isinstance(value, type):
            item = self._new(value, "F")
            try:  # the simple attributes travel with it (an encoder's input_width, say)
                item["attrs"] = {k: v for k, v in vars(value).items() if type(v) in (int, float, str, bool)}
            except TypeError:  # no __dict__: a function's attributes are not its contract
                pass
            return item
        item = self._new(value, "O")
        try:
            text = repr(value)[:200]
        except Exception:  # noqa: BLE001 - a repr is only decoration
            text = "?"
        item.update(type=_type_name(value), repr=text)
        return item

    def _array(self, array: np.ndarray):
        item = self._new(array, "A")
        before = self._snapshots.get(item.get("a"))
        if before is not None and before == (array.shape, array.dtype.str, array.tobytes()):
            return {"t": "=", "i": item["i"], "a": item["a"]}
        item["b"] = self._add(_blob(array))
        item["w"] = bool(array.flags.writeable)
        if array.size:
            root = _root(array)
            low, high = byte_bounds(root)
            item.update(h=self.registry.handle(root), n=high - low,
                        o=array.__array_interface__["data"][0] - low, s=list(array.strides))
        return item


def snapshot(array: np.ndarray) -> tuple:
    """What ``Encoder`` compares to tell an unchanged argument array."""
    return (array.shape, array.dtype.str, array.tobytes())


_PENDING = object()
_OPAQUE: dict[str, type] = {}


class Opaque:
    """Stands in, in the sandbox, for an argument that cannot cross (say a RandomState subclass)."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text


def _opaque(type_name: str, text: str) -> Opaque:
    short = type_name.rsplit(".", 1)[-1]
    if not short.isidentifier():
        short = "Opaque"
    cls = _OPAQUE.setdefault(short, type(short, (Opaque,), {}))
    return cls(type_name, text)


def _hashable(value):
    try:
        hash(value)
    except TypeError:
        raise WireError(f"an unhashable dict key or set item of type {_type_name(value)}") from None
    return value


def _write(target: np.ndarray, data: np.ndarray) -> None:
    """Copy ``data`` into ``target`` when they differ (an in-place change made on the other side)."""
    if target.tobytes() != data.tobytes() and target.flags.writeable:
        target[...] = data


class Decoder:
    """JSON items and blobs back to values, mirroring ``Encoder`` (any flaw: ``WireError``).

    ``args`` (the caller reading a reply) are its request's objects, the targets of ``a``;
    ``make_callable(i)`` (the sandbox reading a request) stands in for the caller's
    callable ``i``. Without them, ``a``, ``=`` and ``F`` items are refused, and ``O`` items
    are refused unless ``opaque`` is set.
    """

    def __init__(self, registry: Registry, names: Names, blobs: list[bytes], *, args=None,
                 make_callable=None, opaque: bool = False):
        self.registry, self.names, self.blobs = registry, names, blobs
        self.args, self.make_callable, self.opaque = args, make_callable, opaque
        self.objects: list = []

    def decode(self, item):
        try:
            return self._decode(item)
        except WireError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, RecursionError,
                MemoryError) as exc:
            raise WireError(f"malformed value ({type(exc).__name__}: {exc})") from None

    def _slot(self, item, value=_PENDING) -> int:
        if item["i"] != len(self.objects):
            raise WireError(f"object index {item['i']!r} out of order (expected {len(self.objects)})")
        self.objects.append(value)
        return item["i"]

    def _target(self, item, kind):
        if "a" not in item:
            return None
        k = item["a"]
        if self.args is None or type(k) is not int or not 0 <= k < len(self.args):
            raise WireError(f"a reference to request object {k!r} that does not exist")
        if not isinstance(self.args[k], kind):
            raise WireError(f"request object {k} is a {_type_name(self.args[k])}, not a {kind.__name__}")
        return self.args[k]

    def _decode(self, item):
        if item is None or type(item) in (bool, int, float, str):
            return item
        tag = item["t"]
        if tag == "@":
            value = self.objects[item["i"]] if type(item["i"]) is int and item["i"] >= 0 else _PENDING
            if value is _PENDING:
                raise WireError(f"a reference to object {item['i']!r} before it is complete")
            return value
        if tag == "=":
            target = self._target(item, object)
            if target is None:
                raise WireError("'=' without the request object it refers to")
            self._slot(item, target)
            return target
        if tag in ("D", "L"):
            return self._container(item, tag)
        if tag in ("T", "N", "C"):
            return self._record(item, tag)
        if tag == "P":
            return self._plain(item)
        if tag == "A":
            index = self._slot(item)
            self.objects[index] = value = self._array(item)
            return value
        if tag in ("G", "R"):
            return self._generator(item, tag)
        return self._other(item, tag)

    def _container(self, item, tag):
        kind = dict if tag == "D" else list
        target = self._target(item, kind)
        value = kind() if target is None else target
        self._slot(item, value)
        keys = [_hashable(self._decode(k)) for k in item["k"]] if tag == "D" else None
        items = [self._decode(v) for v in item["v"]]
        if tag == "D":
            if len(keys) != len(items):
                raise WireError("a dict with more keys than values")
            if target is None or list(target) != keys or any(
                    a is not b for a, b in zip(target.values(), items, strict=True)):
                value.clear()
                value.update(zip(keys, items, strict=True))
        elif target is None or len(target) != len(items) or any(
                a is not b for a, b in zip(target, items, strict=True)):
            value[:] = items
        return value

    def _record(self, item, tag):
        index = self._slot(item)
        if tag == "C":
            cls = self.names.class_of(item["n"])
            if not dataclasses.is_dataclass(cls) or type(item["f"]) is not dict:
                raise WireError(f"{item['n']} is not a config dataclass")
            value = cls(**{name: self._decode(v) for name, v in item["f"].items()})
        else:
            items = [self._decode(v) for v in item["v"]]
            value = tuple(items) if tag == "T" else self.names.class_of(item["n"])(*items)
        target = self._target(item, type(value))
        self.objects[index] = value if target is None else target
        return self.objects[index]

    def _plain(self, item):
        cls = self.names.class_of(item["n"])
        if _kind(cls) != "P" or type(item["f"]) is not dict:
            raise WireError(f"{item['n']} is not a plain object class")
        target = self._target(item, cls)
        value = object.__new__(cls) if target is None else target  # no __init__: its state comes as data
        self._slot(item, value)
        state = {str(key): self._decode(v) for key, v in item["f"].items()}
        if list(vars(value)) != list(state) or any(
                a is not b for a, b in zip(vars(value).values(), state.values(), strict=True)):
            vars(value).clear()
            vars(value).update(state)
        return value

    def _array(self, item) -> np.ndarray:
        data = _load(self.blobs[item["b"]])
        target = self._target(item, np.ndarray)
        if target is not None:
            if target.shape != data.shape or target.dtype != data.dtype:
                raise WireError("an argument array changed shape or dtype")
            _write(target, data)
            return target
        if "h" in item:
            data = self._view(item, data)
        if item.get("w") is False:
            data.flags.writeable = False
        return data

    def _view(self, item, data: np.ndarray) -> np.ndarray:
        handle, size, offset, strides = item["h"], item["n"], item["o"], tuple(item["s"])
        if type(handle) is not str or not all(type(v) is int for v in (size, offset, *strides)):
            raise WireError("malformed array geometry")
        root = self.registry.root(handle)
        if root is not None and byte_bounds(root)[1] - byte_bounds(root)[0] == size:
            view = np.ndarray(data.shape, data.dtype, buffer=_flat_bytes(root), offset=offset, strides=strides)
            _write(view, data)
            return view
        if not 0 < size <= MAX_ROOT:
            raise WireError(f"an array buffer of {size} bytes")
        own = _root(data)
        low, high = byte_bounds(own)
        if (high - low, data.__array_interface__["data"][0] - low, data.strides) == (size, offset, strides):
            self.registry.adopt(handle, own)  # the array is its whole buffer: keep the copy we have
            return data
        root = np.zeros(size, np.uint8)
        self.registry.adopt(handle, root)
        view = np.ndarray(data.shape, data.dtype, buffer=root, offset=offset, strides=strides)
        view[...] = data
        return view

    def _generator(self, item, tag):
        index = self._slot(item)
        state = self._decode(item["s"])
        if tag == "G":
            target = self._target(item, np.random.Generator)
            name = state["bit_generator"] if type(state) is dict else None
            if name not in _BIT_GENERATORS:
                raise WireError(f"bit generator {name!r} may not cross")
            seeds = self._seeds(item["q"]) if "q" in item else None
            if target is None:
                bit_generator = getattr(np.random, name)(seeds)
                bit_generator.state = state
                target = np.random.Generator(bit_generator)
            elif type(target.bit_generator).__name__ == name:
                target.bit_generator.state = state
                mine = getattr(target.bit_generator, "seed_seq", None)
                if seeds is not None and isinstance(mine, np.random.SeedSequence):
                    behind = seeds.n_children_spawned - mine.n_children_spawned
                    if 0 < behind <= 1 << 20:
                        mine.spawn(behind)  # the other side spawned children: count them here too
            else:
                raise WireError("a Generator changed its bit generator")
        else:
            target = self._target(item, np.random.RandomState)
            if target is None:
                target = np.random.RandomState()
            target.set_state(state)
        self.objects[index] = target
        return target

    def _seeds(self, fields) -> np.random.SeedSequence:
        entropy = self._decode(fields["entropy"])
        spawn_key = tuple(int(k) for k in fields["spawn_key"])
        return np.random.SeedSequence(entropy, spawn_key=spawn_key, pool_size=int(fields["pool_size"]),
                                      n_children_spawned=int(fields["n_children_spawned"]))

    def _other(self, item, tag):
        if tag == "S":
            array = _load(self.blobs[item["b"]])
            if array.ndim != 0:
                raise WireError("a scalar blob that is not 0-d")
            return array[()]
        if tag == "X":
            real, imag = item["v"]
            return complex(float(real), float(imag))
        if tag == "B":
            return base64.b64decode(item["v"].encode("ascii"), validate=True)
        if tag == "E":
            values = [_hashable(self._decode(v)) for v in item["v"]]
            return frozenset(values) if item["f"] is True else set(values)
        if tag == "Y":
            module, _, name = item["v"].partition(".")
            found = getattr(np, name, None) if module == "numpy" else _BUILTIN_TYPES.get(name)
            if module == "builtins" and found is not None:
                return found
            if isinstance(found, type) and issubclass(found, np.generic):
                return found
            raise WireError(f"type {item['v']!r} may not cross")
        if tag == "Z":
            dtype = np.dtype(str(item["v"]))
            if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None:
                raise WireError(f"dtype {dtype} may not cross")
            return dtype
        if tag == "F" and self.make_callable is not None:
            index = self._slot(item)
            attrs = item.get("attrs", {})
            if type(attrs) is not dict or not all(type(v) in (int, float, str, bool) for v in attrs.values()):
                raise WireError("a callable's attributes are not plain")
            self.objects[index] = value = self.make_callable(index, {str(k): v for k, v in attrs.items()})
            return value
        if tag == "O" and self.opaque:
            index = self._slot(item)
            self.objects[index] = value = _opaque(str(item["type"]), str(item["repr"]))
            return value
        raise WireError(f"unknown or forbidden item tag {tag!r}")
