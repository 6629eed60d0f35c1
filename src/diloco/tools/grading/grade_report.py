"""The grader's verdict types and output formats: the table, Gradescope ``results.json``, JUnit XML.

Each milestone ends as one of ``passed``, ``not started``, ``failed``, ``locked`` or
``error`` (see ``diloco.tools.grading.grader``); ``GradeReport`` holds the 30 verdicts, and
those of the optional exercises (``diloco.exercises``), which every output shows in a
section of its own and none counts in the score. Every output passes its text through
``grade_text.safe_text``: what the submission wrote reaches no terminal or report raw.
"""

from __future__ import annotations

import os
import shlex
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

from diloco.exercises import EXERCISES, Exercise
from diloco.milestones import MILESTONES, Milestone
from diloco.tools.grading.grade_text import LINE_LIMIT, safe_data, safe_text
from diloco.tools.grading.lessons import mistakes_link

__all__ = [
    "PASSED", "NOT_STARTED", "FAILED", "LOCKED", "ERROR",
    "MilestoneResult", "GradeReport", "format_table", "failure_lines", "rerun_command", "to_gradescope",
    "to_junit_xml", "error_report", "error_junit_xml",
]

PASSED, NOT_STARTED, FAILED, LOCKED, ERROR = "passed", "not started", "failed", "locked", "error"


class MilestoneResult(NamedTuple):
    """The verdict on one milestone (or one optional exercise: ``milestone`` is then an ``Exercise``).

    ``summary`` is one line for the table; ``detail`` the failing check's message
    lines; ``blocked_by`` the prerequisites that did not pass (for ``locked``);
    ``failing`` the node id of every failing test (for ``failed``); ``mistakes`` the
    lesson's "Common mistakes" bullets that name one of them, as plain text.
    """

    milestone: Milestone | Exercise
    status: str
    summary: str = ""
    detail: tuple[str, ...] = ()
    rerun: str = ""
    tests_passed: int = 0
    tests_total: int = 0
    duration: float = 0.0
    blocked_by: tuple[int, ...] = ()
    failing: tuple[str, ...] = ()
    mistakes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status == PASSED


class GradeReport(NamedTuple):
    """Everything one grading run found.

    ``sandbox`` names the protections the graded code ran under (``diloco.tools.sandbox.box``);
    empty when it ran inside the test process (local mode, ``--trust-submission``).
    ``exercises`` holds the verdicts on the optional exercises, outside ``score``; ``notes``
    a line for each file of the package the sandbox did not get (``diloco/adamw.py is a hard
    link and was not copied``), and ``box.full_note`` when the graded code filled its folder's
    file count.
    """

    results: tuple[MilestoneResult, ...]
    impl: Path
    imported_from: str
    tests_dir: Path
    duration: float
    sandbox: str = ""
    exercises: tuple[MilestoneResult, ...] = ()
    notes: tuple[str, ...] = ()  # files of the package not copied for the sandbox, and why; its folder full

    @property
    def mode_line(self) -> str:
        if self.sandbox:
            return f"sandboxed (protections: {self.sandbox})"
        return "local, not sandboxed: the graded code ran in the test process"

    @property
    def score(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def max_score(self) -> int:
        return len(self.results)

    def result(self, number: int) -> MilestoneResult:
        return next(r for r in self.results if r.milestone.number == number)

    def exercise(self, code: str) -> MilestoneResult:
        """The verdict on exercise ``code`` (``x01``)."""
        return next(r for r in self.exercises if r.milestone.code == code)

    def exercise_line(self) -> str:
        """``optional exercises: 1 of 3 done (not part of the 30-milestone score)``."""
        done = sum(r.passed for r in self.exercises)
        return f"optional exercises: {done} of {len(self.exercises)} done (not part of the 30-milestone score)"

    def next_milestone(self) -> Milestone | None:
        """The lowest-numbered milestone that is unlocked and not passed."""
        for r in self.results:
            if r.status in (NOT_STARTED, FAILED, ERROR):
                return r.milestone
        return None

    def progress_line(self) -> str:
        head = f"{self.score}/{self.max_score} passed"
        nxt = self.next_milestone()
        if nxt is not None:
            return f"{head} - next: {nxt.label} ({nxt.lesson})"
        if self.score == self.max_score:
            return f"{head} - all milestones done"
        return f"{head} - every remaining milestone is locked"



# --------------------------------------------------------------------------- output

_WORDS = {PASSED: "passed", NOT_STARTED: "not started", FAILED: "FAILED", LOCKED: "locked", ERROR: "ERROR"}
_WIDTH = 100  # wrap the lesson's bullets to this many columns


def _grouped(nodeids: tuple[str, ...]) -> list[str]:
    """``path::test  [float32, float64]``: one line per test function, its failing parameters."""
    groups: dict[str, list[str]] = {}
    for nodeid in nodeids:
        base, _, params = nodeid.partition("[")
        groups.setdefault(base, [])
        if params:
            groups[base].append(params.removesuffix("]"))
    return [f"{base}  [{', '.join(params)}]" if params else base for base, params in groups.items()]


def _project(impl: Path) -> Path | None:
    """The project folder (a ``Makefile`` beside ``src/diloco``) that ``impl`` names, if any."""
    for folder in (impl, impl.parent, impl.parent.parent):
        if (folder / "Makefile").is_file() and (folder / "src" / "diloco").is_dir():
            return folder
    return None


def rerun_command(report: GradeReport, r: MilestoneResult, cwd: Path | None = None) -> str:
    """``r.rerun`` (``make test M=m04``, a workspace's command) as it must be typed in ``cwd``.

    In the graded project itself it is unchanged; elsewhere it runs make in that project
    (``make -C workspace test M=m04``), so it tests the graded code and never the
    reference of the folder it was printed in. A graded folder that is no project with a
    Makefile gets ``(in your workspace)``.
    """
    here = Path(cwd if cwd is not None else Path.cwd()).resolve()
    project = _project(Path(report.impl).resolve())
    if project == here or not r.rerun.startswith("make "):
        return r.rerun
    if project is None:
        return f"{r.rerun} (in your workspace)"
    where = os.path.relpath(project, here) if project.is_relative_to(here) else str(project)
    return f"make -C {shlex.quote(where)} {r.rerun.removeprefix('make ')}"


def failure_lines(r: MilestoneResult, indent: str = "", rerun: str | None = None) -> list[str]:
    """What a FAILED or ERROR row shows under it: the check's message, every failing test,
    the lesson's matching common mistakes with a link to them, and the rerun command
    (``rerun``, default ``r.rerun``). A detail line that holds line breaks (a submission's
    message) keeps ``indent`` on each of them: no line of it starts where a verdict does."""
    out = [indent + line.replace("\n", "\n" + indent) for line in r.detail]
    if len(r.failing) > 1:
        out.append(f"{indent}failing tests ({len(r.failing)} of {r.tests_total}):")
        out += [f"{indent}  {line}" for line in _grouped(r.failing)]
    if r.mistakes:
        out.append(f"{indent}common mistakes these tests catch ({mistakes_link(r.milestone)}):")
        for text in r.mistakes:
            out += textwrap.wrap(text, width=_WIDTH, initial_indent=f"{indent}  - ",
                                 subsequent_indent=f"{indent}    ", break_on_hyphens=False)
    elif r.status == FAILED and r.failing:
        out.append(f"{indent}common mistakes: {mistakes_link(r.milestone)}")
    out.append(f"{indent}rerun: {r.rerun if rerun is None else rerun}")
    return out


def format_table(report: GradeReport) -> str:
    """The learner's view: one row per milestone, details under failures, a progress line."""
    width = max(len(m.name) for m in MILESTONES)
    out = [f"diloco grade: {report.impl}", f"  (testing {report.imported_from})", f"  ({report.mode_line})",
           *(f"  ({note})" for note in report.notes), "",
           f" #  {'milestone':<{width}}  {'status':<11}  notes", f" -- {'-' * width}  {'-' * 11}  {'-' * 5}"]
    for r in report.results:
        note = r.summary
        if r.status == PASSED:
            note = ""
        elif r.status == NOT_STARTED:
            note = r.milestone.lesson
        out.append(f" {r.milestone.number:02d} {r.milestone.name:<{width}}  {_WORDS[r.status]:<11}  {note}".rstrip())
        if r.status in (FAILED, ERROR):
            out += failure_lines(r, " " * 8, rerun_command(report, r))
    if report.exercises:
        out += ["", f" {'#':<3} {'optional exercise':<{width - 1}}  {'status':<11}  notes",
                f" --- {'-' * (width - 1)}  {'-' * 11}  {'-' * 5}"]
        for r in report.exercises:
            note = "" if r.status == PASSED else r.milestone.lesson if r.status == NOT_STARTED else r.summary
            out.append(f" {r.milestone.code} {r.milestone.name:<{width - 1}}  {_WORDS[r.status]:<11}  {note}".rstrip())
            if r.status in (FAILED, ERROR):
                out += failure_lines(r, " " * 8, rerun_command(report, r))
        out += ["", report.exercise_line()]
    out += ["", report.progress_line()]
    return "\n".join(safe_text(line, LINE_LIMIT, one_line=True) for line in out)


def _output_text(r: MilestoneResult, rerun: str | None = None) -> str:
    if r.status == PASSED:
        return f"passed ({r.tests_passed}/{r.tests_total} tests)"
    if r.status == NOT_STARTED:
        what = ("its functions still raise NotImplementedError" if isinstance(r.milestone, Exercise)
                else "the function still raises NotImplementedError")
        return f"not started: {what}. Lesson: {r.milestone.lesson}"
    if r.status == LOCKED:
        return f"locked: {r.summary}; its tests were not run"
    head = "failed" if r.status == FAILED else "error"  # the verdict: the only line at the margin
    summary = safe_text(r.summary, LINE_LIMIT, one_line=True)
    return "\n".join([f"{head}: {summary}", *failure_lines(r, "  ", rerun)])


def _exercise_entry(r: MilestoneResult, output: str) -> dict:
    """An optional exercise's test entry: no points (``max_score`` 0), so never in the score."""
    e = r.milestone
    return {
        "name": f"{e.label} (optional exercise, no points)",
        "number": e.code,
        "score": 0.0,
        "max_score": 0.0,
        "status": "passed" if r.passed else "failed",
        "output": output,
        "output_format": "text",
        "visibility": "visible",
        "extra_data": {
            "exercise": e.code,
            "state": r.status,
            "tests_passed": r.tests_passed,
            "tests_total": r.tests_total,
            "depends_on": list(e.depends_on),
            "blocked_by": list(r.blocked_by),
            "lesson": e.lesson,
        },
    }


def to_gradescope(report: GradeReport) -> dict:
    """Gradescope's ``results.json``: one test entry per milestone, one point each, then one
    entry per optional exercise with no points (``max_score`` 0).

    Every output is ``"output_format": "text"``, which Gradescope shows as it is, so the
    expected and got columns stay aligned; the rerun command is the learner's own.
    """
    tests = []
    for r in report.results:
        m = r.milestone
        tests.append({
            "name": m.label,
            "number": f"{m.number:02d}",
            "score": 1.0 if r.passed else 0.0,
            "max_score": 1.0,
            "status": "passed" if r.passed else "failed",
            "output": _output_text(r, f"{r.rerun} (in your workspace)"),
            "output_format": "text",
            "visibility": "visible",
            "extra_data": {
                "milestone": m.number,
                "state": r.status,
                "tests_passed": r.tests_passed,
                "tests_total": r.tests_total,
                "depends_on": list(m.depends_on),
                "blocked_by": list(r.blocked_by),
                "lesson": m.lesson,
            },
        })
    tests += [_exercise_entry(r, _output_text(r, f"{r.rerun} (in your workspace)")) for r in report.exercises]
    return safe_data({
        "score": float(sum(t["score"] for t in tests)),
        "max_score": float(sum(t["max_score"] for t in tests)),
        "execution_time": round(report.duration, 3),
        "output": "\n".join([report.progress_line() + ("" if report.sandbox else f" [{report.mode_line}]"),
                             *report.notes]),
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    })


def _suite_attrs(name: str, results: tuple[MilestoneResult, ...], duration: float) -> dict:
    counts = {s: sum(r.status == s for r in results) for s in _WORDS}
    failures, errors, skipped = counts[FAILED] + counts[NOT_STARTED], counts[ERROR], counts[LOCKED]
    return dict(name=name, tests=str(len(results)), failures=str(failures), errors=str(errors),
                skipped=str(skipped), time=f"{duration:.3f}")


def to_junit_xml(report: GradeReport) -> str:
    """JUnit XML: a testcase per milestone (testsuite ``diloco-milestones``), and per optional
    exercise (testsuite ``diloco-exercises``); not started and failed are failures, locked is
    skipped. The root ``testsuites`` element counts the milestones only, as the score does."""
    attrs = _suite_attrs("diloco-milestones", report.results, report.duration)
    suites = ET.Element("testsuites", attrs)
    groups = [(attrs, report.results, "diloco.milestones")]
    if report.exercises:
        groups.append((_suite_attrs("diloco-exercises", report.exercises, sum(r.duration for r in report.exercises)),
                       report.exercises, "diloco.exercises"))
    for suite_attrs, results, classname in groups:
        suite = ET.SubElement(suites, "testsuite", suite_attrs)
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="grading", value=report.mode_line)
        for r in results:
            case = ET.SubElement(suite, "testcase", classname=classname,
                                 name=f"{r.milestone.marker} {r.milestone.name}", time=f"{r.duration:.3f}")
            rerun = rerun_command(report, r)
            if r.status == FAILED:
                ET.SubElement(case, "failure", message=r.summary, type="Failed").text = _output_text(r, rerun)
            elif r.status == NOT_STARTED:
                ET.SubElement(case, "failure", message="not started", type="NotStarted").text = _output_text(r)
            elif r.status == ERROR:
                ET.SubElement(case, "error", message=r.summary, type="Error").text = _output_text(r, rerun)
            elif r.status == LOCKED:
                ET.SubElement(case, "skipped", message=f"locked: {r.summary}")
    for element in suites.iter():
        element.attrib = {key: safe_text(value, LINE_LIMIT, one_line=True) for key, value in element.attrib.items()}
        if element.text:
            element.text = safe_text(element.text)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def error_junit_xml(message: str) -> str:
    """JUnit XML for a submission that cannot be graded: every milestone and exercise an error
    with ``message``, as ``error_report`` is for ``results.json``."""
    line = safe_text(f"error: {message}", LINE_LIMIT, one_line=True)
    counts = dict(failures="0", skipped="0", time="0.000")
    suites = ET.Element("testsuites", name="diloco-milestones", tests=str(len(MILESTONES)),
                        errors=str(len(MILESTONES)), **counts)
    for name, units, classname in (("diloco-milestones", MILESTONES, "diloco.milestones"),
                                   ("diloco-exercises", EXERCISES, "diloco.exercises")):
        suite = ET.SubElement(suites, "testsuite", name=name, tests=str(len(units)), errors=str(len(units)), **counts)
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="grading", value="not graded")
        for unit in units:
            case = ET.SubElement(suite, "testcase", classname=classname, name=f"{unit.marker} {unit.name}",
                                 time="0.000")
            ET.SubElement(case, "error", message=line, type="Error").text = line
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def error_report(impl: Path, message: str) -> dict:
    """``results.json`` for a submission that cannot be graded: every milestone 0 points (and
    every exercise an error)."""
    tests = [{"name": m.label, "number": f"{m.number:02d}", "score": 0.0, "max_score": 1.0, "status": "failed",
              "output": f"error: {message}", "output_format": "text", "visibility": "visible",
              "extra_data": {"milestone": m.number, "state": ERROR, "tests_passed": 0, "tests_total": 0,
                             "depends_on": list(m.depends_on), "blocked_by": [], "lesson": m.lesson}}
             for m in MILESTONES]
    tests += [_exercise_entry(MilestoneResult(e, ERROR, message), f"error: {message}") for e in EXERCISES]
    return safe_data({"score": 0.0, "max_score": float(len(MILESTONES)), "execution_time": 0.0,
                      "output": f"error: {message}", "output_format": "text", "visibility": "visible",
                      "stdout_visibility": "hidden", "tests": tests})
