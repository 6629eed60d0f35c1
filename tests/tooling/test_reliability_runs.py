"""One writer per run folder, every stop signal at every moment, resume only on the run's own code.

Real ``diloco`` processes: a second ``--resume`` of a running run is refused naming the
pid holding the lock; a lock left by a SIGKILLed process does not block the resume;
SIGINT, SIGTERM and SIGHUP at moments from the first import on give one line, exit
128 + n and, once the run folder exists, status "interrupted" and the ``--resume``
command, which continues the run to the history of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import run_cli

from diloco.tools.runs.folders import read_jsonl
from diloco.tools.runs.run_environment import constraints_record, source_record
from diloco.tools.runs.run_lock import RunLocked, lock_run_dir, release_runs

ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
LONG = ["train", "-K", "2", "-H", "20", "--rounds", "100000", "--hidden-sizes", "8", "-q", "--no-plots"]
SHORT = ["-K", "2", "-H", "3", "--rounds", "12", "--hidden-sizes", "8", "--batch-size", "8", "-q", "--no-plots",
         "--checkpoint-every", "1"]


def diloco(*argv, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "diloco", *map(str, argv)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV, **kwargs)


def wait_for_rounds(runs_dir: Path, rounds: int, timeout: float = 60, proc=None) -> Path:
    """The run folder once its history holds ``rounds`` rounds; fails at once if ``proc`` has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        folders = list(runs_dir.glob("*/history.jsonl")) if runs_dir.is_dir() else []
        if folders and len(folders[0].read_bytes().splitlines()) >= rounds:
            return folders[0].parent
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended with status {proc.returncode}: {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError(f"the run's history did not reach {rounds} rounds in {timeout} s")


def without_time(records):
    return [{k: v for k, v in r.items() if k != "time"} for r in records]


# --- one writer ----------------------------------------------------------------------------

def test_a_second_writer_is_refused_naming_the_pid_holding_the_lock(tmp_path):
    first = diloco(*LONG, "--checkpoint-every", "1", "--runs-dir", tmp_path)
    try:
        run_dir = wait_for_rounds(tmp_path, 2)
        second = diloco("train", "--resume", run_dir, "-q", "--no-plots")
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2 and len(err.strip().splitlines()) == 1, err
        assert f"is being written by process {first.pid}" in err
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    finally:
        first.kill()
    rounds = [r["round"] for r in read_jsonl(run_dir / "history.jsonl")]
    assert rounds == list(range(1, len(rounds) + 1))  # one writer: no round twice


def test_a_lock_held_in_another_process_is_refused_in_process_too(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(tmp_path / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'4242\\n'); print('held', flush=True)\n"
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunLocked, match="process 4242") as caught:
            lock_run_dir(tmp_path, "train")
        assert caught.value.pid == 4242
    finally:
        holder.kill()
        holder.wait()
    lock_run_dir(tmp_path, "train")  # the holder died: its lock went with it
    assert (tmp_path / ".lock").read_text().strip() == str(os.getpid()) and (tmp_path / ".reserve").is_file()
    release_runs(tmp_path)
    assert not (tmp_path / ".reserve").exists()


def test_a_stale_lock_of_a_killed_run_does_not_block_its_resume(tmp_path):
    clean = subprocess.run([sys.executable, "-m", "diloco", "train", *SHORT, "--runs-dir", tmp_path / "clean"],
                           env=ENV, capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    killed = diloco("train", *SHORT, "--runs-dir", tmp_path / "killed")
    run_dir = wait_for_rounds(tmp_path / "killed", 4)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert (run_dir / ".lock").read_text().strip() == str(killed.pid)  # left behind, but no longer held
    resumed = subprocess.run([sys.executable, "-m", "diloco", "train", "--resume", str(run_dir), "-q", "--no-plots"],
                             env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    want = read_jsonl(next((tmp_path / "clean").iterdir()) / "history.jsonl")
    assert without_time(read_jsonl(run_dir / "history.jsonl")) == without_time(want)


# --- every signal -----------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM, signal.SIGINT])
def test_a_signal_mid_run_is_interrupted_with_the_resume_command_that_finishes_it(sig, tmp_path):
    clean = subprocess.run([sys.executable, "-m", "diloco", "train", *SHORT, "--runs-dir", tmp_path / "clean"],
                           env=ENV, capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr
    for attempt in range(3):  # 12 tiny rounds: on a fast or a busy machine the run may end before the signal
        proc = diloco("train", *SHORT, "--runs-dir", tmp_path / f"runs{attempt}", cwd=tmp_path)
        try:
            run_dir = wait_for_rounds(tmp_path / f"runs{attempt}", 3)
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        ended_first = json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
        if proc.returncode != 0 and not ended_first:
            break  # the signal came mid-run: what this test checks
    else:
        pytest.skip("the run finished before the signal, three times")
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, (err, (run_dir / "summary.json").read_text())
    line, = err.strip().splitlines()
    # the round named is the newest checkpoint's; history.jsonl may hold one round more when the
    # signal lands between its append and the checkpoint (--resume cuts it back, tested below)
    from diloco.tools.runs.checkpoint import latest_checkpoint

    saved = int(latest_checkpoint(run_dir / "checkpoints", "diloco").stem.rsplit("round", 1)[1])
    assert len(read_jsonl(run_dir / "history.jsonl")) in (saved, saved + 1)
    assert line.startswith(f"diloco train: interrupted by {name}; round {saved} of 12 is saved; continue from "
                           f"round {saved + 1} with: ")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["signal"] == name
    command = shlex.split(line.split(" with: ")[1])
    assert command[-3:-1] == ["train", "--resume"] and (tmp_path / command[-1]).resolve() == run_dir.resolve()
    resumed = subprocess.run([*command, "-q", "--no-plots"], cwd=tmp_path,  # as printed
                             env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    want = read_jsonl(next((tmp_path / "clean").iterdir()) / "history.jsonl")
    assert without_time(read_jsonl(run_dir / "history.jsonl")) == without_time(want)


def _ignoring(*signums):
    """A Popen ``preexec_fn``: the child starts with these signals ignored, as ``nohup`` (SIGHUP) and a
    shell script's background job (SIGINT) start it."""
    def preexec():
        for signum in signums:
            signal.signal(signum, signal.SIG_IGN)
    return preexec


@pytest.mark.parametrize("ignored", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_the_run_was_started_ignoring_stays_ignored_and_the_others_still_stop_it(ignored, tmp_path):
    """``nohup diloco train ...`` keeps training when its terminal closes: a signal ignored at start
    is left ignored (as Python leaves an ignored SIGINT), while SIGTERM still stops the run as usual."""
    proc = diloco(*LONG, "--runs-dir", tmp_path, preexec_fn=_ignoring(ignored))
    try:
        run_dir = wait_for_rounds(tmp_path, 2)
        proc.send_signal(ignored)
        seen = len((run_dir / "history.jsonl").read_bytes().splitlines())
        wait_for_rounds(tmp_path, seen + 50, proc=proc)  # the run goes on: handled, the signal would end it
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.startswith("diloco train: interrupted by SIGTERM; round "), err
    assert json.loads((run_dir / "summary.json").read_text())["signal"] == "SIGTERM"


# From the first import on: a signal at each of these moments after the process starts.
EARLY = [(signal.SIGINT, d) for d in (0.02, 0.05, 0.15, 0.3, 0.5, 0.8, 1.2, 1.8)] + [
    (signal.SIGTERM, d) for d in (0.1, 0.6, 1.4)] + [(signal.SIGHUP, d) for d in (0.1, 0.6, 1.4)]


# The ``diloco`` script, from the moment its handlers are in place (a signal in Python's own start-up, or in
# the millisecond before diloco's first line has run, is Python's): a thread says "ready" as soon as all three
# signals have left Python's defaults, while the main thread imports diloco and runs the command. The moments
# below count from there, so a busy machine that is slow to start the interpreter does not move them earlier.
SCRIPT = """import sys, threading, time, _signal
STOPS = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP)
DEFAULTS = [_signal.getsignal(s) for s in STOPS]
def ready():
    while any(_signal.getsignal(s) is d for s, d in zip(STOPS, DEFAULTS)):
        time.sleep(0.0001)
    print('ready', flush=True)
threading.Thread(target=ready, daemon=True).start()
sys.argv = ['diloco', *sys.argv[1:]]
from diloco.tools.cli.main import main
raise SystemExit(main())
"""


@pytest.mark.slow
def test_a_signal_at_any_early_moment_is_one_line_and_leaves_nothing_half_made(tmp_path):
    outcomes = []
    for index, (sig, delay) in enumerate(EARLY):
        runs_dir = tmp_path / f"runs{index}"
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, *LONG, "--runs-dir", str(runs_dir)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        assert proc.stdout.readline() == "ready\n"
        time.sleep(delay)
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()
        outcomes.append((signal.Signals(sig).name, delay, proc.returncode, err))
        folders = list(runs_dir.iterdir()) if runs_dir.exists() else []
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, (sig, delay, err)
        assert proc.returncode == 128 + sig, (sig, delay, proc.returncode, err)
        assert len(folders) <= 1
        for folder in folders:  # made whole, and says how it ended
            assert {"config.json", "environment.json", "summary.json"} <= {p.name for p in folder.iterdir()}, folder
            assert json.loads((folder / "summary.json").read_text())["status"] == "interrupted"
            assert "--resume" in err
        if not folders:
            assert "nothing was written" in err, err


# --- the run's own code ---------------------------------------------------------------------------

def test_the_source_hash_sees_an_uncommitted_edit_and_the_constraints_file_is_named(tmp_path):
    package = tmp_path / "diloco"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    before = source_record(package)
    (package / "sub" / "b.py").write_text("y = 3\n")  # an edit that no commit records
    after = source_record(package)
    assert before["sha256"] != after["sha256"] and before["files"] == after["files"] == 2
    (package / "sub" / "b.py").write_text("y = 2\n")
    assert source_record(package) == before
    (package / "sub" / "b.py").rename(package / "b.py")  # a moved file is other code too
    assert source_record(package)["sha256"] != before["sha256"]
    assert constraints_record(tmp_path) is None
    (tmp_path / "constraints.txt").write_text("numpy==2.0\n")
    assert constraints_record(tmp_path)["file"] == "constraints.txt"


def _run_with_other_code(tmp_path, capsys) -> Path:
    status, _, err = run_cli(["train", *SHORT[:4], "--rounds", "4", *SHORT[6:], "--runs-dir", tmp_path], capsys)
    assert status == 0, err
    run_dir = next(tmp_path.iterdir())
    environment = json.loads((run_dir / "environment.json").read_text())
    assert environment["source"] == source_record() and "constraints" in environment
    environment["source"] = {"version": "0.0.9", "sha256": "ab" * 32, "files": 1}
    (run_dir / "environment.json").write_text(json.dumps(environment))
    history = run_dir / "history.jsonl"  # as if killed during round 4 (its checkpoint never written)
    history.write_text("".join(line + "\n" for line in history.read_text().splitlines()[:3]))
    for manifest in sorted((run_dir / "checkpoints").glob("diloco-round000004.*")):
        manifest.unlink()
    return run_dir


def test_resume_on_other_code_is_refused_naming_both(tmp_path, capsys):
    run_dir = _run_with_other_code(tmp_path, capsys)
    before = (run_dir / "history.jsonl").read_bytes()
    status, _, err = run_cli(["train", "--resume", run_dir, "-q", "--no-plots"], capsys)
    line, = err.strip().splitlines()
    assert status == 2 and "diloco 0.0.9 (source sha256 abababababab)" in line
    assert f"this is diloco {source_record()['version']} (source sha256 {source_record()['sha256'][:12]})" in line
    assert "--allow-code-change" in line and (run_dir / "history.jsonl").read_bytes() == before


def test_allow_code_change_resumes_and_records_the_change(tmp_path, capsys):
    run_dir = _run_with_other_code(tmp_path, capsys)
    status, _, err = run_cli(["train", "--resume", run_dir, "--allow-code-change", "-q", "--no-plots"], capsys)
    assert status == 0, err
    records = read_jsonl(run_dir / "history.jsonl")
    assert [r["round"] for r in records] == [1, 2, 3, 4]
    assert not any("code_change" in record for record in records[:3])
    change = records[3]["code_change"]  # the first record written on the new code
    assert change["from"]["sha256"] == "ab" * 32 and change["to"] == source_record()
    assert change["after_rounds"] == {"diloco": 3}
    environment = json.loads((run_dir / "environment.json").read_text())
    assert environment["source"] == source_record() and environment["code_changes"] == [change]
    status, _, err = run_cli(["train", "--resume", run_dir, "-q", "--no-plots"], capsys)  # now its own code
    assert status == 0, err
