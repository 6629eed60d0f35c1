"""Every fault ends cleanly: one line on stderr, a known exit status, a truthful run folder.

* refused before the run folder is made (nothing left behind): bad flags, a file or an
  overlong name for the folder, JSON nested too deeply, single-class data, more workers
  than examples, a model that cannot fit in memory (the estimate in the message);
* after the folder exists: divergence (status "diverged", exit 3, round/worker/quantity
  named, no NumPy warning on the terminal, the last good checkpoint kept), a full disk,
  an ``OSError`` or ``MemoryError`` (status "failed", exit 2), SIGTERM (status
  "interrupted", exit 143);
* files: no temporary file, no 0-byte PNG, no torn ``history.jsonl`` line after a failed
  write; a torn line left by a power cut is repaired on ``--resume`` and reported.

A full disk is simulated by a failing ``fsync``/``write`` in-process, and made real where
the machine allows it: a 64 kB tmpfs mounted in a private user namespace (``unshare``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TINY, only_run_dir, run_cli

from diloco.core import sync
from diloco.tools.cli import commands
from diloco.tools.cli.invocation import program
from diloco.tools.runs import folders as runs
from diloco.tools.runs.folders import JsonlWriter, read_jsonl

QUICK = [*TINY, "--no-plots"]


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Warning" not in err, err
    return lines[0]


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def leftovers(folder: Path) -> list:
    """Temporary files and empty files anywhere under ``folder``."""
    return [p for p in folder.rglob("*") if p.is_file() and (p.name.endswith(".tmp") or p.stat().st_size == 0)]


# --- refused before anything is written --------------------------------------------------

def _npz(tmp_path, name, **arrays) -> Path:
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def _cases(tmp_path) -> list:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 3))
    (tmp_path / "a-file").write_text("")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    return [
        (["train", *QUICK, "--runs-dir", tmp_path / "a-file"], "--runs-dir", "is a file, not a folder"),
        (["train", *QUICK, "--name", "n" * 300], "--name", "at most 200 bytes"),
        (["train", *QUICK, "--config", tmp_path / "deep.json"], "config file", "nested too deeply"),
        (["train", *QUICK, "--split-seed", "-1"], "--split-seed", "non-negative"),
        (["train", *QUICK, "--test-fraction", "1.5"], "--test-fraction", "strictly between 0 and 1"),
        (["train", *QUICK, "--checkpoint-every", "0"], "--checkpoint-every", "must be a positive int"),
        (["train", *QUICK, "--max-loss", "-3"], "--max-loss", "positive finite number"),
        (["train", *QUICK, "--max-loss", "nan"], "--max-loss", "positive finite number"),
        (["train", *QUICK, "--seed", "-5"], "seed", "non-negative int"),
        (["train", *QUICK, "-K", "5000"], "K=5000", "only 1438 training examples"),
        (["train", *QUICK, "--hidden-sizes", "10000000"], "memory", "parameters x"),
        (["train", *QUICK, "--data", _npz(tmp_path, "one-class.npz", x=x, y=np.zeros(40, int))],
         "single class", "at least two"),
        (["train", *QUICK, "--data", _npz(tmp_path, "big-label.npz", x=x, y=np.arange(40) % 2 * 10**9)],
         "memory", "GB of memory"),
        (["train", *QUICK, "--resume", tmp_path / "nowhere"], "--resume", "no run folder"),
        (["train", *QUICK, "--resume", _folder(tmp_path / "empty")], "--resume: ",
         "is not a run folder (no config.json)", "start it again"),
        (["train", *QUICK, "--resume", _folder(tmp_path / "torn", config="{")], "--resume: ", "is not valid JSON"),
        (["study", "workers", "--values", "1,5000", "--seeds", "1", *QUICK], "variant K=5000", "1438 training"),
    ]


def _folder(path, **files):
    path.mkdir()
    for stem, text in files.items():
        (path / f"{stem}.json").write_text(text)
    return path


def test_refused_before_the_run_folder_is_made(tmp_path, capsys):
    for argv, *messages in _cases(tmp_path):
        runs_dir = tmp_path / "runs"
        if "--runs-dir" not in argv:
            argv = [*argv, "--runs-dir", runs_dir]
        status, _, err = run_cli(argv, capsys)
        line = one_line(err)
        assert status == 2 and all(m in line for m in messages), (argv, line)
        assert not runs_dir.exists(), (argv, "a run folder was left behind")


def test_the_memory_estimate_is_in_the_message(tmp_path, capsys):
    status, _, err = run_cli(["train", *QUICK, "--hidden-sizes", "10000000", "--runs-dir", tmp_path], capsys)
    line = one_line(err)
    assert status == 2 and "this run needs about" in line and "GB of memory" in line and "is available" in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_runs_dir(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        status, _, err = run_cli(["train", *QUICK, "--runs-dir", locked], capsys)
    finally:
        locked.chmod(0o700)
    assert status == 2 and "Permission denied" in one_line(err) and not list(locked.iterdir())


# --- divergence ------------------------------------------------------------------------------

def test_a_huge_loss_is_divergence_by_default(tmp_path, capsys):
    """The issue's case: --lr 10 --outer-lr 50 used to end "completed" at a loss of 1e4-1e10."""
    status, _, err = run_cli(["train", *QUICK, "--lr", "10", "--outer-lr", "50", "--runs-dir", tmp_path], capsys)
    line = one_line(err)
    assert status == 3 and "DiLoCo diverged in round 1, worker" in line and "exceeds max_loss 1000" in line
    summary = summary_of(only_run_dir(tmp_path))
    assert summary["status"] == "diverged" and summary["divergence"]["round"] == 1
    assert summary["reason"] in line


def test_nan_divergence_names_round_worker_and_quantity_without_numpy_warnings(tmp_path):
    """A real process, so NumPy's warnings would reach its stderr if anything let them."""
    argv = ["-m", "diloco", "train", "--algo", "sync", *QUICK, "--lr", "1e200", "--weight-decay", "0",
            "--max-loss", "off", "--runs-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120)
    line = one_line(done.stderr)
    assert done.returncode == 3
    assert "the synchronous baseline diverged in round 1, step" in line and "worker" in line
    assert "not finite" in line or "nan" in line
    assert summary_of(only_run_dir(tmp_path))["status"] == "diverged"


def test_divergence_keeps_the_last_good_checkpoint(tmp_path, capsys, monkeypatch):
    """NaN appears in round 3: rounds 1-2 stay in the history and the checkpoints, round 3 nowhere."""
    real_outer = sync.outer_optimizer
    calls = []

    def going_bad(config):
        real = real_outer(config)

        def update(params, delta, state, config):
            calls.append(None)
            new_params, state = real.update(params, delta, state, config)
            if len(calls) == 3:
                new_params["b1"] = new_params["b1"] * np.nan
            return new_params, state

        return real._replace(update=update)

    monkeypatch.setattr(sync, "outer_optimizer", going_bad)
    status, _, err = run_cli(["train", *QUICK, "--rounds", "4", "--checkpoint-every", "1", "--max-loss", "off",
                              "--runs-dir", tmp_path], capsys)
    line = one_line(err)
    assert status == 3 and "DiLoCo diverged in round 3, all workers: global parameter 'b1' is not finite" in line
    run_dir = only_run_dir(tmp_path)
    assert [r["round"] for r in read_jsonl(run_dir / "history.jsonl")] == [1, 2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "diloco-round000001.json", "diloco-round000001.npz", "diloco-round000002.json", "diloco-round000002.npz"]
    summary = summary_of(run_dir)
    assert summary["status"] == "diverged" and summary["algorithms"]["diloco"]["rounds_completed"] == 2


@pytest.mark.parametrize("engine, flags, quantity", [
    ("reference", ["--lr", "10", "--outer-lr", "50"], "exceeds max_loss 1000"),
    ("fast", ["--lr", "1e200", "--weight-decay", "0", "--max-loss", "off"], "training loss is nan"),
])
def test_a_study_names_the_diverged_variant_and_seed(engine, flags, quantity, tmp_path, capsys):
    if engine == "fast":
        pytest.importorskip("diloco.engine")
    argv = ["study", "workers", "--values", "2", "--seeds", "1", "--rounds", "2", "-H", "3", "--hidden-sizes", "8",
            "--engine", engine, *flags, "-q", "--no-plots", "--runs-dir", tmp_path]
    status, _, err = run_cli(argv, capsys)
    line = one_line(err)
    assert status == 3 and line.startswith("diloco study: error: variant K=2, seed 0: DiLoCo diverged in round 1")
    assert quantity in line
    assert summary_of(only_run_dir(tmp_path))["status"] == "diverged"


# --- faults after the folder exists --------------------------------------------------------

@pytest.mark.parametrize("fault, message", [
    (MemoryError(), "out of memory during training"),
    (OSError(errno.EIO, "Input/output error", "somewhere/file.bin"), "cannot write somewhere/file.bin: Input/output"),
])
def test_faults_during_training_are_one_line_and_status_failed(fault, message, tmp_path, capsys, monkeypatch):
    real_train = commands.train_resumable

    def failing(algo, *args, on_round=None, **kwargs):
        def on_round_then_fail(record):
            on_round(record)
            if record["round"] == 2:
                raise fault

        return real_train(algo, *args, on_round=on_round_then_fail, **kwargs)

    monkeypatch.setattr(commands, "train_resumable", failing)
    status, _, err = run_cli(["compare", *QUICK, "--rounds", "3", "--runs-dir", tmp_path], capsys)
    assert status == 2 and message in one_line(err)
    run_dir = only_run_dir(tmp_path)
    summary = summary_of(run_dir)
    assert summary["status"] == "failed" and message in summary["reason"]
    assert summary["algorithms"]["diloco"]["rounds_completed"] == 2
    assert not leftovers(run_dir)


def test_a_full_disk_leaves_no_temporary_file_no_empty_png_and_no_torn_line(tmp_path, capsys, monkeypatch):
    """The disk fills up while the plots are written (fsync of a PNG fails)."""
    pytest.importorskip("matplotlib")
    real_fsync = os.fsync

    def full_for_png(fd):
        if ".png." in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_for_png)
    status, _, err = run_cli(["compare", *TINY, "--runs-dir", tmp_path], capsys)
    line = one_line(err)
    assert status == 2 and "heldout_vs_round.png: No space left on device" in line
    assert line.startswith("diloco compare: error: training completed, but the plots failed: cannot write ")
    run_dir = only_run_dir(tmp_path)
    assert not leftovers(run_dir) and not list(run_dir.glob("*.png"))
    summary = summary_of(run_dir)  # the training completed: the status says so, and the plots' failure beside it
    assert summary["status"] == "completed" and summary["plots"].startswith("failed: cannot write ")
    assert summary["algorithms"]["sync"]["rounds_completed"] == 2
    assert (run_dir / "history.jsonl").read_bytes().endswith(b"\n")


class _FullDiskOs:
    """``os`` for ``diloco.tools.runs.folders``, whose ``write`` stores half a line, then fails."""

    def __getattr__(self, name):
        return getattr(os, name)

    @staticmethod
    def write(fd, data):
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_failed_append_is_cut_back_so_no_line_is_torn(tmp_path, monkeypatch):
    writer = JsonlWriter(tmp_path / "history.jsonl")
    writer.write_line({"round": 1})
    monkeypatch.setattr(runs, "os", _FullDiskOs())
    with pytest.raises(OSError, match="No space left") as caught:
        writer.write_line({"round": 2, "payload": "x" * 100})
    monkeypatch.undo()
    assert caught.value.filename == str(tmp_path / "history.jsonl")
    assert (tmp_path / "history.jsonl").read_text() == '{"round": 1}\n'


def test_a_torn_line_is_skipped_with_a_warning_and_repaired_on_resume(tmp_path, capsys):
    status, _, err = run_cli(["train", *QUICK, "--rounds", "3", "--checkpoint-every", "1", "--runs-dir", tmp_path],
                             capsys)
    assert status == 0, err
    run_dir = only_run_dir(tmp_path)
    history = run_dir / "history.jsonl"
    whole = history.read_bytes()
    history.write_bytes(whole + b'{"algo": "diloco", "round": 4, "inner_lo')  # a power cut mid-append
    with pytest.warns(runs.TornLineWarning, match="skipped a torn last line"):
        assert len(read_jsonl(history)) == 3
    status, out, err = run_cli(["train", "--resume", run_dir, "--no-plots"], capsys)
    assert status == 0, err
    assert "history.jsonl: removed a torn last line (40 bytes); 3 records kept" in out
    assert history.read_bytes() == whole


def test_a_damaged_middle_line_is_an_error_not_silence(tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text('{"round": 1}\n{"round": 2, oops\n{"round": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not a JSON object; the file is damaged"):
        read_jsonl(path)


def test_sigterm_is_handled_like_ctrl_c(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "diloco", "train", "-K", "2", "-H", "20", "--rounds", "100000",
                             "--hidden-sizes", "8", "-q", "--no-plots", "--runs-dir", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            history = [folder / "history.jsonl" for folder in tmp_path.iterdir()]
            if history and history[0].is_file() and len(history[0].read_bytes().splitlines()) >= 2:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143
    run_dir = only_run_dir(tmp_path)
    saved = len(read_jsonl(run_dir / "history.jsonl"))  # the last finished round is saved at the signal
    assert one_line(err) == (f"diloco train: interrupted by SIGTERM; round {saved} of 100000 is saved; continue from "
                             f"round {saved + 1} with: {program()} train --resume {run_dir}")
    assert (run_dir / "checkpoints" / f"diloco-round{saved:06d}.json").is_file()
    summary = summary_of(run_dir)
    assert summary["status"] == "interrupted" and summary["signal"] == "SIGTERM"
    assert summary["algorithms"]["diloco"]["rounds_completed"] >= 2
    assert (run_dir / "history.jsonl").read_bytes().endswith(b"\n")


# --- a real full disk --------------------------------------------------------------------------

REAL_DISK = textwrap.dedent("""
    set -e
    mount -t tmpfs -o size=64k tmpfs "$DISK"
    set +e
    "$PYTHON" -m diloco compare -K 2 -H 3 --rounds 30 --hidden-sizes 8 --batch-size 8 -q --no-plots \\
        --checkpoint-every 1 --runs-dir "$DISK" 2> "$OUT/full.err"
    echo $? > "$OUT/full.status"
    cp -r "$DISK"/* "$OUT/copy"
    ls -a "$DISK"/*/ "$DISK"/*/checkpoints > "$OUT/listing"
    mount -o remount,size=4m "$DISK"              # space freed: the run can go on
    "$PYTHON" -m diloco compare --resume "$DISK"/* --no-plots -q > /dev/null 2> "$OUT/resume.err"
    echo $? > "$OUT/resume.status"
    cp "$DISK"/*/params-*.npz "$OUT/"
""")


def test_a_real_full_disk_then_resume_when_space_is_back(tmp_path):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("no unprivileged user and mount namespaces here (unshare -rm)")
    (tmp_path / "disk").mkdir()
    (tmp_path / "copy").mkdir()
    env = {**os.environ, "DISK": str(tmp_path / "disk"), "OUT": str(tmp_path), "PYTHON": sys.executable,
           "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(["unshare", "-rm", "sh", "-c", REAL_DISK], env=env, capture_output=True, text=True,
                          timeout=300)
    if done.returncode and "mount" in done.stderr:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    assert (tmp_path / "full.status").read_text().strip() == "2"
    line = one_line((tmp_path / "full.err").read_text())
    assert line.startswith("diloco compare: error: cannot write ") and line.endswith("No space left on device")
    copy = only_run_dir(tmp_path / "copy")
    assert not leftovers(copy)
    assert ".tmp" not in (tmp_path / "listing").read_text()
    assert (copy / "history.jsonl").read_bytes().endswith(b"\n")
    assert summary_of(copy)["status"] == "failed"
    assert (tmp_path / "resume.status").read_text().strip() == "0", (tmp_path / "resume.err").read_text()

    # Resumed after the disk filled up: the same final models as a run that never stopped.
    status = subprocess.run([sys.executable, "-m", "diloco", "compare", "-K", "2", "-H", "3", "--rounds", "30",
                             "--hidden-sizes", "8", "--batch-size", "8", "-q", "--no-plots", "--runs-dir",
                             str(tmp_path / "clean")], env=env, capture_output=True, text=True, timeout=300)
    assert status.returncode == 0, status.stderr
    clean = only_run_dir(tmp_path / "clean")
    for algo in ("diloco", "sync"):
        with np.load(tmp_path / f"params-{algo}.npz") as got, np.load(clean / f"params-{algo}.npz") as want:
            assert all(np.array_equal(got[k], want[k]) for k in want.files)


@pytest.mark.parametrize("command", ["train", "compare"])
def test_a_history_lost_from_outside_fails_the_run_never_completed(command, tmp_path, capsys, monkeypatch):
    """Appends that reach no file (a history replaced or emptied behind the run): the run ends
    "failed" in one line naming the file and the count, not "completed" beside an empty history."""
    monkeypatch.setattr(runs.HistoryWriter, "write_line", lambda self, record: None)
    status, _, err = run_cli([command, *QUICK, "--runs-dir", tmp_path], capsys)
    run_dir = only_run_dir(tmp_path)
    rounds = 2 if command == "train" else 4
    assert status == 2 and one_line(err) == (f"diloco {command}: error: cannot write {run_dir / 'history.jsonl'}: it "
                                             f"holds 0 records, but the run wrote {rounds} (the file was changed "
                                             f"from outside the run)")
    assert summary_of(run_dir)["status"] == "failed"


@pytest.mark.parametrize("command", ["train", "compare"])
def test_a_run_folder_made_read_only_mid_run_fails_the_run_and_keeps_its_rounds(command, tmp_path, capsys,
                                                                                 monkeypatch):
    """Every write into the run folder fails with EROFS once DiLoCo's round 2 is on disk (what a
    read-only remount does, for root too): one line naming the file, the rounds written are kept,
    and the summary never says "completed"."""
    real_open, real_mkdir, state = os.open, os.mkdir, {"read_only": False}

    def guarded(call):
        def wrapper(path, *args, **kwargs):
            if state["read_only"] and str(path).startswith(str(tmp_path)):
                writes = call is real_mkdir or (args and args[0] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
                if writes:
                    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
            return call(path, *args, **kwargs)
        return wrapper

    real_append = runs.HistoryWriter.append

    def append(self, record):
        written = real_append(self, record)
        state["read_only"] = state["read_only"] or (record.get("algo") == "diloco" and record.get("round") == 2)
        return written

    monkeypatch.setattr(os, "open", guarded(real_open))
    monkeypatch.setattr(os, "mkdir", guarded(real_mkdir))
    monkeypatch.setattr(runs.HistoryWriter, "append", append)
    status, _, err = run_cli([command, *QUICK, "--rounds", "4", "--runs-dir", tmp_path], capsys)
    monkeypatch.undo()
    run_dir = only_run_dir(tmp_path)
    assert status == 2 and one_line(err).startswith(f"diloco {command}: error: cannot write {run_dir}") and \
        one_line(err).endswith(": Read-only file system"), err
    assert [r["round"] for r in read_jsonl(run_dir / "history.jsonl")] == [1, 2]  # what was written is kept
    assert summary_of(run_dir)["status"] == "running"  # the folder could not be written: never "completed"
