"""The prose agrees with the code: commands, paths, numbers and names the docs print.

Each check here is a place where the documentation once said something the project no
longer did: a command that needs an activated virtual environment, a module that moved, a
dependency list copied by hand, a seed count, a licence, a notebook runner that is not
installed, a record's fields.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from diloco.milestones import MILESTONES, by_number
from diloco.milestones import test_command as rerun_command  # not collected as a test
from diloco.tools.workspace.regions import stub_lines

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TEMPLATE_DIR = ROOT / "src" / "diloco" / "tools" / "workspace" / "workspace_template"
GUIDE = DOCS / "learner-guide.md"

# What a learner reads and types: every command here must run as printed.
LEARNER_FILES = sorted([ROOT / "README.md", GUIDE, DOCS / "glossary.md", TEMPLATE_DIR / "README.md",
                        *(DOCS / "milestones").glob("*.md"), *(DOCS / "exercises").glob("*.md")])
# Programs that exist only inside an activated virtual environment (or not at all).
NEEDS_ACTIVATION = ("pytest", "diloco", "python", "mkdocs", "jupyter", "mpiexec", "pip", "ruff", "npm")
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w-]*)")
SHELL = ("bash", "sh", "shell", "console")


def commands(text: str) -> list[tuple[int, str]]:
    """``(line, command)`` for every command a Markdown page shows.

    Shell blocks: every command of every line (comments dropped, ``&&`` / ``;`` / ``|``
    split). Other blocks (a program's output): a line typed at a prompt (``$ ...``), and
    what follows ``rerun:``, ``next:``, ``or:`` or ``with:`` (the interrupt's ``--resume``
    line) or sits in ``(see '...')`` (a usage error's hint). Prose: every inline code span.
    """
    found: list[tuple[int, str]] = []
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = (match.group(1), match.group(2))
            continue
        if fence is not None and line.strip().startswith(fence[0]):
            fence = None
            continue
        if fence is not None:
            if fence[1] in SHELL:
                code = re.sub(r"(^|\s)#.*$", "", line)
                found += [(number, part.strip()) for part in re.split(r"&&|;|\|", code) if part.strip()]
            else:
                if line.startswith("$ "):
                    found.append((number, line[2:].split(" & ")[0].strip()))
                found += [(number, hint) for hint in re.findall(r"\(see '([^']+)'\)", line)]
                for shown in re.findall(r"\b(?:rerun|next|or|with):\s+(.+?)(?:\)|\s{2,}|$)", line):
                    found += [(number, part.strip()) for part in shown.split("&&") if part.strip()]
            continue
        found += [(number, span.strip()) for span in re.findall(r"`([^`\n]+)`", line)]
    return found


def needs_activation(command: str) -> bool:
    """``pytest -m m07`` or ``diloco grade``: a program found only on an activated PATH.

    ``diloco grade: error: ...`` (a program's output) and ``diloco.milestones`` are not commands.
    """
    words = command.split()
    return len(words) > 1 and words[0] in NEEDS_ACTIVATION and not words[1].endswith(":")


@pytest.mark.parametrize("path", LEARNER_FILES, ids=[str(p.relative_to(ROOT)) for p in LEARNER_FILES])
def test_printed_commands_run_without_activating_anything(path):
    """`make test M=m04`, `.venv/bin/diloco ...`, never a bare `pytest -m m04`."""
    bad = [f"{path.relative_to(ROOT)}:{line}: {command}"
           for line, command in commands(path.read_text(encoding="utf-8")) if needs_activation(command)]
    assert not bad, ("write `make ...` or `.venv/bin/PROGRAM ...` (nothing to activate) instead of:\n  "
                     + "\n  ".join(bad))


def test_the_scanner_catches_a_bare_command():
    text = ("Run `pytest -m m04`.\n\n```bash\ncd ws && diloco grade  # progress\n```\n\n"
            "```text\n  rerun: python -m x\n```\n")
    assert [c for _, c in commands(text) if needs_activation(c)] == ["pytest -m m04", "diloco grade", "python -m x"]
    output = ("```\n$ diloco train -q & sleep 1\nx: error: y (see 'diloco train --help')\n"
              "x: interrupted; continue from round 3 with: diloco train --resume runs/r\n```\n")
    assert [c for _, c in commands(output) if needs_activation(c)] == [
        "diloco train -q", "diloco train --help", "diloco train --resume runs/r"]
    assert not needs_activation("diloco grade: error: no package") and not needs_activation("diloco.milestones")
    assert not needs_activation(".venv/bin/python -m pytest -m m07") and not needs_activation("make test M=m07")


def makefile_targets(path: Path) -> set[str]:
    rule = re.compile(r"^([A-Za-z][\w.-]*(?:[ \t]+[A-Za-z][\w.-]*)*)[ \t]*:(?!=)", re.M)
    rules = rule.findall(path.read_text(encoding="utf-8"))
    return {target for rule in rules for target in rule.split()}


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_grader_and_the_workspace_print_commands_that_exist():
    """The rerun command and the stubs' "Test it:" line are workspace make targets; the
    commands every learner file shows name targets of one of the two Makefiles."""
    workspace_targets = makefile_targets(TEMPLATE_DIR / "Makefile")
    all_targets = workspace_targets | makefile_targets(ROOT / "Makefile")
    for m in MILESTONES:
        assert rerun_command(m).split()[:2] == ["make", "test"] and "test" in workspace_targets
        assert not any(needs_activation(c) for line in stub_lines(m, "") for c in re.findall(r"Test it: (.*)", line))
    for path in LEARNER_FILES:
        for line, command in commands(path.read_text(encoding="utf-8")):
            words = command.split()
            if words[:1] == ["make"] and len(words) > 1 and "=" not in words[1]:
                assert words[1] in all_targets, f"{path.relative_to(ROOT)}:{line}: no target {words[1]!r}"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_m_runs_the_marker_expression(tmp_path):
    """`make test M="m26 and not slow"` reaches pytest as one quoted argument."""
    shutil.copy(TEMPLATE_DIR / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").touch()
    # Not the variables of a make this suite runs under (`make test JOBS=3` passes JOBS down in MAKEFLAGS).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "JOBS", "M")}
    for makefile_dir in (tmp_path, ROOT):
        out = subprocess.run(["make", "-n", "-s", "test", "M=m26 and not slow"], cwd=makefile_dir, env=env,
                             capture_output=True, text=True, check=True).stdout.strip().splitlines()
        assert out[-1] == ".venv/bin/python -m pytest -m 'm26 and not slow'", (makefile_dir, out)


# --------------------------------------------------------------------------- names and paths

DOTTED = re.compile(r"(?<![\w/.-])(diloco(?:\.\w+)+)(?![\w/-])")
FILE_SUFFIXES = {"md", "py", "npz", "json", "jsonl", "ipynb", "png", "txt"}  # diloco.md is a page
SRC_PATH = re.compile(
    r"(?<![\w/.-])((?:src/diloco|scripts|benchmarks|tests|notebooks)/[\w/.-]+\.(?:py|md|npz|json|ipynb))")
PROSE = sorted([ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS.rglob("*.md")])


def resolves(dotted: str) -> bool:
    """``diloco.tools.cli.mpi`` is a module; ``diloco.loop.RoundResult`` an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            spec = None
        if spec is None:
            continue
        if cut == len(parts):
            return True
        obj = importlib.import_module(module)
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("path", PROSE, ids=[str(p.relative_to(ROOT)) for p in PROSE])
def test_named_modules_and_source_paths_exist(path):
    """No `diloco.cli`, `python -m diloco.mpi`, `src/diloco/grading.py` or a renamed script after a move."""
    text = path.read_text(encoding="utf-8")
    names = {name for name in DOTTED.findall(text) if name.rsplit(".", 1)[-1] not in FILE_SUFFIXES}
    missing = sorted({name for name in names if not resolves(name)}
                     | {p for p in SRC_PATH.findall(text) if "NN" not in p and not (ROOT / p).exists()})
    assert not missing, f"{path.relative_to(ROOT)} names what does not exist: {missing}"


# --------------------------------------------------------------------------- numbers and lists

def test_learner_guide_locked_rows_follow_the_dependency_graph():
    """The sample table of a fresh workspace: locked rows name the graph's prerequisites."""
    rows = re.findall(r"^ (\d\d) (\w+)\s+(locked|not started)\s+(.*)$", GUIDE.read_text(encoding="utf-8"), re.M)
    assert len(rows) >= 5
    for number, name, status, note in rows:
        m = by_number(int(number))
        assert m.name == name
        if not m.depends_on:
            assert (status, note) == ("not started", m.lesson), (number, status, note)
            continue
        needs = (by_number(m.depends_on[0]).label if len(m.depends_on) == 1
                 else ", ".join(f"{d:02d}" for d in m.depends_on))
        assert (status, note) == ("locked", f"needs {needs}"), f"milestone {m.label}: the guide says {note!r}"


WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "ten": 10}


def _count(word: str) -> int:
    return int(word) if word.isdigit() else WORDS[word.lower()]


def test_notebook_02_quotes_the_seed_count_of_the_results_page():
    """The seeds docs/results.md's reruns of the paper's tables and figures take (their
    `--seeds N` commands, or its "Each study runs N seeds") are the seeds notebook 02 says
    they run. (The page's two added rows, splits and scaling, may run fewer.)"""
    results = (DOCS / "results.md").read_text(encoding="utf-8")
    counts = {int(n) for n in re.findall(r"diloco study (?:table2|fig4|fig6|table3|fig8|fig9) .*?--seeds (\d+)",
                                         results)}
    counts |= {_count(n) for n in re.findall(r"Each study runs (\w+) seeds", results)}
    assert len(counts) == 1, f"docs/results.md states several seed counts: {sorted(counts)}"
    (seeds,) = counts
    source = (ROOT / "scripts" / "make_notebooks.py").read_text(encoding="utf-8")
    quoted = re.findall(r"results\.md`[^.]*?\b(\w+) seeds", source)
    assert quoted, "notebook 02 no longer quotes docs/results.md's seed count"
    assert [_count(q) for q in quoted] == [seeds] * len(quoted), (
        f"results.md runs {seeds} seeds, notebook 02 says {quoted}")


def test_licence_is_mit_and_the_digits_keep_their_attribution():
    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert licence.startswith("MIT License") and "Copyright (c)" in licence and "diloco developers" in licence
    project = pyproject()["project"]
    assert project["license"] == {"text": "MIT"}
    footer = re.search(r"^copyright: (.*)$", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M).group(1)
    assert "MIT" in footer and "CC BY 4.0" in footer
    for path in (ROOT / "src" / "diloco" / "_datasets" / "README.md", ROOT / "README.md", DOCS / "index.md"):
        text = path.read_text(encoding="utf-8")
        assert "CC BY 4.0" in text and "Alpaydin" in text, path


def test_jupyter_commands_the_docs_suggest_are_installed_by_the_notebooks_extra():
    """`.venv/bin/jupyter execute` comes from nbclient; `jupyter nbconvert` would not exist."""
    extras = pyproject()["project"]["optional-dependencies"]
    notebook_dists = {re.split(r"[<>=\[ ]", req)[0].lower() for req in extras["notebooks"]}
    suggested = {sub for path in PROSE + LEARNER_FILES
                 for _, command in commands(path.read_text(encoding="utf-8"))
                 for sub in re.findall(r"(?:^|/)jupyter\s+([\w-]+)", command)}
    assert suggested, "the docs no longer say how to run a notebook"
    for sub in suggested:
        scripts = importlib.metadata.entry_points(group="console_scripts", name=f"jupyter-{sub}")
        providers = {ep.dist.name.lower() for ep in scripts if ep.dist is not None}
        assert providers & notebook_dists, f"`jupyter {sub}` is not installed by the notebooks extra {notebook_dists}"


# --------------------------------------------------------------------------- the API reference

def _documented_attributes(obj) -> set[str]:
    doc = obj.__doc__ or ""
    section = re.search(r"^\s*Attributes\n\s*-+\n(.*?)(?:\n\s*\n\s*[A-Z]\w+\n\s*-+\n|\Z)", doc, re.S | re.M)
    assert section, f"{obj.__name__} has no Attributes section"
    return {name.strip() for line in re.findall(r"^\s{4}(\S[^:\n]*?) :", section.group(1), re.M)
            for name in line.split(",")}


def test_the_records_of_a_run_document_every_field():
    """RoundResult, TrainResult and RoundRecord, rendered by docs/api/loop.md, list each field."""
    from diloco import loop

    assert "::: diloco.loop" in (DOCS / "api" / "loop.md").read_text(encoding="utf-8")
    for cls, fields in ((loop.RoundResult, loop.RoundResult._fields), (loop.TrainResult, loop.TrainResult._fields),
                        (loop.RoundRecord, tuple(loop.RoundRecord.__annotations__))):
        assert set(fields) == _documented_attributes(cls), cls.__name__
        assert cls.__name__ in loop.__all__


# --------------------------------------------------------------------------- the stub a learner sees

def test_learner_guide_quotes_a_real_stub():
    """The guide's milestone-07 stub is what a fresh workspace holds, docstring abridged."""
    from diloco.tools.workspace.regions import stub_source

    guide = GUIDE.read_text(encoding="utf-8")
    (shown,) = re.findall(r"^```python\n(@milestone\ndef init_adamw_state.*?)^```", guide, re.S | re.M)
    source = stub_source((ROOT / "src" / "diloco" / "adamw.py").read_text(encoding="utf-8"), "adamw")
    start = source.index("def init_adamw_state(")
    start = source.rindex("\n\n", 0, start) + 2  # include the decorators
    stub = source[start:source.index("\n\n\n", start)] + "\n"
    docstring = re.search(r'    """(.*?)"""\n', stub, re.S)
    abridged = f'    """{docstring.group(1).splitlines()[0]} ..."""\n'
    assert shown == stub.replace(docstring.group(0), abridged), f"docs/learner-guide.md must show:\n{stub}"


def test_the_learners_room_never_imports_the_tools():
    """docs/architecture.md: imports go one way, from diloco.tools to the milestone modules."""
    import ast

    package = ROOT / "src" / "diloco"
    offenders = []
    modules = [p for p in package.rglob("*.py")  # the library, its engine and family subpackages
               if "tools" not in p.relative_to(package).parts and p.name != "__main__.py"]
    for path in sorted(modules):  # __main__ (`python -m diloco`) is the one door into the tools
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                          if name == "diloco.tools" or name.startswith("diloco.tools.")]
    assert not offenders, "a milestone-side module imports the tools:\n  " + "\n  ".join(offenders)
