"""What the command-line tests share: run the CLI in-process, find the one run folder, find mpiexec."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from diloco.tools.cli.main import main

__all__ = ["run_cli", "only_run_dir", "mpiexec", "TINY", "TINY_DEEP"]

# A run small enough for a test: two workers, three inner steps, one hidden layer of 8.
TINY = ["--rounds", "2", "-H", "3", "-K", "2", "--hidden-sizes", "8", "--batch-size", "8", "-q"]
# The same with two hidden layers (so two fragments fit) and no plots.
TINY_DEEP = ["--rounds", "2", "-H", "4", "-K", "2", "--hidden-sizes", "8,8", "--batch-size", "8", "-q", "--no-plots"]


def run_cli(argv, capsys):
    """``(exit status, stdout, stderr)`` of ``diloco ARGV`` run in this process."""
    try:
        status = main([str(a) for a in argv])
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def only_run_dir(runs_dir: Path) -> Path:
    """The one run folder under ``runs_dir`` (a test that made two is wrong)."""
    folders = [p for p in Path(runs_dir).iterdir() if p.is_dir() and p.name != "study-cache"]  # a study's runs kept
    assert len(folders) == 1, folders
    return folders[0]


def mpiexec() -> str:
    """The mpiexec beside the interpreter (the mpich wheel's), or on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.fail("mpi4py is installed but no mpiexec was found (the mpich wheel provides one)")
    return found
