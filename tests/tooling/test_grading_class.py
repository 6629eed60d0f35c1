"""``diloco grade --submissions DIR --out OUT``: a class at once, one report per learner and a CSV.

The class: a stub workspace (0), a reference copy (3: milestones 01, 02 and 04 of the small
hidden suite of ``test_exploits``), a package that does not import (an error row, still a
report of zeros) and a folder whose name holds escape sequences and a formula. Graded in
the sandbox, two at a time.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
import xml.etree.ElementTree as ET

import pytest
from test_exploits import REPO, hidden_suite, stub_workspace  # noqa: F401  (a fixture)

from diloco.exercises import EXERCISES
from diloco.milestones import MILESTONES
from diloco.tools.cli.main import main
from diloco.tools.grading.grade_class import grade_class, report_name, submissions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def graded(stub_workspace, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("class")
    tests = hidden_suite(base / "hidden")
    folder = base / "submissions"
    shutil.copytree(stub_workspace / "src", folder / "ada" / "src")
    shutil.copytree(REPO / "src" / "diloco", folder / "bob" / "diloco", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(stub_workspace / "src", folder / "cy" / "src")
    (folder / "cy" / "src" / "diloco" / "__init__.py").write_text("raise ImportError('\\x1b[2Jbroken')\n")
    shutil.copytree(stub_workspace / "src", folder / "=cmd|\x1b[31mdee" / "src")
    (folder / "mallory").mkdir()  # the link rule: another's package, through a link, is refused
    (folder / "mallory" / "diloco").symlink_to("../bob/diloco")
    (folder / "eve").symlink_to("bob")
    out = base / "out"
    start = time.monotonic()
    code = main(["grade", "--submissions", str(folder), "--out", str(out), "--tests", str(tests), "--jobs", "2",
                 "--quiet"])
    return {"code": code, "out": out, "folder": folder, "seconds": time.monotonic() - start}


def test_each_learner_gets_a_report_and_a_row_of_the_csv(graded):
    assert graded["code"] == 0
    out = graded["out"]
    with open(out / "scores.csv", newline="") as handle:
        rows = {row["name"]: row for row in csv.DictReader(handle)}
    odd = report_name("=cmd|\x1b[31mdee")
    assert odd.startswith("__cmd__") and "~" in odd and "\x1b" not in odd
    assert set(rows) == {"ada", "bob", "cy", odd, "mallory", "eve"}
    assert {name: float(row["score"]) for name, row in rows.items()} == {"ada": 0, "bob": 3, "cy": 0,
                                                                        odd: 0, "mallory": 0, "eve": 0}
    assert rows[odd]["folder"] == "'=cmd|\\x1b[31mdee"  # the real name, escaped, never a formula
    assert all(rows[name]["folder"] == name for name in ("ada", "bob", "cy", "mallory", "eve"))
    assert rows["cy"]["status"] == "error" and "does not import" in rows["cy"]["error"]
    for name in ("mallory", "eve"):
        assert rows[name]["status"] == "error" and "is a symbolic link" in rows[name]["error"], rows[name]
    assert "\x1b" not in rows["cy"]["error"] and "\\x1b[2Jbroken" in rows["cy"]["error"]
    assert all(rows[name]["status"] == "graded" for name in ("ada", "bob", odd))
    for name in rows:
        results = json.loads((out / "learners" / name / "results.json").read_text())
        assert results["score"] == float(rows[name]["score"])
        assert len(results["tests"]) == len(MILESTONES) + len(EXERCISES)
        assert (out / "learners" / name / "report.txt").read_text().strip()
        xml = ET.parse(out / "learners" / name / "results.xml").getroot()  # graded or not, as the guide says
        assert xml.get("tests") == str(len(MILESTONES))
        if rows[name]["status"] == "error":
            reason = rows[name]["error"].split("error: ", 1)[1][:40]
            assert xml.get("errors") == str(len(MILESTONES)) and reason in ET.tostring(xml, encoding="unicode")
    assert "3/30 passed" in (out / "learners" / "bob" / "report.txt").read_text()
    assert (out / "learners" / "bob" / "results.xml").read_text().startswith("<?xml")


def test_names_are_made_plain_and_unique_and_a_formula_is_never_a_cell(tmp_path):
    for name in ("a", "a b", "a_b", "=1+1", "...", "x\x1b[2J", "-x", "jane doe", "jane_doe", "jane?doe"):
        (tmp_path / "in" / name).mkdir(parents=True)
    found = dict((path.name, name) for name, path in submissions(tmp_path / "in"))
    names = list(found.values())
    assert len(set(names)) == len(names) == 10 and all("\x1b" not in n and "/" not in n for n in names)
    assert all(not n.startswith(("=", "+", "-", "@")) and n.strip("._") for n in names)
    # A plain name is its own; a sanitised one can never take it (jane doe is not jane_doe).
    assert found["jane_doe"] == "jane_doe" and found["a_b"] == "a_b" and found["a"] == "a"
    assert found["jane doe"] != found["jane?doe"] and found["jane doe"].startswith("jane_doe~")
    (tmp_path / "empty").mkdir()
    assert grade_class(tmp_path / "empty", tmp_path / "out", [], 1) == []
    assert (tmp_path / "out" / "scores.csv").read_text() == "name,folder,score,max_score,status,error\n"


def test_two_folders_that_sanitise_alike_keep_their_own_scores_and_scores_csv_is_never_shadowed(tmp_path,
                                                                                              monkeypatch):
    """``jane doe`` scores 2, ``jane_doe`` 0, and a learner's folder is named ``scores.csv``:
    each row carries its own folder's score and name, and ``scores.csv`` is written."""
    import diloco.tools.grading.grade_class as grade_class_module

    scores = {"jane doe": 2.0, "jane_doe": 0.0, "scores.csv": 1.0}

    def fake_grade(name, path, out, flags):  # the grading itself is tested above; here, who gets what
        (out / grade_class_module.LEARNERS / name).mkdir(parents=True)
        return grade_class_module.Row(name, path.name, scores[path.name], 30.0, "graded")

    monkeypatch.setattr(grade_class_module, "_grade_one", fake_grade)
    for name in scores:
        (tmp_path / "in" / name).mkdir(parents=True)
    grade_class(tmp_path / "in", tmp_path / "out", [], 1)
    with open(tmp_path / "out" / "scores.csv", newline="") as handle:
        rows = {row["folder"]: row for row in csv.DictReader(handle)}
    assert {folder: float(row["score"]) for folder, row in rows.items()} == scores
    assert rows["jane_doe"]["name"] == "jane_doe" and rows["jane doe"]["name"] != "jane_doe"
    assert (tmp_path / "out" / "learners" / "scores.csv").is_dir()


def test_bad_class_flags_are_one_line_before_any_work(tmp_path, capsys):
    for argv, message in [(["--submissions", str(tmp_path / "no")], "is not a folder"),
                          (["--submissions", str(tmp_path)], "needs --out"),
                          (["--submissions", str(tmp_path), "--out", str(tmp_path / "o"), "--impl", "."], "no --impl"),
                          (["--submissions", str(tmp_path), "--out", str(tmp_path / "o"), "--jobs", "0"], "--jobs")]:
        assert main(["grade", *argv]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "o").exists()
