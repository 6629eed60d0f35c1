"""The status is the truth: a disk that fills up while a checkpoint is written still gets
``"failed"`` and the reason (the run folder's ``.reserve`` makes room for it), and a study
whose report cannot be written after it completed stays ``"completed"`` and says so.

A full disk is modelled in-process: once it fills, every new file's ``fsync`` fails with
ENOSPC for as long as the run folder's ``.reserve`` takes up the last of the space.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from cli_helpers import TINY, only_run_dir, run_cli

from diloco.tools.runs import run_lock

QUICK = [*TINY, "--no-plots"]


def full_disk_after(monkeypatch, trigger: str):
    """``os.fsync`` that fills the disk at the first file named like ``trigger``."""
    real_fsync = os.fsync
    state = {"full": None}

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        if state["full"] is None and trigger in Path(target).name:
            state["full"] = Path(target).parent
        if state["full"] is not None and target.endswith(".tmp"):
            run_dir = next((p for p in Path(target).parents if (p / run_lock.LOCK_NAME).exists()), None)
            if run_dir is None or (run_dir / run_lock.RESERVE_NAME).exists():
                raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return state


def test_a_full_disk_while_checkpointing_is_failed_with_the_reason(tmp_path, capsys, monkeypatch):
    full_disk_after(monkeypatch, ".diloco-round000002.json.")
    status, _, err = run_cli(["train", *QUICK, "--rounds", "4", "--checkpoint-every", "1", "--runs-dir", tmp_path],
                             capsys)
    line, = err.strip().splitlines()
    assert status == 2 and "diloco-round000002.json: No space left on device" in line
    run_dir = only_run_dir(tmp_path)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "diloco-round000002.json: No space left on device" in summary["reason"]
    assert summary["algorithms"]["diloco"]["rounds_completed"] == 2
    assert not list(run_dir.rglob("*.tmp"))


def test_a_study_whose_report_fails_after_it_completed_stays_completed(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    real_fsync = os.fsync

    def full_for_png(fd):
        if ".png." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_for_png)
    status, _, err = run_cli(["study", "workers", "--seeds", "1", "--values", "1,2", "--rounds", "2", "-H", "2",
                              "--hidden-sizes", "8", "-q", "--runs-dir", tmp_path], capsys)
    line, = err.strip().splitlines()
    assert status == 2 and line.startswith("diloco study: error: training completed, but the report and plots "
                                           "failed: cannot write ")
    summary = json.loads((only_run_dir(tmp_path) / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["report and plots"].startswith("failed: cannot write ")
    assert summary["rows"]
