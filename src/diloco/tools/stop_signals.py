"""SIGINT, SIGTERM and SIGHUP for the ``diloco`` command line, from its first import on.

Standard library only, so it can be installed before NumPy is imported (the top of
``diloco.tools.cli``). The handler has three modes:

* ``"exit"`` (from ``install()`` until the command starts): nothing has been written yet,
  so the process prints one line and ends at once with status 128 + n (no traceback
  from the middle of an import, nothing half-made);
* ``"raise"`` (inside ``session()``, while a command runs): the signal becomes
  ``Stopped``, a ``KeyboardInterrupt``, so every ``finally`` runs and
  ``diloco.tools.faults.run_outcome`` records status ``"interrupted"``;
* once one signal has been raised, later ones are ignored, so the clean-up that writes
  ``summary.json`` is not cut short by a second Ctrl-C (SIGKILL still ends the process).

Only the main thread can receive Python signal handlers; ``install`` does nothing
elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

__all__ = ["SIGNALS", "Stopped", "Terminated", "install", "install_if_cli", "session", "exit_status"]

SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Stopped(KeyboardInterrupt):
    """A stop signal, raised in the main thread; ``signum`` and ``name`` say which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.name = signal.Signals(signum).name


class Terminated(Stopped):
    """SIGTERM (sent by ``timeout``, Slurm, Docker, ``kill``)."""


_state = {"mode": None, "raised": None, "previous": None}


def exit_status(signum: int) -> int:
    """128 + n, what a shell reports for a process ended by signal n."""
    return 128 + int(signum)


def _handler(signum, frame):
    mode = _state["mode"]
    if _state["raised"] is not None or mode == "done":
        return  # already stopping: let the clean-up finish
    if mode == "exit":
        name = signal.Signals(signum).name
        with contextlib.suppress(OSError):
            os.write(2, f"diloco: stopped by {name} while starting; nothing was written\n".encode())
        os._exit(exit_status(signum))
    _state["raised"] = signum
    raise (Terminated if signum == signal.SIGTERM else Stopped)(signum)


def install() -> bool:
    """Put the handler on every stop signal (``"exit"`` mode); False outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if _state["mode"] is None:
        _state["previous"] = {signum: signal.signal(signum, _handler) for signum in SIGNALS}
        _state["mode"] = "exit"
    return True


def install_if_cli() -> bool:
    """``install()`` when this process is the ``diloco`` command (its script or ``python -m
    diloco``), never for a program that merely imports the library."""
    import sys

    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    orig = list(getattr(sys, "orig_argv", []))
    as_module = any(orig[i:i + 2] == ["-m", "diloco"] for i in range(len(orig) - 1))
    if script in ("diloco", "diloco.exe") or as_module:
        return install()
    return False


@contextlib.contextmanager
def session():
    """While a command runs: signals raise ``Stopped``. Restores the previous handlers after,
    when this call installed them (a command run in-process, as the tests do)."""
    installed_here = _state["mode"] is None
    if not install():
        yield
        return
    _state["mode"], _state["raised"] = "raise", None
    try:
        yield
    finally:
        if installed_here:
            for signum, previous in (_state["previous"] or {}).items():
                signal.signal(signum, previous)
            _state["mode"], _state["previous"] = None, None
        else:
            _state["mode"] = "done"  # the command has ended: the process is about to exit
        _state["raised"] = None


install_if_cli()  # at import: diloco/__init__.py imports this module before NumPy
