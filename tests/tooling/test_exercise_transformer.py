"""The transformer exercises (x04-x07) ARE the model: a workspace trains on its own functions.

A workspace with the 30 milestones and x04-x07 filled in from the reference runs
``diloco train --model transformer`` (tiny sizes) on its own ``diloco.models`` and gives the
reference run's parameters and losses bit for bit; the same workspace with one x07 function
still a stub stops with that stub's one-line message.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diloco.exercises import EXERCISES
from diloco.milestones import MILESTONES
from diloco.tools.workspace.create import create_workspace
from diloco.tools.workspace.regions import exercise_module_path, stub_exercise_source, stub_source

REPO = Path(__file__).resolve().parents[2]
TRAIN = ["-m", "diloco", "train", "--model", "transformer", "--data", "shakespeare", "--d-model", "8",
         "--n-heads", "2", "--n-layers", "1", "--context", "8", "--rounds", "2", "--inner-steps", "3",
         "--eval-windows", "256", "--seed", "3", "--no-plots", "--quiet"]


def fill_in(ws: Path, keep_exercises) -> None:
    """Every milestone's reference body into workspace ``ws``, and those of ``keep_exercises``."""
    for module in sorted({m.module for m in MILESTONES}):
        source = (REPO / "src" / "diloco" / f"{module}.py").read_text()
        (ws / "src" / "diloco" / f"{module}.py").write_text(stub_source(source, module, keep=range(1, 31)))
    for module in sorted({module for e in EXERCISES for module, _ in e.functions}):
        source = exercise_module_path(module).read_text()
        exercise_module_path(module, ws / "src" / "diloco").write_text(
            stub_exercise_source(source, module, keep=keep_exercises))


def train(src: Path, runs: Path) -> subprocess.CompletedProcess:
    """``diloco train`` TRAIN with the package of ``src`` first on the path, one thread."""
    runs.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(src), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    check = "import diloco.models.layers as m; print(m.__file__)"
    where = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(src), f"diloco imported from {where.stdout}, not {src}"
    return subprocess.run([sys.executable, *TRAIN, "--runs-dir", str(runs)], env=env, cwd=runs.parent,
                          capture_output=True, text=True, timeout=300)


def run_outputs(runs: Path) -> tuple[dict, list]:
    (folder,) = runs.iterdir()
    with np.load(folder / "params-diloco.npz") as data:
        params = {key: data[key] for key in data.files}
    history = [json.loads(line) for line in (folder / "history.jsonl").read_text().splitlines() if line.strip()]
    losses = [{key: value for key, value in row.items() if "loss" in key or "acc" in key} for row in history]
    return params, losses


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    ws = create_workspace(tmp_path_factory.mktemp("transformer") / "ws")
    fill_in(ws, [e.code for e in EXERCISES])
    return ws


@pytest.mark.slow
def test_a_completed_workspace_trains_the_transformer_bit_for_bit_as_the_reference(workspace, tmp_path):
    mine = train(workspace / "src", tmp_path / "mine" / "runs")
    assert mine.returncode == 0, mine.stderr
    reference = train(REPO / "src", tmp_path / "reference" / "runs")
    assert reference.returncode == 0, reference.stderr
    params, losses = run_outputs(tmp_path / "mine" / "runs")
    expected_params, expected_losses = run_outputs(tmp_path / "reference" / "runs")
    assert list(params) == list(expected_params) and "h0.attn.qkv" in params
    for key, value in expected_params.items():
        assert value.dtype == params[key].dtype and np.array_equal(params[key], value), f"{key} differs"
    assert losses == expected_losses and losses, (losses, expected_losses)


def test_the_workspace_model_is_the_learners_functions(workspace, tmp_path):
    """With x07's block_backward still a stub, training stops with its message, in one line."""
    layers = exercise_module_path("models.transformer", workspace / "src" / "diloco")
    complete = layers.read_text()
    source = exercise_module_path("models.transformer").read_text()
    try:
        layers.write_text(stub_exercise_source(source, "models.transformer", keep=["embedding_backward"]))
        result = train(workspace / "src", tmp_path / "runs")
    finally:
        layers.write_text(complete)
    assert result.returncode != 0
    assert ("exercise x07 lm_head: block_backward is not implemented yet (see docs/exercises/x07-lm-head.md)"
            in result.stderr), result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def lesson_train_command(ws: Path) -> list[str]:
    """The one ``diloco train --model transformer`` command of the x07 lesson's "Prove it works"."""
    lesson = (ws / "docs" / "exercises" / "x07-lm-head.md").read_text().split("## Prove it works", 1)[1]
    (line,) = [line for line in lesson.splitlines() if line.startswith(".venv/bin/diloco train --model transformer")]
    return shlex.split(line.removeprefix(".venv/bin/diloco "))


def test_the_lessons_train_command_runs_in_the_workspaces_own_environment(workspace, tmp_path):
    """As printed, in the environment ``make grade`` installs (the grade extra: no matplotlib)."""
    blocker = tmp_path / "no-matplotlib"
    blocker.mkdir()
    (blocker / "matplotlib.py").write_text("raise ImportError('not in the grade extra')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(workspace / "src")]),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-m", "diloco", *lesson_train_command(workspace),
                             "--runs-dir", str(tmp_path / "runs")], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "held-out loss" in result.stdout and "bigram" in result.stdout, result.stdout
