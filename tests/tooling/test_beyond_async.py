"""Asynchronous DiLoCo in the tools: the flags in train, compare and study, ``--config``,
one-line refusals, ``diloco study async`` and the results page's generated blocks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TINY, only_run_dir, run_cli

from diloco import DiLoCoConfig
from diloco.core.driver import train
from diloco.data import load_digits_split
from diloco.tools.studies import beyond_async
from diloco.tools.studies.summaries import load_summaries

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--async", "--step-times", "1,3", "--delayed-nesterov", "2", "--dynamic-local-steps"]


def test_train_with_the_async_flags_is_the_library_run_and_its_config_round_trips(tmp_path, capsys):
    status, out, err = run_cli(["train", *TINY, *FLAGS, "--runs-dir", tmp_path / "a"], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path / "a")
    data = load_digits_split(seed=0)
    config = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=2, hidden_sizes=(8,), batch_size=8).replace(
        asynchrony={"asynchronous": True, "step_times": (1.0, 3.0), "delayed_nesterov": 2,
                    "dynamic_local_steps": True})
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["config"]["asynchrony"] == config.asynchrony.to_dict()
    expected = train("diloco", data.x_train, data.y_train, config.replace(engine=saved["config"]["engine"]),
                     x_eval=data.x_test, y_eval=data.y_test,
                     executor=saved["config"]["engine"])
    with np.load(run_dir / "params-diloco.npz") as params:
        for key, value in expected.params.items():
            np.testing.assert_allclose(params[key], value, rtol=1e-10, atol=1e-12)
    records = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert [r["arrivals"] for r in records] == [r["arrivals"] for r in expected.history]
    assert records[-1]["sim_cumulative_seconds"] == expected.history[-1]["sim_cumulative_seconds"]
    # --config restores the section (no async flag given again)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(saved["config"]))
    status, out, err = run_cli(["train", "--config", config_file, "-q", "--runs-dir", tmp_path / "b"], capsys)
    assert status == 0, err
    again = json.loads((only_run_dir(tmp_path / "b") / "config.json").read_text())
    assert again["config"]["asynchrony"] == saved["config"]["asynchrony"]


def test_compare_trains_async_diloco_against_the_plain_baseline(tmp_path, capsys):
    status, out, err = run_cli(["compare", *TINY, "--async", "--straggler", "1", "--runs-dir", tmp_path,
                                "--no-plots"], capsys)
    assert status == 0, err
    records = [json.loads(line) for line in (only_run_dir(tmp_path) / "history.jsonl").read_text().splitlines()]
    assert any("arrivals" in r for r in records if r.get("algo") == "diloco")
    assert not any("arrivals" in r for r in records if r.get("algo") == "sync")


def test_an_ablation_study_runs_with_the_async_flags(tmp_path, capsys):
    status, out, err = run_cli(["study", "workers", "--seeds", "1", "--values", "2,3", *TINY, "--async",
                                "--straggler", "0", "--no-plots", "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["config"]["asynchrony"]["asynchronous"] is True
    records = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert records and all(r["max_staleness"] > 0 for r in records if r["round"] == 1)


@pytest.mark.parametrize("argv, message", [
    (["train", "--step-times", "1,x"], "--step-times must be comma-separated seconds"),
    (["train", "--step-times", "1,2,3"], "3 times for 2 workers"),
    (["train", "--delayed-nesterov", "2"], "set asynchronous=True"),
    (["train", "--async", "--eager"], "with eager is not defined"),
    (["train", "--async", "--delayed-nesterov", "2", "--outer-optimizer", "adam"], "SGD/Nesterov outer optimizer"),
    (["train", "--algo", "sync", "--async"], "the synchronous baseline has no outer gradient"),
    (["train", "--straggler", "5"], "worker index in [0, 2)"),
    (["study", "async", "--async"], "sets --async, --delayed-nesterov and --dynamic-local-steps per arm"),
    (["study", "async", "--data", "mnist1d"], "study async runs on --data shakespeare or --data digits"),
    (["study", "async", "--seeds", "1"], "--seeds must be at least 2"),
])
def test_usage_errors_are_one_line_exit_2_and_leave_no_run_folder(argv, message, tmp_path, capsys):
    status, out, err = run_cli([*argv, *TINY, "--runs-dir", tmp_path], capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_the_async_study_runs_and_judges_the_claims(tmp_path, capsys):
    status, out, err = run_cli(["study", "async", "--data", "digits", "--seeds", "2", "--rounds", "2", "-H", "3",
                                "-K", "2", "--hidden-sizes", "8", "--batch-size", "8", "-q", "--runs-dir",
                                tmp_path / "runs", "--export", tmp_path / "export"], capsys)
    assert status == 0, err
    summary = json.loads((tmp_path / "export" / "beyond-async-digits.json").read_text())
    assert [row["arm"] for row in summary["rows"]] == [beyond_async.SYNC, beyond_async.ASYNC, beyond_async.DN,
                                                       beyond_async.DYLU]
    # T = 2 rounds of the straggler (worker 1, 4 s per step) x 3 steps = 24 simulated seconds, for every arm
    assert summary["horizon_seconds"] == 24.0
    assert all(row["sim_seconds"] == 24.0 for row in summary["rows"])
    assert len(summary["claims"]) == 4 and all(c["verdict"] in ("holds", "holds partly", "tie", "reversed")
                                               for c in summary["claims"])
    # the fast worker did 4x the straggler's steps in the same time; synchronous DiLoCo only H a round
    steps = {row["arm"]: row["steps_per_worker"] for row in summary["rows"]}
    assert steps[beyond_async.SYNC] == 6 and steps[beyond_async.ASYNC] == 24
    assert "`.venv/bin/diloco study async --data digits --seeds 2 --workers 2 --inner-steps 3 --rounds 2" in out
    assert f"--export {tmp_path / 'export'}`" in out  # the flag as it was given
    run_dir = only_run_dir(tmp_path / "runs")
    assert (run_dir / "study.png").stat().st_size > 10_000  # a picture, with the run's curves
    # every arm tuned on seed 1000 (not a reported seed): inner lr, the 12 outer pairs (then past a chosen edge,
    # one coordinate at a time, at most 2 a side), inner lr again;
    # each arm evaluated at its own argmin of the outer grid, printed under the block
    assert summary["tune_seeds"] == [1000] and not set(summary["tune_seeds"]) & set(summary["seeds"])
    for arm in summary["rows"]:
        outer = [t for t in summary["tuning"] if t["arm"] == arm["arm"] and t["step"] == 1]
        best = min(outer, key=lambda t: (t["eval_loss"], t["value"]))
        assert 12 <= len(outer) <= 20 and [t["value"] for t in outer if t["chosen"]] == [best["value"]]
        assert [arm["changes"]["outer_lr"], arm["changes"]["outer_momentum"]] == best["value"]
    assert "outer lr x outer momentum (lr/mu) of async + delayed Nesterov" in out


def test_the_async_study_md_names_only_the_flags_given(tmp_path, capsys):
    status, _, err = run_cli(["study", "async", "--data", "digits", "--seeds", "2", "--rounds", "1", "-H", "2",
                              "-K", "2", "--hidden-sizes", "8", "--batch-size", "8", "-q", "--no-plots",
                              "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    assert "--export" not in (run_dir / "study.md").read_text() and not (run_dir / "study.png").exists()


def test_equal_time_rounds_worked_by_hand():
    # K = 2, c = (1, 3), H = 2: asynchronous rounds end when worker 1 arrives, every 6 s.
    config = DiLoCoConfig(num_workers=2, inner_steps=2, rounds=1).replace(
        asynchrony={"asynchronous": True, "step_times": (1.0, 3.0)})
    assert beyond_async.equal_time_rounds(config, 12.0) == 2 and beyond_async.equal_time_rounds(config, 13.0) == 3
    # DyLU: worker 1 takes max(1, floor(2/3)) = 1 step (3 s), worker 0 two (2 s); rounds end at 3, 6, 9, 12 s
    dylu = config.replace(asynchrony={"asynchronous": True, "step_times": (1.0, 3.0), "dynamic_local_steps": True})
    assert beyond_async.equal_time_rounds(dylu, 12.0) == 4


def test_the_results_page_holds_exactly_the_rendered_blocks():
    page = (ROOT / "docs" / "results-beyond.md").read_text(encoding="utf-8")
    blocks = list(beyond_async.BLOCK.finditer(page))
    assert {m["name"] for m in blocks} == {"beyond-async", "beyond-async-shakespeare", "beyond-async-digits",
                                           "beyond-async-shakespeare-spread0.5", "beyond-async-digits-spread0.5"}
    summaries = load_summaries(ROOT / "docs" / "assets" / "results")
    for match in blocks:
        assert match["body"] == beyond_async.render_named(match["name"], summaries), \
            f"{match['name']}: run .venv/bin/python -m diloco.tools.studies.beyond_async"
