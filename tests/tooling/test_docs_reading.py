"""The site reads well: search excerpts show maths as text, display equations fit, names in
tables do not break mid-word.

The search hook (``scripts/mkdocs_search_text.py``) is checked on its own and on an index as
the search and offline plugins write it. The layout rules live in ``docs/stylesheets/extra.css``
(a wide equation scrolls inside its box; a ``code`` name in a table cell never wraps) and
``mkdocs.yml`` must load them. No display equation line of a lesson is longer than what fits
beside Material's navigation at 1280 px (``WIDEST`` characters as typeset; lesson 25's
first line, which overflowed, had 84).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("mkdocs_search_text", ROOT / "scripts" / "mkdocs_search_text.py")
search_text = importlib.util.module_from_spec(spec)
spec.loader.exec_module(search_text)


@pytest.mark.parametrize("tex, text", [
    (r"\(\theta \leftarrow \theta - \eta\,\Delta\)", "θ ← θ - η Δ"),
    (r"\(\frac{1}{K}\sum_{k} \theta_k\)", "(1)/(K)Σ_k θ_k"),
    (r"\(\lVert \Delta^{(t)} \rVert_2\)", "‖ Δ^(t) ‖_2"),
    (r"\[m^{(t)} = \mu\, m^{(t-1)} + \Delta^{(t)}\]", "m^(t) = μ m^(t-1) + Δ^(t)"),
    (r"\(\operatorname{InnerTrain}(\theta)\)", "InnerTrain(θ)"),
    ("no maths, a path C:\\x and (brackets)", "no maths, a path C:\\x and (brackets)"),
])
def test_maths_in_an_excerpt_becomes_text(tex, text):
    assert search_text.plain_maths(tex) == text


def test_the_index_and_its_offline_copy_are_rewritten(tmp_path):
    folder = tmp_path / "search"
    folder.mkdir()
    docs = [{"location": "a/", "title": r"The step \(\eta\)", "text": r"<p>apply \(\theta - \eta\Delta\)</p>"}]
    raw = json.dumps({"config": {"lang": ["en"]}, "docs": docs})
    (folder / "search_index.json").write_text(raw)
    (folder / "search_index.js").write_text(f"var __index = {raw}")
    assert search_text.rewrite_index(tmp_path)
    index = json.loads((folder / "search_index.json").read_text())
    assert index["docs"][0]["title"] == "The step η" and index["docs"][0]["text"] == "<p>apply θ - ηΔ</p>"
    inlined = (folder / "search_index.js").read_text()
    assert inlined.startswith("var __index = ") and json.loads(inlined.removeprefix("var __index = ")) == index
    assert not search_text.rewrite_index(tmp_path / "no-site")


def test_mkdocs_loads_the_hook_and_the_stylesheet():
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "- scripts/mkdocs_search_text.py" in config and "- stylesheets/extra.css" in config
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    assert re.search(r"div\.arithmatex\s*\{[^}]*overflow-x:\s*auto", css)
    assert re.search(r"td code[^{]*\{[^}]*white-space:\s*nowrap", css)


def display_lines(text: str):
    inside = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() == "$$":
            inside = not inside
        elif inside:
            yield number, line


# Characters of a display line as typeset (``search_text.plain``: a command is its symbol). Lesson
# 25's first line, 84, overflowed the page at 1280 px; the widest line no one reported is 71.
WIDEST = 72


@pytest.mark.parametrize("page", sorted((ROOT / "docs" / "milestones").glob("[0-9]*.md")), ids=lambda p: p.stem)
def test_no_lesson_equation_line_is_wider_than_the_page(page):
    wide = [f"{page.name}:{n}: {len(search_text.plain(line))} characters as typeset"
            for n, line in display_lines(page.read_text(encoding="utf-8")) if len(search_text.plain(line)) > WIDEST]
    assert not wide, "break these display lines (aligned rows) so they fit at 1280 px:\n  " + "\n  ".join(wide)
