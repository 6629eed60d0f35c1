"""The MPI backend: K real processes give the single-process simulation's result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")

from cli_helpers import mpiexec  # noqa: E402

from diloco import DiLoCoConfig, train_diloco  # noqa: E402
from diloco.core.driver import train  # noqa: E402
from diloco.data import load_digits_split  # noqa: E402
from diloco.tools.cli.flags import build_config  # noqa: E402
from diloco.tools.cli.main import build_parser  # noqa: E402


def run_mpi(processes: int, *flags: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [mpiexec(), "-n", str(processes), sys.executable, "-m", "diloco.tools.cli.mpi", *flags],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )


@pytest.mark.parametrize("processes", [2, 3])
def test_mpi_processes_match_the_simulation(processes, tmp_path):
    flags = ("--rounds", "3", "-H", "5", "--hidden-sizes", "16", "--seed", "4")
    done = run_mpi(processes, *flags, "--json", "run.json", "--save-params", "params.npz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"DiLoCo on {processes} MPI processes" in done.stdout

    data = load_digits_split(0)
    config = DiLoCoConfig(num_workers=processes, rounds=3, inner_steps=5, hidden_sizes=(16,), seed=4)
    expected = train_diloco(data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test)
    with np.load(tmp_path / "params.npz") as saved:
        assert list(saved.keys()) == list(expected.params)
        for key, value in expected.params.items():
            # The reduce-scatter sums each chunk of the K models in worker order, as average_params does.
            assert saved[key].tobytes() == value.tobytes(), key
    history = json.loads((tmp_path / "run.json").read_text())["history"]
    assert [r["round"] for r in history] == [1, 2, 3]
    for got, want in zip(history, expected.history, strict=True):
        assert got["all_reduces"] == want["all_reduces"] == 1
        assert got["bytes_sent"] == want["bytes_sent"]
        assert got["worker_losses"] == want["worker_losses"]
        assert got["eval_loss"] == want["eval_loss"] and got["eval_accuracy"] == want["eval_accuracy"]
        assert got["mpi_allreduce_bytes"] > 0


def test_mpi_rejects_a_worker_count_that_does_not_match_the_processes(tmp_path):
    done = run_mpi(2, "-K", "3", "--rounds", "1", cwd=tmp_path)
    assert done.returncode == 2
    assert "-K 3 does not match the 2 MPI processes" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("flags", [("--lr-schedule", "cosine", "--warmup-steps", "2"), ("--clip-norm", "0.5"),
                                   ("--drop-prob", "0.5"), ("--outer-optimizer", "adam"), ("--algo", "sync")],
                         ids=["schedule", "clip", "drop", "outer-adam", "sync"])
def test_the_mpi_command_runs_what_train_runs_bit_for_bit(flags, tmp_path):
    """Was refused after the ranks had started, with the fast engine's advice."""
    base = ("--rounds", "2", "-H", "3", "--hidden-sizes", "8", "--seed", "1")
    done = run_mpi(2, *base, *flags, "--save-params", "params.npz", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    args = build_parser().parse_args(["train", "-K", "2", *base, *(f for f in flags if f not in ("--algo", "sync"))])
    data = load_digits_split(0)
    want = train("sync" if "sync" in flags else "diloco", data.x_train, data.y_train, build_config(args),
                 x_eval=data.x_test, y_eval=data.y_test)
    with np.load(tmp_path / "params.npz") as saved:
        assert all(saved[k].tobytes() == v.tobytes() for k, v in want.params.items())
