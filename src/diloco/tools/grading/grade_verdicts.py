"""The grader's verdicts: from the plugin's records of one wave to one ``MilestoneResult``.

The same rules judge a milestone and an optional exercise (``diloco.exercises.Exercise``,
which has a milestone's ``marker``, ``label``, ``lesson`` and ``depends_on``); an exercise
that stubs several functions is ``not started`` while every one of them still raises its
stub, and ``FAILED`` (naming the rest) once some are written.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

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


class _Wave(NamedTuple):
    """What one wave's records say about one milestone: the facts every verdict rule reads."""

    unit: Milestone | Exercise
    records: list[dict]
    crash: str
    tests_dir: Path
    collected: list[str]  # the node ids collected under the unit's marker, in order
    outcomes: dict[str, dict]  # node id -> its record (a failed phase wins over a later pass)
    failures: list[dict]  # the failed records, in collection order
    own_stubs: list[dict]  # the failures that only ever raised the unit's own stub
    common: dict  # the fields every verdict carries

    @property
    def passed(self) -> int:
        return self.common["tests_passed"]

    def verdict(self, status: str, summary: str, detail: tuple[str, ...] = (), **more) -> MilestoneResult:
        return MilestoneResult(self.unit, status, summary, detail, **more, **self.common)


def _outcomes(tests: list[dict]) -> dict[str, dict]:
    """Node id -> its record: a test's failed phase (setup, call, teardown) wins over a later pass."""
    outcomes: dict[str, dict] = {}
    for r in tests:
        previous = outcomes.get(r["nodeid"])
        if previous is None or previous["outcome"] != "failed":
            outcomes[r["nodeid"]] = r
    return outcomes


def _own_stubs(unit: Milestone | Exercise, failures: list[dict]) -> list[dict]:
    """The failures that only ever raised ``unit``'s own stub."""
    return [f for f in failures if f.get("all_stub") and all(_own_stub(unit, s) for s in f["stubs"])]


def _wave(unit: Milestone | Exercise, records: list[dict], crash: str, tests_dir: Path) -> _Wave:
    marker = unit.marker
    collected = [nodeid for r in records if r["kind"] == "collected" for nodeid, m in r["items"] if m == marker]
    mine = [r for r in records if r["kind"] == "test" and r.get("marker") == marker]
    outcomes = _outcomes(mine)
    failures = [outcomes[n] for n in collected if n in outcomes and outcomes[n]["outcome"] == "failed"]
    common = dict(tests_passed=sum(r["outcome"] == "passed" for r in outcomes.values()),
                  tests_total=len(collected), duration=sum(r.get("duration", 0.0) for r in mine),
                  rerun=_rerun(unit))
    return _Wave(unit, records, crash, tests_dir, collected, outcomes, failures, _own_stubs(unit, failures), common)


# --------------------------------------------------------------------------- the rules, first match wins
# Each rule owns one verdict: it returns it when its case holds, else None.


def _import_error(w: _Wave) -> MilestoneResult | None:
    """A test module does not import, and nothing of the unit was collected."""
    errors = [r for r in w.records if r["kind"] == "collect_error"]
    if not errors or w.collected:
        return None
    first = errors[0]
    lines = first["message"].strip().splitlines()
    return w.verdict(ERROR, f"a test module does not import: {first['nodeid']}", tuple(lines[-6:]))


def _no_tests(w: _Wave) -> MilestoneResult | None:
    if w.collected:
        return None
    return w.verdict(ERROR, f"no tests collected for {w.unit.marker} in {w.tests_dir}")


def _stopped(w: _Wave) -> MilestoneResult | None:
    """The run crashed (or timed out) before every collected test reported."""
    missing = [n for n in w.collected if n not in w.outcomes]
    if not (w.crash and missing):
        return None
    started = [r["nodeid"] for r in w.records if r["kind"] == "start" and r["nodeid"] in missing]
    where = f" while running {started[-1]}" if started else ""
    return w.verdict(ERROR, f"the test run stopped{where}", tuple(w.crash.splitlines()[-6:]))


def _no_failure(w: _Wave) -> MilestoneResult | None:
    """Nothing failed: passed, unless nothing ran at all."""
    if w.failures:
        return None
    if w.passed == 0:
        return w.verdict(ERROR, "every test was skipped")
    return w.verdict(PASSED, f"{w.passed} tests passed")


def _own_stub_only(w: _Wave) -> MilestoneResult | None:
    """Every failure is the unit's own stub: not started, or for an exercise some functions still to write."""
    own = w.own_stubs
    if len(own) != len(w.failures):
        return None
    unit = w.unit
    if isinstance(unit, Exercise):
        stubbed = {stub_code(s)[1] for f in own for s in f["stubs"]}
        left = [name for name in unit.function_names if name in stubbed]
        if len(left) < len(unit.function_names):  # some of its functions are written
            return w.verdict(FAILED, f"still a stub: {', '.join(left)}",
                             (f"{unit.code} stubs {', '.join(unit.function_names)}: write {' and '.join(left)} too",),
                             failing=tuple(f["nodeid"] for f in w.failures))
    return w.verdict(NOT_STARTED, f"still the stub ({unit.lesson})")


def _first_real_failure(w: _Wave) -> dict:
    """The first failure that is not the unit's own stub and shows expected beside got, else the first one."""
    real = [f for f in w.failures if f not in w.own_stubs]
    return next((f for f in real if "expected" in f.get("message", "") and "got" in f.get("message", "")), real[0])


def _other_stub_called(w: _Wave) -> MilestoneResult | None:
    """The first real failure only raised another unit's stub: do that one first."""
    first = _first_real_failure(w)
    other = _other_stub(first["stubs"][0]) if first.get("all_stub") and first.get("stubs") else None
    if other is None:
        return None
    return w.verdict(FAILED, _humanise(first), (f"it calls {other}, which is still a stub: do that one first",))


def _failed(w: _Wave) -> MilestoneResult:
    """A real failure: its check, message, where it was raised, and the lesson's matching mistakes."""
    first = _first_real_failure(w)
    message = round_tolerances(first.get("message", "").strip())
    where = "" if first["when"] == "call" else f" (in test {first['when']})"
    lines = [f"{first.get('exc_type', 'Error')}{where}: {line}" if i == 0 else line
             for i, line in enumerate(shown_lines(message, 8))]
    if first.get("where") and first.get("exc_type") != "AssertionError":
        lines.append(f"raised at {first['where']}")
    lines += [n for n in first.get("notes", []) if n.startswith("Falsifying")][:1]
    lines.append(f"test: {first['nodeid']}")  # the test whose message is shown; every failing one follows
    failing = tuple(f["nodeid"] for f in w.failures)
    mistakes = matching_mistakes(common_mistakes(w.tests_dir.parent / w.unit.lesson), failing)
    return w.verdict(FAILED, _humanise(first), tuple(lines), failing=failing,
                     mistakes=tuple(plain_math(m.text) for m in mistakes))


_RULES = (_import_error, _no_tests, _stopped, _no_failure, _own_stub_only, _other_stub_called)


def classify(milestone: Milestone | Exercise, records: list[dict], crash: str, tests_dir: Path) -> MilestoneResult:
    """The verdict on ``milestone`` from one wave's ``records``: the first rule of ``_RULES`` that
    holds, else a real failure (``_failed``)."""
    wave = _wave(milestone, records, crash, tests_dir)
    for rule in _RULES:
        result = rule(wave)
        if result is not None:
            return result
    return _failed(wave)


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
