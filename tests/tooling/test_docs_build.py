"""The documentation site agrees with the code: nav, concept-page snippets, lesson links.

The strict build itself (`make docs`, run by CI after the tests) catches broken links and
pages missing from the nav; these checks need no mkdocs and catch what a build cannot:
a nav that lists the lessons under the wrong part, and concept pages whose code no
longer runs against the library.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from diloco.milestones import MILESTONES, PARTS

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = ROOT / "mkdocs.yml"
CONCEPTS = sorted((ROOT / "docs" / "concepts").glob("*.md"))
PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```", re.S | re.M)


def nav_lessons() -> list[tuple[str, str, str]]:
    """(part title, entry title, path) for every lesson entry under Learn in mkdocs.yml."""
    entries, part = [], None
    for line in MKDOCS.read_text(encoding="utf-8").splitlines():
        part_match = re.match(r'^\s*- "(Part \d - [^"]+)":\s*$', line)
        if part_match:
            part = part_match.group(1)
            continue
        lesson_match = re.match(r'^\s*- "([^"]+)": (milestones/\d{2}-[a-z0-9-]+\.md)\s*$', line)
        if lesson_match:
            entries.append((part, lesson_match.group(1), lesson_match.group(2)))
    return entries


def test_nav_lists_every_lesson_under_its_part_in_order():
    expected = [(PARTS[m.module], f"{m.number:02d} {m.name}", m.lesson.removeprefix("docs/")) for m in MILESTONES]
    assert nav_lessons() == expected, "mkdocs.yml's nav must list the 30 lessons, in order, under their parts"


def test_nav_has_the_promised_pages():
    text = MKDOCS.read_text(encoding="utf-8")
    for page in ("index.md", "concepts/diloco.md", "concepts/communication.md", "concepts/paper-comparison.md",
                 "glossary.md", "learner-guide.md", "milestones/index.md", "instructor-guide.md", "cli.md",
                 "results.md", "api/index.md"):
        assert re.search(rf":\s*{re.escape(page)}\s*$|^\s*-\s*{re.escape(page)}\s*$", text, re.M), page


def test_api_pages_document_the_modules():
    for module in ("model", "adamw", "params", "sharding", "outer", "loop", "evaluation", "config", "data"):
        page = ROOT / "docs" / "api" / f"{module}.md"
        assert f"::: diloco.{module}" in page.read_text(encoding="utf-8"), f"{page} must render diloco.{module}"


@pytest.mark.parametrize("page", CONCEPTS, ids=[p.stem for p in CONCEPTS])
def test_concept_page_snippets_run(page):
    """Every ```python block of a concept page runs and its asserts hold."""
    for i, code in enumerate(PYTHON_BLOCK.findall(page.read_text(encoding="utf-8"))):
        exec(compile(code, f"{page.name}[python block {i}]", "exec"), {})


DOC_PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "TEMPLATE.md")


def display_math_problems(text: str) -> list[str]:
    """Display math arithmatex will not see: ``$$`` not alone on its line, or not opening a block."""
    problems, fence, inside = [], None, False
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            continue
        if "$$" not in line:
            continue
        if stripped != "$$":
            problems.append(f"line {number}: put $$ on a line of its own: {stripped[:60]!r}")
            continue
        if not inside:
            indent = len(line) - len(line.lstrip(" "))
            if number > 1 and lines[number - 2].strip():
                problems.append(f"line {number}: an opening $$ needs a blank line before it")
            if indent % 4:
                problems.append(f"line {number}: indent $$ by a multiple of 4 spaces (inside a list: 4)")
        inside = not inside
    if inside:
        problems.append("a $$ block is never closed")
    return problems


@pytest.mark.parametrize("page", DOC_PAGES, ids=[str(p.relative_to(ROOT / "docs")) for p in DOC_PAGES])
def test_display_math_is_well_formed(page):
    """A $$ block glued to a list item or a paragraph reaches the reader as raw LaTeX."""
    problems = display_math_problems(page.read_text(encoding="utf-8"))
    assert not problems, f"{page.relative_to(ROOT)}:\n  " + "\n  ".join(problems)
