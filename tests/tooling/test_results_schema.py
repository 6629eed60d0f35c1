"""docs/results.schema.json counts what the grader reports: one entry per milestone, then one
per optional exercise (``diloco.milestones``, ``diloco.exercises``). A milestone or an exercise
added without the schema fails here, not on Gradescope."""

from __future__ import annotations

import json
import re
from pathlib import Path

from diloco.exercises import EXERCISES
from diloco.milestones import MILESTONES

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "results.schema.json").read_text())


def _numbers_bounded(node, found: list) -> list:
    """Every ``{"type": "integer", "minimum": 1, "maximum": N}`` in the schema: a milestone number."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and node.get("minimum") == 1 and "maximum" in node:
            found.append(node["maximum"])
        for value in node.values():
            _numbers_bounded(value, found)
    elif isinstance(node, list):
        for value in node:
            _numbers_bounded(value, found)
    return found


def test_the_schema_holds_exactly_one_entry_per_milestone_and_exercise():
    tests = SCHEMA["properties"]["tests"]
    entries = len(MILESTONES) + len(EXERCISES)
    mine = (tests["minItems"], tests["maxItems"])
    assert mine == (entries, entries), f"minItems, maxItems: mine {mine}, expected {(entries, entries)}"
    described = [int(n) for n in re.findall(r"\d+", tests["description"])[:2]]
    assert described == [len(MILESTONES), len(EXERCISES)], tests["description"]


def test_milestone_numbers_are_bounded_by_the_number_of_milestones():
    bounds = _numbers_bounded(SCHEMA["$defs"], [])
    assert len(bounds) == 5 and set(bounds) == {len(MILESTONES)}, bounds  # the number, depends_on, blocked_by


def test_every_exercise_code_and_milestone_number_fits_its_pattern():
    exercise, milestone = SCHEMA["$defs"]["exercise"]["properties"], SCHEMA["$defs"]["milestone"]["properties"]
    assert all(re.fullmatch(exercise["number"]["pattern"].strip("^$"), e.code) for e in EXERCISES)
    assert all(re.fullmatch(milestone["number"]["pattern"].strip("^$"), f"{m.number:02d}") for m in MILESTONES)
