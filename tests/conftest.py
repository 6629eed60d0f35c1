"""Suite-wide rules.

* Every milestone test carries exactly one milestone marker ``m01`` .. ``m30`` (so
  ``pytest -m m07`` runs milestone 7 alone and the grader can attribute every result), or
  the marker of one optional exercise, ``x01`` .. (``diloco.exercises``), instead.
  A test without one, or with two, is a collection error.
* Tests of the supporting tools (grader, workspace, CLI, notebooks, docs) live in
  ``tests/tooling/``. They are marked ``tooling`` automatically, carry no milestone
  marker, are never graded, and are not copied into a learner workspace.
* Hypothesis settings live here and only here. The profiles: ``ci`` (the default: a
  fixed, CI-sized number of examples, derandomised so a failure reproduces),
  ``ci-noshrink`` (the same without the shrink and explain phases; the grader's plugin
  loads it for its whole run) and ``thorough`` (``pytest --hypothesis-profile=thorough``).
  A milestone test never carries ``@settings``: a costly property says how many of the
  profile's examples it runs with the ``examples(fraction)`` marker (``helpers.HALF_EXAMPLES``,
  ``helpers.FEW_EXAMPLES``), and this file applies the settings at collection, through
  Hypothesis' public ``settings`` decorator (which may wrap a ``@given`` test).
* ``DILOCO_TEST_SANDBOX=1 pytest tests`` runs the suite as the grader does: every public
  diloco function a test calls runs in a sandbox process (``diloco.tools.sandbox.proxy``).
* In a learner workspace, the property tests of a milestone that is still a stub (or
  that needs one) do not shrink or explain their failing example: every example fails the
  same way, with the stub's NotImplementedError, and shrinking it only costs seconds.
* SIGINT, SIGTERM and SIGHUP are set back to their defaults where the suite was started
  ignoring them (a shell script's background job): the commands the tests signal inherit them.
* ``make test`` runs the suite on two processes (pytest-xdist, ``--dist loadfile``): each
  test file runs whole on one process, so its module-scoped fixtures are built once, and the
  files holding a ``slow`` test are handed out first, so no long file starts last. Tests that
  must not overlap across the processes take a lock (``tests/tooling/process_quota.py``).
  (Not ``--dist loadgroup``: xdist 3.8 groups by renaming the node id, which pytest 9.2 no
  longer reads, so its ``xdist_group`` marks have no effect here.)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, is_hypothesis_test, settings
from hypothesis.errors import InvalidArgument

sys.path.insert(0, str(Path(__file__).parent))  # `import strategies`, `import helpers`

if os.environ.get("DILOCO_TEST_SANDBOX"):  # the grader's mode: every diloco function runs in a sandbox
    from diloco.tools.sandbox.proxy import install_for_suite

    install_for_suite()

PROFILE = "ci"
NO_SHRINK_PROFILE = "ci-noshrink"
_NO_SHRINK_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)

settings.register_profile(
    PROFILE, max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(NO_SHRINK_PROFILE, settings.get_profile(PROFILE), phases=_NO_SHRINK_PHASES)
settings.register_profile(
    "thorough", max_examples=500, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(PROFILE)

_MILESTONE = re.compile(r"^m(0[1-9]|[12][0-9]|30)$")
_EXERCISE_MARKERS = None  # the exercises' markers, read from diloco.exercises at collection


def _is_unit_marker(name: str) -> bool:
    """A milestone's marker (m01..m30) or an exercise's (x01..)."""
    global _EXERCISE_MARKERS
    if _EXERCISE_MARKERS is None:
        from diloco.exercises import EXERCISES

        _EXERCISE_MARKERS = {e.marker for e in EXERCISES}
    return bool(_MILESTONE.match(name)) or name in _EXERCISE_MARKERS


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "examples(fraction): run this Hypothesis test with that fraction of the profile's examples")
    _stop_signals_not_ignored()


def _stop_signals_not_ignored() -> None:
    """SIGINT, SIGTERM and SIGHUP at their defaults in this process, so the ``diloco`` commands the tests
    start inherit no ignored stop signal: ``diloco`` keeps a signal it was started ignoring ignored
    (``nohup``), and a suite started as a shell script's background job would otherwise find the
    SIGINT it sends to a run ignored."""
    import signal

    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL),
                            (signal.SIGHUP, signal.SIG_DFL)):
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, default)


def _slow_files_first(config, items) -> None:
    """On xdist's workers: the files holding a slow test first, each file's tests in their order (the
    processes are handed whole files in the order of their first test)."""
    if getattr(config, "workerinput", None) is None:
        return
    slow = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow)


def _stub_markers() -> set[str]:
    """Markers of the milestones whose function, or a prerequisite's, is still a stub, and of
    the exercises with a function still a stub."""
    import importlib
    import inspect

    from diloco import exercises
    from diloco.milestones import MILESTONES, all_dependencies, stub_message

    stubs = set()
    for milestone in MILESTONES:
        function = getattr(importlib.import_module(f"diloco.{milestone.module}"), milestone.name)
        if stub_message(milestone) in inspect.getsource(function):
            stubs.add(milestone.number)
    markers = {m.marker for m in MILESTONES if stubs & {m.number, *all_dependencies(m.number)}}
    for exercise in exercises.EXERCISES:
        for module, name in exercise.functions:
            function = getattr(importlib.import_module(f"diloco.{module}"), name)
            if exercises.stub_message(exercise, name) in inspect.getsource(function):
                markers.add(exercise.marker)
    return markers


def _hypothesis_settings(item, stubbed: bool) -> settings:
    """The loaded profile, scaled by the item's ``examples`` marker, without shrinking if ``stubbed``."""
    base = settings.default
    changes = {}
    mark = item.get_closest_marker("examples")
    if mark is not None:
        changes["max_examples"] = max(1, round(mark.args[0] * base.max_examples))
    if stubbed:
        changes["phases"] = [phase for phase in base.phases if phase in _NO_SHRINK_PHASES]
    return settings(base, **changes)


def _apply_settings(items, stubbed_markers) -> list[str]:
    """Give each milestone Hypothesis test its settings, once per function; the errors."""
    bad, done = [], set()
    for item, marker in items:
        function = getattr(getattr(item, "obj", None), "__func__", getattr(item, "obj", None))
        if function is None or not is_hypothesis_test(function) or id(function) in done:
            continue
        done.add(id(function))
        if getattr(function, "diloco_settings", None) is not None:
            continue  # collected before in this process (e.g. pytest.main run twice)
        try:
            function.diloco_settings = _hypothesis_settings(item, marker in stubbed_markers)
            function.diloco_settings(function)
        except InvalidArgument:
            bad.append(f"{item.nodeid}: drop its @settings; use the examples marker (see tests/conftest.py)")
    return bad


def pytest_collection_modifyitems(config, items):
    _slow_files_first(config, items)
    bad = []
    stubbed = _stub_markers()
    tooling_dir = Path(__file__).parent / "tooling"
    milestone_items = []
    for item in items:
        marks = {m.name for m in item.iter_markers() if _is_unit_marker(m.name)}
        if tooling_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.tooling)
            if marks:
                bad.append(f"{item.nodeid}: tooling tests carry no milestone marker, got {sorted(marks)}")
            continue
        if len(marks) != 1:
            bad.append(f"{item.nodeid}: milestone markers {sorted(marks) or 'none'}")
        else:
            milestone_items.append((item, marks.pop()))
    bad += _apply_settings(milestone_items, stubbed)
    if bad:
        raise pytest.UsageError(
            "every test needs exactly one milestone marker (m01..m30) or exercise marker (x01..), and no "
            "@settings:\n  " + "\n  ".join(bad)
        )
