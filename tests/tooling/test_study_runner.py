"""The one study runner: a study added as a spec alone runs, tunes, writes and resumes; a study
stopped after some runs keeps them, says so with the command that continues, and the rerun
ends with the uninterrupted result."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from diloco.tools.cli.main import build_parser
from diloco.tools.studies import paper_runs
from diloco.tools.studies.paper_runs import INNER_LR, Arm, TuneStep
from diloco.tools.studies.runner import Done, Plan, StudySpec, run_spec

pytestmark = pytest.mark.tooling

FIG9 = ["study", "fig9", "--data", "mnist1d", "--num-samples", "600", "--seeds", "2", "--total-steps", "4", "-H", "2",
        "--hidden-sizes", "8", "--inner-grid", "1e-3,3e-3", "--outer-grid", "0.7:0.9", "-q", "--no-plots"]


def _rows(path) -> list:
    """The export's rows without their timings (the only field two equal runs may differ in)."""
    rows = json.loads(path.read_text())["rows"]
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def _stop_after(monkeypatch, runs: int) -> list:
    """Make the ``runs + 1``-th training raise ``KeyboardInterrupt`` (a Ctrl-C there); the list counts the runs."""
    trained, real = [], paper_runs.trainer

    def trainer(algo, engine="reference"):
        train = real(algo, engine)

        def counted(*args, **kwargs):
            if len(trained) == runs:
                raise KeyboardInterrupt
            trained.append(algo)
            return train(*args, **kwargs)
        return counted

    monkeypatch.setattr(paper_runs, "trainer", trainer)
    return trained


def test_a_study_stopped_after_some_runs_goes_on_from_them_and_ends_as_an_uninterrupted_one(tmp_path, capsys,
                                                                                            monkeypatch):
    status, _, err = run_cli([*FIG9, "--runs-dir", tmp_path / "whole", "--export", tmp_path / "whole-export"], capsys)
    assert status == 0, err
    trained = _stop_after(monkeypatch, 5)
    argv = [*FIG9, "--runs-dir", tmp_path / "cut", "--export", tmp_path / "cut-export"]
    status, _, err = run_cli(argv, capsys)
    assert status == 130 and len(trained) == 5
    line = err.strip().splitlines()[-1]
    assert "interrupted by SIGINT; 5 finished run(s) of the study are kept in the run cache" in line, err
    assert "continue from there with:" in line and "study-cache" in line, err
    (run_dir,) = [p for p in (tmp_path / "cut").iterdir() if p.name.endswith("study-fig9-mnist1d")]
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    monkeypatch.undo()
    trained = _stop_after(monkeypatch, 10_000)  # counts only
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    summary = json.loads((tmp_path / "cut-export" / "fig9-mnist1d.json").read_text())
    assert summary["cached_runs"] >= 5, "the five runs kept are read back, not trained again"
    name = "fig9-mnist1d.json"
    assert _rows(tmp_path / "cut-export" / name) == _rows(tmp_path / "whole-export" / name)
    whole = json.loads((tmp_path / "whole-export" / "fig9-mnist1d.json").read_text())
    assert summary["tuning"] == whole["tuning"] and summary["claims"] == whole["claims"]


class TwoArms(StudySpec):
    """A study written as a spec and nothing else: two DiLoCo arms that differ in the outer lr,
    each with its inner lr tuned on itself."""

    name = "two-arms"

    def plan(self, args) -> Plan:
        from diloco.data import load_digits_split
        from diloco.tools.cli.flags import build_config

        config = build_config(args, {"num_workers": 2, "inner_steps": 2, "rounds": 2, "hidden_sizes": (8,),
                                     "batch_size": 8})
        data = load_digits_split(seed=0)
        arms = [Arm("outer lr 0.5", "diloco", {"outer_lr": 0.5}), Arm("outer lr 1", "diloco", {"outer_lr": 1.0})]
        tuning = [TuneStep(INNER_LR, (1e-3, 1e-2), tuple((a.label, (a.label,)) for a in arms))]
        return Plan(self.name, "study-two-arms", config, arms, [0, 1], [1000], tuning, data, {"name": "digits"},
                    {"study": self.name}, "two arms")

    def summary(self, plan: Plan, done: Done) -> dict:
        return {"arms": [a._asdict() for a in done.arms], "losses": [o["eval_loss"] for o in done.outcomes],
                "tuned": len(done.tuned), "cached": sum(bool(o.get("cached")) for o in done.tuned + done.outcomes)}

    def write(self, plan: Plan, summary: dict, done: Done, args) -> None:
        (done.run_dir / "summary.json").write_text(json.dumps(summary))


def test_a_study_added_as_a_spec_alone_tunes_runs_writes_and_reads_its_runs_back(tmp_path):
    args = build_parser().parse_args(["study", "table2", "-q", "--no-plots", "--runs-dir", str(tmp_path)])
    summaries = []
    for _ in range(2):
        assert run_spec(TwoArms(), args) == 0
        (run_dir,) = sorted(p for p in tmp_path.iterdir() if "study-two-arms" in p.name)[-1:]
        summaries.append(json.loads((run_dir / "summary.json").read_text()))
        lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
        assert [line["phase"] for line in lines] == ["tune"] * summaries[-1]["tuned"] + ["eval"] * 4
    first, again = summaries
    assert first["tuned"] >= 4 and len(first["losses"]) == 4 and first["cached"] == 0
    assert all("lr" in a["changes"]["inner"] for a in first["arms"]), "each arm has its tuned inner lr"
    assert again["cached"] == first["tuned"] + 4 and again["losses"] == first["losses"], "the rerun trains nothing"


def test_a_family_study_run_again_reads_every_run_back_and_replays_its_rounds(tmp_path, capsys):
    argv = ["study", "compression", "--seeds", "2", "--values", "native,fp4", "--rounds", "2", "-H", "3", "-K", "2",
            "--hidden-sizes", "8", "--batch-size", "8", "-q", "--no-plots", "--runs-dir", tmp_path]
    for export in ("first", "again"):
        status, _, err = run_cli([*argv, "--export", tmp_path / export], capsys)
        assert status == 0, err
    first, again = (json.loads((tmp_path / n / "family-compression.json").read_text()) for n in ("first", "again"))
    assert first["rows"] == again["rows"] and first["tuning"] == again["tuning"] and first["claims"] == again["claims"]
    assert [o["variant"] for o in again["outcomes"]] == ["native", "native", "fp4", "fp4"]
    one, two = sorted(p for p in tmp_path.iterdir() if "study-compression" in p.name)
    lines = [(p / "history.jsonl").read_text().splitlines() for p in (one, two)]
    assert len(lines[0]) == len(lines[1]) == 2 * 2 * 2, "every evaluation round, replayed from the cache the 2nd time"
    results = [json.loads(line) for line in (two / "results.jsonl").read_text().splitlines()]
    assert all(r["cached"] for r in results), "the second command trains nothing"


def test_a_study_stopped_before_its_first_run_says_nothing_was_kept_and_how_to_start_again(tmp_path, capsys,
                                                                                          monkeypatch):
    _stop_after(monkeypatch, 0)
    status, _, err = run_cli([*FIG9, "--runs-dir", tmp_path], capsys)
    assert status == 130
    assert "no run had finished; start it again with:" in err.strip().splitlines()[-1], err


TRANSFORMER_FIG9 = ["study", "fig9", "--data", "shakespeare", "--model", "transformer", "--d-model", "8", "--n-heads",
                    "2", "--n-layers", "1", "--context", "8", "--eval-windows", "16", "--batch-size", "2", "--seeds",
                    "3", "--total-steps", "8", "-H", "2", "--inner-grid", "1e-3,3e-3", "--outer-grid", "0.7:0.9",
                    "-q", "--no-plots"]


@pytest.mark.slow
def test_a_transformer_study_stopped_by_a_real_sigint_resumes_as_printed_to_the_uninterrupted_result(tmp_path):
    """The program itself, in a process of its own: a ``--model transformer`` study gets a real
    SIGINT once three runs are in ``results.jsonl``; the command its last line prints, run as
    printed (from the same folder), reads the kept runs back and exports the uninterrupted rows."""
    import os
    import shlex
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    program = str(Path(sys.executable).with_name("diloco"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def study(name: str) -> list:
        return [program, *TRANSFORMER_FIG9, "--runs-dir", str(tmp_path / name), "--export", str(tmp_path / f"{name}-x")]

    whole = subprocess.run(study("whole"), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr
    cut = subprocess.Popen(study("cut"), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and cut.poll() is None:
        results = list((tmp_path / "cut").glob("*/results.jsonl"))
        if results and len(results[0].read_text().splitlines()) >= 3:
            cut.send_signal(signal.SIGINT)
            break
        time.sleep(0.01)
    _, err = cut.communicate(timeout=120)
    assert cut.returncode == 130, err
    printed = shlex.split(err.strip().splitlines()[-1].rsplit(" with: ", 1)[1])
    again = subprocess.run([program, *printed[printed.index("study") :]], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    name = "fig9-shakespeare.json"
    assert json.loads((tmp_path / "cut-x" / name).read_text())["cached_runs"] >= 3
    assert _rows(tmp_path / "cut-x" / name) == _rows(tmp_path / "whole-x" / name)
