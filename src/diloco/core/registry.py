"""The named parts a run chooses by name: inner optimizers and outer-gradient codecs.

``DiLoCoConfig.inner_optimizer`` names an entry of ``INNER_OPTIMIZERS`` (an ``Optimizer``,
``diloco.core.inner``) and ``CommSpec.compress`` an entry of ``CODECS`` (a codec
factory, ``diloco.core.codecs``). The config validates its names against these tables,
so this module sits below the config and imports nothing of the package: a built-in
entry is written ``"module:attribute"`` and loaded on first use (its module imports the
config). A plugin registers a value itself, before it builds a config that names it::

    from diloco.core.registry import INNER_OPTIMIZERS
    INNER_OPTIMIZERS.register("lion", LION)        # an Optimizer (diloco.core.inner.from_rule)
"""

from __future__ import annotations

import importlib

__all__ = ["Registry", "INNER_OPTIMIZERS", "CODECS"]


class Registry:
    """Names to entries: ``register``, ``names``, ``check``; ``registry[name]`` loads a built-in on first use."""

    def __init__(self, kind: str, builtins: dict) -> None:
        self.kind = kind
        self._entries = dict(builtins)
        self._builtins = frozenset(builtins)

    def register(self, name: str, entry, *, replace: bool = False) -> None:
        """Add ``entry`` under ``name``; a taken name needs ``replace=True`` (never a built-in's)."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a {self.kind} name must be an identifier such as 'lion', got {name!r}")
        if name in self._builtins:
            raise ValueError(f"{name!r} is a built-in {self.kind}; register under another name")
        if name in self._entries and not replace:
            raise ValueError(f"a {self.kind} named {name!r} is registered already (replace=True to swap it)")
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        """Remove a registered (not built-in) entry; a missing name is ignored."""
        if name in self._builtins:
            raise ValueError(f"{name!r} is a built-in {self.kind} and stays")
        self._entries.pop(name, None)

    def names(self) -> tuple:
        return tuple(self._entries)

    def check(self, name, field: str) -> None:
        """Raise ValueError naming ``field`` and the registered names unless ``name`` is one."""
        if name not in self._entries:
            raise ValueError(f"{field} must be one of {self.names()} (or a {self.kind} registered with "
                             f"diloco.core.registry), got {name!r}")

    def __getitem__(self, name: str):
        self.check(name, self.kind)
        entry = self._entries[name]
        if isinstance(entry, str):  # a built-in, loaded now: its module sits above the config
            module, _, attribute = entry.partition(":")
            entry = self._entries[name] = getattr(importlib.import_module(module), attribute)
        return entry

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self):
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


INNER_OPTIMIZERS = Registry("inner optimizer", {name: f"diloco.core.inner:{name.upper()}"
                                                for name in ("adamw", "muon", "sgd")})
CODECS = Registry("codec", {name: f"diloco.core.codecs:{name.upper()}_CODEC" for name in ("native", "dense", "topk")})
