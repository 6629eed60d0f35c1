"""The grader, end to end on generated workspaces, plus its JSON / JUnit output and errors.

Each scenario grades a real workspace (pytest subprocesses, in waves), so the scenarios
are kept small: only milestones 1-6 are ever filled in, and the slow training-loop tests
never unlock here.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from diloco.exercises import EXERCISES
from diloco.milestones import MILESTONES, all_dependencies
from diloco.tools.cli.main import main
from diloco.tools.grading import grade_verdicts
from diloco.tools.grading import grader as grading
from diloco.tools.grading.grade_report import failure_lines, rerun_command
from diloco.tools.grading.grade_text import plain_math, round_tolerances, shown_lines
from diloco.tools.grading.grader import FAILED, LOCKED, NOT_STARTED, PASSED, grade
from diloco.tools.grading.lessons import common_mistakes
from diloco.tools.workspace.create import create_workspace
from diloco.tools.workspace.regions import exercise_module_path, stub_exercise_source, stub_source

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "docs" / "results.schema.json").read_text())


def fill_in(ws: Path, keep, exercises=()) -> None:
    """Copy the reference bodies of milestones ``keep`` into workspace ``ws``, and those of the
    exercises (codes, ``x01``) or exercise functions (names, ``_topk_flat``) in ``exercises``."""
    for module in sorted({m.module for m in MILESTONES}):
        source = (REPO / "src" / "diloco" / f"{module}.py").read_text()
        (ws / "src" / "diloco" / f"{module}.py").write_text(stub_source(source, module, keep=keep))
    for module in sorted({module for e in EXERCISES for module, _ in e.functions}):
        source = exercise_module_path(module).read_text()
        exercise_module_path(module, ws / "src" / "diloco").write_text(
            stub_exercise_source(source, module, keep=exercises))


def tree_digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """A fresh workspace graded through the CLI, with --json and --junit."""
    out = tmp_path_factory.mktemp("fresh")
    ws = create_workspace(out / "ws")
    before = tree_digest(ws)
    code = main(["grade", "--impl", str(ws), "--json", str(out / "results.json"),
                 "--junit", str(out / "results.xml"), "--quiet"])
    return {"ws": ws, "code": code, "before": before, "after": tree_digest(ws),
            "json": json.loads((out / "results.json").read_text()),
            "xml": ET.parse(out / "results.xml").getroot()}


@pytest.fixture(scope="module", params=[2, 6])
def first_k(request, tmp_path_factory):
    """Milestones 1..k done; with k = 6 also exercise x01, and half of x03 (its top-k, not its feedback)."""
    ws = create_workspace(tmp_path_factory.mktemp(f"k{request.param}") / "ws")
    fill_in(ws, range(1, request.param + 1), ("x01", "_topk_flat") if request.param == 6 else ())
    return request.param, grade(ws)


@pytest.fixture(scope="module")
def naive_softmax(tmp_path_factory):
    """Milestones 1-5 done, with two classic mistakes: softmax without the max shift (it
    overflows for huge logits) and a cross-entropy that sums instead of averaging."""
    ws = create_workspace(tmp_path_factory.mktemp("mistake") / "ws")
    fill_in(ws, range(1, 6))
    model = ws / "src" / "diloco" / "model.py"
    text = model.read_text()
    shifted = "    shifted = logits - logits.max(axis=-1, keepdims=True)\n    exp = np.exp(shifted)\n"
    assert shifted in text
    text = text.replace(shifted, "    exp = np.exp(logits)\n")
    mean = "mean = np.mean(losses)"
    assert mean in text
    model.write_text(text.replace(mean, "mean = np.sum(losses)"))
    return grade(ws)


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_fresh_workspace_grades_zero(fresh):
    assert fresh["code"] == 0
    statuses = {t["extra_data"]["state"] for t in fresh["json"]["tests"]}
    assert statuses <= {NOT_STARTED, LOCKED}
    assert fresh["json"]["score"] == 0
    assert fresh["json"]["output"] == (
        "0/30 passed - next: 01 init_model_params (docs/milestones/01-init-model-params.md)")
    by_number = {t["extra_data"]["milestone"]: t["extra_data"] for t in fresh["json"]["tests"]
                 if "milestone" in t["extra_data"]}
    for m in MILESTONES:  # exactly the milestones with prerequisites are locked
        assert by_number[m.number]["state"] == (LOCKED if m.depends_on else NOT_STARTED)
    exercises = [t for t in fresh["json"]["tests"] if "exercise" in t["extra_data"]]
    assert [t["number"] for t in exercises] == [e.code for e in EXERCISES]
    for t in exercises:  # and 0 of the exercises: each still raises its stubs
        assert t["extra_data"]["state"] == NOT_STARTED and t["status"] == "failed", t
        assert t["score"] == t["max_score"] == 0


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_grading_does_not_touch_the_submission(fresh):
    assert fresh["after"] == fresh["before"]


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_first_k_milestones_pass(first_k):
    k, report = first_k
    assert {r.milestone.number for r in report.results if r.status == PASSED} == set(range(1, k + 1))
    assert report.score == k
    for r in report.results:
        if r.status != PASSED:
            assert r.status in (NOT_STARTED, LOCKED), (r.milestone.label, r.status, r.summary, r.detail)
    assert report.progress_line().startswith(f"{k}/30 passed - next: {k + 1:02d} ")
    assert Path(report.imported_from).is_relative_to(report.impl / "src" / "diloco")
    table = grading.format_table(report)
    assert table.splitlines()[-1] == report.progress_line()
    assert sum(" passed" in line for line in table.splitlines()[4:36]) == k
    states = {r.milestone.code: r for r in report.exercises}
    if k == 6:  # x01 done, x03 half done: neither changes the score
        assert states["x01"].status == PASSED, (states["x01"].summary, states["x01"].detail)
        assert states["x03"].status == FAILED and states["x03"].summary == "still a stub: compress_with_feedback"
        assert states["x03"].tests_passed > 0 and states["x02"].status == NOT_STARTED
        assert "optional exercises: 1 of 7 done (not part of the 30-milestone score)" in table
        row = r"^ x03 topk_error_feedback +FAILED +still a stub: compress_with_feedback$"
        assert re.search(row, table, re.M), table
    else:
        assert {r.status for r in report.exercises} == {NOT_STARTED}


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_a_realistic_mistake_fails_and_locks_its_dependents(naive_softmax):
    report = naive_softmax
    softmax = report.result(4)
    assert softmax.status == FAILED
    text = "\n".join(softmax.detail)
    assert "overflow encountered in exp" in text, text
    assert "raised at diloco/model.py:" in text and "exp = np.exp(logits)" in text, text
    assert "test: tests/test_model.py::test_softmax" in text
    assert softmax.rerun == "make test M=m04"
    loss = report.result(5)
    assert loss.status == FAILED
    text = "\n".join(loss.detail)
    assert "expected" in text and "got" in text, text
    assert {r.milestone.number for r in report.results if r.passed} == {1, 2, 3}
    dependents = {m.number for m in MILESTONES if {4, 5} & set(all_dependencies(m.number))}
    assert dependents >= {6, 19, 20, 25, 26, 27, 28}
    for number in dependents:
        assert report.result(number).status == LOCKED
    assert "needs 04 softmax" in report.result(6).summary
    table = grading.format_table(report)  # printed here, outside the workspace: make runs in the workspace
    assert "FAILED" in table and f"rerun: make -C {report.impl} test M=m04" in table, table
    assert f"rerun: make -C {report.impl} test M=m05" in table
    assert "Traceback" not in table
    assert report.progress_line() == "3/30 passed - next: 04 softmax (docs/milestones/04-softmax.md)"


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_json_validates_against_the_documented_schema_and_adds_up(fresh, first_k):
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for results in (fresh["json"], grading.to_gradescope(first_k[1])):
        validator.validate(results)
        assert results["output_format"] == "text" and {t["output_format"] for t in results["tests"]} == {"text"}
        assert results["score"] == sum(t["score"] for t in results["tests"])
        assert results["max_score"] == sum(t["max_score"] for t in results["tests"]) == 30
        assert [t["number"] for t in results["tests"]] == [f"{n:02d}" for n in range(1, 31)] + [
            e.code for e in EXERCISES]
        milestones, exercises = results["tests"][:30], results["tests"][30:]
        assert all((t["status"] == "passed") == (t["score"] == t["max_score"]) for t in milestones)
        assert all(t["score"] == t["max_score"] == 0 for t in exercises)
    broken = json.loads(json.dumps(fresh["json"]))
    del broken["tests"][3]["output_format"]
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(broken)
    points = json.loads(json.dumps(fresh["json"]))
    points["tests"][30]["max_score"] = 1.0  # an exercise may never carry points
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(points)


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_junit_xml(fresh):
    root = fresh["xml"]
    cases = root.findall("./testsuite[@name='diloco-milestones']/testcase")
    assert len(cases) == 30
    extra = root.find("./testsuite[@name='diloco-exercises']")
    assert [c.get("name") for c in extra.findall("testcase")] == [e.label for e in EXERCISES]
    assert int(extra.get("failures")) == len(EXERCISES) and int(root.get("tests")) == 30
    locked = sum(1 for m in MILESTONES if m.depends_on)
    assert int(root.get("skipped")) == locked == len(root.findall(".//skipped"))
    assert int(root.get("failures")) == 30 - locked
    assert cases[6].get("name") == "m07 init_adamw_state"


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_missing_or_broken_package_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["grade", "--impl", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no diloco package" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    ws = create_workspace(tmp_path / "ws")
    model = ws / "src" / "diloco" / "model.py"
    model.write_text(model.read_text() + "\ndef broken(:\n")
    out = tmp_path / "results.json"
    assert main(["grade", "--impl", str(ws), "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert "does not import" in err and "SyntaxError" in err and "Traceback" not in err
    assert json.loads(out.read_text())["score"] == 0
    # The workspace's own grader, run as a file, reports the same without importing the package.
    proc = subprocess.run([sys.executable, "src/diloco/tools/grading/grader.py", "--impl", "."], cwd=ws,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "SyntaxError" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def relu_only(tmp_path_factory):
    """A suite of one test, of milestone 02, and the reference graded against it in the sandbox."""
    tests = tmp_path_factory.mktemp("relu") / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text("")
    (tests / "test_relu.py").write_text(
        "import numpy as np, pytest\nfrom diloco import relu\n\n"
        "@pytest.mark.m02\ndef test_relu():\n    assert relu(np.array([-1.0, 2.0])).tolist() == [0.0, 2.0]\n")
    return tests, grade(REPO, tests)


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_a_milestone_without_tests_is_an_error(relu_only):
    _, report = relu_only
    assert report.result(2).status == PASSED
    assert report.result(1).status == grading.ERROR
    assert "no tests collected for m01" in report.result(1).summary
    assert report.result(3).status == grading.ERROR  # unlocked by 02, but has no tests here
    assert report.score == 1


def test_a_call_into_another_stub_is_named():
    records = [
        {"kind": "collected", "items": [["t::a", "m20"]]},
        {"kind": "test", "nodeid": "t::a", "marker": "m20", "when": "call", "outcome": "failed", "name": "test_a",
         "doc": "", "exc_type": "NotImplementedError", "message": "milestone 18 sample_worker_batch: ...",
         "stubs": ["milestone 18 sample_worker_batch: ..."], "all_stub": True},
    ]
    result = grade_verdicts.classify(MILESTONES[19], records, "", REPO / "tests")
    assert result.status == FAILED and "18 sample_worker_batch" in result.detail[0]


def failure_text(result) -> str:
    return "\n".join(failure_lines(result))


def _failed_record(nodeid: str, message: str = "state: expected separate arrays\n       got one") -> dict:
    name = nodeid.rsplit("::", 1)[-1].partition("[")[0]
    return {"kind": "test", "nodeid": nodeid, "marker": "m07", "when": "call", "outcome": "failed", "name": name,
            "doc": "", "exc_type": "AssertionError", "message": message, "stubs": [], "all_stub": False}


def test_a_failed_row_names_every_failing_test_and_only_the_mistakes_they_catch():
    """Every failing test is named, not only the first, and the lesson's bullets that name a
    failing test are shown (and no other), with a link to the lesson's section."""
    separate = "tests/test_adamw.py::test_init_state_m_and_v_are_separate_arrays"
    zeros_like = "tests/test_adamw.py::test_init_state_zeros_like_params"
    passing = "tests/test_adamw.py::test_init_state_rejects_bad_params[list]"
    records = [{"kind": "collected", "items": [[separate, "m07"], [zeros_like, "m07"], [passing, "m07"]]},
               _failed_record(separate), _failed_record(zeros_like),
               {"kind": "test", "nodeid": passing, "marker": "m07", "when": "call", "outcome": "passed"}]
    result = grade_verdicts.classify(MILESTONES[6], records, "", REPO / "tests")
    assert result.status == FAILED
    assert result.failing == (separate, zeros_like)
    titles = [text.split(".")[0] for text in result.mistakes]
    # zeros_like catches "default dtype" and "zeroing the parameters"; separate catches "one set of zeros".
    assert titles == ["One set of zeros for both moments", "Zeros in the default dtype", "Zeroing the parameters"]
    assert all("`test_" in text and "**" not in text for text in result.mistakes)
    report = grading.GradeReport((result,), REPO, "", REPO / "tests", 0.0)
    for text in (grading.format_table(report), grading.to_gradescope(report)["tests"][0]["output"]):
        assert separate in text and zeros_like in text and passing not in text
        assert "docs/milestones/07-init-adamw-state.md#common-mistakes" in text
        assert "One set of zeros for both moments." in text and "A plain tuple or dict" not in text
        assert "rerun: make test M=m07" in text


def test_failing_parametrised_cases_are_grouped_under_their_test():
    nodeids = ("tests/test_model.py::test_softmax_fixture[float32]",
               "tests/test_model.py::test_softmax_fixture[float64]", "tests/test_model.py::test_softmax_finite")
    result = grading.MilestoneResult(MILESTONES[3], FAILED, "x", ("message",), rerun="make test M=m04",
                                     tests_total=9, failing=nodeids)
    lines = failure_lines(result)
    assert "failing tests (3 of 9):" in lines
    assert "  tests/test_model.py::test_softmax_fixture  [float32, float64]" in lines
    assert "  tests/test_model.py::test_softmax_finite" in lines


def test_a_lesson_without_a_matching_bullet_still_links_its_mistakes(tmp_path):
    """A failing test no bullet names: no bullets, but the link to the section."""
    records = [{"kind": "collected", "items": [["tests/test_adamw.py::test_new", "m07"]]},
               _failed_record("tests/test_adamw.py::test_new")]
    result = grade_verdicts.classify(MILESTONES[6], records, "", REPO / "tests")
    assert result.mistakes == ()
    assert "common mistakes: docs/milestones/07-init-adamw-state.md#common-mistakes" in failure_text(result)
    # Tests run from a folder with no lessons beside it: the verdict stands, without bullets.
    (tmp_path / "tests").mkdir()
    assert grade_verdicts.classify(MILESTONES[6], records, "", tmp_path / "tests").status == FAILED


def test_lesson_bullets_parse_to_plain_text_with_their_tests(tmp_path):
    from diloco.tools.grading.lessons import common_mistakes, matching_mistakes, section_anchor

    lesson = tmp_path / "lesson.md"
    lesson.write_text(
        "# Milestone 99\n\n## Common mistakes\n\n"
        "- **Summing.** Gives \\(n\\) times the [mean](../x.md#y). Caught by\n"
        "  `test_a[float32]` and `tests/test_x.py::test_b`.\n"
        "- **Other.** Caught by `test_c`.\n\n"
        "```text\n## Common mistakes\n- **In a fence.** `test_d`\n```\n\n## Prove it works\n\n- `test_e`\n")
    mistakes = common_mistakes(lesson)
    assert [m.tests for m in mistakes] == [("test_a", "test_b"), ("test_c",)]
    assert mistakes[0].text == ("Summing. Gives n times the mean. "
                                "Caught by `test_a[float32]` and `tests/test_x.py::test_b`.")
    assert matching_mistakes(mistakes, ["tests/test_x.py::test_b[float64]"]) == mistakes[:1]
    assert matching_mistakes(mistakes, ["tests/test_x.py::test_e"]) == ()
    assert common_mistakes(tmp_path / "missing.md") == ()
    assert section_anchor("Common mistakes") == "common-mistakes"
    toc = pytest.importorskip("markdown.extensions.toc")  # the slug the site really uses
    assert section_anchor("Common mistakes") == toc.slugify("Common mistakes", "-")


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_the_learner_guide_shows_what_the_grader_prints(naive_softmax, monkeypatch):
    """The guide's FAILED rows for softmax and cross-entropy are lines of the real table
    (``...`` marks an elision; source line numbers may differ)."""
    import re

    def normalised(text: str) -> list[str]:
        return [re.sub(r"\.py:\d+:", ".py:N:", line.rstrip()) for line in text.splitlines()]

    monkeypatch.chdir(naive_softmax.impl)  # the guide shows a workspace's `make grade`
    guide = (REPO / "docs" / "learner-guide.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"^```text\n(.*?)^```", guide, re.S | re.M) if " FAILED " in b]
    assert [b.split()[1] for b in blocks] == ["softmax", "cross_entropy_loss"]
    table = normalised(grading.format_table(naive_softmax))
    for block in blocks:
        for line in normalised(block):
            if line.strip() != "...":
                assert line in table, f"docs/learner-guide.md shows a line the grader does not print:\n{line}"


@pytest.mark.slow  # grades a workspace, or its module fixture does (once)
def test_the_report_says_whether_the_graded_code_was_sandboxed(relu_only):
    tests, sandboxed = relu_only
    local = grade(REPO, tests, sandbox=False)
    assert sandboxed.result(2).status == local.result(2).status == PASSED
    assert "\n  (sandboxed (protections: separate process, own session" in grading.format_table(sandboxed)
    assert "\n  (local, not sandboxed" in grading.format_table(local)
    assert grading.to_gradescope(sandboxed)["output"] == sandboxed.progress_line()
    assert "local, not sandboxed" in grading.to_gradescope(local)["output"]
    for report, words in ((sandboxed, "sandboxed (protections:"), (local, "local, not sandboxed")):
        grading_property = ET.fromstring(grading.to_junit_xml(report).split("\n", 1)[1]).find(".//property")
        assert grading_property.get("name") == "grading" and grading_property.get("value").startswith(words)


def test_the_rerun_command_tests_the_graded_code_from_where_it_is_printed(tmp_path, monkeypatch):
    """From the repository root, `make grade` grades ./workspace: its rerun command must run
    the workspace's tests on the workspace's code, not `make test` of the root (the reference)."""
    ws = tmp_path / "work space"
    (ws / "src" / "diloco").mkdir(parents=True)
    (ws / "Makefile").write_text("test:\n")
    result = grading.MilestoneResult(MILESTONES[3], FAILED, "x", ("message",), rerun="make test M=m04")
    report = grading.GradeReport((result,), ws, "", REPO / "tests", 0.0)
    assert rerun_command(report, result, cwd=ws) == "make test M=m04"
    assert rerun_command(report, result, cwd=tmp_path) == "make -C 'work space' test M=m04"
    assert rerun_command(report, result, cwd=REPO) == f"make -C '{ws}' test M=m04"
    for inner in (ws / "src", ws / "src" / "diloco"):  # --impl names the src folder or the package
        assert rerun_command(report._replace(impl=inner), result, cwd=tmp_path) == "make -C 'work space' test M=m04"
    monkeypatch.chdir(tmp_path)
    assert "rerun: make -C 'work space' test M=m04" in grading.format_table(report)
    assert "rerun: make -C 'work space' test M=m04" in grading.to_junit_xml(report)
    gradescope = grading.to_gradescope(report)["tests"][0]["output"]  # seen on Gradescope, run at home
    assert "rerun: make test M=m04 (in your workspace)" in gradescope
    bare = report._replace(impl=tmp_path / "submission")  # no Makefile: no make -C into it
    assert rerun_command(bare, result, cwd=tmp_path) == "make test M=m04 (in your workspace)"


def test_lesson_maths_is_shown_as_plain_text():
    cases = {
        r"Using \(\sqrt{1/\text{fan-in}}\), or \(\sqrt2\, Z_1\)": "Using sqrt(1/fan-in), or sqrt(2) Z_1",
        r"\(\beta_1 g + (1 - \beta_1) m\)": "beta_1 g + (1 - beta_1) m",
        r"\(\hat m / \sqrt{\hat v}\), \(\frac1n\), \(\frac{K-1}{K}\)": "m_hat / sqrt(v_hat), 1/n, (K-1)/K",
        r"\(\theta_{\text{global}} - \alpha\hat m\), \(e^{-1000}\)": "theta_global - alpha m_hat, e^(-1000)",
        "no maths: `{'W1': x[1]}`": "no maths: `{'W1': x[1]}`",
    }
    for latex, plain in cases.items():
        assert plain_math(latex) == plain
    lessons = sorted((REPO / "docs" / "milestones").glob("*.md"))
    shown = [plain_math(m.text) for lesson in lessons for m in common_mistakes(lesson)]
    assert len(shown) > 60
    nodeid = "tests/test_model.py::test_init_matches_hand_worked_fixture[float64]"
    records = [{"kind": "collected", "items": [[nodeid, "m01"]]}, {**_failed_record(nodeid), "marker": "m01"}]
    result = grade_verdicts.classify(MILESTONES[0], records, "", REPO / "tests")
    assert any("Using sqrt(1/fan-in), or sqrt(2/fan-out)" in text for text in result.mistakes), result.mistakes
    assert not any("\\" in text for text in result.mistakes)
    for text in shown:  # every bullet the grader can print, outside its code
        prose = "".join(text.split("`")[::2])
        assert "\\" not in prose and "{" not in prose and "}" not in prose, text


def test_tolerances_are_rounded_and_expected_and_got_show_the_same_rows():
    assert round_tolerances("(rtol=1e-05, atol=1.0000000000000001e-07)") == "(rtol=1e-05, atol=1e-07)"
    assert round_tolerances("rtol=0.30000000000000004 x=1.0000000000000001e-07") == "rtol=0.3 x=1.0000000000000001e-07"
    assert round_tolerances("rtol=1e-12, atol=0.0, tol=0.25") == "rtol=1e-12, atol=0.0, tol=0.25"
    expected = "value: expected [" + "\n                 ".join(f"[{k}.1 {k}.2]" for k in range(5)) + "]"
    got = "             got [" + "\n                 ".join(f"[{k}.9 {k}.8]" for k in range(5)) + "]"
    message = f"{expected}\n{got}\nlargest difference 9 at index (0, 0) (rtol=1e-12, atol=1.0000000000000001e-07)"

    def rows(lines, digit):
        return [k for k in range(5) if any(f"[{k}.{digit} " in line for line in lines)]

    lines = shown_lines(message, 8)
    assert 1 <= len(rows(lines, 1)) < 5 and rows(lines, 1) == rows(lines, 9), lines  # the same rows of both
    assert rows(lines, 1) == list(range(len(rows(lines, 1))))
    assert sum("more rows" in line for line in lines) == 2 and lines[-1].startswith("largest difference")
    assert shown_lines(message, 40) == message.splitlines(), "a message that fits is shown whole"
    records = [{"kind": "collected", "items": [["t::a", "m05"]]},
               {"kind": "test", "nodeid": "t::a", "marker": "m05", "when": "call", "outcome": "failed",
                "name": "test_a", "doc": r"The \(\log \sum_j e^{z_j}\) check.", "exc_type": "AssertionError",
                "message": message, "stubs": [], "all_stub": False}]
    result = grade_verdicts.classify(MILESTONES[4], records, "", REPO / "tests")
    assert result.summary == "The log sum_j e^z_j check"
    shown = "\n".join(result.detail)
    assert rows(result.detail, 1) == rows(result.detail, 9) and "(rtol=1e-12, atol=1e-07)" in shown, shown


def test_the_instructor_guide_shows_the_autograder_scripts_as_they_are():
    guide = (REPO / "docs" / "instructor-guide.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", guide, re.S | re.M)
    for name in ("setup.sh", "run_autograder"):
        assert (REPO / "scripts" / "autograder" / name).read_text() in blocks, f"the guide's {name} is not the file"
    text = (REPO / "Makefile").read_text()
    assert ("\nautograder:\n\t$(PYTHON) scripts/build_autograder.py $(AUTOGRADER_ZIP) "
            "$(if $(TESTS),--tests '$(TESTS)',)\n") in text
