"""The optional exercises beyond the 30: their table, regions, stubs, lessons and verdicts.

The exercises are declared once (``diloco.exercises.EXERCISES``); here the pytest markers,
the site's nav and index, the lessons and the source's ``BEGIN EXERCISE`` regions are
checked against that table, and the grader's verdicts on an exercise are checked on
hand-made records. The end-to-end gradings (a fresh workspace, the reference, workspaces
with exercises done or half done) are in ``test_grading.py``.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest

from diloco import exercises
from diloco.exercises import EXERCISES, by_code, stub_code, stub_message
from diloco.milestones import MILESTONES
from diloco.tools.grading import grade_verdicts
from diloco.tools.grading.grade_report import (
    FAILED,
    NOT_STARTED,
    PASSED,
    GradeReport,
    MilestoneResult,
    format_table,
    to_gradescope,
    to_junit_xml,
)
from diloco.tools.grading.lessons import list_items, named_tests, split_sections
from diloco.tools.workspace import regions as regions_mod
from diloco.tools.workspace.regions import RegionError, exercise_regions, stub_exercise_source

REPO = Path(__file__).resolve().parents[2]
CODES = [e.code for e in EXERCISES]


def test_the_table_is_well_formed():
    assert CODES == [f"x{n:02d}" for n in range(1, len(EXERCISES) + 1)] and len(EXERCISES) >= 3
    for e in EXERCISES:
        assert e.marker == e.code and e.label == f"{e.code} {e.name}"
        assert e.lesson == f"docs/exercises/{e.code}-{e.name.replace('_', '-')}.md"
        assert all(1 <= d <= 30 for d in e.depends_on), "an exercise needs milestones only"
        assert e.functions and len(set(e.functions)) == len(e.functions)
        assert exercises.test_command(e) == f"make test M={e.code}"
    assert by_code("x02").name == "streaming_schedule"


def test_the_stub_message_parses_back():
    e = by_code("x01")
    message = stub_message(e, "fp4_codes")
    assert message == ("exercise x01 fp4_quantiser: fp4_codes is not implemented yet "
                       "(see docs/exercises/x01-fp4-quantiser.md)")
    assert stub_code(message) == ("x01", "fp4_codes")
    assert stub_code("milestone 04 softmax: not implemented yet (see ...)") is None
    assert stub_code("exercise x01 fp4_quantiser: fp4_codes is slow") is None


def test_markers_nav_and_index_follow_the_table():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert [m.split(":")[0] for m in markers if m.startswith("x")] == CODES
    nav = (REPO / "mkdocs.yml").read_text()
    for e in EXERCISES:
        assert f'"{e.label}": {e.lesson.removeprefix("docs/")}' in nav, f"mkdocs.yml must list {e.lesson}"
        assert (REPO / e.lesson).is_file()
    index = (REPO / "docs" / "exercises" / "index.md").read_text()
    rows = re.findall(r"^\| (x\d\d) \| \[`(\w+)`\]\(([^)]+)\) \| (.+) \| (.+) \|$", index, re.M)
    assert [(c, n, f"docs/exercises/{lesson}") for c, n, lesson, _, _ in rows] == [
        (e.code, e.name, e.lesson) for e in EXERCISES]
    for (_, _, _, functions, needs), e in zip(rows, EXERCISES, strict=True):
        assert re.findall(r"`(\w+)`", functions.split(" in ")[0]) == list(e.function_names)
        assert needs == (", ".join(f"{d:02d}" for d in e.depends_on) or "-")


def test_every_exercise_function_has_exactly_one_region():
    found = regions_mod.package_exercise_regions()
    assert sorted(found) == sorted(exercises.exercise_functions())
    for (module, name), region in found.items():
        assert region.region.function == name and region.exercise.code == exercises.exercise_functions()[
            (module, name)].code
        assert Path(region.region.path) == regions_mod.exercise_module_path(module)


def _quantize_source() -> str:
    return (REPO / "src" / "diloco" / "core" / "quantize.py").read_text()


_FP4_BEGIN = "    # BEGIN EXERCISE x01\n    magnitude"
_FP4_END = "    return (sign | index.astype(np.uint8)).astype(np.uint8)\n    # END EXERCISE x01\n"
_FP4_LAST = "    return (sign | index.astype(np.uint8)).astype(np.uint8)\n"


@pytest.mark.parametrize("changes, error", [
    ([("# END EXERCISE x01\n\n\ndef _described", "# END EXERCISE x02\n\n\ndef _described")],
     "closes BEGIN EXERCISE x01"),
    ([(_FP4_BEGIN, "    magnitude"), (_FP4_END, _FP4_LAST)], "fp4_codes have no exercise region"),
    ([("def _described(x) -> str:\n", "def _described(x) -> str:\n    # BEGIN EXERCISE x01\n    pass\n"
       "    # END EXERCISE x01\n")], "_described(), which belongs to no exercise"),
    ([(_FP4_BEGIN, _FP4_BEGIN.replace("x01", "x02")), (_FP4_END, _FP4_END.replace("x01", "x02"))],
     "belongs to exercise x01"),
    ([(_FP4_END, _FP4_LAST)], "never closed"),
])
def test_malformed_exercise_regions_fail_loudly(changes, error):
    broken = _quantize_source()
    for old, new in changes:
        assert broken.count(old) == 1, old
        broken = broken.replace(old, new)
    with pytest.raises(RegionError, match=re.escape(error)):
        exercise_regions(broken, "core.quantize", "quantize.py")


def test_a_stub_keeps_the_checks_and_raises_its_message():
    stubbed = stub_exercise_source(_quantize_source(), "core.quantize")
    assert "BEGIN EXERCISE" not in stubbed and "TODO exercise x01 fp4_quantiser" in stubbed
    assert "make test M=x01" in stubbed
    namespace: dict = {"__name__": "diloco.core.quantize_stubbed"}
    exec(compile(stubbed, "quantize.py", "exec"), namespace)
    with pytest.raises(NotImplementedError, match=r"^exercise x01 fp4_quantiser: fp4_codes is not implemented yet"):
        namespace["fp4_codes"](np.zeros(3))
    with pytest.raises(TypeError, match="scaled"):  # the check before the region stays
        namespace["fp4_codes"]([0.5])
    with pytest.raises(NotImplementedError, match="scale_exponents is not implemented"):  # encode calls the stubs
        namespace["encode"](np.ones(4), "fp4")
    assert namespace["encode"](np.ones(4), "float32").codes.dtype == np.float32  # the rest works
    kept = stub_exercise_source(_quantize_source(), "core.quantize", keep=["x01"])
    assert "NotImplementedError(\n" not in kept and "BEGIN EXERCISE" not in kept
    half = stub_exercise_source(_quantize_source(), "core.quantize", keep=["fp4_codes"])
    assert "fp4_codes is not implemented" not in half and "scale_exponents is not implemented" in half


# --------------------------------------------------------------------------- lessons

SECTIONS = ("Before you start", "What these functions own", "The mathematics", "The contract", "Worked by hand",
            "Boundary, invalid and invariant", "Common mistakes", "Prove it works")


def exercise_test_names(e) -> set[str]:
    names = set()
    for path in (REPO / "tests").glob("test_*.py"):
        text = path.read_text()
        if f"pytestmark = pytest.mark.{e.marker}" in text or f"@pytest.mark.{e.marker}" in text:
            names.update(re.findall(r"^def (test_\w+)\(", text, re.M))
    return names


@pytest.mark.parametrize("code", CODES)
def test_the_lesson_has_its_sections_fixture_and_mistakes(code):
    e = by_code(code)
    text = (REPO / e.lesson).read_text()
    assert text.startswith(f"# Exercise {e.code}: `{e.name}`"), text.splitlines()[0]
    headings, bodies = split_sections(text)
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS), headings
    for name in e.function_names:
        assert re.search(rf"`{name}[`(]", bodies["What these functions own"]), f"the lesson must say what {name} owns"
    fixture = json.loads((REPO / "tests" / "fixtures" / f"{code}.json").read_text())
    block = re.search(rf"<!-- fixture: {code} -->\s*```json\n(.*?)\n```", text, re.S)
    assert block, f"{e.lesson}: no <!-- fixture: {code} --> json block"
    assert json.loads(block.group(1)) == {key: fixture[key] for key in ("case", "inputs", "expected")}
    assert fixture["functions"] == list(e.function_names) and fixture["arithmetic"]
    tests = exercise_test_names(e)
    assert len(tests) >= 8, tests
    mistakes = list_items(bodies["Common mistakes"])
    assert len(mistakes) >= 5
    for item in mistakes:
        named = named_tests(item)
        assert named and set(named) <= tests, f"{e.lesson}: a mistake names no test of {code}, or a missing one: {item}"


# --------------------------------------------------------------------------- verdicts and reports


def _records(marker: str, failures: dict[str, list[str]], passed: int = 1) -> list[dict]:
    nodeids = [f"tests/t.py::test_ok{k}" for k in range(passed)] + list(failures)
    records = [{"kind": "collected", "items": [[n, marker] for n in nodeids]}]
    records += [{"kind": "test", "nodeid": n, "marker": marker, "when": "call", "outcome": "passed"}
                for n in nodeids[:passed]]
    for nodeid, stubs in failures.items():
        records.append({"kind": "test", "nodeid": nodeid, "marker": marker, "when": "call", "outcome": "failed",
                        "name": nodeid.split("::")[1], "doc": "", "exc_type": "NotImplementedError",
                        "message": stubs[0], "stubs": stubs, "all_stub": True})
    return records


def test_an_exercise_is_not_started_while_every_function_is_a_stub_and_failed_once_some_are_written():
    e = by_code("x01")
    both = {"t::test_a": [stub_message(e, "scale_exponents")], "t::test_b": [stub_message(e, "fp4_codes")]}
    result = grade_verdicts.classify(e, _records("x01", both), "", REPO / "tests")
    assert result.status == NOT_STARTED and e.lesson in result.summary
    half = {"t::test_b": [stub_message(e, "fp4_codes")]}
    result = grade_verdicts.classify(e, _records("x01", half), "", REPO / "tests")
    assert result.status == FAILED and result.summary == "still a stub: fp4_codes", result
    assert "write fp4_codes too" in result.detail[0] and result.rerun == "make test M=x01"
    other = {"t::test_c": [stub_message(by_code("x02"), "sync_offsets")]}
    result = grade_verdicts.classify(e, _records("x01", other), "", REPO / "tests")
    assert result.status == FAILED and "x02 streaming_schedule's sync_offsets" in result.detail[0]
    milestone = {"t::test_d": ["milestone 02 relu: not implemented yet (see docs/milestones/02-relu.md)"]}
    assert "02 relu" in grade_verdicts.classify(e, _records("x01", milestone), "", REPO / "tests").detail[0]
    assert grade_verdicts.classify(e, _records("x01", {}, passed=3), "", REPO / "tests").status == PASSED
    # and a milestone never takes an exercise's stub for its own
    m = MILESTONES[1]
    assert grade_verdicts.classify(m, _records("m02", both), "", REPO / "tests").status == FAILED


def test_exercises_never_count_in_the_score():
    results = tuple(MilestoneResult(m, PASSED if m.number <= 3 else NOT_STARTED, rerun=f"make test M={m.marker}")
                    for m in MILESTONES)
    done = tuple(MilestoneResult(e, PASSED, tests_passed=5, tests_total=5, rerun=f"make test M={e.code}")
                 for e in EXERCISES)
    report = GradeReport(results, REPO, "", REPO / "tests", 1.0, "", done)
    assert report.score == 3 and report.max_score == 30
    assert report.progress_line().startswith("3/30 passed - next: 04 ")
    table = format_table(report)
    assert table.splitlines()[-1] == report.progress_line()
    n = len(EXERCISES)
    assert f"optional exercises: {n} of {n} done (not part of the 30-milestone score)" in table
    assert re.search(r"^ x01 fp4_quantiser +passed$", table, re.M), table
    results_json = to_gradescope(report)
    assert results_json["score"] == 3.0 and results_json["max_score"] == 30.0
    extra = [t for t in results_json["tests"] if "exercise" in t["extra_data"]]
    assert [t["number"] for t in extra] == CODES and {(t["score"], t["max_score"]) for t in extra} == {(0.0, 0.0)}
    assert {t["status"] for t in extra} == {"passed"}
    import xml.etree.ElementTree as ET

    root = ET.fromstring(to_junit_xml(report).split("\n", 1)[1])
    assert root.get("tests") == "30" and root.get("failures") == "27"
    suite = root.find("./testsuite[@name='diloco-exercises']")
    assert [c.get("name") for c in suite.findall("testcase")] == [e.label for e in EXERCISES]
    assert suite.get("failures") == "0"


def test_the_error_report_lists_the_exercises_with_no_points():
    from diloco.tools.grading.grade_report import error_report

    report = error_report(REPO, "no diloco package")
    assert report["score"] == 0.0 and report["max_score"] == 30.0
    assert [t["number"] for t in report["tests"][30:]] == CODES


# --------------------------------------------------------------------------- DiLoCo never needs x02


def test_plain_diloco_never_calls_the_streaming_schedule(monkeypatch):
    """One fragment is the whole model: a workspace's `make demo` trains with x02 still a stub."""
    from diloco import DiLoCoConfig
    from diloco.config.sections import FamilyConfig
    from diloco.core import driver, schedule

    def stub(*args, **kwargs):
        raise NotImplementedError("exercise x02 streaming_schedule: sync_offsets is not implemented yet")

    for name in ("fragment_layers", "fragment_keys", "sync_offsets", "sync_steps"):
        monkeypatch.setattr(schedule, name, stub)  # the MLP's fragments (MLPModel.fragments) look it up here
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(24, 3)), np.arange(24) % 2
    config = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=2, batch_size=4, hidden_sizes=(4,), seed=1)
    result = driver.train("diloco", x, y, config)
    assert len(result.history) == 2
    with pytest.raises(NotImplementedError, match="x02"):  # more than one fragment does use it
        driver.train("diloco", x, y, dataclasses.replace(config, family=FamilyConfig(fragments=2)))


def test_the_command_line_names_a_stub_it_reaches_in_one_line(monkeypatch, tmp_path, capsys):
    """In a workspace, `diloco train --fragments 2` before x02 is written: the stub's message, no traceback."""
    from diloco.core import schedule
    from diloco.tools.cli.main import main

    def stub(*args, **kwargs):
        raise NotImplementedError(stub_message(by_code("x02"), "fragment_keys"))

    monkeypatch.setattr(schedule, "fragment_keys", stub)  # where MLPModel.fragments finds the learner's function
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--fragments", "2", "--rounds", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("diloco train: error: exercise x02 streaming_schedule: fragment_keys is not implemented "
                           "yet (see docs/exercises/x02-streaming-schedule.md)"), err
