"""The grader's verdict rules and message trimming, one case per rule, without running a workspace."""

from __future__ import annotations

from pathlib import Path

from diloco.milestones import MILESTONES
from diloco.tools.grading import grade_verdicts
from diloco.tools.grading.grade_report import ERROR, FAILED, NOT_STARTED, PASSED
from diloco.tools.grading.grade_text import shown_lines

REPO = Path(__file__).resolve().parents[2]
M02 = MILESTONES[1]


def _test(nodeid: str, outcome: str, **more) -> dict:
    return {"kind": "test", "nodeid": nodeid, "marker": "m02", "when": "call", "outcome": outcome,
            "name": nodeid.split("::")[1], "doc": "", "stubs": [], "all_stub": False, **more}


def _classify(records: list[dict], crash: str = ""):
    return grade_verdicts.classify(M02, records, crash, REPO / "tests")


def _collected(*nodeids: str) -> dict:
    return {"kind": "collected", "items": [[n, "m02"] for n in nodeids]}


def test_an_import_error_without_tests_is_an_error_naming_the_module():
    result = _classify([{"kind": "collect_error", "nodeid": "tests/t.py", "message": "a\nb\nImportError: x"}])
    assert result.status == ERROR and result.summary == "a test module does not import: tests/t.py"
    assert result.detail == ("a", "b", "ImportError: x")
    # with tests collected, the import error of another module is not this milestone's verdict
    assert _classify([{"kind": "collect_error", "nodeid": "tests/u.py", "message": "x"}, _collected("t::a"),
                      _test("t::a", "passed")]).status == PASSED


def test_no_tests_collected_is_an_error():
    result = _classify([])
    assert result.status == ERROR and result.summary.startswith("no tests collected for m02")


def test_a_crash_before_every_test_reported_names_the_test_it_stopped_in():
    records = [_collected("t::a", "t::b"), _test("t::a", "passed"), {"kind": "start", "nodeid": "t::b"}]
    result = _classify(records, crash="line 1\nSegmentation fault")
    assert result.status == ERROR and result.summary == "the test run stopped while running t::b"
    assert result.detail == ("line 1", "Segmentation fault") and result.tests_passed == 1
    assert _classify(records[:2], crash="boom").summary == "the test run stopped"
    # a crash after every test reported does not hide the verdict
    assert _classify([_collected("t::a"), _test("t::a", "passed")], crash="boom").status == PASSED


def test_passed_counts_tests_and_durations_and_skipped_alone_is_an_error():
    records = [_collected("t::a", "t::b"), _test("t::a", "passed", duration=1.5), _test("t::b", "passed", duration=2.0)]
    result = _classify(records)
    assert (result.status, result.summary, result.tests_passed, result.tests_total) == (PASSED, "2 tests passed", 2, 2)
    assert result.duration == 3.5 and result.rerun == "make test M=m02"
    skipped = _classify([_collected("t::a"), _test("t::a", "skipped")])
    assert skipped.status == ERROR and skipped.summary == "every test was skipped"


def test_a_failed_phase_is_kept_over_a_later_passed_one():
    records = [_collected("t::a"), _test("t::a", "failed", message="boom", exc_type="ValueError"),
               _test("t::a", "passed", when="teardown")]
    assert _classify(records).status == FAILED


def test_the_own_stub_is_not_started():
    stub = f"milestone 02 {M02.name}: not implemented yet"
    result = _classify([_collected("t::a"), _test("t::a", "failed", message=stub, stubs=[stub], all_stub=True)])
    assert result.status == NOT_STARTED and M02.lesson in result.summary


def test_a_failure_shows_its_phase_where_it_was_raised_and_the_falsifying_example():
    failed = _test("t::a", "failed", when="setup", exc_type="ValueError", message="bad shape", where="src/x.py:3",
                   notes=["other note", "Falsifying example: f(x=1)"], doc="Relu keeps positives.")
    result = _classify([_collected("t::a"), failed])
    assert result.status == FAILED and result.summary == "Relu keeps positives"
    assert result.detail == ("ValueError (in test setup): bad shape", "raised at src/x.py:3",
                             "Falsifying example: f(x=1)", "test: t::a")
    assert result.failing == ("t::a",)
    # an assertion is not located, and the check without a docstring is the test's name in words
    asserted = _test("t::a", "failed", exc_type="AssertionError", message="x", where="src/x.py:3", doc="")
    result = _classify([_collected("t::a"), asserted])
    assert result.summary == "a" and result.detail == ("AssertionError: x", "test: t::a")


def test_the_first_failure_showing_expected_and_got_is_the_one_shown():
    records = [_collected("t::a", "t::b", "t::c"),
               _test("t::a", "failed", exc_type="AssertionError", message="got nothing"),
               _test("t::b", "failed", exc_type="AssertionError", message="expected nothing"),
               _test("t::c", "failed", exc_type="AssertionError", message="v: expected 1\ngot 2")]
    result = _classify(records)
    assert result.detail[-1] == "test: t::c" and result.failing == ("t::a", "t::b", "t::c")
    assert _classify(records[:3]).detail[-1] == "test: t::a", "none shows both: the first failure"


def test_an_expected_and_got_message_without_arrays_is_cut_at_the_limit():
    assert shown_lines("a\nb\nc", 2) == ["a", "b"]
    assert shown_lines("") == [""]
    # an expected line with no got after it, or prose between them, is not an array pair
    assert shown_lines("v: expected [1]\nnothing", 1) == ["v: expected [1]"]
    assert shown_lines("v: expected [1]\nprose\ngot [2]", 2) == ["v: expected [1]", "prose"]


def test_one_row_left_out_says_row_and_the_marker_sits_under_the_array():
    expected = "v: expected [[1]\n             [2]]"
    got = "         got [[3]\n             [4]]"
    lines = shown_lines(f"{expected}\n{got}\ntail", 4)
    assert lines == ["v: expected [[1]", "            ... (1 more row)", "         got [[3]",
                     "             ... (1 more row)", "tail"]


def test_a_wave_that_imported_another_diloco_is_refused(tmp_path):
    import pytest

    from diloco.tools.grading import grader
    from diloco.tools.grading.grade_waves import GradingError

    ours, theirs = tmp_path / "ours" / "__init__.py", tmp_path / "theirs" / "__init__.py"
    grader._check_imported([{"kind": "import", "file": str(ours)}, {"kind": "import"}], ours)
    with pytest.raises(GradingError, match="the tests imported diloco from .*theirs"):
        grader._check_imported([{"kind": "import", "file": str(theirs)}], ours)


def test_only_the_sandbox_s_own_full_note_is_kept():
    from types import SimpleNamespace

    from diloco.tools.grading import grader

    assert grader._sandbox_notes(SimpleNamespace(sandbox=None), [{"kind": "note", "text": "x"}]) == set()
    config = {"files": 10}
    note = grader.full_note(config)
    records = [{"kind": "note", "text": note}, {"kind": "note", "text": "forged"}, {"kind": "test", "text": note}]
    assert grader._sandbox_notes(SimpleNamespace(sandbox=config), records) == {note}
    assert grader._sandbox_notes(SimpleNamespace(sandbox=config), records[1:]) == set()


def test_units_left_without_a_verdict_are_locked_as_a_cycle():
    from diloco.exercises import EXERCISES
    from diloco.tools.grading import grader

    status, done = grader._cycles_locked({}, {})
    assert len(status) == len(MILESTONES) and len(done) == len(EXERCISES)
    assert {r.summary for r in (*status.values(), *done.values())} == {"dependency cycle"}
