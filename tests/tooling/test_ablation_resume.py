"""The four ablations run on the one study runner: an ablation stopped by a real SIGINT once
some of its runs are in the run cache, run again with the command it prints, trains only the
rest and ends with the uninterrupted study's table, rows, report and history."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tooling

WORKERS = ["study", "workers", "--values", "1,2,3", "--seeds", "2", "--rounds", "2", "-H", "2", "--hidden-sizes", "8",
           "--batch-size", "8", "--no-plots", "-q"]

# The program with one change: at the start of its fourth run it sends itself a real SIGINT, so
# the signal lands at a known moment (three runs finished and cached), not at a moment a poll saw.
SIGNAL_AT_FOURTH_RUN = """
import os, signal, sys
from diloco.tools.studies import ablation_spec
from diloco.tools.cli.main import main
real, started = ablation_spec.run_variant, []
def run_variant(*args, **kwargs):
    started.append(1)
    if len(started) == 4:
        os.kill(os.getpid(), signal.SIGINT)
    return real(*args, **kwargs)
ablation_spec.run_variant = run_variant
sys.exit(main(sys.argv[1:]))
"""


def _without(records: list, field: str) -> list:
    return [{k: v for k, v in r.items() if k != field} for r in records]


def _outputs(runs_dir: Path, stdout: str) -> dict:
    """What an ablation gives: the printed table, the rows (but their timings), study.md, the rounds
    (but their clock), and which runs were read back from the run cache."""
    (run_dir,) = sorted(p for p in runs_dir.iterdir() if "study-workers" in p.name)[-1:]
    lines = (run_dir / "results.jsonl").read_text().splitlines()
    history = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return {"table": stdout.split("run folder:")[0],
            "rows": _without(json.loads((run_dir / "summary.json").read_text())["rows"], "seconds"),
            "report": (run_dir / "study.md").read_text(), "history": _without(history, "time"),
            "cached": [bool(json.loads(line).get("cached")) for line in lines]}


def test_an_ablation_stopped_by_a_real_sigint_resumes_as_printed_to_the_uninterrupted_result(tmp_path):
    program = str(Path(sys.executable).with_name("diloco"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def study(name: str) -> list:
        return [*WORKERS, "--runs-dir", str(tmp_path / name)]

    whole = subprocess.run([program, *study("whole")], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert whole.returncode == 0, whole.stderr
    cut = subprocess.run([sys.executable, "-c", SIGNAL_AT_FOURTH_RUN, *study("cut")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert cut.returncode == 130, cut.stderr
    last = cut.stderr.strip().splitlines()[-1]
    assert "interrupted by SIGINT; 3 finished run(s) of the study are kept in the run cache" in last, cut.stderr
    (stopped,) = (tmp_path / "cut").glob("*study-workers")
    summary = json.loads((stopped / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["runs_completed"] == 3
    assert [row["variant"] for row in summary["rows"]] == ["K=1", "K=2"], "the rows so far"
    printed = shlex.split(last.rsplit(" with: ", 1)[1])
    again = subprocess.run([program, *printed[printed.index("study"):]], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    resumed, uninterrupted = _outputs(tmp_path / "cut", again.stdout), _outputs(tmp_path / "whole", whole.stdout)
    assert resumed["cached"] == [True] * 3 + [False] * 3, "the three kept runs are read back, the rest trained"
    assert uninterrupted["cached"] == [False] * 6
    for part in ("table", "rows", "report", "history"):
        assert resumed[part] == uninterrupted[part], part
