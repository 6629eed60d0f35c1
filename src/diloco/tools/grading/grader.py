"""The milestone grader: run the tests of an implementation in dependency order.

``grade(impl)`` finds the ``diloco`` package in folder ``impl`` and runs the milestone
tests against it in *waves* following ``diloco.milestones``: a wave holds every milestone
whose prerequisites all passed; a milestone with a prerequisite that did not pass is
*locked* and never run. Each milestone ends as one of

* ``passed``       every test passed;
* ``not started``  every failure is the stub's ``NotImplementedError``;
* ``failed``       the first failing check, its message (expected beside got), a rerun command;
* ``locked``       a prerequisite has not passed, so its tests were not run;
* ``error``        no test collected, a test module that does not import, a time-out, or a
                   collected test that never reported an outcome (the run ended early).

By default the graded code runs only in a sandbox (``diloco.tools.sandbox.box``, bubblewrap
with an allow-list root): each wave's pytest process imports the grader's own ``diloco``,
whose public functions the plugin routes to the sandbox (``diloco.tools.sandbox.proxy``), so
nothing the graded code does can reach the tests, the plugin's records or the verdict.
Where the sandbox cannot be fully isolated, ``grade`` raises ``GradingError`` saying how
to enable it. ``sandbox=False`` (``--local``, alias ``--trust-submission``, what a
workspace's ``make grade`` uses) puts the graded folder first on ``PYTHONPATH`` instead:
quicker, forgeable, and every report says ``local, not sandboxed``.

The tests come from ``--tests DIR`` (say a hidden set), by default the suite that ships
with this grader (the repository's ``tests/`` or the copy bundled in an installed wheel),
never from the graded folder, which is not modified; the sandbox can read none of them.
``--json`` writes Gradescope's ``results.json``, ``--junit`` JUnit XML; both, and the
threat model, are described in ``docs/instructor-guide.md``.

    diloco grade [--impl DIR] [--tests DIR] [--json FILE] [--junit FILE] [--local]
    python src/diloco/tools/grading/grader.py --impl .   # also works when the package does not import
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: never import the graded package
    import sys as _sys
    import types as _types
    from pathlib import Path as _Path

    _package = _types.ModuleType("diloco")
    _package.__path__ = [str(_Path(__file__).resolve().parents[2])]
    _sys.modules.setdefault("diloco", _package)

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from diloco.exercises import EXERCISES, by_code
from diloco.milestones import MILESTONES, Milestone, by_number
from diloco.tools.grading.grade_report import (
    ERROR,
    FAILED,
    LOCKED,
    NOT_STARTED,
    PASSED,
    GradeReport,
    MilestoneResult,
    format_table,
    to_gradescope,
    to_junit_xml,
)
from diloco.tools.grading.grade_verdicts import HIDDEN_LEVELS, classify, hide, locked
from diloco.tools.grading.grade_waves import (
    GRADER_ROOT,
    GradingError,
    grader_folders,
    make_workdir,
    probe_import,
    probe_sandbox,
    run_wave,
    unreported,
    wave_files,
)
from diloco.tools.sandbox.box import Refused, Unavailable, full_note, prepare

__all__ = [
    "PASSED", "NOT_STARTED", "FAILED", "LOCKED", "ERROR",
    "MilestoneResult", "GradeReport", "GradingError",
    "find_package_root", "default_tests_dir", "grade", "format_table",
    "to_gradescope", "to_junit_xml",
]


# --------------------------------------------------------------------------- locating


def find_package_root(impl: Path | str) -> Path:
    """The folder to put first on ``sys.path`` so ``import diloco`` finds ``impl``'s package.

    ``impl`` may be a project (holding ``src/diloco`` or ``diloco``), a ``src`` folder,
    or the ``diloco`` package folder itself. The link rule: ``GradingError`` when ``impl``,
    its ``src`` or its ``diloco`` folder is a symbolic link, or the package resolves to a
    place outside ``impl`` (a link would grade someone else's code as this submission).
    """
    given = Path(impl).expanduser()
    if given.is_symlink():
        raise GradingError(f"{given} is a symbolic link: a submission must be a folder of its own, not a link")
    impl = given.resolve()
    if not impl.is_dir():
        raise GradingError(f"{impl} is not a directory")
    for root in (impl / "src", impl):
        if (root / "diloco" / "__init__.py").is_file():
            return _own_package(impl, root)
    if impl.name == "diloco" and (impl / "__init__.py").is_file():
        return impl.parent
    raise GradingError(f"no diloco package in {impl} (looked for src/diloco/__init__.py and diloco/__init__.py)")


def _own_package(impl: Path, root: Path) -> Path:
    """``root`` if neither it nor ``root/diloco`` is a link and the package resolves inside ``impl``."""
    for folder in (root, root / "diloco"):
        if folder.is_symlink():
            raise GradingError(f"{folder.relative_to(impl)} in {impl} is a symbolic link: a submission must hold "
                               "its own files, not a link to someone else's; it is not graded")
    if not (root / "diloco").resolve().is_relative_to(impl):
        raise GradingError(f"the diloco package of {impl} lies outside it; it is not graded")
    return root


def default_tests_dir() -> Path:
    """The milestone tests shipped with this grader (repository ``tests/`` or bundled copy)."""
    from diloco.tools.workspace.regions import suite_root

    try:
        return suite_root() / "tests"
    except FileNotFoundError as exc:
        raise GradingError(f"{exc}; pass --tests DIR") from None


def grade(impl: Path | str, tests: Path | str | None = None, *, timeout: float = 600.0,
          python: str | None = None, on_wave: Callable[[list[int], list[str]], None] | None = None,
          sandbox: bool = True, sandbox_user: str = "nobody", call_timeout: float = 120.0,
          disk: int = 64 << 20, hidden: str = "full") -> GradeReport:
    """Grade the ``diloco`` package in folder ``impl`` against the milestone tests.

    Parameters
    ----------
    impl : folder holding ``src/diloco``, ``diloco``, or the package itself; not modified.
    tests : folder of milestone tests (default: the suite shipped with this grader).
    timeout : CPU seconds allowed for the tests of each milestone (and each exercise): those
        of the test process and the sandboxes (``grade_waves.tree_cpu``), so a busy machine
        does not shorten them; ``grade_waves.WALL_FACTOR`` times as many wall-clock seconds
        are the backstop. One that runs out fails alone, with its dependants locked. Each
        sandbox worker's own ``RLIMIT_CPU`` is twice ``timeout``.
    python : interpreter for the test runs (default: this one); needs numpy, pytest, hypothesis.
    on_wave : called with the milestone numbers and the exercise codes (``x01``) of each wave
        before it runs.
    sandbox : run the graded code only in the sandbox (``diloco.tools.sandbox.box``); ``False``
        runs it inside the test process (local mode, ``--local``: fast, forgeable).
    sandbox_user : the account the sandbox runs as when the grader is root.
    call_timeout : seconds allowed for one call of a graded function in the sandbox, every
        callback it asks for included.
    disk : bytes the sandbox may write (the size of its tmpfs).
    hidden : how much a failure shows when ``tests`` are hidden from the learner
        (``grade_verdicts.HIDDEN_LEVELS``): ``milestone`` (that a hidden test failed),
        ``check`` (and the check in words) or ``full`` (messages and test names too).

    Raises
    ------
    GradingError
        No package in ``impl``, it does not import, the tests folder is missing, or (with
        ``sandbox``) the isolation cannot be had here: the message says how to enable it.
    """
    start = time.perf_counter()
    if hidden not in HIDDEN_LEVELS:
        raise GradingError(f"hidden must be one of {', '.join(HIDDEN_LEVELS)}, got {hidden!r}")
    package_root = find_package_root(impl)  # before resolving: a link is refused, not followed
    impl = Path(impl).expanduser().resolve()
    tests_dir = _tests_folder(tests)
    options = dict(limits={"cpu": int(max(2 * timeout, 1))}, call_timeout=call_timeout, disk=disk,
                   user=sandbox_user) if sandbox else None
    status, done, notes, imported_from, guarded = _graded(package_root, tests_dir, python or sys.executable,
                                                          timeout, on_wave, options)
    results = tuple(hide(_noted(status[m.number], notes), hidden) for m in MILESTONES)
    return GradeReport(results, impl, imported_from, tests_dir, time.perf_counter() - start, guarded,
                       tuple(hide(_noted(done[e.code], notes), hidden) for e in EXERCISES), notes)


def _graded(package_root: Path, tests_dir: Path, python: str, timeout: float, on_wave,
            sandbox_options: dict | None) -> tuple[dict, dict, tuple[str, ...], str, str]:
    """Every wave, run from a temporary work folder (and, given ``sandbox_options``, a sandbox
    removed afterwards): ``(status, done, notes, imported_from, guarded)``."""
    with tempfile.TemporaryDirectory(prefix="diloco-grade-") as tmp:
        config = None
        if sandbox_options is not None:
            options = dict(sandbox_options)
            user = options.pop("user")
            config = _sandbox_config(package_root, tests_dir, Path(tmp), python, user, options)
        notes = tuple(config["skipped"]) if config else ()
        try:
            workdir = make_workdir(Path(tmp), package_root, config)
            imported, imported_from, guarded = _probe(workdir, package_root, python, notes)
            found: set[str] = set()
            status, done = _run_waves(tests_dir, workdir, python, timeout, on_wave, imported, found)
            notes += tuple(sorted(found))
        finally:
            if config is not None:
                shutil.rmtree(config["folder"], ignore_errors=True)
    return status, done, notes, imported_from, guarded


def _tests_folder(tests: Path | str | None) -> Path:
    """The folder of milestone tests to run; ``GradingError`` when it holds none."""
    tests_dir = Path(tests).expanduser().resolve() if tests is not None else default_tests_dir()
    if not (tests_dir / "conftest.py").is_file() and not any(tests_dir.glob("test_*.py")):
        raise GradingError(f"no tests in {tests_dir}")
    return tests_dir


def _sandbox_config(package_root: Path, tests_dir: Path, tmp: Path, python: str, user: str, options: dict) -> dict:
    """``box.prepare`` in a folder of its own; every way it can fail is a one-line ``GradingError``."""
    folder = Path(tempfile.mkdtemp(prefix="diloco-sandbox-"))
    try:
        return prepare(package_root, folder, user=user, python=python,
                       hide=[GRADER_ROOT / "diloco", tests_dir, tmp, *grader_folders()], **options)
    except KeyError:
        message = f"no user {user!r} to run the sandbox as; pass --sandbox-user"
    except Unavailable as exc:
        message = f"cannot sandbox the submission: {exc}"
    except Refused as exc:
        message = f"the submission is refused: {exc}"
    except (OSError, RecursionError) as exc:  # what the checks did not foresee: still a read, in one line
        message = f"the submission is refused: cannot read it: {getattr(exc, 'strerror', None) or exc}"
    shutil.rmtree(folder, ignore_errors=True)
    raise GradingError(message)


def _probe(workdir, package_root: Path, python: str, notes: tuple[str, ...]) -> tuple[Path, str, str]:
    """Where the tests will import ``diloco`` from, that path shown as the graded folder's, and the
    protections in force (empty in local mode). A package that does not import also says which
    of its files were not copied (``notes``)."""
    config = workdir.sandbox
    try:
        if config is None:
            imported_from = probe_import(workdir, package_root, python)
            return Path(imported_from), imported_from, ""
        imported, guarded = probe_sandbox(config, package_root)
    except GradingError as exc:
        raise GradingError("; ".join([str(exc), *notes])) from None
    return Path(imported), str(package_root / Path(imported).relative_to(config["package_root"])), guarded


def _noted(result: MilestoneResult, notes: tuple[str, ...]) -> MilestoneResult:
    """``result`` with each note whose file its error message names (``adamw.py is a hard link
    and was not copied`` under ``No module named 'diloco.adamw'``) added to its detail."""
    if result.status not in (ERROR, FAILED):
        return result
    text = " ".join([result.summary, *result.detail])
    names = [note for note in notes
             if Path(note.split(" is ")[0]).with_suffix("").as_posix().replace("/", ".") in text]
    return result._replace(detail=(*result.detail, *names)) if names else result


def _lock_blocked(status: dict, done: dict) -> bool:
    """Lock each milestone and exercise whose prerequisites all have verdicts, one not passed;
    whether any was locked."""
    locked_any = False
    for unit, key, verdicts in [*((m, m.number, status) for m in MILESTONES), *((e, e.code, done) for e in EXERCISES)]:
        if (key not in verdicts and all(d in status for d in unit.depends_on)
                and not all(status[d].passed for d in unit.depends_on)):
            verdicts[key] = locked(unit, status)
            locked_any = True
    return locked_any


def _ready(status: dict, done: dict) -> tuple[list[int], list[str]]:
    """The milestones and exercises not yet run whose prerequisites have all passed."""
    def ready(unit) -> bool:
        return all(d in status and status[d].passed for d in unit.depends_on)

    return ([m.number for m in MILESTONES if m.number not in status and ready(m)],
            [e.code for e in EXERCISES if e.code not in done and ready(e)])


def _run_waves(tests_dir: Path, workdir, python: str, timeout: float, on_wave, imported: Path,
               found: set[str]) -> tuple[dict, dict]:
    """Run the waves until every milestone and exercise has its verdict; ``(status, done)``,
    by milestone number and exercise code. The sandbox's notes (``box.full_note``) go into ``found``."""
    status: dict[int, MilestoneResult] = {}
    done: dict[str, MilestoneResult] = {}  # the optional exercises, by code: never in the score
    first: list[dict] | None = None  # the first wave's records: which file holds which unit's tests
    while True:
        locked_any = _lock_blocked(status, done)
        wave, extra = _ready(status, done)
        if not wave and not extra:
            if locked_any:
                continue
            break
        if on_wave is not None:
            on_wave(wave, extra)
        files = None if first is None else wave_files(first, [*wave, *extra], tests_dir)
        records, crashes = run_wave([*wave, *extra], tests_dir, workdir, python, timeout, files)
        first = records if first is None else first
        found.update(_sandbox_notes(workdir, records))
        _check_imported(records, imported)
        for unit in [*map(by_number, wave), *map(by_code, extra)]:
            crash = crashes.get(unit.marker) or unreported([unit.marker], records)
            verdicts = status if isinstance(unit, Milestone) else done
            verdicts[unit.number if isinstance(unit, Milestone) else unit.code] = classify(
                unit, records, crash, tests_dir)
    return _cycles_locked(status, done)


def _sandbox_notes(workdir, records: list[dict]) -> set[str]:
    """The sandbox's full-disk note, if the grader's own proxy recorded it (its one text only)."""
    if workdir.sandbox is None:
        return set()
    note = full_note(workdir.sandbox)
    return {note for r in records if r["kind"] == "note" and r.get("text") == note}


def _check_imported(records: list[dict], imported: Path) -> None:
    """``GradingError`` when a wave's tests imported ``diloco`` from anywhere but ``imported``."""
    for record in records:
        if (record["kind"] == "import" and "file" in record
                and Path(record["file"]).resolve() != Path(imported).resolve()):
            raise GradingError(f"the tests imported diloco from {record['file']}, not {imported}")


def _cycles_locked(status: dict, done: dict) -> tuple[dict, dict]:
    """``(status, done)`` with every unit still without a verdict locked: only reachable with a
    cycle in the dependency graph."""
    for m in MILESTONES:
        status.setdefault(m.number, MilestoneResult(m, LOCKED, "dependency cycle"))
    for e in EXERCISES:
        done.setdefault(e.code, MilestoneResult(e, LOCKED, "dependency cycle"))
    return status, done


# The command line (``diloco grade``) lives in grade_command, which imports this module. Run as a
# script, this file is ``__main__``, not this module, so importing grade_command here is no circle.
if __name__ == "__main__":
    from diloco.tools.grading.grade_command import main

    raise SystemExit(main())
