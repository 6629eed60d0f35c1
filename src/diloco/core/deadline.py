"""A block with a deadline: past it, this process ends, with an exit status of the caller's choosing.

``exit_after(limit, code)`` is the one timer of the MPI code for what no collective's time-out
covers: a replacement's admission (``diloco.core.membership.within``) and ``MPI_Finalize`` after a
rank's death (``diloco.tools.cli.mpi``), both of which can block forever. A timer thread prints
the caller's line (if any), flushes stdout and stderr and calls ``os._exit(code)``; it runs only
where the blocked call lets the GIL go. For a call that keeps it (``MPI_Init``, mpi4py's import),
``backstop`` adds an interval timer whose ``SIGALRM`` runs libc's ``_exit`` directly (no Python,
no GIL) two seconds later: status 14 (``SIGALRM``'s number), silently.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading

__all__ = ["exit_after"]


@contextlib.contextmanager
def exit_after(limit: float | None, code: int, say: str | None = None, *, backstop: bool = False):
    """Run the block; if it has not finished after ``limit`` seconds (None: no limit), print ``say``
    to stderr (None: nothing), flush, and end this process with status ``code`` (module doc)."""
    if limit is None:
        yield
        return

    def leave() -> None:
        if say is not None:
            print(say, file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(limit, leave)
    timer.daemon = True
    timer.start()
    with _alarm(limit + 2.0) if backstop else contextlib.nullcontext():
        try:
            yield
        finally:
            timer.cancel()


@contextlib.contextmanager
def _alarm(seconds: float):
    """``_exit(SIGALRM)`` from libc after ``seconds`` unless the block has finished; the handler it
    replaced is put back."""
    libc = _libc()
    previous = libc.signal(int(signal.SIGALRM), ctypes.cast(libc._exit, ctypes.c_void_p))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        libc.signal(int(signal.SIGALRM), previous)


def _libc():
    """This process's C library, with ``signal(int, handler pointer) -> previous handler pointer``."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
    return libc
