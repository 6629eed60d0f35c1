"""The milestone grader: run the tests of an implementation in dependency order.

``grade(impl)`` finds the ``diloco`` package in folder ``impl`` and runs the milestone
tests against it in a subprocess whose ``PYTHONPATH`` starts with that folder (the run
records ``diloco.__file__`` to prove which package it tested). It runs in *waves*
following ``diloco.milestones``: a wave holds every milestone whose prerequisites all
passed; a milestone with a prerequisite that did not pass is *locked* and never run.
Each milestone ends as one of

* ``passed``       every test passed;
* ``not started``  every failure is the stub's ``NotImplementedError``;
* ``failed``       the first failing check, its message (expected beside got), a rerun command;
* ``locked``       a prerequisite has not passed, so its tests were not run;
* ``error``        no test collected, a test module that does not import, or a time-out.

The tests come from ``--tests DIR``, by default the suite that ships with this grader
(the repository's ``tests/`` or the copy bundled in an installed wheel), never from the
graded folder, which is not modified. ``--json`` writes Gradescope's ``results.json``,
``--junit`` JUnit XML; both are described in ``docs/instructor-guide.md``.

    diloco grade [--impl DIR] [--tests DIR] [--json FILE] [--junit FILE]
    python src/diloco/grading.py --impl .   # also works when the package does not import
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: never import the graded package
    import sys as _sys
    import types as _types
    from pathlib import Path as _Path

    _package = _types.ModuleType("diloco")
    _package.__path__ = [str(_Path(__file__).resolve().parent)]
    _sys.modules.setdefault("diloco", _package)

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, NamedTuple

from diloco.cli import CliError
from diloco.milestones import MILESTONES, Milestone, by_number

__all__ = [
    "PASSED", "NOT_STARTED", "FAILED", "LOCKED", "ERROR",
    "MilestoneResult", "GradeReport", "GradingError",
    "find_package_root", "default_tests_dir", "grade", "format_table",
    "to_gradescope", "to_junit_xml", "add_parsers", "main",
]

PASSED, NOT_STARTED, FAILED, LOCKED, ERROR = "passed", "not started", "failed", "locked", "error"
_STUB_MESSAGE = re.compile(r"^milestone (\d\d) ")
_MARKER = re.compile(r"^m(0[1-9]|[12][0-9]|30)$")


class GradingError(Exception):
    """The implementation cannot be graded at all (no package, or it does not import)."""


class MilestoneResult(NamedTuple):
    """The verdict on one milestone.

    ``summary`` is one line for the table; ``detail`` the failing check's message
    lines; ``blocked_by`` the prerequisites that did not pass (for ``locked``).
    """

    milestone: Milestone
    status: str
    summary: str = ""
    detail: tuple[str, ...] = ()
    rerun: str = ""
    tests_passed: int = 0
    tests_total: int = 0
    duration: float = 0.0
    blocked_by: tuple[int, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status == PASSED


class GradeReport(NamedTuple):
    """Everything one grading run found."""

    results: tuple[MilestoneResult, ...]
    impl: Path
    imported_from: str
    tests_dir: Path
    duration: float

    @property
    def score(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def max_score(self) -> int:
        return len(self.results)

    def result(self, number: int) -> MilestoneResult:
        return next(r for r in self.results if r.milestone.number == number)

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


# --------------------------------------------------------------------------- locating


def find_package_root(impl: Path | str) -> Path:
    """The folder to put first on ``sys.path`` so ``import diloco`` finds ``impl``'s package.

    ``impl`` may be a project (holding ``src/diloco`` or ``diloco``), a ``src`` folder,
    or the ``diloco`` package folder itself.
    """
    impl = Path(impl).expanduser().resolve()
    if not impl.is_dir():
        raise GradingError(f"{impl} is not a directory")
    for root in (impl / "src", impl):
        if (root / "diloco" / "__init__.py").is_file():
            return root
    if impl.name == "diloco" and (impl / "__init__.py").is_file():
        return impl.parent
    raise GradingError(f"no diloco package in {impl} (looked for src/diloco/__init__.py and diloco/__init__.py)")


def default_tests_dir() -> Path:
    """The milestone tests shipped with this grader (repository ``tests/`` or bundled copy)."""
    from diloco.workspace import suite_root

    try:
        return suite_root() / "tests"
    except FileNotFoundError as exc:
        raise GradingError(f"{exc}; pass --tests DIR") from None


# --------------------------------------------------------------------------- subprocess

_PROBE = """
import json, sys, traceback
try:
    import diloco
    print(json.dumps({"file": diloco.__file__}))
except BaseException as exc:
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        where = "%s, line %s" % (exc.filename, exc.lineno)
    elif frames:
        where = "%s, line %s" % (frames[-1].filename, frames[-1].lineno)
    print(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc), "where": where}))
"""

_PYTEST_INI = "[pytest]\naddopts =\n"


class _Workdir(NamedTuple):
    path: Path
    env: dict


def _make_workdir(tmp: Path, package_root: Path) -> _Workdir:
    # The plugin runs where ``diloco`` is the graded package, so it is copied, not imported.
    shutil.copyfile(Path(__file__).with_name("_grade_plugin.py"), tmp / "_diloco_grade_plugin.py")
    (tmp / "pytest.ini").write_text(_PYTEST_INI, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(package_root), str(tmp)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ in the graded folder
    env.pop("PYTEST_ADDOPTS", None)
    return _Workdir(tmp, env)


def _probe_import(workdir: _Workdir, package_root: Path, python: str) -> str:
    """``diloco.__file__`` as the subprocess sees it; ``GradingError`` if it does not import."""
    proc = subprocess.run([python, "-c", _PROBE], cwd=workdir.path, env=workdir.env,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise GradingError(f"cannot start Python to import diloco from {package_root}: {tail}")
    found = json.loads(lines[-1])
    if "error" in found:
        where = f" ({found['where']})" if found.get("where") else ""
        raise GradingError(f"the diloco package in {package_root} does not import: {found['error']}{where}")
    imported = Path(found["file"]).resolve()
    if package_root.resolve() not in imported.parents:
        raise GradingError(f"import diloco found {imported}, not the package in {package_root}")
    return str(imported)


def _run_wave(numbers: list[int], tests_dir: Path, workdir: _Workdir, python: str,
              timeout: float) -> tuple[list[dict], str]:
    """Run the tests of milestones ``numbers``; the plugin's records and any crash text."""
    records_path = workdir.path / f"records-{numbers[0]:02d}.jsonl"
    records_path.unlink(missing_ok=True)
    env = dict(workdir.env, DILOCO_GRADE_RECORDS=str(records_path))
    command = [
        python, "-m", "pytest", str(tests_dir),
        "-m", " or ".join(f"m{n:02d}" for n in numbers),
        "-c", str(workdir.path / "pytest.ini"), "--rootdir", str(tests_dir.parent),
        "--confcutdir", str(tests_dir), "--ignore", str(tests_dir / "tooling"),
        "-p", "no:cacheprovider", "-p", "_diloco_grade_plugin", "-q", "--tb=no", "--no-header",
    ]
    crash = ""
    try:
        proc = subprocess.run(command, cwd=workdir.path, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode not in (0, 1, 5):  # 2 interrupted, 3 internal error, 4 usage error
            crash = (proc.stdout + proc.stderr).strip()[-3000:] or f"pytest exited with status {proc.returncode}"
    except subprocess.TimeoutExpired:
        crash = f"timed out after {timeout:g} s"
    records = []
    if records_path.exists():
        for line in records_path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:  # a line cut short by a time-out
                pass
    return records, crash


# --------------------------------------------------------------------------- verdicts


def _humanise(record: dict) -> str:
    """The check in words: the test's docstring, else its name without ``test_``."""
    if record.get("doc"):
        return record["doc"].splitlines()[0].rstrip(".")
    return record.get("name", record.get("nodeid", "?")).removeprefix("test_").replace("_", " ")


def _rerun(milestone: Milestone) -> str:
    return f"pytest -m {milestone.marker}"


def _classify(milestone: Milestone, records: list[dict], crash: str, tests_dir: Path) -> MilestoneResult:
    marker = milestone.marker
    collected = [nodeid for r in records if r["kind"] == "collected" for nodeid, m in r["items"] if m == marker]
    collect_errors = [r for r in records if r["kind"] == "collect_error"]
    outcomes: dict[str, dict] = {}
    for r in records:
        if r["kind"] == "test" and r.get("marker") == marker:
            previous = outcomes.get(r["nodeid"])
            if previous is None or previous["outcome"] != "failed":
                outcomes[r["nodeid"]] = r
    durations = sum(r.get("duration", 0.0) for r in records if r["kind"] == "test" and r.get("marker") == marker)
    passed = sum(r["outcome"] == "passed" for r in outcomes.values())
    failures = [outcomes[n] for n in collected if n in outcomes and outcomes[n]["outcome"] == "failed"]
    common = dict(tests_passed=passed, tests_total=len(collected), duration=durations, rerun=_rerun(milestone))

    if collect_errors and not collected:
        first = collect_errors[0]
        lines = first["message"].strip().splitlines()
        return MilestoneResult(milestone, ERROR, f"a test module does not import: {first['nodeid']}",
                               tuple(lines[-6:]), **common)
    if not collected:
        return MilestoneResult(milestone, ERROR, f"no tests collected for {marker} in {tests_dir}", **common)
    missing = [n for n in collected if n not in outcomes]
    if crash and missing:
        started = [r["nodeid"] for r in records if r["kind"] == "start" and r["nodeid"] in missing]
        where = f" while running {started[-1]}" if started else ""
        return MilestoneResult(milestone, ERROR, f"the test run stopped{where}",
                               tuple(crash.splitlines()[-6:]), **common)
    if not failures:
        if passed == 0:
            return MilestoneResult(milestone, ERROR, "every test was skipped", **common)
        return MilestoneResult(milestone, PASSED, f"{passed} tests passed", **common)
    own_stub = [f for f in failures
                if f.get("all_stub") and all(s.startswith(f"milestone {milestone.number:02d} ") for s in f["stubs"])]
    if len(own_stub) == len(failures):
        return MilestoneResult(milestone, NOT_STARTED, f"still the stub ({milestone.lesson})", **common)
    real = [f for f in failures if f not in own_stub]
    # The first failure that shows expected beside got, else simply the first failure.
    first = next((f for f in real if "expected" in f.get("message", "") and "got" in f.get("message", "")), real[0])
    check = _humanise(first)
    if first.get("all_stub") and first.get("stubs"):
        other = _STUB_MESSAGE.match(first["stubs"][0])
        if other:
            needed = by_number(int(other.group(1)))
            detail = (f"it calls {needed.label}, which is still a stub: do that one first",)
            return MilestoneResult(milestone, FAILED, f"{check}", detail, **common)
    message = first.get("message", "").strip()
    where = "" if first["when"] == "call" else f" (in test {first['when']})"
    lines = [f"{first.get('exc_type', 'Error')}{where}: {line}" if i == 0 else line
             for i, line in enumerate(message.splitlines()[:8] or [""])]
    if first.get("where") and first.get("exc_type") != "AssertionError":
        lines.append(f"raised at {first['where']}")
    lines += [n for n in first.get("notes", []) if n.startswith("Falsifying")][:1]
    lines.append(f"test: {first['nodeid']}" + (f"  ({len(failures)} of {len(collected)} tests fail)"
                                                  if len(failures) > 1 else ""))
    return MilestoneResult(milestone, FAILED, check, tuple(lines), **common)


def _locked(milestone: Milestone, status: dict[int, MilestoneResult]) -> MilestoneResult:
    blocked = tuple(d for d in milestone.depends_on if not status[d].passed)
    needs = by_number(blocked[0]).label if len(blocked) == 1 else ", ".join(f"{d:02d}" for d in blocked)
    return MilestoneResult(milestone, LOCKED, f"needs {needs}", blocked_by=blocked, rerun=_rerun(milestone))


def grade(impl: Path | str, tests: Path | str | None = None, *, timeout: float = 600.0,
          python: str | None = None, on_wave: Callable[[list[int]], None] | None = None) -> GradeReport:
    """Grade the ``diloco`` package in folder ``impl`` against the milestone tests.

    Parameters
    ----------
    impl : folder holding ``src/diloco``, ``diloco``, or the package itself; not modified.
    tests : folder of milestone tests (default: the suite shipped with this grader).
    timeout : seconds allowed for each wave of tests.
    python : interpreter for the test runs (default: this one); needs numpy, pytest, hypothesis.
    on_wave : called with the milestone numbers of each wave before it runs.

    Raises
    ------
    GradingError
        No package in ``impl``, it does not import, or the tests folder is missing.
    """
    start = time.perf_counter()
    impl = Path(impl).expanduser().resolve()
    package_root = find_package_root(impl)
    tests_dir = Path(tests).expanduser().resolve() if tests is not None else default_tests_dir()
    if not (tests_dir / "conftest.py").is_file() and not any(tests_dir.glob("test_*.py")):
        raise GradingError(f"no tests in {tests_dir}")
    python = python or sys.executable
    status: dict[int, MilestoneResult] = {}
    with tempfile.TemporaryDirectory(prefix="diloco-grade-") as tmp:
        workdir = _make_workdir(Path(tmp), package_root)
        imported_from = _probe_import(workdir, package_root, python)
        while True:
            locked_any = False  # lock once every prerequisite has a verdict and one did not pass
            for m in MILESTONES:
                if (m.number not in status and all(d in status for d in m.depends_on)
                        and not all(status[d].passed for d in m.depends_on)):
                    status[m.number] = _locked(m, status)
                    locked_any = True
            wave = [m.number for m in MILESTONES
                    if m.number not in status and all(d in status and status[d].passed for d in m.depends_on)]
            if not wave:
                if locked_any:
                    continue
                break
            if on_wave is not None:
                on_wave(wave)
            records, crash = _run_wave(wave, tests_dir, workdir, python, timeout)
            for record in records:
                if record["kind"] == "import" and "file" in record and Path(record["file"]).resolve() != Path(
                        imported_from):
                    raise GradingError(f"the tests imported diloco from {record['file']}, not {imported_from}")
            for number in wave:
                status[number] = _classify(by_number(number), records, crash, tests_dir)
        for m in MILESTONES:  # only reachable with a cycle in the graph
            status.setdefault(m.number, MilestoneResult(m, LOCKED, "dependency cycle"))
    results = tuple(status[m.number] for m in MILESTONES)
    return GradeReport(results, impl, imported_from, tests_dir, time.perf_counter() - start)


# --------------------------------------------------------------------------- output

_WORDS = {PASSED: "passed", NOT_STARTED: "not started", FAILED: "FAILED", LOCKED: "locked", ERROR: "ERROR"}


def format_table(report: GradeReport) -> str:
    """The learner's view: one row per milestone, details under failures, a progress line."""
    width = max(len(m.name) for m in MILESTONES)
    out = [f"diloco grade: {report.impl}", f"  (testing {report.imported_from})", "",
           f" #  {'milestone':<{width}}  {'status':<11}  notes", f" -- {'-' * width}  {'-' * 11}  {'-' * 5}"]
    for r in report.results:
        note = r.summary
        if r.status == PASSED:
            note = ""
        elif r.status == NOT_STARTED:
            note = r.milestone.lesson
        out.append(f" {r.milestone.number:02d} {r.milestone.name:<{width}}  {_WORDS[r.status]:<11}  {note}".rstrip())
        if r.status in (FAILED, ERROR):
            pad = " " * 8
            for line in r.detail:
                out.append(pad + line)
            out.append(f"{pad}rerun: {r.rerun}")
    out += ["", report.progress_line()]
    return "\n".join(out)


def _output_text(r: MilestoneResult) -> str:
    if r.status == PASSED:
        return f"passed ({r.tests_passed}/{r.tests_total} tests)"
    if r.status == NOT_STARTED:
        return f"not started: the function still raises NotImplementedError. Lesson: {r.milestone.lesson}"
    if r.status == LOCKED:
        return f"locked: {r.summary}; its tests were not run"
    head = "failed" if r.status == FAILED else "error"
    return "\n".join([f"{head}: {r.summary}", *r.detail, f"rerun: {r.rerun}"])


def to_gradescope(report: GradeReport) -> dict:
    """Gradescope's ``results.json``: one test entry per milestone, one point each."""
    tests = []
    for r in report.results:
        m = r.milestone
        tests.append({
            "name": m.label,
            "number": f"{m.number:02d}",
            "score": 1.0 if r.passed else 0.0,
            "max_score": 1.0,
            "status": "passed" if r.passed else "failed",
            "output": _output_text(r),
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
    return {
        "score": float(sum(t["score"] for t in tests)),
        "max_score": float(sum(t["max_score"] for t in tests)),
        "execution_time": round(report.duration, 3),
        "output": report.progress_line(),
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
    }


def to_junit_xml(report: GradeReport) -> str:
    """JUnit XML: a testcase per milestone; not started and failed are failures, locked is skipped."""
    counts = {s: sum(r.status == s for r in report.results) for s in _WORDS}
    failures, errors, skipped = counts[FAILED] + counts[NOT_STARTED], counts[ERROR], counts[LOCKED]
    attrs = dict(name="diloco-milestones", tests=str(len(report.results)), failures=str(failures),
                 errors=str(errors), skipped=str(skipped), time=f"{report.duration:.3f}")
    suites = ET.Element("testsuites", attrs)
    suite = ET.SubElement(suites, "testsuite", attrs)
    for r in report.results:
        case = ET.SubElement(suite, "testcase", classname="diloco.milestones",
                             name=f"{r.milestone.marker} {r.milestone.name}", time=f"{r.duration:.3f}")
        if r.status == FAILED:
            ET.SubElement(case, "failure", message=r.summary, type="Failed").text = _output_text(r)
        elif r.status == NOT_STARTED:
            ET.SubElement(case, "failure", message="not started", type="NotStarted").text = _output_text(r)
        elif r.status == ERROR:
            ET.SubElement(case, "error", message=r.summary, type="Error").text = _output_text(r)
        elif r.status == LOCKED:
            ET.SubElement(case, "skipped", message=f"locked: {r.summary}")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"


def _error_report(impl: Path, message: str) -> dict:
    """``results.json`` for a submission that cannot be graded: every milestone 0 points."""
    tests = [{"name": m.label, "number": f"{m.number:02d}", "score": 0.0, "max_score": 1.0, "status": "failed",
              "output": f"error: {message}", "visibility": "visible",
              "extra_data": {"milestone": m.number, "state": ERROR, "tests_passed": 0, "tests_total": 0,
                             "depends_on": list(m.depends_on), "blocked_by": [], "lesson": m.lesson}}
             for m in MILESTONES]
    return {"score": 0.0, "max_score": float(len(tests)), "execution_time": 0.0, "output": f"error: {message}",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


# --------------------------------------------------------------------------- command line


def _write(path: str, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def _cmd_grade(args) -> int:
    impl = Path(args.impl) if args.impl else Path.cwd()
    progress = None if args.quiet else (
        lambda wave: print(f"running {len(wave)} milestone(s): {' '.join(f'm{n:02d}' for n in wave)}",
                           file=sys.stderr, flush=True))
    try:
        report = grade(impl, args.tests, timeout=args.timeout, on_wave=progress)
    except GradingError as exc:
        if args.json:
            _write(args.json, json.dumps(_error_report(impl, str(exc)), indent=2) + "\n")
        raise CliError(str(exc)) from None
    print(format_table(report))
    if args.json:
        _write(args.json, json.dumps(to_gradescope(report), indent=2) + "\n")
    if args.junit:
        _write(args.junit, to_junit_xml(report))
    return 0


def add_parsers(subparsers) -> None:
    parser = subparsers.add_parser(
        "grade", help="grade the 30 milestones of a diloco package (a workspace or a submission)",
        description="Run the milestone tests against a diloco package in dependency order and print a "
                    "table of the 30 milestones. Milestones whose prerequisites do not pass are locked "
                    "and not run. The graded folder is not modified. See docs/learner-guide.md and "
                    "docs/instructor-guide.md.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=_cmd_grade)


def _add_arguments(parser) -> None:
    parser.add_argument("--impl", metavar="DIR",
                        help="folder holding the diloco package to grade (src/diloco or diloco); "
                             "default: the current directory")
    parser.add_argument("--tests", metavar="DIR",
                        help="folder of milestone tests (default: the suite shipped with this grader)")
    parser.add_argument("--json", metavar="FILE", help="also write Gradescope results.json to FILE")
    parser.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="time allowed for each wave of tests (default 600)")
    parser.add_argument("--quiet", action="store_true", help="do not print a line per wave")


def main(argv=None) -> int:
    """``python src/diloco/grading.py``: the grade command alone, without importing the graded package."""
    import argparse

    parser = argparse.ArgumentParser(prog="grading.py", description="Grade the 30 diloco milestones.")
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return _cmd_grade(args)
    except CliError as exc:
        print(f"diloco grade: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
