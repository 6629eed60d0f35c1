"""The workspace generator: solution regions, stubs, the generated project, the README list."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from diloco.exercises import EXERCISES
from diloco.milestones import MILESTONES
from diloco.tools.cli.main import main
from diloco.tools.workspace import create as workspace
from diloco.tools.workspace import regions as regions_mod
from diloco.tools.workspace.create import create_workspace
from diloco.tools.workspace.regions import RegionError, solution_regions, stub_source

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted({m.module for m in MILESTONES})


@pytest.fixture(scope="module")
def created(tmp_path_factory):
    """One workspace, made by ``diloco workspace create`` (the CLI calls ``create_workspace``), for every test.

    Returns ``(workspace, exit status, standard output, standard error)``.
    """
    import contextlib
    import io

    parent = tmp_path_factory.mktemp("ws")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["workspace", "create", str(parent / "workspace")])
    return (parent / "workspace").resolve(), status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def fresh(created):
    return created[0]


def test_every_milestone_has_exactly_one_region():
    regions = regions_mod.package_regions()
    assert sorted(regions) == list(range(1, 31))
    for m in MILESTONES:
        assert regions[m.number].function == m.name
        assert Path(regions[m.number].path).name == f"{m.module}.py"


BEGIN, END = "    # BEGIN " + "SOLUTION", "    # END " + "SOLUTION"


@pytest.mark.parametrize("body, error", [
    ([BEGIN, "    return 1"], "never closed"),
    (["    return 1", END], "without a BEGIN"),
    ([BEGIN, BEGIN, "    return 1", END, END], "inside the region"),
    ([BEGIN, "    return 1", "  # END " + "SOLUTION"], "indented differently"),
    ([BEGIN, END], "empty solution region"),
])
def test_malformed_regions_fail_loudly(body, error):
    source = "def relu(x):\n    '''doc'''\n" + "\n".join(body) + "\n"
    with pytest.raises(RegionError, match=error):
        solution_regions(source, "model.py")


def test_a_milestone_without_region_fails_loudly():
    source = (REPO / "src/diloco/params.py").read_text()
    broken = source.replace("# BEGIN " + "SOLUTION\n    return {key: value.copy()", "return {key: value.copy()", 1)
    broken = broken.replace("value.copy() for key, value in params.items()}\n    # END " + "SOLUTION\n",
                            "value.copy() for key, value in params.items()}\n", 1)
    assert broken != source
    with pytest.raises(RegionError, match="clone_params have no solution region"):
        stub_source(broken, "params", path="params.py")


def test_a_region_outside_a_milestone_function_fails_loudly():
    source = "def helper():\n" + BEGIN + "\n    return 1\n" + END + "\n"
    with pytest.raises(RegionError, match="not a milestone function"):
        stub_source(source, "outer", path="outer.py")


def test_stub_keeps_signature_docstring_and_checks_and_raises():
    stubbed = stub_source((REPO / "src/diloco/model.py").read_text(), "model")
    namespace: dict = {}
    exec(compile(stubbed, "model.py", "exec"), namespace)
    softmax = namespace["softmax"]
    assert "subtract the row max" in softmax.__doc__.lower() or "row max" in softmax.__doc__
    import numpy as np

    with pytest.raises(NotImplementedError, match=r"^milestone 04 softmax: .*docs/milestones/04-softmax\.md"):
        softmax(np.zeros((2, 3)))
    with pytest.raises(ValueError):  # the validation before the region is kept
        softmax(np.array([[np.nan]]))
    assert "TODO milestone 04 softmax" in stubbed and "make test M=m04" in stubbed


def test_workspace_layout(fresh):
    for path in ("pyproject.toml", "conftest.py", "Makefile", "README.md", ".gitignore",
                 "src/diloco/__init__.py", "src/diloco/config/__init__.py", "src/diloco/tools/cli/main.py",
                 "src/diloco/data.py",
                 "src/diloco/_datasets/digits.npz", "tests/conftest.py", "tests/helpers.py",
                 "tests/strategies.py"):
        assert (fresh / path).is_file(), path
    assert list((REPO / "tests").glob("test_*.py")), "the reference has milestone tests"
    for test_file in (REPO / "tests").glob("test_*.py"):
        assert (fresh / "tests" / test_file.name).is_file()
    assert not (fresh / "tests" / "tooling").exists()
    # diloco.tools.cli.mpi composes milestones 20-24 into the round of milestone 25: reference only.
    assert (REPO / "src/diloco/tools/cli/mpi.py").is_file() and not (fresh / "src/diloco/tools/cli/mpi.py").exists()
    assert not list(fresh.rglob("__pycache__"))
    makefile = (fresh / "Makefile").read_text()
    assert re.search(r"^test:", makefile, re.M) and re.search(r"^grade:", makefile, re.M)
    for module in MODULES:
        assert "NotImplementedError" in (fresh / "src/diloco" / f"{module}.py").read_text()
    for e in EXERCISES:  # the optional exercises: every function they list is a stub
        for module, name in e.functions:
            text = regions_mod.exercise_module_path(module, fresh / "src" / "diloco").read_text()
            assert f'"exercise {e.label}: {name} is not implemented yet (see {e.lesson})"' in text, (module, name)
        assert (fresh / e.lesson).is_file()


def test_workspace_has_no_solution_line(fresh):
    # Strict inside the package: no line of any region survives.
    strict = regions_mod.solution_lines()
    assert len(strict) > 100
    assert regions_mod.find_solution_lines(fresh / "src", strict) == []
    # Everywhere: nothing beyond the lines the project publishes anyway (tests, scripts, docs).
    everywhere = regions_mod.solution_lines(public=regions_mod.public_dirs())
    assert regions_mod.find_solution_lines(fresh, everywhere) == []
    for path in (fresh / "src").rglob("*.py"):
        lines = path.read_text().splitlines()
        assert not [line for line in lines if regions_mod._MARKER.match(line)], path
        assert not [line for line in lines if regions_mod._EXERCISE_MARKER.match(line)], path
    exercise_lines = {line.strip() for found in regions_mod.package_exercise_regions().values()
                      for line in found.region.body} & strict
    assert len(exercise_lines) > 15, "the exercises' solution lines are part of the scan"
    assert not [p for p in (fresh / "src").rglob("*") if p.suffix in {".orig", ".rej", ".bak"}]


def test_no_test_file_repeats_a_whole_solution_body():
    regions = dict(regions_mod.package_regions())
    regions.update({f"{found.exercise.code} ({name})": found.region
                    for (_, name), found in regions_mod.package_exercise_regions().items()})
    for path in (REPO / "tests").rglob("*.py"):
        text = {line.strip() for line in path.read_text().splitlines()}
        for number, region in regions.items():
            body = [line.strip() for line in region.body if len(line.strip()) >= regions_mod.MIN_SOLUTION_LINE]
            if len(body) >= 2:
                assert not set(body) <= text, f"{path} repeats the whole solution of milestone {number}"


def test_pytest_in_the_workspace_tests_the_workspace_src(fresh):
    """No install: the workspace's conftest puts its src/ before the installed reference."""
    # tests/test_model.py holds milestone 02's tests: collecting only it skips importing the other files.
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "m02", "-x",
                           "tests/test_model.py"],
                          cwd=fresh, capture_output=True, text=True, env={"PYTHONDONTWRITEBYTECODE": "1",
                                                                           "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "NotImplementedError: milestone 02 relu" in proc.stdout


def test_create_refuses_a_non_empty_directory(tmp_path, capsys):
    (tmp_path / "mine.py").write_text("x = 1\n")
    with pytest.raises(FileExistsError):
        create_workspace(tmp_path)
    assert main(["workspace", "create", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.py"]


def test_cli_creates_a_workspace(created):
    folder, status, out, err = created
    assert status == 0 and err == ""
    assert "make grade" in out
    codes = ", ".join(f"x{n:02d}" for n in range(1, 8))
    assert f"optional: 7 graded exercises beyond the 30 ({codes}; docs/exercises/)" in out  # make workspace too
    assert (folder / "src/diloco/model.py").is_file()
    assert [p.name for p in folder.parent.iterdir()] == ["workspace"]  # no staging directory left behind


_ITEM = re.compile(r"^(\d+)\. \[`(\w+)`\]\(([^)]+)\): (.+) \(needs: ([-0-9, ]+)\)$")


@pytest.mark.parametrize("readme", ["README.md", "workspace"])
def test_readme_milestone_list_matches_the_graph(readme, fresh):
    text = (REPO / readme if readme == "README.md" else fresh / "README.md").read_text()
    items = [_ITEM.match(line) for line in text.splitlines()]
    items = [m.groups() for m in items if m]
    assert len(items) == 30
    for (number, name, lesson, summary, needs), m in zip(items, MILESTONES, strict=True):
        assert (int(number), name, lesson, summary) == (m.number, m.name, m.lesson, m.summary)
        assert needs == (", ".join(f"{d:02d}" for d in m.depends_on) or "-")
    assert workspace.milestone_list_markdown() in text
    if readme == "workspace":
        assert workspace.exercise_list_markdown() in text
        for e in EXERCISES:
            assert f"**{e.code}** [`{e.name}`]({e.lesson})" in text
