"""The learner workspace: the project with every milestone body replaced by a stub.

``create_workspace`` copies the project (package, tests, lessons, notebooks), replaces
every solution region of the milestone modules, and every region of the optional exercises
(``diloco.exercises``), with a stub (``diloco.tools.workspace.regions``),
writes the workspace's README, Makefile and conftest from ``workspace_template/``, and
refuses to finish if any solution line would leak.

    diloco workspace create DIR          # or: make workspace [WS=DIR]
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from diloco.exercises import EXERCISES
from diloco.milestones import MILESTONES, PARTS
from diloco.tools.cli.errors import CliError
from diloco.tools.workspace.regions import (
    COPIED_DIRS,
    PACKAGE_DIR,
    RegionError,
    exercise_module_path,
    find_solution_lines,
    is_reference_only,
    package_exercise_regions,
    package_regions,
    public_dirs,
    solution_lines,
    stub_exercise_source,
    stub_source,
    suite_root,
)

__all__ = ["create_workspace", "milestone_list_markdown", "exercise_list_markdown", "add_parsers"]

_TEMPLATE_DIR = Path(__file__).resolve().parent / "workspace_template"
_SKIPPED_NAMES = {"__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints", "_suite"}
# Compiled files, and the backups patch and editors leave (``quantize.py.orig``), which may hold solutions.
_SKIPPED_SUFFIXES = (".pyc", ".orig", ".rej", ".bak", "~")
_INSTRUCTOR_ONLY = {"instructor-guide.md"}


def milestone_list_markdown() -> str:
    """The README's milestone list, generated from ``diloco.milestones``."""
    out, part = [], None
    for m in MILESTONES:
        if m.module != part:
            part = m.module
            if out:
                out.append("")
            out += [f"**{PARTS[m.module]}** (`src/diloco/{m.module}.py`)", ""]
        needs = ", ".join(f"{d:02d}" for d in m.depends_on) or "-"
        out.append(f"{m.number}. [`{m.name}`]({m.lesson}): {m.summary} (needs: {needs})")
    return "\n".join(out) + "\n"


def exercise_list_markdown() -> str:
    """The README's list of the optional exercises, generated from ``diloco.exercises``."""
    out = []
    for e in EXERCISES:
        functions = ", ".join(f"`{name}`" for name in e.function_names)
        modules = ", ".join(dict.fromkeys(f"`src/diloco/{module.replace('.', '/')}.py`" for module, _ in e.functions))
        needs = ", ".join(f"{d:02d}" for d in e.depends_on) or "-"
        out.append(f"- **{e.code}** [`{e.name}`]({e.lesson}): {e.summary}; write {functions} in {modules} "
                   f"(needs: {needs}; `make test M={e.marker}`)")
    return "\n".join(out) + "\n"


def _ignore(directory: str, names: list[str]) -> set[str]:
    skipped = {n for n in names if n in _SKIPPED_NAMES or n.endswith(_SKIPPED_SUFFIXES)}
    skipped |= {n for n in names if is_reference_only(Path(directory) / n)}  # tools/cli/mpi.py, engine/
    if Path(directory).name == "docs":
        skipped |= _INSTRUCTOR_ONLY & set(names)
    if Path(directory).name == "tests":
        skipped |= {"tooling"} & set(names)  # tests of the tools, never graded
    return skipped


def _write_package(dest: Path) -> None:
    """Copy the package to ``dest``, every milestone module stubbed."""
    package_regions(PACKAGE_DIR)  # fails loudly before anything is written
    shutil.copytree(PACKAGE_DIR, dest, ignore=_ignore)
    for module in sorted({m.module for m in MILESTONES}):
        path = PACKAGE_DIR / f"{module}.py"
        stubbed = stub_source(path.read_text(encoding="utf-8"), module, path=str(path))
        compile(stubbed, str(path), "exec")  # a stub that does not parse is our bug
        (dest / f"{module}.py").write_text(stubbed, encoding="utf-8")
    package_exercise_regions(PACKAGE_DIR)
    for module in sorted({module for e in EXERCISES for module, _ in e.functions}):
        path = exercise_module_path(module)
        stubbed = stub_exercise_source(path.read_text(encoding="utf-8"), module, path=str(path))
        compile(stubbed, str(path), "exec")
        exercise_module_path(module, dest).write_text(stubbed, encoding="utf-8")


def _render_template(name: str, **values: str) -> str:
    text = (_TEMPLATE_DIR / name).read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def create_workspace(dest: Path | str) -> Path:
    """Write a learner workspace to ``dest`` (which must not exist, or be empty).

    The workspace is built in a temporary directory beside ``dest``, checked (it must
    import-compile and hold no solution line), then moved into place, so a failure
    leaves nothing half-written.

    Returns
    -------
    Path
        ``dest``, resolved.

    Raises
    ------
    FileExistsError
        ``dest`` exists and is not an empty directory.
    RegionError
        The reference's solution markers are missing or malformed.
    """
    dest = Path(dest).expanduser().resolve()
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"{dest} already exists and is not empty; choose a new directory")
    root = suite_root()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        build = staging / "workspace"
        build.mkdir()
        _write_package(build / "src" / "diloco")
        for name in COPIED_DIRS:
            if (root / name).is_dir():
                shutil.copytree(root / name, build / name, ignore=_ignore)
        shutil.copy2(root / "pyproject.toml", build / "pyproject.toml")
        if (root / "constraints.txt").is_file():  # the pinned versions the workspace's make installs with
            shutil.copy2(root / "constraints.txt", build / "constraints.txt")
        (build / "README.md").write_text(_render_template("README.md", MILESTONES=milestone_list_markdown(),
                                                          EXERCISES=exercise_list_markdown()), encoding="utf-8")
        for name in ("Makefile", "conftest.py"):
            (build / name).write_text(_render_template(name), encoding="utf-8")
        (build / ".gitignore").write_text(_render_template("gitignore"), encoding="utf-8")
        leaks = find_solution_lines(build, solution_lines(public=public_dirs(root)))
        if leaks:
            raise RegionError("solution text would leak into the workspace:\n  " + "\n  ".join(leaks[:20]))
        if dest.exists():
            dest.rmdir()
        build.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


def _cmd_create(args) -> int:
    try:
        dest = create_workspace(args.directory)
    except (FileExistsError, FileNotFoundError, RegionError) as exc:
        raise CliError(str(exc).splitlines()[0] if isinstance(exc, FileExistsError) else str(exc)) from exc
    print(f"created your workspace in {dest}")
    print("  30 milestone functions are stubs; each raises NotImplementedError until you write it.")
    print(f"  optional: {len(EXERCISES)} graded exercises beyond the 30 "
          f"({', '.join(e.code for e in EXERCISES)}; docs/exercises/), never part of the score")
    print(f"  next: cd {dest} && make grade")  # runs as printed: make creates and uses the workspace's .venv
    print(f"  start with {MILESTONES[0].label}: {MILESTONES[0].lesson}")
    return 0


def add_parsers(subparsers) -> None:
    parser = subparsers.add_parser(
        "workspace", help="create a learner workspace (the project with the 30 milestones as stubs)",
        description="Create a learner workspace: the whole project with every milestone body, and the "
                    "bodies of the optional exercises x01.., replaced by a stub that raises "
                    "NotImplementedError. See docs/learner-guide.md.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    create = actions.add_parser("create", help="write a new workspace to DIR",
                                description="Write a new learner workspace to DIR (must not exist, or be empty).")
    create.add_argument("directory", metavar="DIR", help="where to create the workspace")
    create.set_defaults(func=_cmd_create)
