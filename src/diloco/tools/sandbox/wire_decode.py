"""The sandbox wire format, part 4: JSON items and blobs back to values (``Decoder``).

The mirror of ``wire_values.Encoder``; any flaw in a message is a ``WireError``, and so is
anything a message asks for beyond plain data:

* an item that is not one of the tags of ``wire_values``, or nests deeper than ``MAX_DEPTH``;
* a record whose name is not listed (``wire_names.RECORDS``) or whose fields are not
  exactly the listed ones: a record is rebuilt by its constructor, never by setting
  attributes, so no ``__dict__``, dunder name or ``__array_interface__`` can cross;
* an array blob of a non-numeric dtype, or whose declared shape does not match its bytes
  (``wire.load_array`` checks both before it allocates, and copies the array out of the blob);
* more new memory than the message's ``Budget`` (``MAX_DECODE``), counting the copies and
  the buffers a shared view makes the reader allocate.

A view's offset and strides inside its buffer are checked by NumPy against that buffer's
size, so a view can only ever reach the memory of the buffer it belongs to. Like ``wire``,
this module imports only the standard library and NumPy.
"""

from __future__ import annotations

import base64
import re

import numpy as np

from .wire import (
    ARRAY_KINDS,
    MAX_DECODE,
    MAX_DEPTH,
    Budget,
    Registry,
    WireError,
    byte_bounds,
    flat_bytes,
    load_array,
    root_of,
)
from .wire_names import BIT_GENERATORS, BUILTIN_TYPES, Names, qualified_name, record_kind

_PENDING = object()
_OPAQUE: dict[str, type] = {}
_HANDLE = re.compile(r"[a-z][a-z0-9-]{0,39}")
_MAX_SPAWNED = 1 << 16  # children a Generator's SeedSequence may have spawned in one call


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
        raise WireError(f"an unhashable dict key or set item of type {qualified_name(value)}") from None
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
        self.budget = Budget(MAX_DECODE)
        self._depth = 0

    def decode(self, item):
        try:
            return self._decode(item)
        except WireError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever a malformed item breaks, it is a malformed item
            raise WireError(f"malformed value ({type(exc).__name__}: {str(exc)[:300]})") from None

    def _slot(self, item, value=_PENDING) -> int:
        if type(item["i"]) is not int or item["i"] != len(self.objects):
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
            raise WireError(f"request object {k} is a {qualified_name(self.args[k])}, not a {kind.__name__}")
        return self.args[k]

    def _decode(self, item):
        if item is None or type(item) in (bool, int, float, str):
            return item
        if type(item) is not dict or type(item.get("t")) is not str:
            raise WireError(f"an item that is neither plain nor tagged: {str(item)[:100]}")
        if self._depth >= MAX_DEPTH:
            raise WireError(f"values nested deeper than {MAX_DEPTH}")
        self._depth += 1
        try:
            return self._tagged(item, item["t"])
        finally:
            self._depth -= 1

    def _tagged(self, item, tag):
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
        if tag == "T":
            index = self._slot(item)
            value = tuple(self._decode(v) for v in self._list(item["v"]))
            target = self._target(item, tuple)
            self.objects[index] = value if target is None else target
            return self.objects[index]
        if tag == "C":
            return self._record(item)
        if tag == "A":
            index = self._slot(item)
            self.objects[index] = value = self._array(item)
            return value
        if tag in ("G", "R"):
            return self._generator(item, tag)
        return self._other(item, tag)

    @staticmethod
    def _list(value) -> list:
        if type(value) is not list:
            raise WireError("a container whose items are not a list")
        return value

    def blob_of(self, item):
        index = item["b"]
        if type(index) is not int or not 0 <= index < len(self.blobs):
            raise WireError(f"a reference to array blob {str(index)[:20]} that the frame does not hold")
        return self.blobs[index]

    def _container(self, item, tag):
        """A dict or list, refilled in place when it stands for a request object (``a``)."""
        kind = dict if tag == "D" else list
        target = self._target(item, kind)
        value = kind() if target is None else target
        self._slot(item, value)
        if tag == "D":
            keys = [_hashable(self._decode(k)) for k in self._list(item["k"])]
            _refill_dict(value, target, keys, [self._decode(v) for v in self._list(item["v"])])
        else:
            _refill_list(value, target, [self._decode(v) for v in self._list(item["v"])])
        return value

    def _record(self, item):
        """A listed record, rebuilt by its constructor from exactly its listed fields."""
        index = self._slot(item)
        name, given = item["n"], item["f"]
        cls = self.names.class_of(name)
        fields = self.names.fields(cls, name)
        if type(given) is not dict or sorted(given) != sorted(fields):
            shown = sorted(given)[:10] if type(given) is dict else type(given).__name__
            raise WireError(f"{name} crosses with the fields {list(fields)}, not {shown}")
        values = {field: self._decode(v) for field, v in given.items()}
        value = cls(**values)
        target = self._target(item, cls)
        if target is not None and record_kind(cls) == "P":  # a plain object changed on the other side: as in-process
            for field in fields:
                if getattr(target, field) is not values[field]:
                    setattr(target, field, values[field])
        self.objects[index] = value if target is None else target
        return self.objects[index]

    def _array(self, item) -> np.ndarray:
        data = load_array(self.blob_of(item), self.budget)
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
        handle, size, offset, strides = item["h"], item["n"], item["o"], tuple(self._list(item["s"]))
        if (type(handle) is not str or not _HANDLE.fullmatch(handle) or len(strides) != data.ndim
                or not all(type(v) is int for v in (size, offset, *strides))):
            raise WireError("malformed array geometry")
        root = self.registry.root(handle)
        flat = None if root is None else flat_bytes(root)
        if flat is not None and flat.size == size:  # a buffer of ours: the view is of it (NumPy checks the bounds)
            view = np.ndarray(data.shape, data.dtype, buffer=flat, offset=offset, strides=strides)
            _write(view, data)
            return view
        if root is not None:
            return data  # a buffer of ours the view does not fit: the data, shared with nothing
        if not 0 < size <= MAX_DECODE:
            raise WireError(f"an array buffer of {size} bytes")
        own = root_of(data)
        low, high = byte_bounds(own)
        if (high - low, data.__array_interface__["data"][0] - low, data.strides) == (size, offset, strides):
            self.registry.adopt(handle, own)  # the array is its whole buffer: keep the copy we have
            return data
        self.budget.take(size, "shared buffers")
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
            if name not in BIT_GENERATORS:
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
                    if 0 < behind <= _MAX_SPAWNED:
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
        spawn_key, pool_size = self._list(fields["spawn_key"]), fields["pool_size"]
        spawned = fields["n_children_spawned"]
        if (len(spawn_key) > 64 or not all(type(k) is int and k >= 0 for k in spawn_key)
                or type(pool_size) is not int or not 4 <= pool_size <= 64
                or type(spawned) is not int or not 0 <= spawned < 1 << 32):
            raise WireError("a malformed SeedSequence")
        if isinstance(entropy, np.ndarray) and entropy.size > 1024:
            raise WireError("a SeedSequence with more than 1024 words of entropy")
        return np.random.SeedSequence(entropy, spawn_key=tuple(spawn_key), pool_size=pool_size,
                                      n_children_spawned=spawned)

    def _other(self, item, tag):
        """A tag of ``_OTHER_TAGS``, each decoded by a method of its own; any other is refused."""
        method = _OTHER_TAGS.get(tag)
        if method is None:
            raise WireError(f"unknown or forbidden item tag {tag!r}")
        return getattr(self, method)(item, tag)

    def _scalar(self, item, tag):
        array = load_array(self.blob_of(item), self.budget)
        if array.ndim != 0:
            raise WireError("a scalar blob that is not 0-d")
        return array[()]

    @staticmethod
    def _complex(item, tag):
        real, imag = item["v"]
        return complex(float(real), float(imag))

    @staticmethod
    def _bytes(item, tag):
        return base64.b64decode(item["v"].encode("ascii"), validate=True)

    def _set(self, item, tag):
        values = [_hashable(self._decode(v)) for v in self._list(item["v"])]
        return frozenset(values) if item["f"] is True else set(values)

    @staticmethod
    def _type(item, tag):
        """A builtin type, or a NumPy scalar type, by name: nothing else, and no private name."""
        module, _, name = str(item["v"]).partition(".")
        if not name.isidentifier() or name.startswith("_"):
            raise WireError(f"type {str(item['v'])[:100]!r} may not cross")
        found = getattr(np, name, None) if module == "numpy" else BUILTIN_TYPES.get(name)
        if module == "builtins" and found is not None:
            return found
        if isinstance(found, type) and issubclass(found, np.generic):
            return found
        raise WireError(f"type {item['v']!r} may not cross")

    @staticmethod
    def _dtype(item, tag):
        """A plain numeric dtype: no record fields, no sub-array."""
        if type(item["v"]) is not str or len(item["v"]) > 16:
            raise WireError("a malformed dtype")
        dtype = np.dtype(item["v"])
        if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
            raise WireError(f"dtype {dtype} may not cross")
        return dtype

    def _callable(self, item, tag):
        """The caller's callable, only for a reader that can stand in for one (``make_callable``)."""
        if self.make_callable is None:
            raise WireError(f"unknown or forbidden item tag {tag!r}")
        index = self._slot(item)
        attrs = item.get("attrs", {})
        if type(attrs) is not dict or not all(type(v) in (int, float, str, bool) for v in attrs.values()):
            raise WireError("a callable's attributes are not plain")
        self.objects[index] = value = self.make_callable(index, {str(k): v for k, v in attrs.items()})
        return value

    def _opaque_item(self, item, tag):
        """A stand-in for what cannot cross, only for a reader that accepts them (``opaque``)."""
        if not self.opaque:
            raise WireError(f"unknown or forbidden item tag {tag!r}")
        index = self._slot(item)
        self.objects[index] = value = _opaque(str(item["type"]), str(item["repr"]))
        return value


# The tags ``Decoder._other`` reads, each with the method that decodes it.
_OTHER_TAGS = {"S": "_scalar", "X": "_complex", "B": "_bytes", "E": "_set", "Y": "_type", "Z": "_dtype",
               "F": "_callable", "O": "_opaque_item"}


def _refill_dict(value: dict, target: dict | None, keys: list, items: list) -> None:
    """Fill ``value`` with ``keys`` and ``items``, leaving a request's dict (``target``) untouched
    when nothing in it changed."""
    if len(keys) != len(items):
        raise WireError("a dict with more keys than values")
    if target is None or list(target) != keys or any(a is not b for a, b in zip(target.values(), items, strict=True)):
        value.clear()
        value.update(zip(keys, items, strict=True))


def _refill_list(value: list, target: list | None, items: list) -> None:
    """Fill ``value`` with ``items``, leaving a request's list (``target``) untouched when nothing in it changed."""
    if target is None or len(target) != len(items) or any(a is not b for a, b in zip(target, items, strict=True)):
        value[:] = items
