"""SIGINT, SIGTERM and SIGHUP for the ``diloco`` command line, from its first import on.

Standard library only, so it can be installed before NumPy is imported: the first line of
``diloco/__init__.py`` imports it, and it installs itself only when the process is the
``diloco`` command (``install_if_cli``). It lives beside the library, not in
``diloco.tools``, because the library never imports the tools. The handler has three modes:

* ``"exit"`` (from ``install()`` until the command starts): nothing has been written yet,
  so the process prints one line and ends at once with status 128 + n (no traceback
  from the middle of an import, nothing half-made);
* ``"raise"`` (inside ``session()``, while a command runs): the signal becomes
  ``Stopped``, a ``KeyboardInterrupt``, so every ``finally`` runs and
  ``diloco.tools.runs.faults.run_outcome`` records status ``"interrupted"``;
* once one signal has been raised, later ones are ignored, so the clean-up that writes
  ``summary.json`` is not cut short by a second Ctrl-C (SIGKILL still ends the process).

``signal_first()`` keeps a signal from being masked: a ``Stopped`` lands between any two bytecodes, and
library code is not always safe against that. A clean-up can then fail half-way, and its error
replaces the signal. NumPy's ``savez``, stopped between ``zipfile``'s ``_writing = True`` and the
writer it returns, closes its archive with ``ValueError: Can't close the ZIP file while there is an
open writing handle on it``. Once a signal has been raised, any exception that reaches
``signal_first`` is that signal again.

``deferred()`` holds a signal back for a few steps that must happen together: a signal
landing inside waits, and is raised as the block ends (the round's ``history.jsonl`` line and
the copy of that round kept for the interrupt's checkpoint, ``diloco.tools.runs.training``,
so the round saved is always the last round the history holds).

Only the main thread can receive Python signal handlers; ``install`` does nothing
elsewhere. The module imports only ``os`` and the C module ``_signal`` (not ``signal``,
whose ``enum`` costs tens of milliseconds), so it is in place within a millisecond.
"""

import _signal
import os

__all__ = ["SIGNALS", "NAMES", "Stopped", "Terminated", "install", "install_if_cli", "session", "deferred",
           "signal_first", "signal_behind", "exit_status"]

NAMES = {getattr(_signal, name): name for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(_signal, name)}
SIGNALS = tuple(NAMES)


class Stopped(KeyboardInterrupt):
    """A stop signal, raised in the main thread; ``signum`` and ``name`` say which."""

    def __init__(self, signum: int):
        super().__init__(NAMES.get(signum, f"signal {signum}"))
        self.signum = int(signum)
        self.name = NAMES.get(signum, f"signal {signum}")


class Terminated(Stopped):
    """SIGTERM (sent by ``timeout``, Slurm, Docker, ``kill``)."""


_state = {"mode": None, "raised": None, "previous": None, "deferring": False, "pending": None}


def exit_status(signum: int) -> int:
    """128 + n, what a shell reports for a process ended by signal n."""
    return 128 + int(signum)


def _handler(signum, frame):
    mode = _state["mode"]
    if _state["raised"] is not None or _state["pending"] is not None or mode == "done":
        return  # already stopping: let the clean-up finish
    if mode == "exit":
        try:
            os.write(2, f"diloco: stopped by {NAMES.get(signum, signum)} while starting; nothing was written\n"
                     .encode())
        finally:
            os._exit(exit_status(signum))
    if _state["deferring"]:
        _state["pending"] = signum  # raised as the deferred block ends
        return
    _state["raised"] = signum
    raise _stop(signum)


def _stop(signum: int) -> Stopped:
    return (Terminated if signum == _signal.SIGTERM else Stopped)(signum)


def install() -> bool:
    """Put the handler on every stop signal (``"exit"`` mode); False outside the main thread.

    A signal the process was started ignoring stays ignored, as Python leaves an ignored SIGINT:
    ``nohup diloco train ...`` keeps training when its terminal closes (SIGHUP), and a shell
    script's background job is not stopped by the Ctrl-C meant for the script."""
    if _state["mode"] is None:
        previous = {}
        try:
            for signum in SIGNALS:
                if _signal.getsignal(signum) != _signal.SIG_IGN:
                    previous[signum] = _signal.signal(signum, _handler)
        except ValueError:  # not the main thread
            for signum, handler in previous.items():
                _signal.signal(signum, handler)
            return False
        _state["previous"], _state["mode"] = previous, "exit"
    return True


def install_if_cli() -> bool:
    """``install()`` when this process is the ``diloco`` command (its script or ``python -m
    diloco``), never for a program that merely imports the library."""
    import sys  # already imported by the interpreter: free

    script = os.path.basename(sys.argv[0]) if sys.argv else ""
    orig = list(getattr(sys, "orig_argv", []))
    as_module = any(orig[i:i + 2] == ["-m", "diloco"] for i in range(len(orig) - 1))
    if script in ("diloco", "diloco.exe") or as_module:
        return install()
    return False


class session:
    """While a command runs (``with session():``): signals raise ``Stopped``. Restores the previous
    handlers after, when this call installed them (a command run in-process, as the tests do)."""

    def __enter__(self):
        self.installed_here = _state["mode"] is None
        self.active = install()
        if self.active:
            _state["mode"], _state["raised"] = "raise", None
        return self

    def __exit__(self, *exc_info):
        if not self.active:
            return False
        if self.installed_here:
            for signum, previous in (_state["previous"] or {}).items():
                _signal.signal(signum, previous)
            _state["mode"], _state["previous"] = None, None
        else:
            _state["mode"] = "done"  # the command has ended: the process is about to exit
        _state.update(raised=None, pending=None, deferring=False)
        return False


class deferred:
    """Inside (``with deferred():``): a stop signal waits until the block ends, then is raised
    there, so the steps inside happen all or none. Nested blocks raise at the outermost end;
    a block ended by another exception lets that one go on (the signal is then dropped).
    Outside ``session()`` (a library call) nothing changes."""

    def __enter__(self):
        self.outer = _state["deferring"]
        _state["deferring"] = True
        return self

    def __exit__(self, exc_type, *rest):
        _state["deferring"] = self.outer  # first: a signal from here on is raised at once
        pending = _state["pending"]
        if self.outer or pending is None:
            return False
        _state["pending"] = None
        if exc_type is None:
            _state["raised"] = pending
            raise _stop(pending)
        return False


def signal_behind(exc: BaseException):
    """The stop signal ``exc`` stands for: ``exc`` itself if it is a ``Stopped``. If a signal has
    already been raised in this session, any other exception came from a clean-up it cut short,
    so the result is a ``Stopped`` for that signal, caused by ``exc``. Otherwise None."""
    if isinstance(exc, KeyboardInterrupt):
        return exc
    if _state["raised"] is None or not isinstance(exc, Exception):
        return None
    stop = _stop(_state["raised"])
    stop.__cause__ = exc
    return stop


class signal_first:
    """Inside (``with signal_first():``): an exception raised after a stop signal was raised is
    that signal (``signal_behind``), never an error of its own."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, traceback):
        stop = None if exc is None else signal_behind(exc)
        if stop is None or stop is exc:
            return False
        raise stop


install_if_cli()  # at import: diloco/__init__.py imports this module before NumPy
