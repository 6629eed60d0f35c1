"""``plan_resume`` on a finished run whose files were then damaged: what it keeps and says; and where
``train_resumable`` writes the checkpoints of a resumed run."""

from __future__ import annotations

import json
import shutil

from cli_helpers import run_cli

from diloco.tools.cli.main import build_parser
from diloco.tools.runs.resume import CHECKPOINT_DIR, plan_resume

TINY = ["-K", "2", "-H", "2", "--rounds", "2", "--hidden-sizes", "4", "--batch-size", "8", "--no-plots"]


def _finished_run(tmp_path, capsys):
    status, _, err = run_cli(["compare", *TINY, "--runs-dir", tmp_path, "--name", "run"], capsys)
    assert status == 0, err
    (run_dir,) = tmp_path.iterdir()
    return run_dir


def _plan(run_dir):
    args = build_parser().parse_args(["compare", "--resume", str(run_dir)])
    return plan_resume(args, "compare", ("sync", "diloco"))


def test_a_record_the_history_lost_comes_from_the_checkpoint(tmp_path, capsys):
    run_dir = _finished_run(tmp_path, capsys)
    history = run_dir / "history.jsonl"
    records = [json.loads(line) for line in history.read_text().splitlines()]
    lost = next(r for r in records if r["algo"] == "diloco" and r["round"] == 2)
    history.write_text("".join(json.dumps(r) + "\n" for r in records if r is not lost))
    plan = _plan(run_dir)
    kept = [(r["algo"], r["round"]) for r in plan.history]
    assert sorted(kept) == [("diloco", 1), ("diloco", 2), ("sync", 1), ("sync", 2)], kept
    rebuilt = next(r for r in plan.history if r["algo"] == "diloco" and r["round"] == 2)
    assert rebuilt == {"algo": "diloco", **plan.starts["diloco"].history[1], "time": None}, rebuilt


def test_an_algorithm_without_a_checkpoint_starts_again_and_says_so(tmp_path, capsys):
    run_dir = _finished_run(tmp_path, capsys)
    for path in (run_dir / CHECKPOINT_DIR).glob("sync-round*"):
        path.unlink()
    plan = _plan(run_dir)
    assert plan.starts["sync"] is None and plan.starts["diloco"].round == 2
    assert plan.notes == ["sync: no checkpoint, starting it from round 0"], plan.notes
    assert [r["algo"] for r in plan.history] == ["diloco", "diloco"]
    shutil.rmtree(run_dir / CHECKPOINT_DIR)
    notes = _plan(run_dir).notes  # in the run's own order of algorithms
    assert notes == [f"{algo}: no checkpoint, starting it from round 0" for algo in ("diloco", "sync")], notes


def test_a_resumed_run_checkpoints_into_the_folder_it_was_resumed_from(tmp_path):
    from diloco import DiLoCoConfig
    from diloco.data import load_digits_split
    from diloco.tools.runs.checkpoint import latest_checkpoint, list_checkpoints
    from diloco.tools.runs.training import train_resumable

    data = load_digits_split(seed=0)
    config = DiLoCoConfig(num_workers=2, inner_steps=2, rounds=3, hidden_sizes=(4,), batch_size=8)
    folder = tmp_path / "checkpoints"
    train_resumable("diloco", data.x_train, data.y_train, config, checkpoint_dir=folder, checkpoint_every=1)
    newest = list_checkpoints(folder, "diloco")[-1]
    newest.unlink()  # as if the run had stopped after round 2
    newest.with_suffix(".npz").unlink()
    assert latest_checkpoint(folder, "diloco").name == "diloco-round000002.json"
    train_resumable("diloco", data.x_train, data.y_train, config, resume_from=folder)  # no checkpoint_dir
    assert latest_checkpoint(folder, "diloco").name == "diloco-round000003.json"
