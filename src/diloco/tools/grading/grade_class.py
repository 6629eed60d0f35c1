"""``diloco grade --submissions DIR --out OUT``: a whole class, one submission per folder.

Each folder of ``DIR`` is one learner's submission (a workspace, a ``src`` folder or the
``diloco`` package itself), named after the learner. Each is graded by its own ``diloco
grade`` process (so its own sandbox and its own time limits), ``jobs`` at a time, at most
one per core. For each learner, ``OUT/learners/<name>/`` holds ``report.txt`` (the table),
``results.json`` and ``results.xml``; ``OUT/scores.csv`` has one row per learner: name (the
report folder's), folder (the submission folder's own name, escaped), score, max_score,
status (``graded`` or ``error``) and the error line. The reports sit in a sub-folder, so no
learner's folder can shadow ``scores.csv``. A submission that cannot be graded gets its
row and a ``results.json`` of zeros, and the class goes on.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from diloco.tools.grading.grade_report import error_report
from diloco.tools.grading.grade_text import LINE_LIMIT, safe_text
from diloco.tools.runs.atomic_files import atomic_write_text

__all__ = ["Row", "grade_class", "submissions", "default_jobs", "LEARNERS"]

_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}$")
LEARNERS = "learners"  # OUT's sub-folder of the learners' reports


class Row(NamedTuple):
    """One learner's line of ``scores.csv``: ``name`` is the report folder's, ``folder`` the
    submission folder's own name (escaped by ``safe_text``)."""

    name: str
    folder: str
    score: float
    max_score: float
    status: str
    error: str = ""


def default_jobs() -> int:
    """One grading per core (each runs one pytest process and one sandbox at a time)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def report_name(folder_name: str) -> str:
    """The report folder's name for a submission folder: the name itself when it is plain
    (letters, digits, ``._@+-``, starting with a letter or digit), else its plain characters
    with ``_`` for the rest, then ``~`` and 8 hex digits of its hash. ``~`` is in no plain
    name, so a sanitised name never takes a plain one's place, and the hash keeps two
    folders (``jane doe``, ``jane?doe``) apart."""
    if _PLAIN_NAME.match(folder_name):
        return folder_name
    digest = hashlib.sha256(os.fsencode(folder_name)).hexdigest()[:8]
    plain = re.sub(r"[^A-Za-z0-9._@+-]", "_", folder_name)[:80]
    return f"{plain if plain[:1].isalnum() else '_' + plain}~{digest}"


def submissions(folder: Path) -> list[tuple[str, Path]]:
    """``(name, path)`` of each submission in ``folder``, sorted; ``name`` is ``report_name``,
    made unique (with more ``~``) should two hashes ever agree."""
    found: list[tuple[str, Path]] = []
    used: set[str] = set()
    for path in sorted(p for p in folder.iterdir() if p.is_dir()):  # a link is graded, and refused, too
        name = report_name(path.name)
        while name in used:
            name += "~"
        used.add(name)
        found.append((name, path))
    return found


def _score(results: Path) -> tuple[float, float] | None:
    """``(score, max_score)`` of a ``results.json``; ``None`` when it is missing or malformed."""
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
        return float(data["score"]), float(data["max_score"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _grade_one(name: str, path: Path, out: Path, flags: list[str]) -> Row:
    """Grade one submission in a process of its own; its report files and its row. Its
    ``results.json`` is written whatever happened (zeros and the reason when the grading
    process wrote none)."""
    folder = out / LEARNERS / name
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / "results.json"
    command = [sys.executable, "-m", "diloco.tools.cli.main", "grade", "--impl", str(path), "--quiet",
               "--json", str(results), "--junit", str(folder / "results.xml"), *flags]
    proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    atomic_write_text(folder / "report.txt", proc.stdout or proc.stderr)
    shown = safe_text(path.name, LINE_LIMIT, one_line=True)
    error = safe_text((proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1], LINE_LIMIT,
                      one_line=True)
    scored = _score(results)
    if scored is None:
        atomic_write_text(results, json.dumps(error_report(path, error), indent=2) + "\n")
        return Row(name, shown, 0.0, 30.0, "error", error)
    if proc.returncode == 0:
        return Row(name, shown, *scored, "graded")
    return Row(name, shown, *scored, "error", error)


def _csv_cell(value) -> str:
    """A cell a spreadsheet shows as text: no leading ``=``, ``+``, ``-``, ``@`` formula."""
    text = str(value)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@") and not isinstance(value, float) else text


def grade_class(folder: Path, out: Path, flags: list[str], jobs: int | None = None,
                on_done=None) -> list[Row]:
    """Grade every submission in ``folder`` into ``out``, ``jobs`` at a time (default: one per
    core); the rows of ``out/scores.csv``, which is written last (atomically). The reports
    go to ``out/learners/<name>/``."""
    found = submissions(folder)
    jobs = max(1, min(jobs or default_jobs(), default_jobs(), len(found) or 1))
    out.mkdir(parents=True, exist_ok=True)

    def one(item):
        row = _grade_one(*item, out, flags)
        if on_done is not None:
            on_done(row)
        return row

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        rows = list(pool.map(one, found))
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(Row._fields)
    writer.writerows([_csv_cell(cell) for cell in row] for row in rows)
    atomic_write_text(out / "scores.csv", text.getvalue())
    return rows
