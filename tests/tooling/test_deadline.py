"""``diloco.core.deadline.exit_after``: the one exit timer of the admission and of ``MPI_Finalize``."""

from __future__ import annotations

import subprocess
import sys

import pytest

LATE = """
import time
from diloco.core.deadline import exit_after
print("before", flush=True)
with exit_after(0.3, {code}, {say!r}, backstop={backstop}):
    time.sleep(30)
print("never")
"""


@pytest.mark.parametrize("backstop", [False, True])
@pytest.mark.parametrize("code, say", [(4, "rank 0: too late"), (0, None)])
def test_a_block_past_its_deadline_ends_the_process_with_the_callers_status(code, say, backstop):
    done = subprocess.run([sys.executable, "-c", LATE.format(code=code, say=say, backstop=backstop)],
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == code and done.stdout == "before\n"
    assert done.stderr == (f"{say}\n" if say else "")


def test_a_block_in_time_leaves_no_timer_and_restores_sigalrm():
    import signal
    import time

    from diloco.core.deadline import exit_after

    before = signal.getsignal(signal.SIGALRM)
    with exit_after(0.2, 9, "late", backstop=True):
        pass
    with exit_after(None, 9, "late"):
        pass
    time.sleep(0.4)  # a timer left running would have ended this process by now
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
