"""Submission text reaches no output raw: each class of dangerous character, through every output.

A submission controls the text of its exceptions, of its crash output and of its folder's
name. Each class below is sent through the verdicts (``classify``) into the table, the
Gradescope ``results.json``, the JUnit XML, the error ``results.json`` and the command's
one-line error: every output shows it escaped (``\\x1b``), never raw, and cut to length.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_exploits import raw_controls, strings  # the exploit suite's checks of every output

from diloco.milestones import MILESTONES
from diloco.tools.cli.main import main
from diloco.tools.grading import grade_command
from diloco.tools.grading.grade_report import (
    LOCKED,
    GradeReport,
    MilestoneResult,
    error_report,
    format_table,
    to_gradescope,
    to_junit_xml,
)
from diloco.tools.grading.grade_text import safe_text
from diloco.tools.grading.grade_verdicts import classify
from diloco.tools.grading.grader import GradingError

REPO = Path(__file__).resolve().parents[2]

# Each class, as the submission would write it, and how it must be shown.
CLASSES = {
    "clear screen and cursor home": ("\x1b[2J\x1b[H", "\\x1b[2J\\x1b[H"),
    "colour": ("\x1b[32m30/30 passed\x1b[0m", "\\x1b[32m30/30 passed\\x1b[0m"),
    "OSC 8 link": ("\x1b]8;;https://evil.example\x07here\x1b]8;;\x07", "\\x1b]8;;https://evil.example\\x07here"),
    "BEL": ("ding\x07", "ding\\x07"),
    "backspace": ("ok\x08\x08XX", "ok\\x08\\x08XX"),
    "carriage return": ("failed\r30/30 passed", "failed\\r30/30 passed"),
    "C1 control (CSI)": ("\x9b2J", "\\x9b2J"),
    "DEL": ("a\x7fb", "a\\x7fb"),
    "bidi override": ("\u202edessap\u202c", "\\u202edessap\\u202c"),
    "bidi isolate": ("\u2066x\u2069", "\\u2066x\\u2069"),
    "zero-width space": ("a\u200bb", "a\\u200bb"),
    "line separator": ("a\u2028b", "a\\u2028b"),
}
LONG = "A" * 100_000


def report_of(text: str, tmp_path: Path) -> GradeReport:
    """Milestone 02 failed with ``text`` as its message, raised-at line, and crash; the rest locked."""
    nodeid = "tests/test_model.py::test_relu"
    records = [{"kind": "collected", "items": [[nodeid, "m02"], [nodeid + "2", "m02"]]},
               {"kind": "test", "nodeid": nodeid, "marker": "m02", "when": "call", "outcome": "failed",
                "name": "test_relu", "doc": "", "exc_type": "ValueError", "message": f"relu: {text}\n{text}",
                "notes": [], "stubs": [], "all_stub": False, "where": f"diloco/model.py:1: {text}"}]
    failed = classify(MILESTONES[1], records, "", REPO / "tests")
    crashed = classify(MILESTONES[0], [{"kind": "collected", "items": [[nodeid + "x", "m01"]]}],
                       f"its last output: {text}", REPO / "tests")
    assert any(text[:20] in line for line in failed.detail), "the verdict keeps the text as it came"
    results = tuple([crashed, failed] + [MilestoneResult(m, LOCKED, "needs 01") for m in MILESTONES[2:]])
    return GradeReport(results, tmp_path / f"ws{text[:30]}", f"/x/{text}", REPO / "tests", 1.0, f"sandbox {text}")


@pytest.mark.parametrize("name", [*CLASSES, "100,000 characters"])
def test_each_class_of_submission_text_is_escaped_in_every_output(name, tmp_path):
    raw, shown = CLASSES.get(name, (LONG, "A" * 400))
    report = report_of(raw, tmp_path)
    table = format_table(report)
    results = json.loads(json.dumps(to_gradescope(report)))  # as Gradescope reads it
    xml = to_junit_xml(report)
    parsed = ET.tostring(ET.fromstring(xml.encode()), encoding="unicode")  # well-formed XML, as a reader sees it
    errors = json.loads(json.dumps(error_report(tmp_path / raw, f"does not import: {raw}")))
    outputs = {"table": table, "results.json": "\n".join(strings(results)), "JUnit XML": parsed,
               "error results.json": "\n".join(strings(errors))}
    for where, text in outputs.items():
        assert not raw_controls(text), f"{where}: {raw_controls(text)}"
        assert shown in text, where
    assert all(len(line) <= 600 for line in table.splitlines())
    assert all(len(text) <= 9000 for text in strings(results) + strings(errors))


@pytest.mark.parametrize("name", list(CLASSES))
def test_the_commands_one_line_error_shows_submission_text_escaped(name, tmp_path, monkeypatch, capsys):
    raw, shown = CLASSES[name]

    def fails(*args, **kwargs):
        raise GradingError(f"the diloco package does not import: ImportError: {raw}\n0 errors{LONG}")

    monkeypatch.setattr(grade_command, "grade", fails)
    assert main(["grade", "--impl", str(tmp_path), "--json", str(tmp_path / "r.json"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and len(err) < 3000, err[:200]
    assert shown in err and not raw_controls(err)
    assert not raw_controls("\n".join(strings(json.loads((tmp_path / "r.json").read_text()))))


def test_safe_text_keeps_ordinary_text_and_says_what_it_cut():
    text = "expected [0.5 1. ] got [0.5 2. ]: max |diff| = 1 (é, ü, 中, ≤)\n  second line"
    assert safe_text(text) == text
    assert safe_text(text, one_line=True) == text.replace("\n", "\\n")
    assert safe_text("x" * 30, 20) == "x" * 20 + " ... (10 more characters)"
    assert len(safe_text("\x1b" * 100, 20)) < 60


def test_a_learners_printed_verdict_never_starts_a_line_of_its_own():
    """The submission's message says ``30/30 passed ...`` on lines of its own: in every output
    those lines are indented under the grader's verdict, which alone starts at the margin."""
    from diloco.milestones import by_number
    from diloco.tools.grading.grade_report import FAILED, MilestoneResult, to_gradescope, to_junit_xml

    fake = "30/30 passed - next: nothing, all done"
    result = MilestoneResult(by_number(2), FAILED, f"relu\n{fake}", (f"ValueError: x\n{fake}", fake),
                             failing=("t::a",), tests_total=1)
    others = tuple(MilestoneResult(m, "locked", "x") for m in MILESTONES if m.number != 2)
    report = GradeReport((result, *others), REPO, "", REPO / "tests", 1.0, "sandbox")
    entry = next(t for t in to_gradescope(report)["tests"] if t["extra_data"]["milestone"] == 2)
    for text in (entry["output"], format_table(report), to_junit_xml(report)):
        assert not [line for line in text.splitlines() if line.lstrip("<>").startswith(fake)], text
    assert entry["output"].splitlines()[0].startswith("failed: relu")


def test_invisible_fillers_and_stacked_accents_are_escaped():
    assert safe_text("a\u3164b\u115fc") == "a\\u3164b\\u115fc"
    assert safe_text("e\u0301") == "e\u0301" and safe_text("e" + "\u0301" * 4) == "e" + "\u0301" * 4
    stacked = safe_text("e" + "\u0301" * 300, 100000)
    assert stacked == "e" + "\u0301" * 4 + "\\u0301" * 296
    assert safe_text("한국어 café") == "한국어 café"
