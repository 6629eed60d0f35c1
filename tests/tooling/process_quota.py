"""One fork bomb at a time on this machine.

The sandbox runs graded code as ``nobody`` with a limit of 64 processes, and that limit
counts every process of ``nobody``, whoever started it. A fork bomb (test_exploits.py, as
root and as an unprivileged grader) holds the whole quota until its sandbox dies, and
test_sandbox.py's fork-bomb test counts the children it could start. Under `make test`'s
two processes (pytest-xdist), or beside another checkout's test run, two of these at once
would starve each other: each takes this lock, a file lock every process on the machine sees.
"""

from __future__ import annotations

import fcntl
import tempfile
from contextlib import contextmanager
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "diloco-tests-nobody-processes.lock"


@contextmanager
def nobody_processes():
    """Hold the machine-wide lock on the process quota of ``nobody`` for the ``with`` block."""
    with open(LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
