"""A workspace's environment is small: `make test` and `make grade` install the `grade` extra
(pytest and Hypothesis beside NumPy), pinned by the constraints file, not the 500 MB dev set;
and `make workspace` installs nothing, so the workspace's first `make grade` is a learner's
only install."""

from __future__ import annotations

import filecmp
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest

from diloco.tools.workspace.create import create_workspace

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[2]


def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def expand(extras: dict, name: str) -> set[str]:
    """The distributions an extra brings, self-references (``diloco[test]``) followed."""
    found = set()
    for requirement in extras[name]:
        match = re.match(r"diloco\[([\w,]+)\]", requirement)
        if match:
            for inner in match.group(1).split(","):
                found |= expand(extras, inner)
        else:
            found.add(re.split(r"[<>=\[ ;]", requirement)[0].lower())
    return found


def test_the_grade_extra_is_the_test_tools_and_nothing_heavy():
    extras = pyproject()["project"]["optional-dependencies"]
    grade = expand(extras, "grade")
    assert {"pytest", "hypothesis"} <= grade
    heavy = {"scipy", "mnist1d", "mpich", "mpi4py", "jupyter", "nbclient", "ipykernel", "matplotlib", "ruff",
             "mkdocs", "mkdocs-material", "tqdm"}
    assert not grade & heavy, f"the grade extra pulls in {sorted(grade & heavy)}"


def test_dev_holds_the_docs_extra_so_make_test_runs_the_docs_tests():
    extras = pyproject()["project"]["optional-dependencies"]
    assert expand(extras, "docs") <= expand(extras, "dev")


def test_a_workspace_installs_the_grade_extra_with_the_constraints(tmp_path):
    workspace = create_workspace(tmp_path / "ws")
    makefile = (workspace / "Makefile").read_text(encoding="utf-8")
    install = makefile[makefile.index("$(VENV)/.installed:"):]
    install = install[:install.index("\n\n")]
    assert "-e '.[grade]'" in install and ".[dev]" not in makefile, install
    for target in ("test", "grade"):
        assert re.search(rf"^{target}: \$\(VENV\)/\.installed$", makefile, re.M), f"make {target} needs more than grade"
    assert (workspace / "constraints.txt").read_text() == (ROOT / "constraints.txt").read_text()
    assert "$(if $(CONSTRAINTS),-c $(CONSTRAINTS),)" in makefile


@pytest.mark.slow
def test_make_workspace_installs_nothing_and_writes_the_same_workspace(tmp_path):
    """``make workspace`` on a Python with nothing installed (no NumPy, no pip): the workspace of
    ``diloco workspace create``, file for file; the target depends on no install."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = bare / "bin" / "python"
    assert subprocess.run([python, "-c", "import numpy"], capture_output=True).returncode != 0
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^workspace:\s*$", makefile, re.M), "make workspace must depend on no install"
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "workspace", f"WS={tmp_path / 'ws'}", f"PYTHON={python}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"next: cd {tmp_path / 'ws'} && make grade" in done.stdout
    reference = create_workspace(tmp_path / "reference")
    compared = filecmp.dircmp(tmp_path / "ws", reference)

    def same(cmp) -> bool:
        return not (cmp.left_only or cmp.right_only or cmp.diff_files or cmp.funny_files) and all(
            same(sub) for sub in cmp.subdirs.values())

    assert same(compared)
    again = subprocess.run([python, str(ROOT / "scripts" / "create_workspace.py"), str(tmp_path / "ws")],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already exists and is not empty" in again.stderr  # never overwritten


def test_the_constraints_pin_every_package_of_the_dev_environment():
    lines = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    pinned = {re.split(r"==", line)[0].lower().replace("_", "-") for line in lines}
    assert all("==" in line for line in lines), "every line pins one version"
    for name in ("numpy", "pytest", "hypothesis", "mkdocs", "mkdocs-material", "nbclient", "ruff", "scipy"):
        assert name in pinned, f"{name} is not pinned"
    assert not any(name.startswith("diloco") for name in pinned), "the project itself is not pinned"


def test_every_install_of_the_root_makefile_uses_the_constraints():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    installs = re.findall(r"^\t(.*(?:pip install|\$\(PIP_INSTALL\)|\$\(PIP_PROJECT\)).*)$", makefile, re.M)
    project_installs = [line for line in installs if "-e '." in line and "$(LOCK_VENV)" not in line]  # lock: unpinned
    assert project_installs and all("$(PIP_PROJECT)" in line for line in project_installs), project_installs
    assert re.search(r"^PIP_INSTALL := .*-c \$\(CONSTRAINTS\)$", makefile, re.M)
    assert re.search(r"^PIP_PROJECT := \$\(PIP_INSTALL\) --no-build-isolation$", makefile, re.M)
    lock = makefile[makefile.index("\nlock:"):]
    assert "pip freeze" in lock and "> $(CONSTRAINTS).tmp" in lock


def backend_names(makefile: str) -> list[str]:
    (line,) = re.findall(r"^BUILD_BACKEND := (.*)$", makefile, re.M)
    return line.split()


def test_the_build_backend_and_its_dependencies_are_pinned():
    """Every package the project's build needs is in the constraints: the backend of
    ``[build-system]`` (and ``editables``, which hatchling needs for an editable install), and
    what the backend itself requires (``tomlkit`` ...), so no install resolves them anew."""
    pinned = {line.split("==")[0].lower().replace("_", "-")
              for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line}
    backend = backend_names((ROOT / "Makefile").read_text(encoding="utf-8"))
    requires = {re.split(r"[<>=\[ ;]", r)[0].lower() for r in pyproject()["build-system"]["requires"]}
    assert requires <= set(backend) and "editables" in backend, backend
    assert set(backend) <= pinned, sorted(set(backend) - pinned)
    try:
        needed = importlib.metadata.requires("hatchling") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("hatchling is not installed in this environment (make install puts it in .venv)")
    from packaging.requirements import Requirement

    needed = {Requirement(r).name.lower().replace("_", "-") for r in needed if Requirement(r).marker is None
              or Requirement(r).marker.evaluate()}
    assert needed <= pinned, f"hatchling needs {sorted(needed - pinned)}, which the constraints do not pin"


@pytest.mark.parametrize("where", ["workspace", "repository"])
def test_the_project_is_built_with_the_backend_already_in_the_venv(where, tmp_path):
    """``make -n``: the backend installed (pinned) before the project, and the project installed
    with ``--no-build-isolation``: pip's isolated build would fetch the backend and its dependencies
    from an index at every install (offline, ``tomlkit`` was not to be had)."""
    folder = create_workspace(tmp_path / "ws") if where == "workspace" else ROOT
    venv = tmp_path / "venv"
    target = "install" if where == "workspace" else f"{venv}/.installed-dev"
    dry = subprocess.run(["make", "-n", "-C", str(folder), target, f"VENV={venv}"], capture_output=True, text=True,
                         timeout=60)
    assert dry.returncode == 0, dry.stderr
    installs = [line for line in dry.stdout.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    backend = backend_names((folder / "Makefile").read_text(encoding="utf-8"))
    assert len(installs) == 2, installs
    assert installs[0].split()[-len(backend):] == backend and "-c constraints.txt" in installs[0], installs
    assert "--no-build-isolation" in installs[1] and "-e '." in installs[1], installs
