"""``diloco grade --submissions DIR --out OUT``: a whole class, one submission per folder.

Each folder of ``DIR`` is one learner's submission (a workspace, a ``src`` folder or the
``diloco`` package itself), named after the learner. Each is graded by its own ``diloco
grade`` process (so its own sandbox and its own time limits), ``jobs`` at a time, at most
one per core. For each learner, ``OUT/<name>/`` holds ``report.txt`` (the table),
``results.json`` and ``results.xml``; ``OUT/scores.csv`` has one row per learner: name,
score, max_score, status (``graded`` or ``error``) and the error line. A submission that
cannot be graded gets its row and a ``results.json`` of zeros, and the class goes on.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from diloco.tools.grading.grade_text import LINE_LIMIT, safe_text

__all__ = ["Row", "grade_class", "submissions", "default_jobs"]

_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,99}$")


class Row(NamedTuple):
    """One learner's line of ``scores.csv``."""

    name: str
    score: float
    max_score: float
    status: str
    error: str = ""


def default_jobs() -> int:
    """One grading per core (each runs one pytest process and one sandbox at a time)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def submissions(folder: Path) -> list[tuple[str, Path]]:
    """``(name, path)`` of each submission in ``folder``, sorted; ``name`` is the folder's name
    when it is plain (letters, digits, ``._@+-``), else an escaped form of it made unique."""
    found = []
    for path in sorted(p for p in folder.iterdir() if p.is_dir()):  # a link is graded, and refused, too
        name = path.name if _PLAIN_NAME.match(path.name) else re.sub(r"[^A-Za-z0-9._@+-]", "_", path.name)[:100]
        if not name.strip("._"):  # no name left (".."): a folder of that name would be no folder of its own
            name = f"submission{name}"
        while name in {n for n, _ in found}:
            name = f"{name}_"
        found.append((name, path))
    return found


def _grade_one(name: str, path: Path, out: Path, flags: list[str]) -> Row:
    """Grade one submission in a process of its own; its report files and its row."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    results = folder / "results.json"
    command = [sys.executable, "-m", "diloco.tools.cli.main", "grade", "--impl", str(path), "--quiet",
               "--json", str(results), "--junit", str(folder / "results.xml"), *flags]
    proc = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    (folder / "report.txt").write_text(proc.stdout or proc.stderr, encoding="utf-8")
    try:
        data = json.loads(results.read_text(encoding="utf-8"))
        score, max_score = float(data["score"]), float(data["max_score"])
    except (OSError, ValueError, KeyError, TypeError):
        score, max_score = 0.0, 30.0
    if proc.returncode == 0:
        return Row(name, score, max_score, "graded")
    error = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return Row(name, score, max_score, "error", safe_text(error, LINE_LIMIT, one_line=True))


def _csv_cell(value) -> str:
    """A cell a spreadsheet shows as text: no leading ``=``, ``+``, ``-``, ``@`` formula."""
    text = str(value)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@") and not isinstance(value, float) else text


def grade_class(folder: Path, out: Path, flags: list[str], jobs: int | None = None,
                on_done=None) -> list[Row]:
    """Grade every submission in ``folder`` into ``out``, ``jobs`` at a time (default: one per
    core); the rows of ``out/scores.csv``, which is written last (atomically)."""
    from diloco.tools.runs.atomic_files import atomic_write_text

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
