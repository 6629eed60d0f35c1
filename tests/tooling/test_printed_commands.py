"""Every command the command line prints runs as printed, from where the user stands.

``diloco.tools.cli.invocation.program`` decides how: ``.venv/bin/diloco`` from a checkout,
an absolute path from another folder, the bare ``diloco`` when that name on ``PATH`` is this
environment's. Real processes print a usage hint (``see '... --help'``) and a resume refusal
(``resume it with: ...``); each command is taken from the line and run, as printed, in the
same folder with the same ``PATH``. (The interrupt's ``--resume`` line is run as printed by
``test_interrupt_keeps_work.py`` and ``test_reliability_runs.py``.)
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from diloco.tools.cli.invocation import program, shown_path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "diloco"
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="no diloco script beside the interpreter")
BARE_PATH = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                            if not (Path(p) / "diloco").exists())  # a PATH without any diloco


def from_root(path: Path) -> str:
    """``path`` as typed from the project root (what a process started there prints)."""
    relative = os.path.relpath(path, ROOT)
    return str(path) if relative.startswith("..") else relative


def run(argv, cwd, path=BARE_PATH):
    return subprocess.run(argv, cwd=cwd, env={**os.environ, "PATH": path, "OPENBLAS_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=300)


def where_from(tmp_path):
    """(how the user starts diloco, the folder, the PATH): from the checkout, from elsewhere, on PATH."""
    return [
        (["python", "-m", "diloco"], ROOT, BARE_PATH),
        ([str(SCRIPT)], tmp_path, BARE_PATH),
        (["diloco"], tmp_path, os.pathsep.join([str(SCRIPT.parent), BARE_PATH])),
    ]


@pytest.mark.slow
def test_the_usage_hint_runs_as_printed_wherever_the_user_stands(tmp_path):
    printed = []
    for start, cwd, path in where_from(tmp_path):
        start = [sys.executable, *start[1:]] if start[0] == "python" else start
        proc = run([*start, "compare", "--round", "3"], cwd, path)
        hint = re.search(r"\(see '([^']+)'\)", proc.stderr)
        assert proc.returncode == 2 and hint, proc.stderr
        printed.append(hint[1])
        again = run(shlex.split(hint[1]), cwd, path)  # as printed
        assert again.returncode == 0 and again.stdout.startswith("usage: diloco compare"), (hint[1], again.stderr)
    assert printed[0] == f"{from_root(SCRIPT)} compare --help"  # a checkout (.venv/bin/diloco): nothing on PATH
    assert printed[1] == f"{SCRIPT} compare --help"  # outside the checkout: the script's full path
    assert printed[2] == "diloco compare --help"  # diloco on PATH is this environment's


def test_a_resume_refusal_prints_the_command_that_resumes_it(tmp_path):
    made = run([str(SCRIPT), "train", "-K", "2", "-H", "2", "--rounds", "2", "--hidden-sizes", "8", "-q",
                "--no-plots", "--runs-dir", "runs"], tmp_path)
    assert made.returncode == 0, made.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    refused = run([str(SCRIPT), "compare", "--resume", f"runs/{run_dir.name}"], tmp_path)
    match = re.search(r"resume it with: (.+)$", refused.stderr.strip())
    assert refused.returncode == 2 and match, refused.stderr
    assert match[1] == f"{SCRIPT} train --resume runs/{run_dir.name}"
    again = run(shlex.split(match[1]), tmp_path)  # as printed
    assert again.returncode == 0, again.stderr


def test_program_names_the_checkout_script_relative_and_outside_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", BARE_PATH)
    monkeypatch.chdir(SCRIPT.parents[2])  # the folder holding .venv
    assert program() == os.path.join(SCRIPT.parent.parent.name, "bin", "diloco")
    monkeypatch.chdir(tmp_path)
    assert program() == str(SCRIPT) and shown_path(tmp_path / "runs" / "x") == os.path.join("runs", "x")
    monkeypatch.setenv("PATH", str(SCRIPT.parent))
    assert program() == "diloco"


def test_the_mpi_entry_points_hint_runs_as_printed(tmp_path):
    pytest.importorskip("mpi4py")
    proc = run([sys.executable, "-m", "diloco.tools.cli.mpi", "--round", "3"], ROOT)
    hint = re.search(r"\(see '([^']+)'\)", proc.stderr)
    assert proc.returncode == 2 and hint, proc.stderr
    assert hint[1] == f"{from_root(Path(sys.executable))} -m diloco.tools.cli.mpi --help"
    again = run(shlex.split(hint[1]), ROOT)
    assert again.returncode == 0 and again.stdout.startswith("usage: python -m diloco.tools.cli.mpi"), again.stderr
