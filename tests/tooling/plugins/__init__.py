"""Parts added from outside the package, as a plugin would: one file each (``test_plugins.py`` runs them).

``register()`` adds both by name (``lion``, ``randk``) and ``unregister()`` takes them out
again; ``plugins.enable``, imported, registers them (the MPI tool's ``--plugin``). The
composition test (``test_core.py``) runs both on every executor.
"""

from __future__ import annotations

from diloco.core.registry import CODECS, INNER_OPTIMIZERS

from .lion import LION
from .randk import RandomK

__all__ = ["register", "unregister"]


def register() -> None:
    """``INNER_OPTIMIZERS["lion"]`` and ``CODECS["randk"]``, as a plugin registers them."""
    INNER_OPTIMIZERS.register("lion", LION)
    CODECS.register("randk", RandomK)


def unregister() -> None:
    INNER_OPTIMIZERS.unregister("lion")
    CODECS.unregister("randk")
