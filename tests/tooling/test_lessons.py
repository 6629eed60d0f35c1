"""The 30 lessons follow one structure, and their worked numbers are the fixtures' numbers.

Every milestone in ``diloco.milestones.MILESTONES`` has a lesson at ``m.lesson``
(``docs/milestones/NN-name-with-dashes.md``) laid out as ``docs/milestones/TEMPLATE.md``
describes. A missing lesson FAILS here, it is not skipped: the site promises 30 lessons.

The worked case of each lesson is a ``<!-- fixture: mNN -->`` marker followed by a
```` ```json ```` block equal to the ``case``, ``inputs`` and ``expected`` of
``tests/fixtures/mNN.json``, the same numbers the milestone's tests check. Change a
fixture and the lesson must change with it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diloco.milestones import MILESTONES, PARTS, by_number
from diloco.milestones import test_command as rerun_command  # not collected as a test
from diloco.tools.grading.lessons import list_items, named_tests, split_sections

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TEMPLATE = ROOT / "docs" / "milestones" / "TEMPLATE.md"
INDEX = ROOT / "docs" / "milestones" / "index.md"

# The level-2 headings every lesson has, in this order (other "## " sections may sit between).
REQUIRED_SECTIONS = (
    "Before you start",
    "What this function owns",
    "The mathematics",
    "The contract",
    "Worked by hand",
    "Boundary, invalid and invariant",
    "Common mistakes",
    "Prove it works",
)
FIXTURE_KEYS = ("case", "inputs", "expected")
DEPENDENCY_LINE = re.compile(r"^\s*[-*]\s+\[(\d{2}) ([a-z0-9_]+)\]\(([^)\s]+)\)")
NONE_LINE = re.compile(r"^\s*[-*]\s+None\b")
SYMBOL_TABLE_HEADER = re.compile(r"^\|\s*symbol\s*\|.*\bcode\b.*\|.*\bshape\b.*\|.*\bdtype\b.*\|", re.I | re.M)

IDS = [m.marker for m in MILESTONES]


def lesson_file(m) -> Path:
    return ROOT / m.lesson


def fixture_subset(marker: str) -> dict:
    with open(FIXTURES / f"{marker}.json") as handle:
        data = json.load(handle)
    return {key: data[key] for key in FIXTURE_KEYS}


def quoted_fixture(text: str, marker: str):
    """The JSON block right after ``<!-- fixture: mNN -->``; raises AssertionError if absent."""
    tag = f"<!-- fixture: {marker} -->"
    count = text.count(tag)
    assert count == 1, f"expected the marker {tag!r} exactly once, found it {count} times"
    after = text.split(tag, 1)[1]
    block = re.match(r"\s*```json[ \t]*\n(.*?)\n\s*```", after, re.S)
    assert block, f"{tag} must be followed immediately by a ```json fenced block"
    try:
        return json.loads(block.group(1))
    except json.JSONDecodeError as exc:
        raise AssertionError(f"the ```json block after {tag} is not valid JSON: {exc}") from None


def first_difference(got, expected, path="$"):
    """Where two parsed JSON values first differ, for a readable failure."""
    if type(got) is not type(expected) and not (isinstance(got, (int, float)) and isinstance(expected, (int, float))):
        return f"{path}: lesson has {got!r}, fixture has {expected!r}"
    if isinstance(expected, dict):
        if list(got) != list(expected) and set(got) != set(expected):
            return f"{path}: lesson keys {sorted(got)}, fixture keys {sorted(expected)}"
        for key in expected:
            diff = first_difference(got[key], expected[key], f"{path}.{key}")
            if diff:
                return diff
        return None
    if isinstance(expected, list):
        if len(got) != len(expected):
            return f"{path}: lesson has {len(got)} items, fixture has {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            diff = first_difference(g, e, f"{path}[{i}]")
            if diff:
                return diff
        return None
    return None if got == expected else f"{path}: lesson has {got!r}, fixture has {expected!r}"


def milestone_test_names() -> set[str]:
    """Every ``def test_...`` in the milestone test files (tests/, tooling excluded)."""
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        if "tooling" in path.relative_to(ROOT / "tests").parts:
            continue
        names.update(re.findall(r"^\s*(?:async\s+)?def\s+(test_\w+)\s*\(", path.read_text(), re.M))
    return names


def structure_problems(m, text: str, test_names: set[str]) -> list[str]:
    problems: list[str] = []
    nn = f"{m.number:02d}"
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if not re.match(rf"^# Milestone {nn}: `{m.name}`", first):
        problems.append(f"first line must be '# Milestone {nn}: `{m.name}` ...', got {first!r}")

    headings, bodies = split_sections(text)
    present = [h for h in headings if h in REQUIRED_SECTIONS]
    missing = [s for s in REQUIRED_SECTIONS if s not in headings]
    if missing:
        problems.append(f"missing sections: {', '.join('## ' + s for s in missing)}")
    duplicated = sorted({h for h in present if present.count(h) > 1})
    if duplicated:
        problems.append(f"sections appear more than once: {duplicated}")
    if not missing and not duplicated and present != list(REQUIRED_SECTIONS):
        problems.append(f"sections out of order: {present}, expected {list(REQUIRED_SECTIONS)}")
    for section in REQUIRED_SECTIONS:
        if section in bodies and not bodies[section].strip():
            problems.append(f"section '## {section}' is empty")

    before = bodies.get("Before you start", "")
    listed = []
    for line in before.splitlines():
        match = DEPENDENCY_LINE.match(line)
        if match:
            listed.append((int(match.group(1)), match.group(2), match.group(3)))
    expected = [(d, by_number(d).name, Path(by_number(d).lesson).name) for d in m.depends_on]
    if listed != expected:
        problems.append(
            "'## Before you start' must list exactly the graph's dependencies as "
            f"'- [NN name](NN-name.md)' lines: expected {expected or 'none'}, found {listed or 'none'}"
        )
    if not m.depends_on and not any(NONE_LINE.match(line) for line in before.splitlines()):
        problems.append("'## Before you start' of a milestone with no dependencies needs a '- None' line")

    maths = bodies.get("The mathematics", "")
    if "$$" not in maths and "\\[" not in maths:
        problems.append("'## The mathematics' needs at least one display equation ($$ ... $$)")
    if not SYMBOL_TABLE_HEADER.search(maths):
        problems.append("'## The mathematics' needs a table with columns Symbol | Code | Shape | dtype")

    contract = bodies.get("The contract", "")
    if f"def {m.name}(" not in contract:
        problems.append(f"'## The contract' must show the signature 'def {m.name}(' in a code block")

    worked = bodies.get("Worked by hand", "")
    if f"<!-- fixture: {m.marker} -->" not in worked:
        problems.append(f"'## Worked by hand' must hold the marker <!-- fixture: {m.marker} --> and its JSON block")

    edges = bodies.get("Boundary, invalid and invariant", "")
    for label in ("**Boundary", "**Invalid", "**Invariant"):
        if label not in edges:
            problems.append(f"'## Boundary, invalid and invariant' needs an item starting {label}...**")

    mistakes = list_items(bodies.get("Common mistakes", ""))
    if not mistakes:
        problems.append("'## Common mistakes' must be a list, one mistake per item")
    for item in mistakes:
        named = named_tests(item)
        if not named:
            problems.append(f"common mistake without the test that catches it (`test_...`): {item[:80]!r}")
        for name in named:
            if name not in test_names:
                problems.append(f"common mistake names `{name}`, which is not a test in tests/")

    prove = bodies.get("Prove it works", "")
    # The commands the grader prints, which run in a workspace as printed (no venv to activate).
    for command in (rerun_command(m), "make grade"):
        if command not in prove:
            problems.append(f"'## Prove it works' must show the command `{command}`")
    return problems


@pytest.fixture(scope="module")
def test_names() -> set[str]:
    return milestone_test_names()


@pytest.mark.parametrize("number", [m.number for m in MILESTONES], ids=IDS)
def test_lesson_follows_the_template(number, test_names):
    m = by_number(number)
    path = lesson_file(m)
    assert path.is_file(), (
        f"lesson for milestone {m.label} is missing: write {m.lesson} (see {TEMPLATE.relative_to(ROOT)})")
    problems = structure_problems(m, path.read_text(encoding="utf-8"), test_names)
    assert not problems, f"{m.lesson}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("number", [m.number for m in MILESTONES], ids=IDS)
def test_worked_case_equals_fixture(number):
    m = by_number(number)
    path = lesson_file(m)
    assert path.is_file(), f"lesson for milestone {m.label} is missing: write {m.lesson}"
    fixture_path = FIXTURES / f"{m.marker}.json"
    assert fixture_path.is_file(), f"fixture {fixture_path.relative_to(ROOT)} is missing"
    quoted = quoted_fixture(path.read_text(encoding="utf-8"), m.marker)
    expected = fixture_subset(m.marker)
    assert isinstance(quoted, dict) and list(quoted) == list(FIXTURE_KEYS), (
        f"{m.lesson}: the quoted fixture must be an object with keys {list(FIXTURE_KEYS)} in that order, "
        f"got {list(quoted) if isinstance(quoted, dict) else type(quoted).__name__}"
    )
    diff = first_difference(quoted, expected)
    assert diff is None and quoted == expected, (
        f"{m.lesson} quotes numbers that differ from {fixture_path.relative_to(ROOT)}: {diff}"
    )


def test_template_lists_the_required_sections():
    """The template and this test agree on the structure, so writers follow what is checked."""
    headings, _ = split_sections(TEMPLATE.read_text(encoding="utf-8"))
    assert [h for h in headings if h in REQUIRED_SECTIONS] == list(REQUIRED_SECTIONS), (
        f"{TEMPLATE.relative_to(ROOT)} must show the sections {list(REQUIRED_SECTIONS)} in order, got {headings}"
    )


def index_row(m) -> str:
    needs = ", ".join(f"[{d:02d}]({Path(by_number(d).lesson).name})" for d in m.depends_on) or "-"
    return f"| {m.number:02d} | [`{m.name}`]({Path(m.lesson).name}) | {m.summary} | {needs} |"


def test_milestone_index_matches_the_graph():
    """docs/milestones/index.md has one row per milestone, its dependencies from the graph."""
    text = INDEX.read_text(encoding="utf-8")
    wrong = [index_row(m) for m in MILESTONES if index_row(m) not in text]
    assert not wrong, "docs/milestones/index.md must contain these rows verbatim:\n" + "\n".join(wrong)
    for title in PARTS.values():
        assert title in text, f"docs/milestones/index.md must name the part {title!r}"
