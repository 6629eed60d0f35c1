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

By default the graded code runs only in a sandbox (``diloco.tools.sandbox``): each wave's
pytest process imports the grader's own ``diloco``, whose public functions the plugin
routes to the sandbox (``diloco.tools.proxy``), so nothing the graded code does can reach
the tests, the plugin's records or the verdict. ``sandbox=False`` (``--trust-submission``,
what a workspace's ``make grade`` uses) puts the graded folder first on ``PYTHONPATH``
instead: quicker, forgeable, and the report says ``local, not sandboxed``.

The tests come from ``--tests DIR``, by default the suite that ships with this grader
(the repository's ``tests/`` or the copy bundled in an installed wheel), never from the
graded folder, which is not modified. ``--json`` writes Gradescope's ``results.json``,
``--junit`` JUnit XML; both, and the threat model, are described in
``docs/instructor-guide.md``.

    diloco grade [--impl DIR] [--tests DIR] [--json FILE] [--junit FILE] [--trust-submission]
    python src/diloco/tools/grading.py --impl .   # also works when the package does not import
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: never import the graded package
    import sys as _sys
    import types as _types
    from pathlib import Path as _Path

    _package = _types.ModuleType("diloco")
    _package.__path__ = [str(_Path(__file__).resolve().parent.parent)]
    _sys.modules.setdefault("diloco", _package)

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from diloco.milestones import MILESTONES, by_number
from diloco.tools.errors import CliError
from diloco.tools.grade_report import (
    ERROR,
    FAILED,
    LOCKED,
    NOT_STARTED,
    PASSED,
    GradeReport,
    MilestoneResult,
    error_report,
    format_table,
    to_gradescope,
    to_junit_xml,
)
from diloco.tools.grade_verdicts import classify, locked
from diloco.tools.sandbox import Sandbox, SandboxError, prepare, protections

__all__ = [
    "PASSED", "NOT_STARTED", "FAILED", "LOCKED", "ERROR",
    "MilestoneResult", "GradeReport", "GradingError",
    "find_package_root", "default_tests_dir", "grade", "format_table",
    "to_gradescope", "to_junit_xml", "add_parsers", "main",
]


class GradingError(Exception):
    """The implementation cannot be graded at all (no package, or it does not import)."""


# --------------------------------------------------------------------------- locating


def find_package_root(impl: Path | str) -> Path:
    """The folder to put first on ``sys.path`` so ``import diloco`` finds ``impl``'s package.

    ``impl`` may be a project (holding ``src/diloco`` or ``diloco``), a ``src`` folder,
    or the ``diloco`` package folder itself.
    """
    impl = Path(impl).expanduser().resolve()
    if not impl.is_dir():
        raise GradingError(f"{impl} is not a directory")
    for root in (impl / "src", impl):
        if (root / "diloco" / "__init__.py").is_file():
            return root
    if impl.name == "diloco" and (impl / "__init__.py").is_file():
        return impl.parent
    raise GradingError(f"no diloco package in {impl} (looked for src/diloco/__init__.py and diloco/__init__.py)")


def default_tests_dir() -> Path:
    """The milestone tests shipped with this grader (repository ``tests/`` or bundled copy)."""
    from diloco.tools.regions import suite_root

    try:
        return suite_root() / "tests"
    except FileNotFoundError as exc:
        raise GradingError(f"{exc}; pass --tests DIR") from None


# --------------------------------------------------------------------------- subprocess

_PROBE = """
import json, sys, traceback
try:
    import diloco
    print(json.dumps({"file": diloco.__file__}))
except BaseException as exc:
    where = ""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        where = "%s, line %s" % (exc.filename, exc.lineno)
    elif frames:
        where = "%s, line %s" % (frames[-1].filename, frames[-1].lineno)
    print(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc), "where": where}))
"""

_PYTEST_INI = "[pytest]\naddopts =\n"
# The grader's own package root: in sandbox mode the tests import this ``diloco``, never the graded one.
_GRADER_ROOT = Path(__file__).resolve().parents[2]


class _Workdir(NamedTuple):
    path: Path
    env: dict
    sandbox: dict | None


def _make_workdir(tmp: Path, package_root: Path, sandbox: dict | None) -> _Workdir:
    # The plugin is copied, not imported: in local mode ``diloco`` is the graded package.
    shutil.copyfile(Path(__file__).with_name("grade_plugin.py"), tmp / "_diloco_grade_plugin.py")
    (tmp / "pytest.ini").write_text(_PYTEST_INI, encoding="utf-8")
    env = dict(os.environ)
    # The plugin's folder comes first, so no module of the graded folder can stand in for the plugin.
    code = _GRADER_ROOT if sandbox is not None else package_root
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(code)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ in the graded folder
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("DILOCO_GRADE_SANDBOX", None)
    if sandbox is not None:
        env["DILOCO_GRADE_SANDBOX"] = json.dumps(sandbox)
    return _Workdir(tmp, env, sandbox)


def _probe_import(workdir: _Workdir, package_root: Path, python: str) -> str:
    """``diloco.__file__`` as the subprocess sees it; ``GradingError`` if it does not import."""
    proc = subprocess.run([python, "-c", _PROBE], cwd=workdir.path, env=workdir.env,
                          capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise GradingError(f"cannot start Python to import diloco from {package_root}: {tail}")
    found = json.loads(lines[-1])
    if "error" in found:
        where = f" ({found['where']})" if found.get("where") else ""
        raise GradingError(f"the diloco package in {package_root} does not import: {found['error']}{where}")
    imported = Path(found["file"]).resolve()
    if package_root.resolve() not in imported.parents:
        raise GradingError(f"import diloco found {imported}, not the package in {package_root}")
    return str(imported)


def _probe_sandbox(config: dict, package_root: Path) -> tuple[str, str]:
    """The graded package's ``__init__`` in the sandbox, and the protections in force."""
    box = Sandbox(config)
    try:
        hello = box.start()
    except SandboxError as exc:
        raise GradingError(f"the sandbox could not import the diloco package in {package_root}: {exc}") from None
    finally:
        box.close()
    if "error" in hello:
        where = f" ({hello['where']})" if hello.get("where") else ""
        raise GradingError(f"the diloco package in {package_root} does not import: {hello['error']}{where}")
    copy = Path(config["package_root"]).resolve()
    if copy not in Path(str(hello.get("file"))).resolve().parents:
        raise GradingError(f"the sandbox imported diloco from {hello.get('file')}, not the package in {package_root}")
    return str(hello["file"]), protections(config, hello)


def _grader_folders() -> list[Path]:
    """Covered in the sandbox: the checkout (or bundled suite) this grader comes from, so the
    graded code cannot read the reference in it (its git history, a build folder ...), and
    the temporary folder, so it sees none of the files there but its own."""
    from diloco.tools.regions import suite_root

    try:
        return [suite_root(), Path(tempfile.gettempdir())]
    except FileNotFoundError:
        return [Path(tempfile.gettempdir())]


def _kill_leftovers(records: list[dict], folder: str) -> None:
    """Kill the process group of every sandbox of the wave still running (normally none: each
    dies with its test run). A pid counts only while its command line names our sandbox folder."""
    for record in records:
        pid = record.get("pid")
        if record.get("kind") != "sandbox" or type(pid) is not int or pid <= 1:
            continue
        try:
            if folder.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass


def _run_wave(numbers: list[int], tests_dir: Path, workdir: _Workdir, python: str,
              timeout: float) -> tuple[list[dict], str]:
    """Run the tests of milestones ``numbers``; the plugin's records and any crash text."""
    command = [
        python, "-m", "pytest", str(tests_dir),
        "-m", " or ".join(f"m{n:02d}" for n in numbers),
        "-c", str(workdir.path / "pytest.ini"), "--rootdir", str(tests_dir.parent),
        "--confcutdir", str(tests_dir), "--ignore", str(tests_dir / "tooling"),
        "-p", "no:cacheprovider", "-p", "_diloco_grade_plugin", "-q", "--tb=no", "--no-header",
    ]
    crash = ""
    with tempfile.TemporaryFile() as out:  # a file with no name: only the plugin holds it
        env = dict(workdir.env, DILOCO_GRADE_RECORDS_FD=str(out.fileno()))
        try:
            proc = subprocess.run(command, cwd=workdir.path, env=env, capture_output=True, text=True,
                                  timeout=timeout, pass_fds=(out.fileno(),))
            if proc.returncode not in (0, 1, 5):  # 2 interrupted, 3 internal error, 4 usage error
                crash = (proc.stdout + proc.stderr).strip()[-3000:] or f"pytest exited with status {proc.returncode}"
        except subprocess.TimeoutExpired:
            crash = f"timed out after {timeout:g} s"
        out.seek(0)
        lines = out.read().decode("utf-8", "replace").splitlines()
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a line cut short by a time-out
            continue
        if isinstance(record, dict) and isinstance(record.get("kind"), str):
            records.append(record)
    if workdir.sandbox is not None:
        _kill_leftovers(records, workdir.sandbox["folder"])
    return records, crash


def _unreported(numbers: list[int], records: list[dict]) -> str:
    """Crash text when a collected test of ``numbers`` has no outcome, whatever pytest's status."""
    markers = {f"m{n:02d}" for n in numbers}
    collected = [nodeid for r in records if r["kind"] == "collected" for nodeid, marker in r.get("items", [])
                 if marker in markers]
    done = {r.get("nodeid") for r in records if r["kind"] == "test" and r.get("when") in ("call", "setup")
            and (r.get("when") == "call" or r.get("outcome") != "passed")}
    missing = [nodeid for nodeid in collected if nodeid not in done]
    if not missing:
        return ""
    return (f"the test run ended before {len(missing)} of {len(collected)} tests reported an outcome "
            f"(first: {missing[0]})")


def grade(impl: Path | str, tests: Path | str | None = None, *, timeout: float = 600.0,
          python: str | None = None, on_wave: Callable[[list[int]], None] | None = None,
          sandbox: bool = True, sandbox_user: str = "nobody", call_timeout: float = 120.0) -> GradeReport:
    """Grade the ``diloco`` package in folder ``impl`` against the milestone tests.

    Parameters
    ----------
    impl : folder holding ``src/diloco``, ``diloco``, or the package itself; not modified.
    tests : folder of milestone tests (default: the suite shipped with this grader).
    timeout : seconds allowed for each wave of tests.
    python : interpreter for the test runs (default: this one); needs numpy, pytest, hypothesis.
    on_wave : called with the milestone numbers of each wave before it runs.
    sandbox : run the graded code only in the sandbox (``diloco.tools.sandbox``); ``False``
        runs it inside the test process (local mode, ``--trust-submission``: fast, forgeable).
    sandbox_user : the account the sandbox runs as when the grader is root.
    call_timeout : seconds allowed for one call of a graded function in the sandbox.

    Raises
    ------
    GradingError
        No package in ``impl``, it does not import, or the tests folder is missing.
    """
    start = time.perf_counter()
    impl = Path(impl).expanduser().resolve()
    package_root = find_package_root(impl)
    tests_dir = Path(tests).expanduser().resolve() if tests is not None else default_tests_dir()
    if not (tests_dir / "conftest.py").is_file() and not any(tests_dir.glob("test_*.py")):
        raise GradingError(f"no tests in {tests_dir}")
    python = python or sys.executable
    status: dict[int, MilestoneResult] = {}
    with tempfile.TemporaryDirectory(prefix="diloco-grade-") as tmp:
        config, guarded = None, ""
        if sandbox:
            try:
                config = prepare(package_root, Path(tempfile.mkdtemp(prefix="diloco-sandbox-")), user=sandbox_user,
                                 python=python,
                                 hide=[_GRADER_ROOT / "diloco", tests_dir, Path(tmp)], cover=_grader_folders(),
                                 limits={"cpu": int(max(timeout, 1))}, call_timeout=call_timeout)
            except KeyError:
                raise GradingError(f"no user {sandbox_user!r} to run the sandbox as; pass --sandbox-user") from None
        try:
            workdir = _make_workdir(Path(tmp), package_root, config)
            if config is None:
                imported_from = _probe_import(workdir, package_root, python)
                imported = Path(imported_from)
            else:
                imported, guarded = _probe_sandbox(config, package_root)
                imported_from = str(package_root / Path(imported).relative_to(Path(config["package_root"]).resolve()))
            while True:
                locked_any = False  # lock once every prerequisite has a verdict and one did not pass
                for m in MILESTONES:
                    if (m.number not in status and all(d in status for d in m.depends_on)
                            and not all(status[d].passed for d in m.depends_on)):
                        status[m.number] = locked(m, status)
                        locked_any = True
                wave = [m.number for m in MILESTONES
                        if m.number not in status and all(d in status and status[d].passed for d in m.depends_on)]
                if not wave:
                    if locked_any:
                        continue
                    break
                if on_wave is not None:
                    on_wave(wave)
                records, crash = _run_wave(wave, tests_dir, workdir, python, timeout)
                for record in records:
                    if record["kind"] == "import" and "file" in record and Path(record["file"]).resolve() != Path(
                            imported).resolve():
                        raise GradingError(f"the tests imported diloco from {record['file']}, not {imported}")
                crash = crash or _unreported(wave, records)
                for number in wave:
                    status[number] = classify(by_number(number), records, crash, tests_dir)
        finally:
            if config is not None:
                shutil.rmtree(config["folder"], ignore_errors=True)
        for m in MILESTONES:  # only reachable with a cycle in the graph
            status.setdefault(m.number, MilestoneResult(m, LOCKED, "dependency cycle"))
    results = tuple(status[m.number] for m in MILESTONES)
    return GradeReport(results, impl, imported_from, tests_dir, time.perf_counter() - start, guarded)



# --------------------------------------------------------------------------- command line


def _write(path: str, text: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")


def _cmd_grade(args) -> int:
    impl = Path(args.impl) if args.impl else Path.cwd()
    progress = None if args.quiet else (
        lambda wave: print(f"running {len(wave)} milestone(s): {' '.join(f'm{n:02d}' for n in wave)}",
                           file=sys.stderr, flush=True))
    try:
        report = grade(impl, args.tests, timeout=args.timeout, on_wave=progress, sandbox=not args.trust_submission,
                       sandbox_user=args.sandbox_user, call_timeout=args.call_timeout)
    except GradingError as exc:
        if args.json:
            _write(args.json, json.dumps(error_report(impl, str(exc)), indent=2) + "\n")
        raise CliError(str(exc)) from None
    print(format_table(report))
    if args.json:
        _write(args.json, json.dumps(to_gradescope(report), indent=2) + "\n")
    if args.junit:
        _write(args.junit, to_junit_xml(report))
    return 0


def add_parsers(subparsers) -> None:
    parser = subparsers.add_parser(
        "grade", help="grade the 30 milestones of a diloco package (a workspace or a submission)",
        description="Run the milestone tests against a diloco package in dependency order and print a "
                    "table of the 30 milestones. Milestones whose prerequisites do not pass are locked "
                    "and not run. The graded folder is not modified. See docs/learner-guide.md and "
                    "docs/instructor-guide.md.",
    )
    _add_arguments(parser)
    parser.set_defaults(func=_cmd_grade)


def _seconds(text: str) -> float:
    """A timeout flag's value: a positive, finite number of seconds (argparse reports anything else)."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _add_arguments(parser) -> None:
    parser.add_argument("--impl", metavar="DIR",
                        help="folder holding the diloco package to grade (src/diloco or diloco); "
                             "default: the current directory")
    parser.add_argument("--tests", metavar="DIR",
                        help="folder of milestone tests (default: the suite shipped with this grader)")
    parser.add_argument("--json", metavar="FILE", help="also write Gradescope results.json to FILE")
    parser.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    parser.add_argument("--timeout", type=_seconds, default=600.0, metavar="SECONDS",
                        help="time allowed for each wave of tests (default 600)")
    parser.add_argument("--quiet", action="store_true", help="do not print a line per wave")
    parser.add_argument("--trust-submission", action="store_true",
                        help="run the graded code inside the test process (fast, but the code can forge its "
                             "score; the report says 'local, not sandboxed'). Default: a sandbox process")
    parser.add_argument("--sandbox-user", default="nobody", metavar="USER",
                        help="account the sandbox runs as when the grader runs as root (default nobody)")
    parser.add_argument("--call-timeout", type=_seconds, default=120.0, metavar="SECONDS",
                        help="time allowed for one call of a graded function in the sandbox (default 120)")


def main(argv=None) -> int:
    """``python src/diloco/tools/grading.py``: the grade command alone, without importing the graded package."""
    import argparse

    parser = argparse.ArgumentParser(prog="grading.py", description="Grade the 30 diloco milestones.")
    _add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return _cmd_grade(args)
    except CliError as exc:
        print(f"diloco grade: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
