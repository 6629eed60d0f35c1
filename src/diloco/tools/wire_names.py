"""The sandbox wire format, part 3: which classes cross as data, by name (``Names``).

Shared by the encoder (``wire_values``) and the decoder (``wire_decode``). Like ``wire``,
it imports only the standard library and NumPy, so the sandbox can load it as a private
package without importing ``diloco``.
"""

from __future__ import annotations

import dataclasses

from .wire import WireError

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
