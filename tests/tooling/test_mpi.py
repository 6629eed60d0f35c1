"""The MPI backend: K real processes give the single-process simulation's result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")

from cli_helpers import mpiexec, only_run_dir, run_cli  # noqa: E402

from diloco import DiLoCoConfig, train_diloco  # noqa: E402
from diloco.core.driver import train  # noqa: E402
from diloco.data import load_digits_split  # noqa: E402
from diloco.tools.cli.flags import build_config  # noqa: E402
from diloco.tools.cli.main import build_parser  # noqa: E402


def run_mpi(processes: int, *flags: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [mpiexec(), "-n", str(processes), sys.executable, "-m", "diloco.tools.cli.mpi", *flags],
        cwd=cwd, capture_output=True, text=True, timeout=300, env=env,
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


def test_an_mpi_run_is_rerun_from_its_config_json(tmp_path, capsys):
    """``--run-dir`` keeps the run's config.json (algorithm, guard, data split and config, not only the
    defaults): this tool's ``--config`` and ``diloco train --config`` both run it again, bit for bit."""
    flags = ("--algo", "sync", "--rounds", "2", "-H", "3", "--hidden-sizes", "8", "--seed", "5", "--split-seed", "3",
             "--max-loss", "40", "--lr", "0.05")
    first = run_mpi(2, *flags, "--run-dir", "first", "--json", "first.json", "--save-params", "first.npz",
                    cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    record = json.loads((tmp_path / "first" / "config.json").read_text())
    assert record["command"] == "train" and record["algorithms"] == ["sync"] and record["max_loss"] == 40
    assert record["data"]["split_seed"] == 3 and record["config"]["inner"]["lr"] == 0.05
    assert record["config"]["num_workers"] == 2 and record["config"]["seed"] == 5
    assert [p.name for p in (tmp_path / "first").iterdir()] == ["config.json"]  # no temporary file left

    again = run_mpi(2, "--config", "first/config.json", "--run-dir", "again", "--save-params", "again.npz",
                    cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "the synchronous baseline on 2 MPI processes" in again.stdout  # the algorithm came from the record
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == record
    with np.load(tmp_path / "first.npz") as want, np.load(tmp_path / "again.npz") as got:
        assert list(got) == list(want) and all(got[k].tobytes() == want[k].tobytes() for k in want)

    status, _, err = run_cli(["train", "--config", tmp_path / "first" / "config.json", "--runs-dir",
                              tmp_path / "runs", "--no-plots", "-q"], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path / "runs")
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["algorithms"] == ["sync"] and saved["max_loss"] == 40 and saved["config"] == record["config"]
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    mpi_history = json.loads((tmp_path / "first.json").read_text())["history"]
    assert [r["eval_loss"] for r in history] == [r["eval_loss"] for r in mpi_history]
    assert [r["worker_losses"] for r in history] == [r["worker_losses"] for r in mpi_history]


def test_the_mpi_tool_never_overwrites_a_run_record(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.json").write_text("{}")
    done = run_mpi(2, "--rounds", "1", "-H", "2", "--run-dir", "taken", cwd=tmp_path)
    assert done.returncode == 2
    assert "--run-dir taken already holds a config.json" in done.stderr and "Traceback" not in done.stderr
    assert (tmp_path / "taken" / "config.json").read_text() == "{}"


SLOW_RANK = '''
import sys, time
from pathlib import Path
from mpi4py import MPI
import diloco.tools.cli.mpi as backend

if MPI.COMM_WORLD.rank == 1:  # this rank sets up only once rank 0 has written the record
    real = backend._setup

    def setup(*args, **kwargs):
        record, waited = Path("record") / "config.json", 0.0
        while not record.exists() and waited < 60:
            time.sleep(0.05)
            waited += 0.05
        return real(*args, **kwargs)

    backend._setup = setup
sys.exit(backend.main(sys.argv[1:]))
'''


def test_a_rank_that_sets_up_after_the_record_is_written_still_trains(tmp_path):
    """Only worker 0 decides on ``--run-dir`` and tells the others: a rank that reached its set-up after
    the record existed used to refuse the folder on its own and leave the others waiting in round 1."""
    (tmp_path / "slow.py").write_text(SLOW_RANK)
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "slow.py", "--rounds", "2", "-H", "2",
                           "--run-dir", "record", "--round-timeout", "20", "--json", "run.json"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(json.loads((tmp_path / "run.json").read_text())["history"]) == 2


# --- a plugin's parts in every rank: --plugin (tests/tooling/plugins: Lion, random-k) ---

PLUGIN_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent),
                                                           os.environ.get("PYTHONPATH", "")])}
PLUGGED = [("--inner-optimizer", "lion", "--compress", "randk:fraction=0.5", "--error-feedback"),
           ("--algo", "sync", "--inner-optimizer", "lion")]


@pytest.mark.parametrize("flags", PLUGGED, ids=["lion-randk", "sync-lion"])
def test_the_mpi_command_loads_a_plugin_in_every_rank_and_runs_it_bit_for_bit(flags, tmp_path):
    """``--plugin plugins.enable`` registers Lion and random-k in each rank before the flags are read;
    the ranks' run equals the single-process run with the plugin registered, bit for bit."""
    import plugins

    base = ("--rounds", "2", "-H", "3", "--hidden-sizes", "8", "--seed", "1")
    done = run_mpi(2, "--plugin", "plugins.enable", *base, *flags, "--save-params", "params.npz", cwd=tmp_path,
                   env=PLUGIN_ENV)
    assert done.returncode == 0, done.stderr
    plugins.register()
    try:
        train_flags = [f for f in flags if f not in ("--algo", "sync")]
        args = build_parser().parse_args(["train", "-K", "2", *base, *train_flags])
        data = load_digits_split(0)
        want = train("sync" if "sync" in flags else "diloco", data.x_train, data.y_train, build_config(args),
                     x_eval=data.x_test, y_eval=data.y_test)
        plain = train("diloco", data.x_train, data.y_train, build_config(build_parser().parse_args(
            ["train", "-K", "2", *base])), x_eval=data.x_test, y_eval=data.y_test)
    finally:
        plugins.unregister()
    with np.load(tmp_path / "params.npz") as saved:
        assert all(saved[k].tobytes() == v.tobytes() for k, v in want.params.items())
        assert any(saved[k].tobytes() != v.tobytes() for k, v in plain.params.items()), "the plugin changed nothing"


@pytest.mark.parametrize("flags, message", [
    (("--inner-optimizer", "lion"), "argument --inner-optimizer: invalid choice: 'lion'"),
    (("--plugin", "plugins.no_such_plugin", "--inner-optimizer", "lion"),
     "cannot load --plugin plugins.no_such_plugin: ModuleNotFoundError: No module named 'plugins.no_such_plugin'"),
], ids=["not-loaded", "missing"])
def test_a_plugin_not_loaded_is_refused_in_one_line(flags, message, tmp_path):
    done = run_mpi(2, "--rounds", "1", "-H", "2", *flags, cwd=tmp_path, env=PLUGIN_ENV)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
