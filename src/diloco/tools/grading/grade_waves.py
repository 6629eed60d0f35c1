"""Running one wave of the grader: the pytest subprocess, its working folder, the probes.

``make_workdir`` lays out a wave's folder (the copied plugin, a ``pytest.ini``, the
environment); ``probe_import`` / ``probe_sandbox`` check which ``diloco`` the tests will
see; ``run_wave`` runs the milestone tests of one wave and returns the plugin's records;
``unreported`` names collected tests that never reported an outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from diloco.tools.sandbox.box import Sandbox, SandboxError, missing, protections

__all__ = ["GRADER_ROOT", "GradingError", "Workdir", "grader_folders", "kill_leftovers", "make_workdir",
           "probe_import", "probe_sandbox", "run_wave", "unreported"]


class GradingError(Exception):
    """The implementation cannot be graded at all (no package, or it does not import)."""


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
GRADER_ROOT = Path(__file__).resolve().parents[3]


class Workdir(NamedTuple):
    path: Path
    env: dict
    sandbox: dict | None


def make_workdir(tmp: Path, package_root: Path, sandbox: dict | None) -> Workdir:
    # The plugin is copied, not imported: in local mode ``diloco`` is the graded package.
    shutil.copyfile(Path(__file__).with_name("grade_plugin.py"), tmp / "_diloco_grade_plugin.py")
    (tmp / "pytest.ini").write_text(_PYTEST_INI, encoding="utf-8")
    env = dict(os.environ)
    # The plugin's folder comes first, so no module of the graded folder can stand in for the plugin.
    code = GRADER_ROOT if sandbox is not None else package_root
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(code)] + (
        [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # leave no __pycache__ in the graded folder
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("DILOCO_GRADE_SANDBOX", None)
    if sandbox is not None:
        env["DILOCO_GRADE_SANDBOX"] = json.dumps(sandbox)
    return Workdir(tmp, env, sandbox)


def probe_import(workdir: Workdir, package_root: Path, python: str) -> str:
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


def probe_sandbox(config: dict, package_root: Path) -> tuple[str, str]:
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
    copy = PurePosixPath(config["package_root"])
    if copy not in PurePosixPath(str(hello.get("file"))).parents:
        raise GradingError(f"the sandbox imported diloco from {hello.get('file')}, not the package in {package_root}")
    gaps = missing(config, hello)
    if gaps:  # never call it sandboxed without all of them
        raise GradingError(f"cannot sandbox the submission: no {'; no '.join(gaps)}; pass --local to grade in-process "
                           "without isolation (forgeable)")
    return str(hello["file"]), protections(config, hello)


def grader_folders() -> list[Path]:
    """Never visible in the sandbox, even should the allow-list root show a folder holding
    them: the checkout (or bundled suite) this grader comes from, with its tests and the
    reference, and the temporary folder."""
    from diloco.tools.workspace.regions import suite_root

    try:
        return [suite_root(), Path(tempfile.gettempdir())]
    except FileNotFoundError:
        return [Path(tempfile.gettempdir())]


def kill_leftovers(records: list[dict], folder: str) -> None:
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


def _markers(units: list) -> list[str]:
    """``[3, "x01"]`` -> ``["m03", "x01"]``: milestone numbers as their markers, exercise codes as they are."""
    return [unit if isinstance(unit, str) else f"m{unit:02d}" for unit in units]


def run_wave(units: list, tests_dir: Path, workdir: Workdir, python: str,
              timeout: float) -> tuple[list[dict], str]:
    """Run the tests of ``units`` (milestone numbers, exercise codes ``x01``); the plugin's records
    and any crash text."""
    command = [
        python, "-m", "pytest", str(tests_dir),
        "-m", " or ".join(_markers(units)),
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
        kill_leftovers(records, workdir.sandbox["folder"])
    return records, crash


def unreported(units: list, records: list[dict]) -> str:
    """Crash text when a collected test of ``units`` (milestone numbers, exercise codes) has no
    outcome, whatever pytest's status."""
    markers = set(_markers(units))
    collected = [nodeid for r in records if r["kind"] == "collected" for nodeid, marker in r.get("items", [])
                 if marker in markers]
    done = {r.get("nodeid") for r in records if r["kind"] == "test" and r.get("when") in ("call", "setup")
            and (r.get("when") == "call" or r.get("outcome") != "passed")}
    missing = [nodeid for nodeid in collected if nodeid not in done]
    if not missing:
        return ""
    return (f"the test run ended before {len(missing)} of {len(collected)} tests reported an outcome "
            f"(first: {missing[0]})")
