"""Progress within a round: the executors say how many inner steps they have finished.

A round of ``-H 1000000`` (or of a thousand workers) can last hours; a progress bar that
moves once a round shows nothing meanwhile. Inside ``reporting(listener)`` every executor
calls ``steps_done(n)`` as its workers finish inner steps (a reference worker in chunks of
``CHUNK`` steps, the stacked executor after every step), and ``listener(n)`` runs (the
command line's progress, ``diloco.tools.cli.run_progress``). Outside it
nothing is called and the executors step exactly as before. The chunks change no bit: a
worker's steps are one loop over its carried params, optimizer state and generator.
"""

from __future__ import annotations

import contextlib
import contextvars

__all__ = ["CHUNK", "reporting", "steps_done", "chunks"]

CHUNK = 256  # inner steps of one reference worker between two reports

_listener: contextvars.ContextVar = contextvars.ContextVar("diloco_progress", default=None)


@contextlib.contextmanager
def reporting(listener):
    """Call ``listener(steps)`` for every report of finished inner steps inside."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def steps_done(steps: int) -> None:
    """Report ``steps`` finished inner steps (one worker's, or one step of several stacked)."""
    listener = _listener.get()
    if listener is not None:
        listener(steps)


def chunks(steps: int) -> list[int]:
    """``steps`` cut into pieces of at most ``CHUNK`` when someone listens, else ``[steps]``."""
    if _listener.get() is None or steps <= CHUNK:
        return [steps]
    return [CHUNK] * (steps // CHUNK) + ([steps % CHUNK] if steps % CHUNK else [])
