"""Running one wave of the grader: the pytest subprocess, its working folder, the probes.

``make_workdir`` lays out a wave's folder (the copied plugin, a ``pytest.ini``, the
environment); ``probe_import`` / ``probe_sandbox`` check which ``diloco`` the tests will
see; ``run_wave`` runs the milestone tests of one wave, each milestone within its own budget
of CPU seconds (``tree_cpu``) and a wall-clock backstop ``WALL_FACTOR`` times as large, and
returns the plugin's records;
``unreported`` names collected tests that never reported an outcome.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from diloco.tools.sandbox.box import Sandbox, SandboxError, full_note, missing, protections

__all__ = ["GRADER_ROOT", "GradingError", "Workdir", "grader_folders", "kill_leftovers", "make_workdir",
           "probe_import", "probe_sandbox", "run_wave", "unreported", "wave_files", "STARTUP_LIMIT", "WALL_FACTOR",
           "tree_cpu", "timed_out"]


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
        full = f"; {full_note(config)}" if hello.get("full") is True else ""
        raise GradingError(f"the diloco package in {package_root} does not import: {hello['error']}{where}{full}")
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


STARTUP_LIMIT = 120.0  # seconds a pytest run may take to reach its first test (imports, collection)
WALL_FACTOR = 5  # the wall-clock backstop of a unit: this many times its CPU budget
_POLL = 0.2
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_of(pid: int) -> tuple[float, list[int]]:
    """CPU seconds of process ``pid`` and of its children it has reaped, and its live children
    (``/proc``); ``(0.0, [])`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        children = []
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as handle:
                children += [int(child) for child in handle.read().split()]
    except (OSError, IndexError, ValueError):
        return 0.0, []
    return sum(int(ticks) for ticks in fields[11:15]) / _TICK, children


def tree_cpu(root: int) -> float:
    """CPU seconds (user and system) used so far by process ``root`` and every process below it:
    the pytest run of a wave, the sandboxes it started and whatever they started. A busy
    machine does not make it grow, as wall-clock time does; a process that left the tree
    (reparented, never reaped by it) is no longer counted, which the wall backstop covers."""
    total, stack, seen = 0.0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        seconds, children = _cpu_of(pid)
        total += seconds
        stack += children
    return total


class _Run:
    """One pytest run of a wave, watched: the CPU seconds (of the run's whole process tree) and
    the wall-clock seconds each unit's tests have taken, from the plugin's ``start`` records,
    and the records read so far."""

    def __init__(self, out, markers: set[str], used: dict[str, list[float]], pid: int):
        self.out, self.markers, self.offset, self.pid = out, markers, 0, pid
        self.records: list[dict] = []
        self.unit_of: dict[str, str] = {}  # nodeid -> marker, from the ``collected`` record
        self.used = used  # marker -> [CPU s, wall s] its tests have run, in this run and the wave's earlier ones
        self.current: str | None = None  # the marker of the test running now
        self.begun = False  # a test has started
        self.started = self.since = time.monotonic()
        self.cpu = tree_cpu(pid)

    def read(self) -> None:
        """Take in every complete line the plugin has written since the last read."""
        data = os.pread(self.out.fileno(), 1 << 24, self.offset)
        data = data[:data.rfind(b"\n") + 1]
        self.offset += len(data)
        for line in data.decode("utf-8", "replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("kind"), str):
                self._take(record)

    def _take(self, record: dict) -> None:
        self.records.append(record)
        if record["kind"] == "collected":
            self.unit_of.update({str(n): m for n, m in record.get("items", []) if m in self.markers})
        elif record["kind"] == "start":
            self.charge()
            self.current = self.unit_of.get(record.get("nodeid"))
            self.begun = True

    def charge(self) -> None:
        """Charge the CPU and wall-clock time since the last charge to the unit whose test runs."""
        now, cpu = time.monotonic(), tree_cpu(self.pid)
        if self.current is not None:
            spent = self.used.setdefault(self.current, [0.0, 0.0])
            spent[0] += max(cpu - self.cpu, 0.0)
            spent[1] += now - self.since
        self.since, self.cpu = now, cpu

    def over(self, budget: float) -> tuple[str | None, str]:
        """The marker whose tests have used more than ``budget`` CPU seconds, or more than
        ``WALL_FACTOR * budget`` wall-clock seconds, and which (``"cpu"``, ``"wall"``); ``"*"``
        when the run has not reached its first test within ``STARTUP_LIMIT``."""
        self.charge()
        cpu, wall = self.used.get(self.current, [0.0, 0.0]) if self.current is not None else (0.0, 0.0)
        if cpu > budget:
            return self.current, "cpu"
        if wall > WALL_FACTOR * budget:
            return self.current, "wall"
        if not self.begun and time.monotonic() - self.started > STARTUP_LIMIT:
            return "*", "wall"
        return None, ""


def timed_out(budget: float, why: str) -> str:
    """The crash text of a unit that ran out of time (``why``: ``"cpu"`` or ``"wall"``)."""
    if why == "cpu":
        return f"timed out: its tests used up their {budget:g} s of CPU time"
    return (f"timed out: its tests ran past the wall-clock backstop of {WALL_FACTOR * budget:g} s "
            f"({WALL_FACTOR} x its {budget:g} s of CPU time)")


def _finished(records: list[dict], marker: str) -> bool:
    """Every collected test of ``marker`` reported its outcome in ``records``."""
    return not unreported([marker], records)


def _own(records: list[dict], markers: set[str]) -> list[dict]:
    """The records of one run that belong to ``markers`` (and those of no unit: imports, sandboxes)."""
    unit_of = {}
    kept = []
    for record in records:
        if record["kind"] == "collected":
            items = [item for item in record.get("items", []) if item[1] in markers]
            unit_of.update(dict(record.get("items", [])))
            kept.append({**record, "items": items})
        elif record["kind"] in ("test", "start"):
            if unit_of.get(record.get("nodeid"), record.get("marker")) in markers:
                kept.append(record)
        else:
            kept.append(record)
    return kept


def wave_files(first: list[dict], units: list, tests_dir: Path) -> list[Path] | None:
    """The test files a later wave of ``units`` needs, in the order the first wave collected
    them, from the first wave's records (``first``); ``None`` (collect the whole folder) when
    that run did not list its files, had a collection error, or collected a test with no single
    marker (``-m`` may still select it). Every test of ``units`` lies in these files, so the
    wave collects the same tests in the same order, without importing the other modules."""
    listed = [r for r in first if r["kind"] == "files"]
    if len(listed) != 1 or any(r["kind"] == "collect_error" for r in first):
        return None
    wanted, files = set(_markers(units)), []
    for name, markers in listed[0].get("files", []):
        if None in markers or not isinstance(name, str):
            return None
        if wanted & set(markers):
            files.append(tests_dir.parent / name)
    return files or None


def run_wave(units: list, tests_dir: Path, workdir: Workdir, python: str,
             budget: float, files: list[Path] | None = None) -> tuple[list[dict], dict[str, str]]:
    """Run the tests of ``units`` (milestone numbers, exercise codes ``x01``); the plugin's records
    and a crash text per unit's marker (``m04``) that did not end normally.

    Each unit's tests have ``budget`` seconds of CPU time in all (``tree_cpu``: the test
    process, the sandboxes, whatever they start), and ``WALL_FACTOR`` times as much wall-clock
    time as a backstop. When one unit uses either up, the run is stopped, that unit is timed
    out, and the units it had not finished run again without it (their time so far still
    counts): a slow unit fails only itself, and a wave takes at most
    ``len(units) * (WALL_FACTOR * budget + STARTUP_LIMIT)`` of wall-clock time. Given
    ``files`` (``wave_files``), pytest collects only those instead of all of ``tests_dir``.
    """
    pending = _markers(units)
    records: list[dict] = []
    crashes: dict[str, str] = {}
    used: dict[str, list[float]] = {}
    while pending:
        run_records, ended, (over, why) = _run_once(pending, tests_dir, workdir, python, budget, used, files)
        done = {m for m in pending if _finished(run_records, m)}
        if over == "*":
            crashes.update({m: f"the test run did not reach its first test within {STARTUP_LIMIT:g} s"
                            for m in pending})
            done = set(pending)
        elif over is not None:
            crashes[over] = timed_out(budget, why)
            done.add(over)
        else:  # the run ended by itself: whatever it did not finish, it never will
            crashes.update({m: ended for m in pending if ended and m not in done})
            done = set(pending)
        records += _own(run_records, done)
        pending = [m for m in pending if m not in done]
    return records, crashes


def _run_once(markers: list[str], tests_dir: Path, workdir: Workdir, python: str, budget: float,
              used: dict[str, list[float]], files: list[Path] | None) -> tuple[list[dict], str, tuple[str | None, str]]:
    """One pytest run of the tests of ``markers``: its records, its crash text, and the marker
    that ran out of ``budget`` with which clock (``"*"``: the run never reached a test;
    ``None``: none did)."""
    command = [
        python, "-m", "pytest", *map(str, files or [tests_dir]),
        "-m", " or ".join(markers),
        "-c", str(workdir.path / "pytest.ini"), "--rootdir", str(tests_dir.parent),
        "--confcutdir", str(tests_dir), "--ignore", str(tests_dir / "tooling"),
        "-p", "no:cacheprovider", "-p", "_diloco_grade_plugin", "-q", "--tb=no", "--no-header",
    ]
    crash, over = "", (None, "")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as log:  # no names: only we hold them
        env = dict(workdir.env, DILOCO_GRADE_RECORDS_FD=str(out.fileno()))
        proc = subprocess.Popen(command, cwd=workdir.path, env=env, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, pass_fds=(out.fileno(),), start_new_session=True)
        run = _Run(out, set(markers), used, proc.pid)
        try:
            while proc.poll() is None and over[0] is None:
                try:
                    proc.wait(timeout=_POLL)
                except subprocess.TimeoutExpired:
                    pass
                run.read()
                over = run.over(budget)
        finally:
            _kill_group(proc)
        run.read()
        if over[0] is None and proc.returncode not in (0, 1, 5):  # 2 interrupted, 3 internal error, 4 usage error
            size = os.fstat(log.fileno()).st_size
            tail = os.pread(log.fileno(), 3000, max(0, size - 3000)).decode("utf-8", "replace").strip()
            crash = tail or f"pytest exited with status {proc.returncode}"
    if workdir.sandbox is not None:
        kill_leftovers(run.records, workdir.sandbox["folder"])
    return run.records, crash, over


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill a pytest run and everything it started in its session."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


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
