"""The family's flags in ``diloco train``, ``compare`` and ``study`` (diloco.tools.family_*)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cli_helpers import TINY_DEEP as TINY
from cli_helpers import only_run_dir, run_cli

from diloco import DiLoCoConfig
from diloco.config.sections import FamilyConfig
from diloco.core.trainers import train_family
from diloco.data import load_digits_split


def test_train_with_family_flags_equals_the_library_and_counts_encoded_bytes(tmp_path, capsys):
    flags = ["--comm-dtype", "fp4", "--fragments", "3", "--overlap", "1", "--mix", "0.5"]
    status, out, err = run_cli(["train", *TINY, *flags, "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    data = load_digits_split(seed=0)
    config = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=2, hidden_sizes=(8, 8), batch_size=8)
    expected = train_family(data.x_train, data.y_train, config,
                            FamilyConfig(comm_dtype="fp4", fragments=3, overlap=1, mix=0.5))
    with np.load(run_dir / "params-diloco.npz") as params:
        assert all(params[k].tobytes() == v.tobytes() for k, v in expected.params.items())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["family"]["comm_dtype"] == "fp4"
    sent = sum(r["bytes_sent"] for r in expected.history)
    assert summary["communication"]["diloco_bytes_per_worker"] == pytest.approx(sent)
    assert summary["communication"]["outer_bytes_per_value"] < 1.0  # 4 bits and a scale byte per block
    assert summary["algorithms"]["diloco"]["bytes_sent_per_worker"] == pytest.approx(sent)


def test_compare_with_a_simulated_network_reports_time_and_utilisation(tmp_path, capsys):
    flags = ["--bandwidth", "10Mbit", "--latency", "5ms", "--step-time", "2ms", "--eager"]
    status, out, err = run_cli(["compare", *TINY, *flags, "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    assert "diloco: simulated" in out and "sync: simulated" in out
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(summary["simulated"]) == {"diloco", "sync"}
    assert summary["simulated"]["diloco"]["compute_utilization"] > summary["simulated"]["sync"]["compute_utilization"]
    records = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    assert all("sim_seconds" in r and 0 < r["sim_utilization"] <= 1 for r in records)


@pytest.mark.parametrize("argv, message", [
    (["train", "--algo", "sync", "--comm-dtype", "fp4"], "the synchronous baseline has no outer gradient"),
    (["train", "--fragments", "5"], "fragments (5) must not exceed the model's layers (3"),
    (["train", "--overlap", "4"], "overlap tau (4) must be smaller than inner_steps (4)"),
    (["train", "--eager", "--overlap", "2"], "overlap must be 0 or H=4"),
    (["train", "--mix", "0"], "mix must be > 0"),
    (["train", "--bandwidth", "fast"], "bandwidth must look like"),
    (["train", "--latency", "5ms"], "--latency and --step-time need --bandwidth"),
    (["study", "compression", "--values", "fp3"], "unknown compression 'fp3'"),
    (["study", "streaming", "--values", "9:0:1"], "fragments (9) must not exceed"),
    (["study", "noniid", "--target-loss", "1"], "--target-loss applies only to the bandwidth study"),
])
def test_family_usage_errors_are_one_line_exit_2_and_leave_no_run_folder(argv, message, tmp_path, capsys):
    status, out, err = run_cli([*argv, *TINY, "--runs-dir", tmp_path], capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.parametrize("name, values", [("compression", "native,fp4,prune0.5"), ("streaming", "1:0:1,2:1:0.5"),
                                          ("bandwidth", "1Mbit,1Gbit")])
def test_family_studies_run_and_write_their_tables(name, values, tmp_path, capsys):
    extra = ["--target-loss", "2.5", "--hidden-sizes", "8,8,8"] if name == "bandwidth" else []  # P=4: 4 layers
    status, out, err = run_cli(["study", name, "--seeds", "1", "--values", values, *TINY, *extra, "--runs-dir",
                                tmp_path], capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    assert (run_dir / "study.md").read_text().count("|") > 10
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rows"]
    if name == "bandwidth":
        cells = summary["bandwidth"][0]["cells"]
        assert [c["bandwidth"] for c in cells] == ["1Mbit", "1Gbit"]


def test_family_studies_tune_each_arm_through_the_paper_studies_loop(monkeypatch):
    """A family study tunes inner lr, outer lr x momentum, inner lr again (``tune_arms``);
    a diverged candidate scores inf and is never chosen; the arm keeps its family changes."""
    import math

    from diloco.core.divergence import Diverged
    from diloco.tools.studies import family_study
    from diloco.tools.studies.family_study import FamilyVariant, tune_outer_step

    def fake(v, config, family, dataset, seed, **_):
        c = v.changes
        lr, mu = c.get("outer_lr", 0.7), c.get("outer_momentum", 0.9)
        if (lr, mu) == (1.0, 0.9):
            raise Diverged("diloco", 1, None, "training loss nan")
        inner = c.get("inner", {}).get("lr", 1e-3)
        loss = (lr - 0.7) ** 2 + (mu - 0.5) ** 2 + (math.log10(inner) + 3) ** 2 / 10
        return {"eval_loss": loss, "seed": seed}

    monkeypatch.setattr(family_study, "run_family_variant", fake)
    arms = [FamilyVariant("P=2", "diloco", {}, {"fragments": 2}), FamilyVariant("sync", "sync", {}, {})]
    tuned, records = tune_outer_step(arms, DiLoCoConfig(), FamilyConfig(), None, [1000])
    # the synchronous arm tunes its inner lr only (it has no outer step)
    assert {r["step"] for r in records if r["arm"] == "sync"} == {0}
    assert {r["arm"] for r in records if r["step"] > 0} == {"P=2"} and {r["step"] for r in records} == {0, 1, 2}
    outer = [r for r in records if r["step"] == 1]
    assert len(outer) == 12 and [r["value"] for r in outer if r["chosen"]] == [(0.7, 0.5)]
    assert [r["eval_loss"] for r in outer if r["value"] == (1.0, 0.9)] == [math.inf]
    assert tuned[0].changes == {"inner": {"lr": 1e-3}, "outer_lr": 0.7, "outer_momentum": 0.5}
    assert tuned[0].family == {"fragments": 2} and tuned[1] == arms[1]._replace(changes={"inner": {"lr": 1e-3}})


def test_the_default_bandwidth_target_is_the_lowest_loss_every_run_reaches():
    from diloco.tools.studies.family_study import reached_by_every_run

    runs = [{"history": [{"eval_loss": v} for v in losses]}
            for losses in ((2.0, 1.0, 1.2), (2.5, 1.5, 1.4), (3.0, 0.9, 0.8))]
    # best losses 1.0, 1.4 and 0.8: the second run never goes below 1.4, so 1.4 is the lowest
    # that all three reach; each reaches it (at rounds 2, 3 and 2)
    assert reached_by_every_run(runs) == 1.4
