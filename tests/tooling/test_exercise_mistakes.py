"""Each slip of ``exercise_mistakes`` loses exactly its own exercise, with a hint that names it.

A workspace with x04-x07 written (the reference bodies; the milestones stay stubs, which
these exercises never call) grades them all passed. Then each mistake is planted, one at a
time, into a copy of it and graded as a learner's ``make grade`` does (local mode): the
planted exercise fails, the other three still pass, and among the common mistakes the report
shows is the one planted (issue 39).
"""

from __future__ import annotations

import shutil

import pytest
from exercise_mistakes import EXERCISE_MISTAKES

from diloco.exercises import EXERCISES
from diloco.tools.grading.grade_report import FAILED, NOT_STARTED, PASSED
from diloco.tools.grading.grader import grade
from diloco.tools.workspace.create import create_workspace
from diloco.tools.workspace.regions import exercise_module_path, stub_exercise_source

TRANSFORMER = ("x04", "x05", "x06", "x07")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A fresh workspace with the reference bodies of x04-x07, and nothing else written."""
    ws = create_workspace(tmp_path_factory.mktemp("transformer-exercises") / "ws")
    for module in sorted({module for e in EXERCISES for module, _ in e.functions}):
        source = exercise_module_path(module).read_text()
        exercise_module_path(module, ws / "src" / "diloco").write_text(
            stub_exercise_source(source, module, keep=TRANSFORMER))
    return ws


def verdicts(ws) -> dict:
    return {r.milestone.code: r for r in grade(ws, sandbox=False).exercises}


def test_the_written_exercises_pass_and_the_others_are_not_started(written):
    states = verdicts(written)
    for code in TRANSFORMER:
        assert states[code].status == PASSED, (code, states[code].summary, states[code].detail)
    assert {states[code].status for code in ("x01", "x02", "x03")} == {NOT_STARTED}


def test_the_table_covers_every_transformer_exercise():
    assert {m.exercise for m in EXERCISE_MISTAKES} == set(TRANSFORMER)
    assert len({m.name for m in EXERCISE_MISTAKES}) == len(EXERCISE_MISTAKES)


@pytest.mark.parametrize("mistake", EXERCISE_MISTAKES, ids=[m.name for m in EXERCISE_MISTAKES])
def test_a_planted_mistake_fails_only_its_exercise_and_is_named(mistake, written, tmp_path):
    ws = tmp_path / "ws"
    shutil.copytree(written, ws)
    path = exercise_module_path(mistake.module, ws / "src" / "diloco")
    source = path.read_text()
    assert source.count(mistake.old) == 1, f"{mistake.name}: update `old` to the reference source"
    path.write_text(source.replace(mistake.old, mistake.new))
    states = verdicts(ws)
    planted = states[mistake.exercise]
    assert planted.status == FAILED, (mistake.name, planted.status, planted.summary)
    for code in set(TRANSFORMER) - {mistake.exercise}:
        assert states[code].status == PASSED, (mistake.name, code, states[code].summary, states[code].detail)
    assert any(mistake.hint in text for text in planted.mistakes), (mistake.name, planted.mistakes)
