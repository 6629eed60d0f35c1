"""Suite-wide rules.

* Every milestone test carries exactly one milestone marker ``m01`` .. ``m30`` (so
  ``pytest -m m07`` runs milestone 7 alone and the grader can attribute every result).
  A test without one, or with two, is a collection error.
* Tests of the supporting tools (grader, workspace, CLI, notebooks, docs) live in
  ``tests/tooling/``. They are marked ``tooling`` automatically, carry no milestone
  marker, are never graded, and are not copied into a learner workspace.
* Hypothesis runs a fixed, CI-sized number of examples, derandomised so a failure
  reproduces.
* In a learner workspace, the property tests of a milestone that is still a stub (or
  that needs one) do not shrink or explain their failing example: every example fails the
  same way, with the stub's NotImplementedError, and shrinking it only costs seconds.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

sys.path.insert(0, str(Path(__file__).parent))  # `import strategies`, `import helpers`

settings.register_profile(
    "ci", max_examples=40, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "thorough", max_examples=500, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci")

_MILESTONE = re.compile(r"^m(0[1-9]|[12][0-9]|30)$")


def _stub_markers() -> set[str]:
    """Markers of the milestones whose function, or a prerequisite's, is still a stub."""
    import importlib
    import inspect

    from diloco.milestones import MILESTONES, all_dependencies, stub_message

    stubs = set()
    for milestone in MILESTONES:
        function = getattr(importlib.import_module(f"diloco.{milestone.module}"), milestone.name)
        if stub_message(milestone) in inspect.getsource(function):
            stubs.add(milestone.number)
    return {m.marker for m in MILESTONES if stubs & {m.number, *all_dependencies(m.number)}}


def _skip_shrinking(item) -> None:
    function = getattr(item, "obj", None)
    current = getattr(function, "_hypothesis_internal_use_settings", None)
    if current is not None and Phase.shrink in current.phases:
        function._hypothesis_internal_use_settings = settings(
            current, phases=[Phase.explicit, Phase.reuse, Phase.generate]
        )


def pytest_collection_modifyitems(config, items):
    bad = []
    stubbed = _stub_markers()
    tooling_dir = Path(__file__).parent / "tooling"
    for item in items:
        marks = {m.name for m in item.iter_markers() if _MILESTONE.match(m.name)}
        if tooling_dir in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.tooling)
            if marks:
                bad.append(f"{item.nodeid}: tooling tests carry no milestone marker, got {sorted(marks)}")
            continue
        if len(marks) == 1 and marks & stubbed:
            _skip_shrinking(item)
        if len(marks) != 1:
            bad.append(f"{item.nodeid}: milestone markers {sorted(marks) or 'none'}")
    if bad:
        raise pytest.UsageError(
            "every test needs exactly one milestone marker (m01..m30):\n  " + "\n  ".join(bad)
        )
