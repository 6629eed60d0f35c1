"""The test suite's time: ``make test`` (the README's command, the quick tier) against issue 18's
4 minutes of wall time and 150 s of CPU time, and ``make test-all`` (every test, as CI runs it)
beside it, with no target. Each once (minutes each), with one BLAS thread as ``.ci/run`` sets, wall
and CPU seconds of the whole process tree. ``benchmarks/bench.py --only suite`` remeasures this
section alone and rewrites it, and its target rows, in place.
"""

from __future__ import annotations

import datetime
import os
import time

TARGETS = {"wall": 240.0, "cpu": 150.0}  # seconds: `make test` on an idle 2-core machine (issue 18)
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # as .ci/run sets
COMMANDS = (("test", "`make test` (the quick tier: every test not marked slow)"),
            ("test-all", "`make test-all` (every test, as CI runs it; no target)"))


def measure(log, timed_command, idle_load: float, settle: float = 300.0) -> dict:
    """``{target: timed_command's result, or {"failed": True}}`` for ``make test`` and ``make test-all``;
    a failing one is reported, not the end of the benchmark. Each starts once the load average has
    fallen below ``idle_load`` (what came before it, the other command included, has left the
    machine), or after ``settle`` seconds of waiting, when its row is marked as loaded."""
    out: dict = {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}
    for target, _ in COMMANDS:
        waited = settled(idle_load, settle)
        log(f"  make {target}: starting at a load average of {os.getloadavg()[0]:.2f}, after {waited:.0f} s of waiting")
        try:
            out[target] = timed_command(["make", "-s", target], ONE_THREAD)
        except RuntimeError as error:
            log(f"  make {target} FAILED: {str(error)[-2000:]}")
            out[target] = {"failed": True}
            continue
        log(f"  make {target}: {out[target]['wall']:.0f} s wall, {out[target]['cpu']:.0f} s CPU")
    return out


def settled(idle_load: float, limit: float, poll: float = 5.0) -> float:
    """Wait until the one-minute load average is below ``idle_load``, at most ``limit`` seconds; the seconds waited."""
    start = time.monotonic()
    while os.getloadavg()[0] >= idle_load and time.monotonic() - start < limit:
        time.sleep(poll)
    return time.monotonic() - start


def section(result: dict, idle_load: float) -> tuple[list, list]:
    """The report's suite section and the target rows of ``make test``."""
    date = result.get("date", "an unrecorded date")
    lines = ["", "## The test suite", "",
             f"Measured on {date}, each command once, one BLAS thread; wall and "
             "CPU seconds of all its processes (the sandboxed gradings and MPI jobs included; where that CPU goes: "
             "docs/contributing.md, \"What `make test` measures\").", "",
             "| command | wall s | CPU s | load average at its start |", "|---|---|---|---|"]
    for target, label in COMMANDS:
        timed = result.get(target, {"failed": True})
        lines.append(f"| {label} | failed | failed | - |" if timed.get("failed") else
                     f"| {label} | {timed['wall']:.0f} | {timed['cpu']:.0f} | {timed['load'][0]:.2f} |")
    quick = result.get("test", {"failed": True})
    rows = []
    for kind, label in (("wall", "wall time"), ("cpu", "CPU time")):
        goal = f"make test in at most {TARGETS[kind]:.0f} s of {label}"
        if quick.get("failed"):
            rows.append((goal, "the suite failed", "**missed**"))
            continue
        loaded = " (loaded machine)" if quick["load"][0] >= idle_load else ""  # at its start: it raises it after
        rows.append((goal, f"{quick[kind]:.0f} s (`make test`, {date})",
                     ("met" if quick[kind] <= TARGETS[kind] else "**missed**") + loaded))
    return lines, rows
