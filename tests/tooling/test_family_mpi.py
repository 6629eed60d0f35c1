"""The family on real MPI ranks (diloco.core.trainers.train_family_mpi): equal to the simulation, bytes counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")

from cli_helpers import mpiexec  # noqa: E402

from diloco import DiLoCoConfig  # noqa: E402
from diloco.config.sections import FamilyConfig  # noqa: E402
from diloco.core.trainers import train_family  # noqa: E402
from diloco.data import load_digits_split  # noqa: E402

# Each rank trains, then rank 0 writes every rank's record of bytes sent and the params.
SCRIPT = """
import json, sys
import numpy as np
from mpi4py import MPI
from diloco import DiLoCoConfig
from diloco.data import load_digits_split
from diloco.config.sections import FamilyConfig
from diloco.core.trainers import train_family_mpi

comm = MPI.COMM_WORLD
config = DiLoCoConfig.from_dict(json.loads(sys.argv[1]))
family = FamilyConfig.from_dict(json.loads(sys.argv[2]))
data = load_digits_split(seed=0)
result = train_family_mpi(data.x_train, data.y_train, config, comm, family, x_eval=data.x_test, y_eval=data.y_test)
sent = comm.gather([r["mpi_allreduce_bytes"] for r in result.history])
if comm.rank == 0:
    np.savez(sys.argv[3] + ".npz", **result.params)
    json.dump({"sent": sent, "history": result.history}, open(sys.argv[3] + ".json", "w"))
"""




def run(processes: int, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([mpiexec(), "-n", str(processes), sys.executable, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


CASES = {
    "fp4 blocks, 3 fragments": FamilyConfig(comm_dtype="fp4", comm_block=8, fragments=3, overlap=1, mix=0.5),
    "int8 per tensor, pruned, error feedback": FamilyConfig(comm_dtype="int8", comm_block=0, sign_prune=0.5,
                                                            error_feedback=True),
    "raw float64, 2 fragments": FamilyConfig(fragments=2),
    "raw float64, 2 fragments, overlap 2 (in flight)": FamilyConfig(fragments=2, overlap=2),
    "eager, bfloat16": FamilyConfig(eager=True, comm_dtype="bfloat16"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_ranks_compute_the_simulation_bit_for_bit_and_record_the_bytes_they_sent(name, tmp_path):
    family, processes = CASES[name], 3
    config = DiLoCoConfig(num_workers=processes, inner_steps=4, rounds=2, hidden_sizes=(8, 8), iid=False, seed=3)
    (tmp_path / "run.py").write_text(SCRIPT, encoding="utf-8")
    done = run(processes, "run.py", json.dumps(config.to_dict()), json.dumps(family.to_dict()), "out",
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = load_digits_split(seed=0)
    simulated = train_family(data.x_train, data.y_train, config, family, x_eval=data.x_test, y_eval=data.y_test)
    with np.load(tmp_path / "out.npz") as params:
        for key, value in simulated.params.items():
            assert params[key].tobytes() == value.tobytes(), key
    report = json.loads((tmp_path / "out.json").read_text())
    assert [r["eval_loss"] for r in report["history"]] == [r["eval_loss"] for r in simulated.history]
    assert [r["bytes_sent"] for r in report["history"]] == [r["bytes_sent"] for r in simulated.history]
    sent = np.array(report["sent"])  # (ranks, rounds): outer-gradient bytes each rank handed MPI for the others
    modelled = np.array([r["bytes_sent"] for r in simulated.history])
    if family.comm_dtype is None:
        # Native: reduce-scatter then all-gather of the flat buffer. Rank r owns a chunk of L_r of
        # the N values: it sends N - L_r, then L_r to each of K-1 ranks; the mean over the
        # ranks is the ring model 2 (K-1)/K N b exactly, and a rank is off by < (K-2) values per sync.
        np.testing.assert_allclose(sent.mean(axis=0), modelled, rtol=1e-12)
        assert np.all(np.abs(sent - modelled) <= (processes - 2) * 8 * 2)  # 2 fragments a round
    else:
        # Encoded: every payload all-gathered as its bytes, K-1 copies of each rank's own,
        # where the model (bytes_sent) reduce-scatters them: (K-1)/K (payload + reduced).
        assert np.all(sent.mean(axis=0) >= modelled)


def test_the_mpi_command_takes_the_family_flags(tmp_path):
    flags = ("--rounds", "2", "-H", "4", "--hidden-sizes", "8,8", "--seed", "2", "--comm-dtype", "fp4",
             "--fragments", "2", "--overlap", "1")
    done = run(2, "-m", "diloco.tools.cli.mpi", *flags, "--save-params", "params.npz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = load_digits_split(seed=0)
    config = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=2, hidden_sizes=(8, 8), seed=2)
    family = FamilyConfig(comm_dtype="fp4", fragments=2, overlap=1)
    simulated = train_family(data.x_train, data.y_train, config, family)
    with np.load(tmp_path / "params.npz") as params:
        assert all(params[k].tobytes() == v.tobytes() for k, v in simulated.params.items())


# Rank 0 logs, in order, each reduce-scatter posted, each batch of inner steps run and each wait.
ORDER = """
import json, sys
from mpi4py import MPI
import diloco.core.executors as executors
import diloco.tools.cli.mpi as backend

events, cls = [], executors.MPIExecutor
post, run, finish = cls._post_reduce_scatter, cls.run, cls._finish
cls._post_reduce_scatter = lambda self, *a: (events.append("post"), post(self, *a))[1]
cls.run = lambda self, rngs, steps, workers=None: (events.append(steps), run(self, rngs, steps, workers))[1]
cls._finish = lambda self, *a: (events.append("wait"), finish(self, *a))[1]
status = backend.main(sys.argv[1:])
if MPI.COMM_WORLD.rank == 0:
    json.dump(events, open("events.json", "w"))
sys.exit(status)
"""


@pytest.mark.parametrize("tau", [2, 0])
def test_with_overlap_the_all_reduce_is_waited_at_the_merge_tau_steps_after_it_started(tau, tmp_path):
    """Streaming DiLoCo's all-reduce stays in flight while the workers take tau inner steps (the
    reduce-scatter posted at the sync, waited at the merge), not waited at the sync."""
    (tmp_path / "order.py").write_text(ORDER, encoding="utf-8")
    flags = ("--rounds", "2", "-H", "4", "--hidden-sizes", "8,8", "--fragments", "2", "--overlap", str(tau))
    done = run(2, "order.py", *flags, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = json.loads((tmp_path / "events.json").read_text())
    steps_in_flight = []  # inner steps run between each post and its wait (the n-th wait is the n-th post's)
    for n, i in enumerate(i for i, e in enumerate(events) if e == "post"):
        until = [j for j, e in enumerate(events) if e == "wait"][n]
        steps_in_flight.append(sum(e for e in events[i:until] if isinstance(e, int)))
    # fragment 0 syncs after step 2 and is waited tau steps later; fragment 1 syncs at the round's end,
    # where the record's held-out evaluation needs the global model: waited at once
    assert steps_in_flight == [tau, 0, tau, 0], events


def test_a_family_setting_that_does_not_fit_is_one_line_and_exit_2(tmp_path):
    done = run(2, "-m", "diloco.tools.cli.mpi", "--fragments", "3", "--rounds", "1", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "diloco.tools.cli.mpi: error: fragments (3) must not exceed the model's layers (2, from hidden_sizes (128,))"]
