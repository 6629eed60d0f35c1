"""`make autograder`'s zip, as Gradescope runs it: unpacked in a fresh folder, ``setup.sh`` once,
then ``run_autograder`` (default mode: sandboxed) for each submission.

Its own file (not ``test_grading.py``), so ``make test``'s processes grade these beside the
scenarios there. ``setup.sh`` runs once for the module: the zip built with a hidden suite
(``TESTS=DIR``) is checked to hold the same files, byte for byte, plus ``hidden-tests/``, so
its ``setup.sh`` would install the same environment, which its folder then shares. The
reference graded 30/30 here is also the suite's check that the reference passes every
milestone and exercise through the sandbox (its proxy is faithful).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest
from test_grading import SCHEMA, fill_in

from diloco.exercises import EXERCISES
from diloco.milestones import MILESTONES
from diloco.tools.grading.grader import NOT_STARTED, PASSED
from diloco.tools.workspace.create import create_workspace

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _env(root: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(DILOCO_NO_APT="1", DILOCO_AUTOGRADER=str(root))
    return env


def _run_autograder(root: Path) -> tuple[subprocess.CompletedProcess, dict]:
    """``run_autograder`` called with no arguments, as Gradescope does; its run and results.json."""
    run = subprocess.run(["bash", str(root / "source" / "run_autograder")], env=_env(root), capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    return run, json.loads((root / "results" / "results.json").read_text())


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    """The zip built and set up once; the completed workspace (every milestone and exercise) and a
    fresh one graded by it: ``{score: (run, results)}``, with the zip's names under ``"names"``."""
    base = tmp_path_factory.mktemp("autograder")
    archive = base / "autograder.zip"
    subprocess.run(["make", "-s", "autograder", f"AUTOGRADER_ZIP={archive}", f"PYTHON={sys.executable}"],
                   cwd=REPO, check=True, capture_output=True)
    root = base / "autograder"
    with zipfile.ZipFile(archive) as unpacked:
        names = unpacked.namelist()
        unpacked.extractall(root / "source")
    subprocess.run(["bash", str(root / "source" / "setup.sh")], env=_env(root), check=True, capture_output=True)
    graded = {"root": root, "archive": archive, "names": names}
    for keep, score in ((range(1, 31), 30), ((), 0)):
        shutil.rmtree(root / "submission", ignore_errors=True)
        fill_in(create_workspace(root / "submission"), keep, [e.code for e in EXERCISES] if keep else ())
        graded[score] = _run_autograder(root)
    return graded


def test_the_autograder_zip_grades_the_reference_30_and_a_fresh_workspace_0(autograder):
    root = autograder["root"]
    assert {"setup.sh", "run_autograder", "pyproject.toml", "src/diloco/model.py"} <= set(autograder["names"])
    assert all(not name.startswith("tests/") or "__pycache__" not in name for name in autograder["names"])
    assert (root / "source" / ".venv" / "bin" / "diloco").exists()
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for score in (30, 0):
        run, results = autograder[score]
        validator.validate(results)
        assert results["score"] == score, (results["output"], [t["output"][:300] for t in results["tests"]][:3])
        assert "(testing " + str(root / "submission") in run.stdout, "it graded the submission, not the reference"
        assert "local, not sandboxed" not in results["output"]
        states = {t["extra_data"]["state"] for t in results["tests"] if "exercise" in t["extra_data"]}
        assert states == ({PASSED} if score else {NOT_STARTED}), states  # every exercise, or none


def test_the_reference_grades_30_of_30_through_the_sandbox(autograder):
    """Every milestone test passes with the reference running in the sandbox (the proxy is faithful)."""
    run, results = autograder[30]
    milestones = [t for t in results["tests"] if "milestone" in t["extra_data"]]
    failing = [(t["name"], t["extra_data"]["state"], t["output"][:300]) for t in milestones
               if t["extra_data"]["state"] != PASSED]
    assert len(milestones) == len(MILESTONES) and results["score"] == 30 and not failing, failing
    assert "\n  (sandboxed (protections: separate process" in run.stdout, run.stdout[:2000]
    exercises = [t for t in results["tests"] if "exercise" in t["extra_data"]]
    not_passed = [(t["name"], t["extra_data"]["state"], t["output"][:300]) for t in exercises
                  if t["extra_data"]["state"] != PASSED]
    assert len(exercises) == len(EXERCISES) and not not_passed, not_passed  # and every exercise
    assert all(t["extra_data"]["tests_total"] >= 8 for t in exercises)


def test_the_autograder_zip_with_hidden_tests_grades_with_them(autograder, tmp_path):
    """`make autograder TESTS=DIR`: run_autograder, called with no arguments as Gradescope does,
    grades with the hidden suite (three milestones of relu tests) and shows no hidden test name."""
    from test_exploits import hidden_suite

    hidden = hidden_suite(tmp_path / "hidden")
    archive = tmp_path / "autograder.zip"
    made = subprocess.run(["make", "-s", "autograder", f"AUTOGRADER_ZIP={archive}", f"TESTS={hidden}",
                           f"PYTHON={sys.executable}"], cwd=REPO, capture_output=True, text=True)
    assert made.returncode == 0 and "hidden tests from" in made.stdout, made.stderr
    root = tmp_path / "autograder"
    with zipfile.ZipFile(archive) as unpacked, zipfile.ZipFile(autograder["archive"]) as plain:
        assert {"hidden-tests/conftest.py", "hidden-tests/test_hidden.py"} <= set(unpacked.namelist())
        # the same source as the zip set up above, plus hidden-tests/: setup.sh would install the same
        shared = [name for name in unpacked.namelist() if not name.startswith("hidden-tests/")]
        assert shared == plain.namelist()
        changed = [name for name in shared if unpacked.read(name) != plain.read(name)]
        assert not changed, f"the two zips' sources differ (edited during the run?): {changed[:5]}"
        unpacked.extractall(root / "source")
    (root / "source" / ".venv").symlink_to(autograder["root"] / "source" / ".venv")
    for reference, score in ((True, 3), (False, 0)):
        shutil.rmtree(root / "submission", ignore_errors=True)
        ws = create_workspace(root / "submission")
        if reference:
            shutil.rmtree(ws / "src" / "diloco")
            shutil.copytree(REPO / "src" / "diloco", ws / "src" / "diloco",
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:  # relu written but wrong: its hidden tests fail
            model = ws / "src" / "diloco" / "model.py"
            model.write_text(model.read_text().replace('    raise NotImplementedError(\n        "milestone 02 relu',
                                                       '    return x\n    raise NotImplementedError(\n        "m'))
        run, results = _run_autograder(root)
        assert "(testing " + str(root / "submission") in run.stdout, "it graded this zip's submission"
        assert results["score"] == score, results["output"]
        assert [t["extra_data"]["tests_total"] for t in results["tests"][:4]] == [5, 2, 0, 2]  # the hidden suite's
        text = json.dumps(results)
        assert "test_relu" not in text, "a hidden test's name is shown"
        assert ("hidden tests failed" in text) == (not reference), text[:2000]
