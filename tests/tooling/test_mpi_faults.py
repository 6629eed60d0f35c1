"""The MPI backend under faults: a raising rank, a stopped rank, a killed rank, divergence.

No fault may hang the job. Each test runs the real ``mpiexec`` on a small wrapper
(``fault_rank.py``, written to the test's folder) that injects the fault into one rank's
``inner_train_worker`` call of a chosen round, then runs ``diloco.tools.cli.mpi.main``. The
job runs in its own process group, killed at the end whatever happens, and under a
timeout far above what a working fault path needs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")

from cli_helpers import mpiexec  # noqa: E402

FLAGS = ("--rounds", "3", "-H", "2", "--hidden-sizes", "8", "--batch-size", "8")

WRAPPER = '''
import os, signal, sys
from mpi4py import MPI
import diloco.core.executors as executors
import diloco.tools.cli.mpi as backend

mode, failing_rank, failing_round = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if MPI.COMM_WORLD.rank == failing_rank:
    real, calls = executors.inner_train_worker, []

    def faulty(*args, **kwargs):
        calls.append(None)
        if len(calls) == failing_round:
            if mode == "raise":
                raise RuntimeError("injected fault")
            if mode == "memory":
                raise MemoryError()
            os.kill(os.getpid(), {"stop": signal.SIGSTOP, "kill": signal.SIGKILL}[mode])
        return real(*args, **kwargs)

    executors.inner_train_worker = faulty
sys.exit(backend.main(sys.argv[4:]))
'''


def run_job(tmp_path: Path, processes: int, *argv: str, wrapper: bool = True, limit: float = 120.0):
    """Run the job; return (exit status, stdout, stderr, seconds). Never leaves a process behind."""
    script = tmp_path / "fault_rank.py"
    script.write_text(WRAPPER)
    target = [str(script)] if wrapper else ["-m", "diloco.tools.cli.mpi"]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.Popen([mpiexec(), "-n", str(processes), sys.executable, *target, *argv], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the MPI job hung for {limit} s:\n{out}\n{err}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # a stopped rank must not outlive the test
        except ProcessLookupError:
            pass
    return proc.returncode, out, err, time.monotonic() - start


def test_an_exception_on_one_rank_aborts_the_job_with_its_message(tmp_path):
    status, out, err, _ = run_job(tmp_path, 2, "raise", "1", "2", *FLAGS)
    assert status != 0
    assert "rank 1 failed: RuntimeError: injected fault; aborting the job" in err
    assert "Traceback" not in err


def test_memory_error_on_one_rank_aborts_the_job(tmp_path):
    status, _, err, _ = run_job(tmp_path, 3, "memory", "2", "1", *FLAGS)
    assert status != 0 and "rank 2 failed: MemoryError; aborting the job" in err


@pytest.mark.parametrize("family", [[], ["--comm-dtype", "fp4", "--fragments", "2", "--hidden-sizes", "8,8"]],
                         ids=["diloco", "family"])
def test_a_stopped_rank_ends_the_job_after_the_round_timeout(family, tmp_path):
    """Rank 1 freezes (SIGSTOP) in round 2: rank 0 waits --round-timeout seconds, then aborts.

    With the family's flags too (they used to run on a path that ignored --round-timeout and hung)."""
    status, out, err, seconds = run_job(tmp_path, 2, "stop", "1", "2", *FLAGS, *family, "--round-timeout", "2")
    assert status != 0
    # the second inner phase: round 2 of DiLoCo, the second fragment's segment of round 1 with P = 2
    where = "round 1" if family else "round 2"
    assert f"rank 0: a collective of {where} did not complete within 2 s (--round-timeout)" in err
    assert "aborting the job" in err
    assert seconds < 60


def test_a_killed_rank_ends_the_job(tmp_path):
    """Rank 1 dies (SIGKILL) in round 2: the job ends, never hangs, and says so."""
    status, out, err, seconds = run_job(tmp_path, 2, "kill", "1", "2", *FLAGS, "--round-timeout", "5")
    assert status != 0
    assert "DiLoCo on" not in out
    assert "signal 9" in out + err or "did not complete within 5 s" in err
    assert seconds < 60


def test_divergence_stops_every_rank_with_the_guards_message(tmp_path):
    status, _, err, _ = run_job(tmp_path, 2, *FLAGS, "--lr", "50", "--outer-lr", "50", "--rounds", "8",
                                "--json", "run.json", wrapper=False)
    assert status == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "DiLoCo diverged in round" in lines[0], err
    assert "RuntimeWarning" not in err and not (tmp_path / "run.json").exists()


def test_json_is_strict_and_written_atomically(tmp_path):
    status, _, err, _ = run_job(tmp_path, 2, *FLAGS, "--json", "run.json", "--save-params", "params.npz",
                                wrapper=False)
    assert status == 0, err
    text = (tmp_path / "run.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fault_rank.py", "params.npz", "run.json"]  # no temp files


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_round_timeout_is_refused_in_one_line(tmp_path, value):
    status, _, err, _ = run_job(tmp_path, 1, "--round-timeout", value, wrapper=False)
    assert status == 2 and "--round-timeout" in err and "Traceback" not in err
