"""Solution regions of the reference source, the stubs that replace them, and the leak scan.

One source, two audiences (nbgrader / otter style). In the reference source each
milestone function keeps its signature, docstring and one line of input checks, and its
body sits between two marker comments, ``BEGIN SOLUTION`` and ``END SOLUTION`` (each on
a line of its own, ``#``-prefixed, at the body's indentation). ``stub_source`` replaces
every such region with a stub that raises ``NotImplementedError(stub_message(m))``
(``diloco.milestones.stub_message``, the one definition of the stub's message).

``RegionError`` is raised when a milestone function has no region, a region is
unbalanced, nested or outside a milestone function; ``find_solution_lines`` finds any
solution line that would survive into a workspace.

The optional exercises (``diloco.exercises``) work the same way in the library's other
modules: each function an exercise stubs has one region between ``# BEGIN EXERCISE xNN``
and ``# END EXERCISE xNN`` (``exercise_regions``, ``package_exercise_regions``), which
``stub_exercise_source`` replaces with a stub raising
``NotImplementedError(diloco.exercises.stub_message(...))``; the leak scan covers them too.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from diloco import exercises as exercise_table
from diloco.exercises import Exercise
from diloco.milestones import MILESTONES, Milestone, stub_message, test_command

__all__ = [
    "PACKAGE_DIR",
    "REFERENCE_ONLY",
    "is_reference_only",
    "RegionError",
    "SolutionRegion",
    "solution_regions",
    "package_regions",
    "stub_source",
    "stub_lines",
    "ExerciseRegion",
    "exercise_regions",
    "package_exercise_regions",
    "exercise_module_path",
    "stub_exercise_source",
    "exercise_stub_lines",
    "solution_lines",
    "find_solution_lines",
    "public_dirs",
    "suite_root",
]

# The ``diloco`` package (this module lives in ``diloco/tools``).
PACKAGE_DIR = Path(__file__).resolve().parents[2]
_MARKER = re.compile(r"^(?P<indent>[ \t]*)#[ \t]*(?P<kind>BEGIN|END) SOLUTION[ \t]*$")
_EXERCISE_MARKER = re.compile(r"^(?P<indent>[ \t]*)#[ \t]*(?P<kind>BEGIN|END) EXERCISE(?:[ \t]+(?P<code>\S+))?[ \t]*$")
# Copied from the project into a workspace, when present (tests/tooling is left out).
COPIED_DIRS = ("tests", "docs", "notebooks", "scripts")
# Parts of the package left out of a workspace, as paths relative to ``diloco/``, because
# they spell out what the milestones teach: ``tools/cli/mpi.py`` runs the DiLoCo round of
# milestone 25 over MPI, and ``engine`` (the fast executor) implements every milestone.
REFERENCE_ONLY = {"tools/cli/mpi.py", "engine"}


def is_reference_only(path: Path | str) -> bool:
    """Whether ``path`` (a file or folder of the package) stays out of a workspace."""
    try:
        relative = Path(path).resolve().relative_to(PACKAGE_DIR)
    except ValueError:
        return False
    return any(relative.parts[:len(Path(entry).parts)] == Path(entry).parts for entry in REFERENCE_ONLY)
# A solution line shorter than this (``return params``, ``)``) is not distinctive text.
MIN_SOLUTION_LINE = 12



class RegionError(ValueError):
    """The solution-region markers of the reference source are missing or malformed."""


class SolutionRegion(NamedTuple):
    """One marked solution body.

    ``begin`` and ``end`` are the 1-based lines of the two markers; ``body`` the lines
    strictly between them, newline-free.
    """

    path: str
    function: str
    begin: int
    end: int
    indent: str
    body: tuple[str, ...]


def _function_spans(source: str, path: str) -> list[tuple[str, int, int]]:
    """``(name, first_line, last_line)`` of each top-level function, the span running
    up to the next top-level statement (so a trailing marker comment belongs to it)."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise RegionError(f"{path}: cannot parse: {exc}") from exc
    num_lines = len(source.splitlines())
    starts = [min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) for node in tree.body]
    spans = []
    for index, node in enumerate(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            last = starts[index + 1] - 1 if index + 1 < len(tree.body) else num_lines
            spans.append((node.name, node.lineno, last))
    return spans


def _marked_regions(source: str, path: str, marker: re.Pattern, what: str) -> list[tuple[SolutionRegion, str]]:
    """Every region between ``BEGIN <what>`` and ``END <what>`` markers, with the code the
    markers carry (``x01``; "" for solution markers), in order."""
    lines = source.splitlines()
    spans = _function_spans(source, path)

    def function_at(line_no: int) -> str | None:
        for name, first, last in spans:
            if first <= line_no <= last:
                return name
        return None

    regions, open_at = [], None
    for line_no, line in enumerate(lines, start=1):
        match = marker.match(line)
        if not match:
            continue
        code = (match.groupdict().get("code") or "")
        if match["kind"] == "BEGIN":
            if open_at is not None:
                raise RegionError(f"{path}:{line_no}: BEGIN {what} inside the region opened at line {open_at[0]}")
            open_at = (line_no, match["indent"], code)
            continue
        if open_at is None:
            raise RegionError(f"{path}:{line_no}: END {what} without a BEGIN {what} before it")
        begin, indent, begin_code = open_at
        open_at = None
        if match["indent"] != indent:
            raise RegionError(f"{path}:{line_no}: END {what} is indented differently from its BEGIN (line {begin})")
        if code != begin_code:
            raise RegionError(f"{path}:{line_no}: END {what} {code} closes BEGIN {what} {begin_code} (line {begin})")
        function = function_at(begin)
        if function is None or function_at(line_no) != function:
            raise RegionError(f"{path}:{begin}: {what.lower()} region (lines {begin}-{line_no}) is not inside one "
                              "function")
        body = tuple(lines[begin:line_no - 1])
        if not any(text.strip() for text in body):
            raise RegionError(f"{path}:{begin}: empty {what.lower()} region in {function}()")
        regions.append((SolutionRegion(path, function, begin, line_no, indent, body), code))
    if open_at is not None:
        raise RegionError(f"{path}:{open_at[0]}: BEGIN {what} is never closed by an END {what}")
    return regions


def solution_regions(source: str, path: str = "<source>") -> list[SolutionRegion]:
    """Every solution region of one module's source, in order.

    Raises
    ------
    RegionError
        A BEGIN without END (or the reverse), nested regions, markers of different
        indentation, an empty region, or a region outside a top-level function.
    """
    return [region for region, _ in _marked_regions(source, path, _MARKER, "SOLUTION")]


def _module_milestones(module: str) -> dict[str, Milestone]:
    return {m.name: m for m in MILESTONES if m.module == module}


def _checked_regions(source: str, module: str, path: str) -> dict[str, SolutionRegion]:
    """The regions of ``module``, exactly one per milestone function and no others."""
    expected = _module_milestones(module)
    found: dict[str, SolutionRegion] = {}
    for region in solution_regions(source, path):
        if region.function not in expected:
            raise RegionError(f"{path}:{region.begin}: solution region in {region.function}(), "
                              "which is not a milestone function")
        if region.function in found:
            raise RegionError(f"{path}:{region.begin}: a second solution region in {region.function}()")
        found[region.function] = region
    missing = [name for name in expected if name not in found]
    if missing:
        raise RegionError(f"{path}: milestone function(s) {', '.join(missing)} have no solution region "
                          "(mark the body with BEGIN SOLUTION / END SOLUTION comments)")
    return found


def package_regions(package_dir: Path | str = PACKAGE_DIR) -> dict[int, SolutionRegion]:
    """The solution region of every milestone, by number, read from ``package_dir``.

    Also checks that no other module of the package carries a region.
    """
    package_dir = Path(package_dir)
    modules = {m.module for m in MILESTONES}
    by_name: dict[str, SolutionRegion] = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        source = path.read_text(encoding="utf-8")
        module = path.stem if path.parent == package_dir else None
        if module in modules:
            by_name.update(_checked_regions(source, module, str(path)))
        elif solution_regions(source, str(path)):
            raise RegionError(f"{path}: solution regions are only allowed in the milestone modules")
    for module in modules:
        if not (package_dir / f"{module}.py").is_file():
            raise RegionError(f"{package_dir}: milestone module {module}.py is missing")
    return {m.number: by_name[m.name] for m in MILESTONES}


def stub_lines(milestone: Milestone, indent: str) -> list[str]:
    """The body a learner starts from."""
    return [
        f"{indent}# TODO milestone {milestone.label}: write the body here (signature and checks above stay).",
        f"{indent}# Lesson: {milestone.lesson}    Test it: {test_command(milestone)}",
        f"{indent}raise NotImplementedError(",
        f'{indent}    "{stub_message(milestone)}"',
        f"{indent})",
    ]


def stub_source(source: str, module: str, *, keep: Iterable[int] = (), path: str = "<source>") -> str:
    """``source`` of milestone module ``module`` with every solution region stubbed.

    Regions of the milestones numbered in ``keep`` keep their body (markers dropped):
    a workspace in which a learner has finished those milestones.
    """
    keep = set(keep)
    regions = _checked_regions(source, module, path)
    milestones = _module_milestones(module)
    lines = source.splitlines()
    out: list[str] = []
    cursor = 0
    for region in sorted(regions.values(), key=lambda r: r.begin):
        out.extend(lines[cursor:region.begin - 1])
        milestone = milestones[region.function]
        out.extend(region.body if milestone.number in keep else stub_lines(milestone, region.indent))
        cursor = region.end
    out.extend(lines[cursor:])
    return "\n".join(out) + "\n"


class ExerciseRegion(NamedTuple):
    """The marked body of one function an exercise stubs (``region.function`` of ``module``)."""

    exercise: Exercise
    module: str
    region: SolutionRegion


def exercise_module_path(module: str, package_dir: Path | str = PACKAGE_DIR) -> Path:
    """``core.quantize`` -> ``<package>/core/quantize.py``."""
    return Path(package_dir, *module.split(".")).with_suffix(".py")


def exercise_regions(source: str, module: str, path: str = "<source>") -> dict[str, ExerciseRegion]:
    """The exercise regions of module ``module`` (``core.quantize``), by function.

    Raises
    ------
    RegionError
        Malformed markers (as ``solution_regions``), a region whose code is no exercise, in
        a function its exercise does not list, a second region in one function, or a listed
        function of this module without its region.
    """
    listed = {name: e for (mod, name), e in exercise_table.exercise_functions().items() if mod == module}
    found: dict[str, ExerciseRegion] = {}
    for region, code in _marked_regions(source, path, _EXERCISE_MARKER, "EXERCISE"):
        exercise = listed.get(region.function)
        if exercise is None or exercise.code != code:
            owner = f"exercise {exercise.code}" if exercise is not None else "no exercise"
            raise RegionError(f"{path}:{region.begin}: EXERCISE {code or '(no code)'} region in {region.function}(), "
                              f"which belongs to {owner} (diloco.exercises.EXERCISES)")
        if region.function in found:
            raise RegionError(f"{path}:{region.begin}: a second exercise region in {region.function}()")
        found[region.function] = ExerciseRegion(exercise, module, region)
    missing = [name for name in listed if name not in found]
    if missing:
        raise RegionError(f"{path}: exercise function(s) {', '.join(missing)} have no exercise region "
                          "(mark the body with BEGIN EXERCISE xNN / END EXERCISE xNN comments)")
    return found


def package_exercise_regions(package_dir: Path | str = PACKAGE_DIR) -> dict[tuple[str, str], ExerciseRegion]:
    """The region of every function of every exercise, by ``(module, function)``.

    Also checks that no other module of the package carries an exercise region.
    """
    package_dir = Path(package_dir)
    modules = {module for module, _ in exercise_table.exercise_functions()}
    found: dict[tuple[str, str], ExerciseRegion] = {}
    for path in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        module = ".".join(path.relative_to(package_dir).with_suffix("").parts)
        source = path.read_text(encoding="utf-8")
        if module in modules:
            found.update({(module, name): r for name, r in exercise_regions(source, module, str(path)).items()})
        elif _marked_regions(source, str(path), _EXERCISE_MARKER, "EXERCISE"):
            raise RegionError(f"{path}: exercise regions are only allowed in the functions diloco.exercises lists")
    for module in modules:
        if not exercise_module_path(module, package_dir).is_file():
            raise RegionError(f"{package_dir}: exercise module {module} is missing")
    return found


def exercise_stub_lines(exercise: Exercise, function: str, indent: str) -> list[str]:
    """The body a learner starts from, in place of the region of ``function``."""
    return [
        f"{indent}# TODO exercise {exercise.label}: write this part of {function} here (the checks above stay).",
        f"{indent}# Lesson: {exercise.lesson}    Test it: {exercise_table.test_command(exercise)}",
        f"{indent}raise NotImplementedError(",
        f'{indent}    "{exercise_table.stub_message(exercise, function)}"',
        f"{indent})",
    ]


def stub_exercise_source(source: str, module: str, *, keep: Iterable[str] = (), path: str = "<source>") -> str:
    """``source`` of module ``module`` with the region of every exercise function stubbed.

    Regions of the exercises whose codes are in ``keep``, and of the functions named in
    ``keep``, keep their body (markers dropped): a workspace in which those are done.
    """
    keep = set(keep)
    regions = sorted(exercise_regions(source, module, path).values(), key=lambda r: r.region.begin)
    lines = source.splitlines()
    out: list[str] = []
    cursor = 0
    for found in regions:
        region = found.region
        out.extend(lines[cursor:region.begin - 1])
        done = found.exercise.code in keep or region.function in keep
        out.extend(region.body if done else exercise_stub_lines(found.exercise, region.function, region.indent))
        cursor = region.end
    out.extend(lines[cursor:])
    return "\n".join(out) + "\n"


def _text_lines(root: Path) -> Iterable[tuple[Path, list[str]]]:
    """``(path, lines)`` of every readable text file under ``root`` (notebook cells unpacked)."""
    for path in sorted(Path(root).rglob("*")):
        if not path.is_file() or path.suffix in {".npz", ".png", ".pyc"} or "__pycache__" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if path.suffix == ".ipynb":  # look inside the JSON strings of the cells
            try:
                text = "\n".join("".join(cell.get("source", "")) for cell in json.loads(text).get("cells", []))
            except (ValueError, AttributeError):
                pass
        yield path, text.splitlines()


def _lines_outside(package_dir: Path, regions: list) -> set[str]:
    """The stripped lines of the package's modules (not the reference-only ones) outside ``regions``."""
    outside: set[str] = set()
    for path, lines in _text_lines(package_dir):
        if path.suffix != ".py" or is_reference_only(path):
            continue
        masked = set()
        for region in regions:
            if Path(region.path) == path:
                masked.update(range(region.begin - 1, region.end))
        outside.update(line.strip() for i, line in enumerate(lines) if i not in masked)
    return outside


def _public_lines(public: Iterable[Path | str]) -> set[str]:
    """The stripped lines of every file under the ``public`` folders, but their ``tooling`` parts."""
    lines_seen: set[str] = set()
    for root in public:
        for path, lines in _text_lines(Path(root)):
            if "tooling" not in path.relative_to(root).parts:
                lines_seen.update(line.strip() for line in lines)
    return lines_seen


def solution_lines(package_dir: Path | str = PACKAGE_DIR, public: Iterable[Path | str] = ()) -> set[str]:
    """The distinctive solution lines of the reference, stripped.

    A line counts when it is at least ``MIN_SOLUTION_LINE`` characters long, is not a
    bare comment, and does not also occur outside the solution regions of the
    reference package or in a file under one of the ``public`` folders (a line the
    learner is given anyway, such as a loop header shared with a test helper, is not
    solution text).
    """
    package_dir = Path(package_dir)
    regions = list(package_regions(package_dir).values())
    regions += [found.region for found in package_exercise_regions(package_dir).values()]
    inside = {line.strip() for region in regions for line in region.body}
    outside = _lines_outside(package_dir, regions) | _public_lines(public)
    return {line for line in inside - outside if len(line) >= MIN_SOLUTION_LINE and not line.startswith("#")}


def public_dirs(root: Path | str | None = None) -> list[Path]:
    """The folders of the project copied verbatim into a workspace."""
    root = suite_root() if root is None else Path(root)
    return [root / name for name in COPIED_DIRS if (root / name).is_dir()]


def find_solution_lines(root: Path | str, lines: set[str] | None = None) -> list[str]:
    """``path:line: text`` for every solution line found in a text file under ``root``.

    ``lines`` defaults to ``solution_lines(public=public_dirs())``.
    """
    lines = solution_lines(public=public_dirs()) if lines is None else lines
    return [f"{path}:{line_no}: {line.strip()}"
            for path, text_lines in _text_lines(Path(root))
            for line_no, line in enumerate(text_lines, start=1) if line.strip() in lines]



def suite_root() -> Path:
    """The directory holding the project's ``tests/``, ``docs/``, ``notebooks/`` ...

    In a checkout (or an editable install) it is the repository, two levels above this
    package; in an installed wheel it is the copy bundled as ``diloco/_suite``.
    """
    for candidate in (PACKAGE_DIR.parent.parent, PACKAGE_DIR / "_suite"):
        if (candidate / "tests" / "conftest.py").is_file():
            return candidate
    raise FileNotFoundError(
        f"cannot find the diloco test suite next to {PACKAGE_DIR} (no tests/conftest.py in the "
        "repository or in diloco/_suite); run from a checkout of the diloco repository"
    )
