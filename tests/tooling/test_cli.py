"""The ``diloco`` command line: compare / train / study, run folders, data options, errors.

Most tests call ``diloco.tools.cli.main.main`` in-process with tiny configs; one runs the real
``python -m diloco`` in a subprocess. Every user error must print exactly one line on
stderr and exit with status 2; a Ctrl-C must keep what was already written.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import TINY, only_run_dir, run_cli

from diloco.data import load_npz_dataset
from diloco.tools.cli import commands
from diloco.tools.cli.invocation import program
from diloco.tools.runs.folders import HISTORY_FIELDS, read_jsonl
from diloco.tools.studies import ablations as studies


def test_compare_writes_run_folder_with_plots(tmp_path, capsys):
    status, out, err = run_cli(["compare", *TINY, "--runs-dir", tmp_path, "--name", "demo"], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    assert run_dir.name.endswith("-demo")
    names = {p.name for p in run_dir.iterdir()}
    assert {"config.json", "environment.json", "history.jsonl", "summary.json",
            "heldout_vs_round.png", "heldout_vs_bytes.png"} <= names
    for png in ("heldout_vs_round.png", "heldout_vs_bytes.png"):
        assert (run_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    history = read_jsonl(run_dir / "history.jsonl")
    assert [(r["algo"], r["round"]) for r in history] == [("diloco", 1), ("diloco", 2), ("sync", 1), ("sync", 2)]
    for record in history:
        assert set(HISTORY_FIELDS) <= set(record)
        assert 0.0 <= record["eval_accuracy"] <= 1.0 and record["time"] >= 0.0
    assert history[1]["cumulative_bytes"] * 3 == pytest.approx(history[3]["cumulative_bytes"])  # H = 3

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["communication"]["savings_factor"] == pytest.approx(3.0)
    assert summary["algorithms"]["diloco"]["all_reduces"] == 2
    assert summary["algorithms"]["sync"]["all_reduces"] == 6
    config = json.loads((run_dir / "config.json").read_text())
    assert config["config"]["num_workers"] == 2 and config["data"]["name"] == "digits"
    environment = json.loads((run_dir / "environment.json").read_text())
    assert environment["seed"] == 0 and environment["packages"]["numpy"] == np.__version__

    # The final table: both algorithms, the savings factor and the run folder.
    assert "DiLoCo" in out and "sync" in out and "3x" in out and str(run_dir) in out


def test_train_flags_override_config_file(tmp_path, capsys):
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({"num_workers": 3, "rounds": 5, "inner_steps": 2, "hidden_sizes": [8],
                                       "inner": {"lr": 0.01}}))
    status, _, err = run_cli(["train", "--algo", "sync", "--config", config_file, "--rounds", "2", "--beta1", "0.8",
                              "--runs-dir", tmp_path / "runs", "--no-plots", "-q"], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path / "runs")
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["algorithms"] == ["sync"]
    assert saved["config"]["num_workers"] == 3 and saved["config"]["rounds"] == 2
    assert saved["config"]["inner"]["lr"] == 0.01 and saved["config"]["inner"]["beta1"] == 0.8
    assert len(read_jsonl(run_dir / "history.jsonl")) == 2

    # A run folder's config.json is itself a valid --config: the run can be repeated.
    status, _, err = run_cli(["train", "--config", run_dir / "config.json", "--runs-dir", tmp_path / "again",
                              "--no-plots", "-q"], capsys)
    assert status == 0, err
    again = json.loads((only_run_dir(tmp_path / "again") / "config.json").read_text())
    assert again["config"] == saved["config"]


def test_train_noniid_float32(tmp_path, capsys):
    status, _, err = run_cli(["train", *TINY, "--noniid", "--alpha", "0.3", "--dtype", "float32", "--no-plots",
                              "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    saved = json.loads((only_run_dir(tmp_path) / "config.json").read_text())["config"]
    assert saved["iid"] is False and saved["alpha"] == 0.3 and saved["dtype"] == "float32"


def test_npz_data(tmp_path, capsys):
    rng = np.random.default_rng(0)
    images = rng.normal(size=(60, 3, 4)).astype(np.float32)  # flattened to 12 features
    labels = np.arange(60) % 3
    path = tmp_path / "blobs.npz"
    np.savez(path, x=images, y=labels)
    data = load_npz_dataset(path)
    assert data.x_train.shape[1] == 12 and len(data.y_train) + len(data.y_test) == 60
    np.savez(path, x=images, y=labels, x_test=images[:9], y_test=labels[:9])
    assert load_npz_dataset(path).x_test.shape == (9, 12)

    status, _, err = run_cli(["compare", *TINY, "--data", path, "--no-plots", "--runs-dir", tmp_path / "runs"],
                             capsys)
    assert status == 0, err
    info = json.loads((only_run_dir(tmp_path / "runs") / "config.json").read_text())["data"]
    assert info["num_train"] == 60 and info["num_test"] == 9 and info["num_features"] == 12


def _bad_npz(tmp_path, **arrays):
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return path


X, Y = np.zeros((10, 4)), np.arange(10) % 2


@pytest.mark.parametrize("argv, message", [
    (["compare", "--bogus"], "unrecognized arguments: --bogus"),
    (["compare", "--rounds", "abc"], "invalid int value: 'abc'"),
    (["compare", "--rounds", "0"], "--rounds must be a positive int"),
    (["compare", "--outer-momentum", "1.5"], "--outer-momentum must be < 1.0"),
    (["compare", "--hidden-sizes", "a,b"], "--hidden-sizes must be comma-separated integers"),
    (["train", "--algo", "adam"], "invalid choice: 'adam'"),
    (["study", "nonsense"], "invalid choice: 'nonsense'"),
    (["study", "inner-steps", "--values", "1,7", "--total-steps", "20"], "multiple of every H"),
    (["study", "workers", "--total-steps", "20"], "--total-steps applies only to the inner-steps study"),
    (["compare", "--data", "no/such/file.npz"], "no such file: no/such/file.npz"),
    (["compare", "--data", "imagenet"], "--data must be digits, mnist1d"),
    (["train", "--config", "no/such/config.json"], "config file not found"),
    (["compare", *TINY, "-K", "5000"], "K=5000 workers but only 1438 training examples"),
])
def test_usage_errors_print_one_line_and_exit_2(argv, message, tmp_path, capsys):
    status, out, err = run_cli([*argv, "--runs-dir", tmp_path], capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("diloco") and "error:" in lines[0] and message in lines[0], lines[0]


@pytest.mark.parametrize("content, message", [
    ("{not json", "cannot read config file"),
    ('{"num_workers": 2, "wormers": 3}', "unknown field(s) ['wormers']"),
    ('{"inner": {"lr": -1}}', "inner.lr must be > 0"),
    ("[1, 2]", "must hold a JSON object"),
])
def test_bad_config_file(content, message, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(content)
    status, _, err = run_cli(["train", "--config", path, "--runs-dir", tmp_path], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("arrays, message", [
    (dict(y=Y), "missing array(s) ['x']"),
    (dict(x=X), "missing array(s) ['y']"),
    (dict(x=X, y=Y[:7]), "must have the same length, got 10 and 7"),
    (dict(x=np.where(np.eye(10, 4) > 0, np.nan, 0.0), y=Y), "only finite values"),
    (dict(x=X, y=Y.astype(np.float64)), "must hold integer class labels"),
    (dict(x=X.astype(str), y=Y), "must hold real numbers"),
    (dict(x=X[:, 0], y=Y), "must be 2-D"),
    (dict(x=X, y=-Y), "non-negative class labels"),
    (dict(x=X, y=Y, x_test=X), "'x_test' and 'y_test' must be given together"),
    (dict(x=X, y=Y, x_test=X[:, :3], y_test=Y), "must have 4 features"),
    (dict(x=X, y=Y, labels=Y), "unknown array(s) ['labels']"),
])
def test_malformed_npz(arrays, message, tmp_path, capsys):
    path = _bad_npz(tmp_path, **arrays)
    status, _, err = run_cli(["compare", "--data", path, "--runs-dir", tmp_path / "runs"], capsys)
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "runs").exists()  # nothing written before the data is known good


def test_not_an_npz(tmp_path, capsys):
    path = tmp_path / "garbage.npz"
    path.write_bytes(b"this is not a zip archive")
    status, _, err = run_cli(["compare", "--data", path, "--runs-dir", tmp_path], capsys)
    assert status == 2 and "not a readable .npz archive" in err and len(err.strip().splitlines()) == 1


def test_ctrl_c_keeps_what_was_written(tmp_path, capsys, monkeypatch):
    """A KeyboardInterrupt in the baseline's third round: DiLoCo's four rounds and the
    baseline's two finished rounds stay on disk, config and environment are intact."""
    real_train = commands.train_resumable

    def interrupted_sync(algo, *args, on_round=None, **kwargs):
        def on_round_then_interrupt(record):
            if algo == "sync" and record["round"] == 3:
                raise KeyboardInterrupt
            on_round(record)

        return real_train(algo, *args, on_round=on_round_then_interrupt, **kwargs)

    monkeypatch.setattr(commands, "train_resumable", interrupted_sync)
    argv = ["compare", "--rounds", "4", "-H", "2", "-K", "2", "--hidden-sizes", "8", "-q", "--runs-dir", tmp_path]
    status, _, err = run_cli(argv, capsys)
    run_dir = only_run_dir(tmp_path)
    assert status == 130 and err.startswith("diloco compare: interrupted by SIGINT; diloco complete, sync round 2 of "
                                            f"4 saved; continue with: {program()} compare --resume {run_dir}"), err
    assert (run_dir / "checkpoints" / "sync-round000002.json").is_file()  # the last finished round, kept
    history = read_jsonl(run_dir / "history.jsonl")
    assert [(r["algo"], r["round"]) for r in history] == [("diloco", i) for i in (1, 2, 3, 4)] + [("sync", 1),
                                                                                                  ("sync", 2)]
    assert (run_dir / "history.jsonl").read_text().endswith("\n")  # no torn line
    assert json.loads((run_dir / "config.json").read_text())["config"]["rounds"] == 4
    assert json.loads((run_dir / "environment.json").read_text())["seed"] == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["algorithms"]["sync"]["rounds_completed"] == 2
    assert not list(run_dir.glob("*.png"))


def test_study_writes_table_results_and_plots(tmp_path, capsys):
    argv = ["study", "inner-steps", "--seeds", "2", "--total-steps", "4", "--values", "1,4", "-K", "2",
            "--hidden-sizes", "8", "--batch-size", "8", "-q", "--runs-dir", tmp_path]
    status, out, err = run_cli(argv, capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    results = read_jsonl(run_dir / "results.jsonl")
    assert [(r["variant"], r["seed"]) for r in results] == [
        ("H=1", 0), ("H=1", 1), ("H=4", 0), ("H=4", 1), ("sync", 0), ("sync", 1)]
    assert [r["all_reduces"] for r in results[::2]] == [4, 1, 4]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert [row["variant"] for row in summary["rows"]] == ["H=1", "H=4", "sync"]
    table = (run_dir / "study.md").read_text()
    assert "| H=4 | diloco |" in table and "95% CI" in table
    assert (run_dir / "study.png").exists() and (run_dir / "study_curves.png").exists()
    history = read_jsonl(run_dir / "history.jsonl")
    assert {(r["variant"], r["seed"]) for r in history} == {(r["variant"], r["seed"]) for r in results}
    assert "| H=1 | diloco |" in out


@pytest.mark.parametrize("name, values", [("outer-optimizer", "nesterov,fedavg"), ("noniid", "0.5"),
                                          ("workers", "1,2")])
def test_other_studies_run(name, values, tmp_path, capsys):
    argv = ["study", name, "--seeds", "1", "--values", values, "--rounds", "1", "-H", "2", "-K", "2",
            "--hidden-sizes", "8", "--no-plots", "-q", "--runs-dir", tmp_path]
    status, out, err = run_cli(argv, capsys)
    assert status == 0, err
    rows = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())["rows"]
    expected = {"outer-optimizer": 6, "noniid": 4, "workers": 2}[name]
    assert len(rows) == expected


def test_mean_interval():
    stats = studies.mean_interval([1.0, 2.0, 3.0])
    assert stats["mean"] == 2.0
    assert stats["half_width"] == pytest.approx(4.303 * 1.0 / np.sqrt(3))
    assert studies.mean_interval([0.5])["half_width"] == 0.0
    assert studies.t_quantile_975(30) == 2.042
    assert studies.t_quantile_975(60) == pytest.approx(2.000, abs=2e-3)
    assert studies.t_quantile_975(1000) == pytest.approx(1.962, abs=1e-3)


def test_mnist1d_generated_locally_and_cached(tmp_path, monkeypatch):
    pytest.importorskip("mnist1d")
    from diloco.data import load_mnist1d

    data = load_mnist1d(cache_dir=tmp_path, num_samples=200)
    assert data.x_train.shape == (160, 40) and data.x_test.shape == (40, 40)
    assert set(np.unique(data.y_train)) <= set(range(10))
    cached = tmp_path / "mnist1d-n200-seed42.npz"
    assert cached.is_file()
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)  # the cache alone must suffice now
    again = load_mnist1d(cache_dir=tmp_path, num_samples=200)
    np.testing.assert_array_equal(again.x_train, data.x_train)


def test_mnist1d_missing_extra_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mnist1d.data", None)  # as if the extra were not installed
    status, _, err = run_cli(["compare", "--data", "mnist1d", "--cache-dir", tmp_path, "--runs-dir", tmp_path],
                             capsys)
    assert status == 2 and "pip install 'diloco[mnist1d]'" in err and len(err.strip().splitlines()) == 1


def test_python_dash_m_diloco_subprocess(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "diloco", "train", "--algo", "diloco", *TINY, "--no-plots",
                         "--runs-dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "run folder:" in ok.stdout and len(read_jsonl(only_run_dir(tmp_path) / "history.jsonl")) == 2

    bad = subprocess.run([sys.executable, "-m", "diloco", "compare", "--bogus"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unrecognized arguments" in bad.stderr


def test_resuming_a_completed_run_says_it_is_complete_and_writes_nothing(tmp_path, capsys):
    status, out, err = run_cli(["compare", *TINY, "--no-plots", "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}
    table = [line for line in out.splitlines() if re.match(r"(DiLoCo|sync) +\d", line)]  # the table's rows
    status, again, err = run_cli(["compare", "--resume", run_dir], capsys)
    assert status == 0, err
    assert again.startswith(f"{run_dir} is already complete (diloco 2 of 2 rounds, sync 2 of 2 rounds): "
                            f"nothing to resume. Its results:"), again
    assert [line for line in again.splitlines() if re.match(r"(DiLoCo|sync) +\d", line)] == table  # its wall time
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != ".lock"}
    assert after == before
