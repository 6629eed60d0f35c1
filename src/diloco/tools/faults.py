"""How a command ends when something goes wrong: one line, an exit status, a truthful run folder.

Once a run folder exists, ``run_outcome`` turns every way a run can end early into a
``summary.json`` status and a one-line error (``CliError``):

========================  ===============  ===========  ==============================
what happened             status           exit status  the line says
========================  ===============  ===========  ==============================
Ctrl-C, SIGTERM           ``interrupted``  130, 143     which signal; files kept
non-finite or huge loss   ``diverged``     3            round, worker, quantity
``OSError`` (disk full,   ``failed``       2            the file and the OS's reason
read-only, name too long)
``MemoryError``           ``failed``       2            out of memory
``TypeError/ValueError``  ``failed``       2            the library's message
========================  ===============  ===========  ==============================

``failed`` is written only if the folder can still be written (a full disk may refuse
even that); the line is printed either way. ``quiet_numpy`` keeps NumPy's
RuntimeWarnings (overflow, invalid value) off the terminal: the divergence guard's
message says what they would have said, and where.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import warnings

import numpy as np

from diloco.tools.errors import CliError
from diloco.tools.training import Diverged

__all__ = ["Terminated", "sigterm_as_interrupt", "quiet_numpy", "describe_os_error", "run_outcome",
           "DIVERGED_STATUS"]

DIVERGED_STATUS = 3  # the exit status of a diverged run


class Terminated(KeyboardInterrupt):
    """SIGTERM (sent by ``timeout``, Slurm, Docker, ``kill``), handled exactly like Ctrl-C."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While inside, SIGTERM raises ``Terminated`` (a ``KeyboardInterrupt``) in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def quiet_numpy():
    """No NumPy floating-point warnings inside (the divergence guard reports instead)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def describe_os_error(exc: OSError) -> str:
    """``cannot write runs/x/history.jsonl: No space left on device`` style, one line."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is not None:
        return f"cannot write {exc.filename}: {reason}"
    return f"input/output error: {reason}"


@contextlib.contextmanager
def run_outcome(write_summary):
    """Map an early end inside to a summary status and a ``CliError``.

    ``write_summary(status, reason, extra)`` writes ``summary.json``; an ``OSError`` it
    raises itself (a full disk) is ignored, the line is still printed.
    """

    def record(status: str, reason: str, extra: dict | None = None) -> None:
        with contextlib.suppress(OSError, MemoryError):
            write_summary(status, reason, extra or {})

    try:
        yield
    except Terminated:
        record("interrupted", "terminated by SIGTERM", {"signal": "SIGTERM"})
        raise
    except KeyboardInterrupt:
        record("interrupted", "interrupted by Ctrl-C (SIGINT)", {"signal": "SIGINT"})
        raise
    except Diverged as exc:
        record("diverged", str(exc), {"divergence": exc.as_dict()})
        raise CliError(str(exc), status=DIVERGED_STATUS) from None
    except OSError as exc:
        reason = describe_os_error(exc)
        record("failed", reason)
        raise CliError(reason) from None
    except MemoryError:
        reason = "out of memory during training"
        record("failed", reason)
        raise CliError(reason) from None
    except (TypeError, ValueError) as exc:
        reason = f"cannot train: {exc}"
        record("failed", reason)
        raise CliError(reason) from None
