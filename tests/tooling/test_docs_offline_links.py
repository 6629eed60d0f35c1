"""`make docs-offline` builds a site that works from file://: every link of the navigation
names a .html file that exists, and search works without a server.

Opened over file://, a link to a folder (``milestones/04-softmax/``) shows a directory
listing, and search's fetch of ``search_index.json`` is refused by the browser. The
offline build (``DILOCO_DOCS_OFFLINE=true``: Material's offline plugin) links files and
ships the search index as a script. A static check of the built HTML: no browser needed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.tooling, pytest.mark.slow]


class Links(HTMLParser):
    """The ``href`` of every ``<a>``, and whether it sits in a navigation (``md-nav``, ``md-footer``,
    ``md-tabs``, ``md-header``) element; and the ``src`` of every ``<script>``."""

    def __init__(self):
        super().__init__()
        self.links, self.scripts, self._stack = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        nav = any(part in (attrs.get("class") or "") for part in ("md-nav", "md-footer", "md-tabs", "md-header"))
        if tag not in ("br", "img", "input", "link", "meta", "hr", "source"):
            self._stack.append(nav)
        if tag == "a" and attrs.get("href"):
            self.links.append((attrs["href"], nav or any(self._stack)))
        if tag == "script" and attrs.get("src"):
            self.scripts.append(attrs["src"])

    def handle_endtag(self, tag):
        if self._stack and tag not in ("br", "img", "input", "link", "meta", "hr", "source"):
            self._stack.pop()


@pytest.fixture(scope="module")
def offline_site(tmp_path_factory):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (`make install` installs it)")
    pytest.importorskip("material", reason="the docs extra is not installed")
    tmp = tmp_path_factory.mktemp("offline")
    es5 = tmp / "es5"  # a stand-in for the npm mathjax@3 package: links are what is checked here
    es5.mkdir()
    (es5 / "tex-mml-chtml.js").write_text("window.MathJax = {startup: {}};\n")
    shim = tmp / "shim.js"  # a stand-in for npm's iframe-worker shim
    shim.write_text(SHIM_TEXT)
    proc = build(tmp / "site", {"DILOCO_DOCS_OFFLINE": "true", "DILOCO_MATHJAX_URL": "mathjax/es5/tex-mml-chtml.js",
                                "DILOCO_MATHJAX_DIR": str(es5), "DILOCO_IFRAME_WORKER": str(shim)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "site"


SHIM_TEXT = '"use strict";/* iframe-worker shim stand-in */\n'


def build(site: Path, env: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", **env}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def local_target(page: Path, href: str) -> Path | None:
    """The file a relative link of ``page`` opens, or None for an external or in-page link."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    return (page.parent / unquote(parts.path)).resolve()


def test_every_navigation_link_names_an_html_file_that_exists(offline_site):
    # 404.html is served by a web server only, with absolute links; from file:// nothing opens it.
    pages = sorted(p for p in offline_site.rglob("*.html") if p.name != "404.html")
    assert len(pages) > 40, f"only {len(pages)} pages built"
    checked, bad = 0, []
    for page in pages:
        parser = Links()
        parser.feed(page.read_text(encoding="utf-8"))
        for href, in_nav in parser.links:
            target = local_target(page, href)
            if target is None or not in_nav:
                continue
            checked += 1
            if not (target.suffix == ".html" and target.is_file()):
                bad.append(f"{page.relative_to(offline_site)}: {href}")
    assert checked > 1000, f"only {checked} navigation links found: is the parser reading the pages?"
    assert not bad, "navigation links that do not open a page from file://:\n  " + "\n  ".join(bad[:20])


def test_no_link_of_any_page_opens_a_folder(offline_site):
    folders = []
    for page in offline_site.rglob("*.html"):
        if page.name == "404.html":
            continue
        parser = Links()
        parser.feed(page.read_text(encoding="utf-8"))
        for href, _ in parser.links:
            target = local_target(page, href)
            if target is not None and (href.split("#")[0].endswith("/") or target.is_dir()):
                folders.append(f"{page.relative_to(offline_site)}: {href}")
    assert not folders, "links to a folder show a directory listing from file://:\n  " + "\n  ".join(folders[:20])


def test_search_ships_its_index_and_its_shim_inside_the_site(offline_site):
    """From file:// a browser refuses fetch(); the offline plugin loads the index as a script
    (search/search_index.js) through the iframe-worker shim, which must come from the site
    itself, not from a CDN."""
    index_js = offline_site / "search" / "search_index.js"
    assert index_js.is_file() and index_js.stat().st_size > 10_000, "no search index script"
    assert "softmax" in index_js.read_text(encoding="utf-8")
    shipped = offline_site / "assets" / "javascripts" / "iframe-worker-shim.js"
    assert shipped.read_text() == SHIM_TEXT
    for page in (offline_site / "index.html", offline_site / "milestones" / "04-softmax.html",
                 offline_site / "api" / "loop.html"):
        text = page.read_text(encoding="utf-8")
        parser = Links()
        parser.feed(text)
        shims = [src for src in parser.scripts if "iframe-worker" in src]
        assert len(shims) == 1 and (page.parent / shims[0]).resolve() == shipped.resolve(), (page, parser.scripts)
        assert "unpkg.com" not in text and "cdn.jsdelivr.net" not in text, f"{page.name} loads from a CDN"
    lesson = (offline_site / "milestones" / "04-softmax.html").read_text(encoding="utf-8")
    assert 'src="../mathjax/es5/tex-mml-chtml.js"' in lesson


def test_an_offline_build_without_the_shim_fails_loudly(tmp_path):
    pytest.importorskip("material", reason="the docs extra is not installed")
    proc = build(tmp_path / "site", {"DILOCO_DOCS_OFFLINE": "true", "DILOCO_IFRAME_WORKER": ""})
    assert proc.returncode != 0
    assert "DILOCO_DOCS_OFFLINE=true needs DILOCO_IFRAME_WORKER" in proc.stdout + proc.stderr
    assert not (tmp_path / "site" / "index.html").exists()


def test_the_makefile_builds_the_offline_site_with_the_offline_plugin():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile[makefile.index("\ndocs-offline:"):]
    recipe = recipe[:recipe.index("\n\n")]
    assert "DILOCO_DOCS_OFFLINE=true" in recipe and "DILOCO_IFRAME_WORKER=$(IFRAME_WORKER_SHIM)" in recipe
    assert "npm install --prefix build/iframe-worker" in makefile and "iframe-worker@1" in makefile
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"- offline:\n\s+enabled: !ENV \[DILOCO_DOCS_OFFLINE, false\]", mkdocs)
