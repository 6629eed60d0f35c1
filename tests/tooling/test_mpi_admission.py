"""A death during a replacement's admission ends the job within ``--round-timeout``; it never hangs.

The admission (``Membership.admit``: ``MPI_Comm_spawn``, the merge, the start state sent) is not
fault tolerant. Here worker 1 dies in round 3 and worker 2 dies as the admission of worker 1's
replacement begins: rank 0 errors out of the spawn and aborts, while the spawned replacement is
left in ``MPI_Init``, waiting for survivors that are gone, and Open MPI's launcher waits for it.
Before ``membership.within`` that job hung until killed (over 150 s with ``--round-timeout 30``);
now the replacement ends itself and so does the job, well inside the test's limit.

Needs Open MPI with ULFM (``make openmpi``); skips without it, as ``test_mpi_ulfm.py`` does.
"""

from __future__ import annotations

import sys
import time

import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")

from test_mpi_ulfm import FLAGS, ROUND, open_mpi, run_job  # noqa: E402  (the ULFM job runner)

pytestmark = pytest.mark.tooling

DIES_IN_ADMISSION = '''
import os, signal, sys
from mpi4py import MPI
import diloco.core.executors as executors
import diloco.core.membership as membership
import diloco.tools.cli.mpi as backend

original = MPI.Comm.Get_parent() == MPI.COMM_NULL  # not a replacement
if original and MPI.COMM_WORLD.rank == 1:  # killed during the inner steps of round ROUND
    real, calls = executors.inner_train_worker, []

    def dies(*args, **kwargs):
        calls.append(None)
        if len(calls) == ROUND:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    executors.inner_train_worker = dies
if original and MPI.COMM_WORLD.rank == 2:  # killed as the admission of worker 1's replacement begins
    def admit(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    membership.Membership.admit = admit
sys.exit(backend.main(sys.argv[1:]))
'''.replace("ROUND", str(ROUND))


def test_a_death_during_the_admission_ends_the_job_within_the_round_timeout(tmp_path):
    prefix = open_mpi()
    (tmp_path / "dies.py").write_text(DIES_IN_ADMISSION)
    began = time.monotonic()
    done = run_job(prefix, tmp_path, sys.executable, "dies.py", *FLAGS, "--survive-failures", "--replace-failed",
                   "--round-timeout", "5", "--json", "run.json", timeout=120)
    took = time.monotonic() - began
    assert done.returncode != 0, "the job cannot finish: every worker but one died"
    assert "rank 0 failed" in done.stderr, done.stderr
    assert not (tmp_path / "run.json").exists()
    print(f"the job ended in {took:.1f} s, status {done.returncode}")
