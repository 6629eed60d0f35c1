"""The grader's verdicts: from the plugin's records of one wave to one ``MilestoneResult``.

The same rules judge a milestone and an optional exercise (``diloco.exercises.Exercise``,
which has a milestone's ``marker``, ``label``, ``lesson`` and ``depends_on``); an exercise
that stubs several functions is ``not started`` while every one of them still raises its
stub, and ``FAILED`` (naming the rest) once some are written.
"""

from __future__ import annotations

from pathlib import Path

from diloco.exercises import Exercise, by_code, stub_code
from diloco.milestones import Milestone, by_number, stub_number, test_command
from diloco.tools.grading.grade_report import ERROR, FAILED, LOCKED, NOT_STARTED, PASSED, MilestoneResult
from diloco.tools.grading.grade_text import plain_math, round_tolerances, shown_lines
from diloco.tools.grading.lessons import common_mistakes, matching_mistakes

__all__ = ["classify", "locked", "hide", "HIDDEN_LEVELS"]


def _humanise(record: dict) -> str:
    """The check in words: the test's docstring, else its name without ``test_``."""
    if record.get("doc"):
        return plain_math(record["doc"].splitlines()[0].rstrip("."))
    return record.get("name", record.get("nodeid", "?")).removeprefix("test_").replace("_", " ")


def _rerun(milestone: Milestone | Exercise) -> str:
    return test_command(milestone)  # make test M=<marker>, for an exercise too


def _own_stub(unit: Milestone | Exercise, message: str) -> bool:
    if isinstance(unit, Exercise):
        found = stub_code(message)
        return found is not None and found[0] == unit.code
    return stub_number(message) == unit.number


def _other_stub(message: str) -> str | None:
    """``18 sample_worker_batch`` or ``x01 fp4_quantiser's fp4_codes``: the stub a message is from."""
    number = stub_number(message)
    if number is not None:
        return by_number(number).label
    found = stub_code(message)
    if found is not None:
        try:
            return f"{by_code(found[0]).label}'s {found[1]}"
        except KeyError:
            return None
    return None


def classify(milestone: Milestone | Exercise, records: list[dict], crash: str, tests_dir: Path) -> MilestoneResult:
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
    own_stub = [f for f in failures if f.get("all_stub") and all(_own_stub(milestone, s) for s in f["stubs"])]
    if len(own_stub) == len(failures):
        if isinstance(milestone, Exercise):
            stubbed = {stub_code(s)[1] for f in own_stub for s in f["stubs"]}
            left = [name for name in milestone.function_names if name in stubbed]
            if len(left) < len(milestone.function_names):  # some of its functions are written
                return MilestoneResult(milestone, FAILED, f"still a stub: {', '.join(left)}",
                                       (f"{milestone.code} stubs {', '.join(milestone.function_names)}: write "
                                        f"{' and '.join(left)} too",),
                                       failing=tuple(f["nodeid"] for f in failures), **common)
        return MilestoneResult(milestone, NOT_STARTED, f"still the stub ({milestone.lesson})", **common)
    real = [f for f in failures if f not in own_stub]
    # The first failure that shows expected beside got, else simply the first failure.
    first = next((f for f in real if "expected" in f.get("message", "") and "got" in f.get("message", "")), real[0])
    check = _humanise(first)
    if first.get("all_stub") and first.get("stubs"):
        other = _other_stub(first["stubs"][0])
        if other is not None:
            detail = (f"it calls {other}, which is still a stub: do that one first",)
            return MilestoneResult(milestone, FAILED, f"{check}", detail, **common)
    message = round_tolerances(first.get("message", "").strip())
    where = "" if first["when"] == "call" else f" (in test {first['when']})"
    lines = [f"{first.get('exc_type', 'Error')}{where}: {line}" if i == 0 else line
             for i, line in enumerate(shown_lines(message, 8))]
    if first.get("where") and first.get("exc_type") != "AssertionError":
        lines.append(f"raised at {first['where']}")
    lines += [n for n in first.get("notes", []) if n.startswith("Falsifying")][:1]
    lines.append(f"test: {first['nodeid']}")  # the test whose message is shown; every failing one follows
    failing = tuple(f["nodeid"] for f in failures)
    mistakes = matching_mistakes(common_mistakes(tests_dir.parent / milestone.lesson), failing)
    return MilestoneResult(milestone, FAILED, check, tuple(lines), failing=failing,
                           mistakes=tuple(plain_math(m.text) for m in mistakes), **common)


def locked(milestone: Milestone | Exercise, status: dict[int, MilestoneResult]) -> MilestoneResult:
    blocked = tuple(d for d in milestone.depends_on if not status[d].passed)
    needs = by_number(blocked[0]).label if len(blocked) == 1 else ", ".join(f"{d:02d}" for d in blocked)
    return MilestoneResult(milestone, LOCKED, f"needs {needs}", blocked_by=blocked, rerun=_rerun(milestone))


# How much a failure of a hidden test shows (``diloco grade --hidden``), least first.
HIDDEN_LEVELS = ("milestone", "check", "full")
_KEPT = ("timed out:", "the test run did not reach its first test")  # grader-made lines that name no test


def hide(result: MilestoneResult, level: str) -> MilestoneResult:
    """``result`` as a learner may see it when its tests are hidden.

    ``milestone``: that a hidden test failed, and how many, nothing else; ``check``: also the
    check in words (the failing test's docstring, else its name); ``full``: everything, the
    message (which the submission can fill with the test's inputs) and the test names too.
    No level but ``full`` shows a test's name, node id, message, output or matching mistakes.
    """
    if level not in HIDDEN_LEVELS:
        raise ValueError(f"hidden level must be one of {', '.join(HIDDEN_LEVELS)}, got {level!r}")
    if level == "full" or result.status not in (FAILED, ERROR):
        return result
    failed = len(result.failing) or 1
    if result.status == FAILED:
        summary = result.summary if level == "check" else "a hidden test failed"
        detail = (f"{failed} of {result.tests_total} hidden tests failed; the hidden tests and their messages "
                  "are not shown",)
    elif result.tests_total == 0:
        summary, detail = f"no hidden tests for {result.milestone.marker}", ()
    else:
        summary = "the hidden tests did not run to the end"
        detail = tuple(line for line in result.detail if line.startswith(_KEPT))[:1]
    return result._replace(summary=summary, detail=detail, failing=(), mistakes=())
