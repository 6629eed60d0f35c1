"""``diloco plot RUN_DIR``: pictures of a finished, an interrupted and a study folder, and ``--follow``.

Also what the pictures say: a title naming every setting that differs from the defaults, as
its flag, and log axes where the data spans decades (the table-2 panel whose arms run 5,000
and 40,000 steps).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from cli_helpers import TINY, only_run_dir, run_cli

from diloco import DiLoCoConfig
from diloco.tools.cli import commands
from diloco.tools.cli.plot_command import run_title

pytest.importorskip("matplotlib")
PICTURES = ["heldout_vs_bytes.png", "heldout_vs_round.png"]


def pictures(folder):
    return sorted(p.name for p in folder.glob("*.png"))


def test_a_finished_run_is_plotted_again_from_its_folder(tmp_path, capsys):
    status, _, err = run_cli(["compare", *TINY, "--no-plots", "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    assert pictures(run_dir) == []
    status, out, err = run_cli(["plot", run_dir], capsys)
    assert status == 0, err
    assert pictures(run_dir) == PICTURES and "heldout_vs_round.png" in out
    assert all((run_dir / name).stat().st_size > 10_000 for name in PICTURES)


def test_an_interrupted_run_is_plotted_from_its_finished_rounds(tmp_path, capsys, monkeypatch):
    real_train = commands.train_resumable

    def interrupted(algo, *args, on_round=None, **kwargs):
        def then_stop(record):
            on_round(record)
            if record["round"] == 2:
                raise KeyboardInterrupt

        return real_train(algo, *args, on_round=then_stop, **kwargs)

    monkeypatch.setattr(commands, "train_resumable", interrupted)
    status, _, _ = run_cli(["train", "--rounds", "5", "-H", "2", "-K", "2", "--hidden-sizes", "8", "-q",
                            "--runs-dir", tmp_path], capsys)
    run_dir = only_run_dir(tmp_path)
    assert status == 130 and pictures(run_dir) == []  # an interrupted run draws nothing itself
    monkeypatch.undo()
    status, _, err = run_cli(["plot", run_dir], capsys)
    assert status == 0, err
    assert pictures(run_dir) == PICTURES


def test_a_study_folder_is_plotted(tmp_path, capsys):
    argv = ["study", "inner-steps", "--seeds", "2", "--total-steps", "4", "--values", "1,4", "-K", "2",
            "--hidden-sizes", "8", "--batch-size", "8", "-q", "--no-plots", "--runs-dir", tmp_path]
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    status, _, err = run_cli(["plot", run_dir], capsys)
    assert status == 0, err
    assert pictures(run_dir) == ["study.png", "study_curves.png"]


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing", "no run folder"),
    (lambda d: d, "is not a run folder (no config.json)"),
])
def test_a_wrong_folder_is_one_line(make, message, tmp_path, capsys):
    status, _, err = run_cli(["plot", make(tmp_path)], capsys)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_run_with_no_round_yet_says_so(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"command": "train", "algorithms": ["diloco"],
                                                      "config": DiLoCoConfig().to_dict(), "data": {"name": "x"}}))
    status, _, err = run_cli(["plot", tmp_path], capsys)
    assert status == 2 and "no finished round to draw yet" in err


@pytest.mark.slow
def test_follow_redraws_while_the_run_trains_and_stops_when_it_ends(tmp_path):
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    train = subprocess.Popen([sys.executable, "-m", "diloco", "train", "--rounds", "100000", "-K", "2", "-H", "5",
                              "--hidden-sizes", "8", "-q", "--no-plots", "--runs-dir", tmp_path], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    follow = None
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("*/history.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.05)
        run_dir = only_run_dir(tmp_path)
        follow = subprocess.Popen([sys.executable, "-m", "diloco", "plot", run_dir, "--follow", "--every", "0.2"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        while not (run_dir / "heldout_vs_round.png").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        first = (run_dir / "heldout_vs_round.png").stat().st_mtime_ns
        while (run_dir / "heldout_vs_round.png").stat().st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(0.05)  # drawn again as new rounds come in
        train.send_signal(signal.SIGTERM)
        train.wait(timeout=60)
        out, err = follow.communicate(timeout=60)
    finally:
        train.kill()
        if follow is not None:
            follow.kill()
    assert follow.returncode == 0, err
    lines = out.strip().splitlines()
    assert len(lines) >= 3 and lines[-1] == f"the run ended (interrupted); pictures in {run_dir}", out
    assert pictures(run_dir) == PICTURES


def test_the_title_names_what_differs_from_the_defaults():
    base = {"name": "digits"}
    assert run_title(DiLoCoConfig(), base) == "digits, K=8, H=50"
    changed = DiLoCoConfig(num_workers=4, hidden_sizes=(64, 32), inner_optimizer="muon", seed=3).replace(
        family={"comm_dtype": "fp4", "error_feedback": True}, asynchrony={"asynchronous": True})
    assert run_title(changed, base) == ("digits, K=4, H=50, --hidden-sizes 64,32, --inner-optimizer muon, "
                                        "--comm-dtype fp4, --error-feedback, --async")


def test_a_curve_panel_spanning_decades_gets_log_axes():
    from diloco.tools.studies.paper_command import plot_paper_study

    def row(arm, steps, start):
        curve = [[s, start / (1 + s / 500)] for s in range(50, steps + 1, 50)]
        return {"arm": arm, "algo": "diloco", "curve": curve, "eval_loss": {"mean": 0.5, "half_width": 0.1}}

    summary = {"task": "mnist1d", "reference": "Table 2", "title": "t", "seeds": [0, 1], "steps_per_worker": 5000,
               "rows": [row("DiLoCo", 5000, 2.0), row("8x updates", 40000, 2.0)]}
    curves = plot_paper_study(summary).axes[0]
    assert curves.get_xscale() == "log" and curves.get_yscale() == "log"
    summary["rows"] = [row("DiLoCo", 500, 1.0)]  # 50..500 steps, loss 0.91..0.5: linear is readable
    curves = plot_paper_study(summary).axes[0]
    assert curves.get_xscale() == "linear" and curves.get_yscale() == "linear"


def test_follow_on_a_finished_study_draws_and_ends_at_once(tmp_path, capsys):
    """The beyond-DiLoCo and paper studies write summary.json once, at the end, without a status."""
    status, _, err = run_cli(["study", "async", "--data", "digits", "--seeds", "2", "--rounds", "1", "-H", "2", "-K",
                              "2", "--hidden-sizes", "8", "--batch-size", "8", "-q", "--no-plots",
                              "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    status, out, err = run_cli(["plot", run_dir, "--follow", "--every", "0.05"], capsys)
    assert status == 0, err
    assert out.strip().splitlines()[-1] == f"the run ended (completed); pictures in {run_dir}"
    assert pictures(run_dir) == ["study.png"]
