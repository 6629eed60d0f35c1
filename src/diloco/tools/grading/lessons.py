"""The lessons as the grader reads them: the "Common mistakes" bullets and the tests they name.

Every lesson (``docs/milestones/NN-name.md``) ends its ``## Common mistakes`` section with one
list item per mistake, and each item names the test that catches it
(``Caught by `test_softmax_matches_hand_worked_fixture```). The grader prints, under a
FAILED milestone, the bullets that name a failing test, and links to the section.

Only the standard library and ``diloco.milestones`` are imported: the grader also runs as a
file in a workspace whose own package may not import.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from diloco.milestones import Milestone

__all__ = ["MISTAKES_HEADING", "Mistake", "split_sections", "list_items", "named_tests", "common_mistakes",
           "matching_mistakes", "section_anchor", "mistakes_link", "plain_text"]

MISTAKES_HEADING = "Common mistakes"
# A test named in backticks, optionally with its file and parameters: `tests/test_x.py::test_y[float32]`.
TEST_NAME = re.compile(r"`(?:[\w/.]+::)?(test_\w+)(?:\[[^\]`]*\])?`")
_ITEM = re.compile(r"^(?:[-*]|\d+\.)\s+")


class Mistake(NamedTuple):
    """One bullet of a lesson's "Common mistakes".

    ``text`` is the bullet as plain text (no ``**``, no maths delimiters, links reduced to
    their words); ``tests`` the names of the tests it says catch the mistake.
    """

    text: str
    tests: tuple[str, ...]


def split_sections(text: str) -> tuple[list[str], dict[str, str]]:
    """The ``## `` headings of a Markdown page in order, and each one's body.

    A ``## `` line inside fenced code is not a heading.
    """
    headings: list[str] = []
    bodies: dict[str, list[str]] = {}
    current = None
    fence = None
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence is None and (stripped.startswith("```") or stripped.startswith("~~~")):
            fence = stripped[:3]
        elif fence is not None and stripped.startswith(fence):
            fence = None
        elif fence is None and line.startswith("## "):
            current = line[3:].strip()
            headings.append(current)
            bodies.setdefault(current, [])
            continue
        if current is not None:
            bodies[current].append(line)
    return headings, {k: "\n".join(v) for k, v in bodies.items()}


def list_items(body: str) -> list[str]:
    """Top-level list items of a section, each with its continuation lines joined.

    Lines of fenced code are skipped.
    """
    items: list[str] = []
    fence = None
    for line in body.splitlines():
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif fence is not None:
            fence = None if stripped.startswith(fence) else fence
        elif _ITEM.match(line):
            items.append(line)
        elif items and line.startswith((" ", "\t")) and line.strip():
            items[-1] += " " + line.strip()
    return items


def named_tests(item: str) -> tuple[str, ...]:
    """The test function names a bullet names, in order, without repeats."""
    return tuple(dict.fromkeys(TEST_NAME.findall(item)))


def plain_text(item: str) -> str:
    """A Markdown list item as one line of plain text for a terminal."""
    text = _ITEM.sub("", item.strip(), count=1)
    text = re.sub(r"\[([^\]]+)\]\([^)\s]+\)", r"\1", text)  # [words](link) -> words
    text = text.replace("**", "").replace("\\(", "").replace("\\)", "")
    return re.sub(r"\s+", " ", text).strip()


def common_mistakes(lesson: Path | str) -> tuple[Mistake, ...]:
    """The "Common mistakes" bullets of the lesson file ``lesson``; () if the file is missing."""
    try:
        text = Path(lesson).read_text(encoding="utf-8")
    except OSError:
        return ()
    _, bodies = split_sections(text)
    return tuple(Mistake(plain_text(item), named_tests(item))
                 for item in list_items(bodies.get(MISTAKES_HEADING, "")))


def matching_mistakes(mistakes: Iterable[Mistake], failing: Iterable[str]) -> tuple[Mistake, ...]:
    """The mistakes that name at least one of the ``failing`` tests, in the lesson's order.

    ``failing`` holds test function names or pytest node ids
    (``tests/test_model.py::test_softmax_matches_hand_worked_fixture[float32]``).
    """
    names = {re.sub(r"\[.*\]$", "", f.rsplit("::", 1)[-1]) for f in failing}
    return tuple(m for m in mistakes if names & set(m.tests))


def section_anchor(heading: str) -> str:
    """The anchor the site gives a heading (Python-Markdown's ``toc`` slug): ``common-mistakes``."""
    slug = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", slug)


def mistakes_link(milestone: Milestone) -> str:
    """``docs/milestones/04-softmax.md#common-mistakes``: the section, relative to the project."""
    return f"{milestone.lesson}#{section_anchor(MISTAKES_HEADING)}"
