"""The sandbox wire format, part 3: which classes cross as data, by name (``Names``).

Only the classes of ``RECORDS`` cross, each rebuilt on the other side by calling its
constructor with its fields by name: a NamedTuple's ``_fields``, a dataclass's init
fields, or (for a plain class) the constructor parameters listed here. Nothing else of an
object crosses: no ``__dict__``, no attribute the list does not name. A class that
should cross and is not listed is refused with its name; add it here.

Shared by the encoder (``wire_values``) and the decoder (``wire_decode``). Like ``wire``,
it imports only the standard library and NumPy, so the sandbox can load it as a private
package without importing ``diloco``.
"""

from __future__ import annotations

import dataclasses

from .wire import WireError

BIT_GENERATORS = ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
BUILTIN_TYPES = {"float": float, "int": int, "bool": bool, "complex": complex, "str": str, "bytes": bytes}

# The project's records that cross, by where the milestone modules (and their tests) name
# them: ``None`` takes the fields from the class (NamedTuple, dataclass); a tuple names the
# constructor parameters of a plain class, read back as its attributes of those names.
RECORDS: dict[str, tuple[str, ...] | None] = {
    "adamw.AdamWState": None,
    "config.AdamWConfig": None,
    "config.DiLoCoConfig": None,
    "config.MuonConfig": None,
    "config.sections.FamilyConfig": None,
    "config.sections.AsyncConfig": None,
    "config.sections.TransformerShape": None,
    "core.quantize.Encoded": None,  # the records of the optional exercises' modules
    "methods.sparse.SparseConfig": None,
    "methods.sparse.SparsePayload": None,
    "methods.sparse.ErrorFeedbackState": None,
    "models.transformer.TransformerConfig": None,
    "models.transformer.LayerCache": None,
    "data.Dataset": None,
    "data.Standardizer": None,
    "evaluation.CommunicationReport": None,
    "loop.RoundResult": None,
    "loop.TrainResult": None,
    "model.ForwardCache": None,
    "outer.OuterState": None,
    "text.OneHot": ("vocab_size", "context"),
    "text.TextData": None,
}


def record_kind(cls) -> str | None:
    """``"N"`` NamedTuple, ``"C"`` dataclass, ``"P"`` any other class, else None (not a class)."""
    if not isinstance(cls, type):
        return None
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return "N"
    if dataclasses.is_dataclass(cls):
        return "C"
    return "P"


def record_fields(cls, declared: tuple[str, ...] | None) -> tuple[str, ...]:
    """The fields ``cls`` is rebuilt from: ``declared``, or the NamedTuple's / dataclass's own."""
    kind = record_kind(cls)
    if declared is not None:
        fields = tuple(declared)
    elif kind == "N":
        fields = tuple(cls._fields)
    elif kind == "C":
        fields = tuple(f.name for f in dataclasses.fields(cls) if f.init)
    else:
        raise WireError(f"{cls.__qualname__} is neither a NamedTuple nor a dataclass and lists no fields")
    if not all(type(name) is str and name.isidentifier() and not name.startswith("_") for name in fields):
        raise WireError(f"{cls.__qualname__} has a field that may not cross: {fields}")
    return fields


class Names:
    """The project's record classes on one side, by name (``"loop.RoundResult"``).

    ``module(name)`` gives ``diloco.<name>`` or None: the grader only looks at modules it
    has already imported, the sandbox imports the graded package's. A name is looked up as
    an attribute of its module, so a record re-exported from where it is defined still
    crosses under the name the list gives it.
    """

    def __init__(self, module, records: dict | None = None):
        self._module = module
        self._records = dict(RECORDS if records is None else records)
        self._found: dict[str, type] = {}

    def _resolve(self, name: str) -> type | None:
        cls = self._found.get(name)
        if cls is not None:
            return cls
        module_name, _, attribute = name.rpartition(".")
        try:
            module = self._module(module_name)
        except Exception:  # noqa: BLE001 - a module that does not import has no classes to offer
            module = None
        cls = getattr(module, attribute, None) if module is not None else None
        if isinstance(cls, type) and (self._records[name] is not None or record_kind(cls) in ("N", "C")):
            self._found[name] = cls
            return cls
        return None

    def name_of(self, cls) -> str | None:
        """The listed name of ``cls``, or None when it is no record of the list."""
        if not isinstance(cls, type):
            return None
        for name in self._records:
            if name.rpartition(".")[2] == cls.__name__ and self._resolve(name) is cls:
                return name
        return None

    def unlisted(self, cls) -> str | None:
        """``"text.Window"`` for a class of a ``diloco`` module that is not listed, else None."""
        module = getattr(cls, "__module__", "") or ""
        if not module.startswith("diloco.") or self.name_of(cls) is not None:
            return None
        return f"{module[len('diloco.'):]}.{cls.__qualname__}"

    def class_of(self, name) -> type:
        """The listed class called ``name``; ``WireError`` for any other name."""
        cls = self._resolve(name) if type(name) is str and name in self._records else None
        if cls is None:
            raise WireError(f"{str(name)[:100]!r} is not a record class of the project")
        return cls

    def fields(self, cls, name: str) -> tuple[str, ...]:
        return record_fields(cls, self._records[name])


def qualified_name(value) -> str:
    cls = type(value)
    return f"{cls.__module__}.{cls.__qualname__}"
