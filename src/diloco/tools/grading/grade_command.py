"""``diloco grade``: the grader's command line (also ``python src/diloco/tools/grading/grader.py``).

Parses the flags, runs ``diloco.tools.grading.grader.grade``, prints the table and writes
Gradescope's ``results.json`` (``--json``) and JUnit XML (``--junit``) atomically. A
submission that cannot be graded at all still gets a ``results.json`` of zeros, and its
one-line error passes through ``grade_text.safe_text``. ``--submissions DIR --out OUT``
grades a class instead (``diloco.tools.grading.grade_class``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from diloco.tools.cli.errors import CliError
from diloco.tools.grading.grade_report import (
    error_junit_xml,
    error_report,
    format_table,
    to_gradescope,
    to_junit_xml,
)
from diloco.tools.grading.grade_text import LINE_LIMIT, safe_text
from diloco.tools.grading.grade_verdicts import HIDDEN_LEVELS
from diloco.tools.grading.grader import GradingError, grade
from diloco.tools.runs.atomic_files import atomic_write_text

__all__ = ["add_parsers", "main"]


def _write(path: str, text: str) -> None:
    """Write a report atomically (temporary file, fsync, rename), making its folder if needed."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(target, text)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None


def _passed_on(args) -> list[str]:
    """The flags of ``args`` that each submission's own ``diloco grade`` takes too."""
    flags = ["--timeout", f"{args.timeout:g}", "--call-timeout", f"{args.call_timeout:g}",
             "--sandbox-user", args.sandbox_user]
    flags += ["--tests", str(Path(args.tests).resolve())] if args.tests else []
    flags += ["--hidden", args.hidden] if args.hidden else []
    return flags + (["--local"] if args.trust_submission else [])


def _cmd_grade_class(args) -> int:
    from diloco.tools.grading.grade_class import grade_class

    folder = Path(args.submissions)
    if args.impl or args.json or args.junit:
        raise CliError("--submissions writes a report per submission into --out: no --impl, --json or --junit")
    if not folder.is_dir():
        raise CliError(f"--submissions: {folder} is not a folder")
    if not args.out:
        raise CliError("--submissions needs --out DIR, the folder for the reports and scores.csv")
    if args.jobs is not None and args.jobs < 1:
        raise CliError(f"--jobs must be at least 1, got {args.jobs}")
    out = Path(args.out)
    progress = None if args.quiet else (lambda row: print(
        f"{row.folder}: {row.score:g}/{row.max_score:g}" + (f" ({row.error})" if row.error else ""),
        file=sys.stderr, flush=True))
    rows = grade_class(folder, out, _passed_on(args), args.jobs, on_done=progress)
    errors = sum(row.status == "error" for row in rows)
    print(f"graded {len(rows)} submissions into {safe_text(out, LINE_LIMIT, one_line=True)}: "
          f"{len(rows) - errors} graded, {errors} could not be graded; scores in "
          f"{safe_text(out / 'scores.csv', LINE_LIMIT, one_line=True)}")
    return 0


def _unforeseen(exc: OSError | RecursionError) -> str:
    """One line for a fault no check of the grader named (never a traceback)."""
    if isinstance(exc, RecursionError):
        return "cannot grade: a folder nests too deep to be read"
    where = f"{exc.filename}: " if exc.filename else ""
    return f"cannot grade: {where}{exc.strerror or exc}"


def _cmd_grade(args) -> int:
    if args.submissions:
        return _cmd_grade_class(args)
    impl = Path(args.impl) if args.impl else Path.cwd()
    progress = None if args.quiet else (
        lambda wave, extra: print(f"running {len(wave)} milestone(s)"
                                  + (f" and {len(extra)} optional exercise(s)" if extra else "")
                                  + f": {' '.join([*(f'm{n:02d}' for n in wave), *extra])}",
                                  file=sys.stderr, flush=True))
    try:
        report = grade(impl, args.tests, timeout=args.timeout, on_wave=progress, sandbox=not args.trust_submission,
                       sandbox_user=args.sandbox_user, call_timeout=args.call_timeout,
                       hidden=args.hidden or ("milestone" if args.tests else "full"))
    except (GradingError, OSError, RecursionError) as exc:  # every learner gets a results.json, with the reason
        message = str(exc) if isinstance(exc, GradingError) else _unforeseen(exc)
        if args.json:
            _write(args.json, json.dumps(error_report(impl, message), indent=2) + "\n")
        if args.junit:
            _write(args.junit, error_junit_xml(message))
        raise CliError(safe_text(message, LINE_LIMIT * 4, one_line=True)) from None
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
                    "table of the 30 milestones, then the optional exercises (x01..) in a section of "
                    "their own, which never change the score. Milestones whose prerequisites do not "
                    "pass are locked and not run. The graded folder is not modified. See "
                    "docs/learner-guide.md and docs/instructor-guide.md.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=_cmd_grade)


def _seconds(text: str) -> float:
    """A timeout flag's value: a positive, finite number of seconds (argparse reports anything else)."""
    from diloco.tools.cli.arg_types import positive_finite

    return positive_finite(text, not_a_number="must be a number of seconds",
                           not_positive="must be a positive number of seconds")


def _add_arguments(parser) -> None:
    parser.add_argument("--impl", metavar="DIR",
                        help="folder holding the diloco package to grade (src/diloco or diloco); "
                             "default: the current directory")
    parser.add_argument("--tests", metavar="DIR",
                        help="folder of milestone tests, say a hidden set (default: the suite shipped with this "
                             "grader); the sandbox can never read it")
    parser.add_argument("--hidden", choices=HIDDEN_LEVELS, metavar="LEVEL",
                        help="what a failure of the --tests shows: milestone (that a hidden test failed, how many), "
                             "check (and the check in words) or full (its message and the test names). Default: "
                             "milestone with --tests, full for the shipped suite")
    parser.add_argument("--json", metavar="FILE", help="also write Gradescope results.json to FILE")
    parser.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    parser.add_argument("--timeout", type=_seconds, default=600.0, metavar="SECONDS",
                        help="CPU seconds allowed for the tests of each milestone (the test process and its "
                             "sandboxes; a busy machine does not shorten them), with 5 times as many wall-clock "
                             "seconds as a backstop; one that runs out fails alone and locks its dependants "
                             "(default 600)")
    parser.add_argument("--quiet", action="store_true", help="do not print a line per wave (or per submission)")
    parser.add_argument("--submissions", metavar="DIR",
                        help="grade a class: each folder of DIR is one learner's submission, graded by its own "
                             "process and sandbox; writes OUT/learners/<name>/report.txt, results.json, results.xml "
                             "and OUT/scores.csv (needs --out)")
    parser.add_argument("--out", metavar="DIR", help="with --submissions: where the reports and scores.csv go")
    parser.add_argument("--jobs", type=int, metavar="N",
                        help="with --submissions: submissions graded at once (default and most: one per core)")
    parser.add_argument("--local", "--trust-submission", dest="trust_submission", action="store_true",
                        help="grade in-process: run the graded code inside the test process (fast, but the code "
                             "can forge its score; every report says 'local, not sandboxed'). Default: the "
                             "bubblewrap sandbox; without it, grading stops with a line saying how to enable it")
    parser.add_argument("--sandbox-user", default="nobody", metavar="USER",
                        help="account the sandbox runs as when the grader runs as root (default nobody)")
    parser.add_argument("--call-timeout", type=_seconds, default=120.0, metavar="SECONDS",
                        help="time allowed for one call of a graded function in the sandbox, its callbacks "
                             "included (default 120)")


def main(argv=None) -> int:
    """``python src/diloco/tools/grading/grader.py``: the grade command alone, without importing the graded package."""
    import argparse

    parser = argparse.ArgumentParser(prog="grading.py", description="Grade the 30 diloco milestones.")
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return _cmd_grade(args)
    except CliError as exc:
        print(f"diloco grade: error: {exc}", file=sys.stderr)
        return 2
