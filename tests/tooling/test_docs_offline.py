"""`make docs-offline`: MathJax shipped inside the site, a loud failure when it cannot be,
and a visible note on a page whose maths did not load."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK_FILE = ROOT / "scripts" / "mkdocs_mathjax.py"
FALLBACK_JS = ROOT / "docs" / "javascripts" / "mathjax-fallback.js"
MATHJAX_ES5 = ROOT / "build" / "mathjax" / "node_modules" / "mathjax" / "es5"


def _load_hook():
    spec = importlib.util.spec_from_file_location("mkdocs_mathjax", HOOK_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hook = _load_hook()


@pytest.fixture
def es5(tmp_path):
    folder = tmp_path / "node_modules" / "mathjax" / "es5"
    folder.mkdir(parents=True)
    (folder / "tex-mml-chtml.js").write_text("window.MathJax = {startup: {}};\n")
    return folder


def test_a_cdn_or_no_url_ships_nothing(tmp_path):
    assert hook.plan(None, tmp_path, None) is None
    assert hook.plan("https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js", tmp_path, None) is None


def test_a_fetched_copy_is_shipped_at_the_url_folder(tmp_path, es5):
    shipment = hook.plan("mathjax/es5/tex-mml-chtml.js", tmp_path, str(es5))
    assert shipment.source == es5 and str(shipment.target) == "mathjax/es5"
    (tmp_path / "vendor").mkdir()
    (tmp_path / "vendor" / "mj.js").write_text("x")
    assert hook.plan("vendor/mj.js", tmp_path, None) == hook.Shipment(None, PurePosixPath("vendor"))


@pytest.mark.parametrize("url, why", [
    ("/usr/share/mathjax/tex-mml-chtml.js", "not a path inside the site"),
    ("file:///tmp/tex-mml-chtml.js", "not a path inside the site"),
    ("C:/mathjax/tex-mml-chtml.js", "not a path inside the site"),
    ("../mathjax/tex-mml-chtml.js", "no '..'"),
    ("mathjax/es5/", "must be a .js file"),
    ("mathjax/es5/tex-svg.js", "no tex-svg.js in DILOCO_MATHJAX_DIR"),
])
def test_a_url_the_build_cannot_ship_fails(tmp_path, es5, url, why):
    with pytest.raises(ValueError, match=re.escape(why)) as info:
        hook.plan(url, tmp_path, str(es5))
    assert "DILOCO_MATHJAX_URL" in str(info.value) and "make docs-offline" in str(info.value)


def test_a_missing_or_empty_file_fails(tmp_path):
    with pytest.raises(ValueError, match="no tex-mml-chtml.js in the docs folder"):
        hook.plan("mathjax/es5/tex-mml-chtml.js", tmp_path, None)
    (tmp_path / "m.js").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        hook.plan("m.js", tmp_path, None)


def test_the_makefile_and_mkdocs_yml_agree_with_the_hook():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = makefile[makefile.index("docs-offline:"):]
    url = re.search(r"DILOCO_MATHJAX_URL=(\S+)", recipe).group(1)
    folder = re.search(r"^MATHJAX_ES5 := (\S+)$", makefile, re.M).group(1)
    assert f"$(MATHJAX_ES5)/{Path(url).name}:" in makefile, "make must fetch the file the URL names"
    assert "npm install --prefix build/mathjax" in makefile and "mathjax@3" in makefile
    assert folder == str(MATHJAX_ES5.relative_to(ROOT)) and "DILOCO_MATHJAX_DIR=$(MATHJAX_ES5)" in recipe
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "- scripts/mkdocs_mathjax.py" in mkdocs
    scripts = mkdocs[mkdocs.index("extra_javascript:"):mkdocs.index("hooks:")]
    assert scripts.index("javascripts/mathjax-fallback.js") < scripts.index("DILOCO_MATHJAX_URL")


@pytest.mark.skipif(not MATHJAX_ES5.is_dir(), reason="run `make docs-offline` first (fetches mathjax@3)")
def test_the_readme_states_the_size_of_what_is_shipped():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    size, version = re.search(r"\((\d+) MB for MathJax ([\d.]+)\)", readme).groups()
    package = json.loads((MATHJAX_ES5.parent / "package.json").read_text())
    measured = sum(p.stat().st_size for p in MATHJAX_ES5.rglob("*") if p.is_file()) / 1e6
    assert package["version"] == version, f"README names MathJax {version}, build/ has {package['version']}"
    assert abs(measured - int(size)) <= 0.1 * measured, f"README says {size} MB, es5/ is {measured:.1f} MB"


# --------------------------------------------------------------------------- the page-side note

_DOM = """
const listeners = {};
let inserted = null;
const formulas = %(formulas)d;
const element = () => ({children: [], className: "", textContent: "", id: "",
  setAttribute() {}, appendChild(c) { this.children.push(c); }});
global.window = {addEventListener: (name, f) => { listeners[name] = f; }, MathJax: %(mathjax)s};
global.document = {
  querySelectorAll: () => ({length: formulas}),
  getElementById: () => null,
  querySelector: () => ({firstChild: null, insertBefore(note) { inserted = note; }}),
  createElement: element,
  createTextNode: (text) => ({textContent: text}),
  body: null,
};
require(%(script)s);
listeners.load();
const text = inserted ? [inserted, ...inserted.children.flatMap(c => [c, ...c.children])]
  .map(c => c.textContent).join(" ") : "";
process.stdout.write(JSON.stringify({inserted: Boolean(inserted), text}));
"""


def _run_page(tmp_path, *, mathjax: str, formulas: int) -> dict:
    page = tmp_path / "page.js"
    page.write_text(_DOM % {"formulas": formulas, "mathjax": mathjax, "script": json.dumps(str(FALLBACK_JS))})
    out = subprocess.run(["node", str(page)], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page script")
def test_a_page_whose_maths_did_not_load_says_so(tmp_path):
    config_only = "{tex: {}, options: {}}"  # what javascripts/mathjax.js leaves when MathJax never ran
    missing = _run_page(tmp_path, mathjax=config_only, formulas=3)
    assert missing["inserted"] and "did not load" in missing["text"] and "make docs-offline" in missing["text"]
    assert "3 formulas" in missing["text"]
    assert not _run_page(tmp_path, mathjax="{startup: {}}", formulas=3)["inserted"]  # MathJax ran
    assert not _run_page(tmp_path, mathjax=config_only, formulas=0)["inserted"]  # no maths on the page


# --------------------------------------------------------------------------- a real build

def _mkdocs(tmp_path, env: dict) -> subprocess.CompletedProcess:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (`make docs` installs it)")
    pytest.importorskip("material", reason="the docs extra is not installed")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", **env}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_the_build_fails_loudly_on_a_url_it_cannot_ship(tmp_path):
    proc = _mkdocs(tmp_path, {"DILOCO_MATHJAX_URL": "mathjax/es5/tex-mml-chtml.js", "DILOCO_MATHJAX_DIR": ""})
    assert proc.returncode != 0
    assert "DILOCO_MATHJAX_URL=mathjax/es5/tex-mml-chtml.js: no tex-mml-chtml.js" in proc.stdout + proc.stderr
    assert not (tmp_path / "site" / "index.html").exists()


@pytest.mark.slow
def test_an_offline_build_ships_mathjax_inside_the_site(tmp_path, es5):
    proc = _mkdocs(tmp_path, {"DILOCO_MATHJAX_URL": "mathjax/es5/tex-mml-chtml.js", "DILOCO_MATHJAX_DIR": str(es5)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    assert (site / "mathjax" / "es5" / "tex-mml-chtml.js").read_text() == (es5 / "tex-mml-chtml.js").read_text()
    lesson = (site / "milestones" / "04-softmax" / "index.html").read_text(encoding="utf-8")
    assert 'src="../../mathjax/es5/tex-mml-chtml.js"' in lesson and "mathjax-fallback.js" in lesson
    assert "cdn.jsdelivr.net" not in lesson
    # The API reference shows what a round returns, field by field (RoundResult and RoundRecord).
    from diloco.loop import RoundRecord, RoundResult

    api = (site / "api" / "loop" / "index.html").read_text(encoding="utf-8")
    for cls, fields in ((RoundResult, RoundResult._fields), (RoundRecord, RoundRecord.__annotations__)):
        section = api[api.index(f'id="diloco.loop.{cls.__name__}"'):]
        section = section[:section.index('class="doc doc-heading"', 100)]
        assert all(f"{field}" in section for field in fields), cls.__name__
