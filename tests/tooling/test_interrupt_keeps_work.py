"""An interrupt keeps the work: a signal mid-round writes the last finished round, and ``--resume``
continues after it to exactly the run that was never interrupted.

In-process, ``train_resumable`` is stopped by a ``KeyboardInterrupt`` (what ``diloco.runtime.stop_signals``
raises for SIGINT, SIGTERM and SIGHUP) in the middle of a round, without ``checkpoint_every``,
for the course's algorithms and for families whose state is more than params and moments
(error feedback, asynchrony, streaming fragments, Muon), on both engines. A stop in the
middle of a checkpoint's write leaves no temporary file and no arrays without a manifest.
Then a real ``diloco train --rounds 200`` is stopped by SIGINT after round 25 and resumed with
the command its message prints, as printed.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from diloco import DiLoCoConfig
from diloco.data import load_digits_split
from diloco.tools.runs import atomic_files
from diloco.tools.runs.checkpoint import list_checkpoints
from diloco.tools.runs.folders import read_jsonl
from diloco.tools.runs.training import train_resumable

DATA = load_digits_split(0)
X, Y, X_EVAL, Y_EVAL = DATA.x_train, DATA.y_train, DATA.x_test, DATA.y_test
BASE = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=6, hidden_sizes=(8, 8), batch_size=8, seed=3)
FAMILIES = {
    "plain": {},
    "topk-error-feedback": dict(family={"topk": 0.25, "error_feedback": True}),
    "async": dict(asynchrony={"asynchronous": True, "step_times": (1.0, 2.5)}),
    "streaming": dict(family={"fragments": 2}),
    "muon": dict(inner_optimizer="muon"),
}


def stop_in_round(at: int):
    """An ``on_round`` that raises ``KeyboardInterrupt`` once, as round ``at`` ends: the
    history writer's moment, before the checkpoint hook has seen the round."""
    state = {"armed": True}

    def on_round(record):
        if state["armed"] and record["round"] == at:
            state["armed"] = False
            raise KeyboardInterrupt

    return on_round


def same_run(got, want) -> bool:
    return all(got.params[k].tobytes() == want.params[k].tobytes() for k in want.params) and \
        got.history == want.history


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_interrupt_without_checkpoint_every_saves_the_last_finished_round(family, engine, tmp_path):
    config = BASE.replace(engine=engine, **FAMILIES[family])
    want = train_resumable("diloco", X, Y, config, x_eval=X_EVAL, y_eval=Y_EVAL)
    with pytest.raises(KeyboardInterrupt):
        train_resumable("diloco", X, Y, config, x_eval=X_EVAL, y_eval=Y_EVAL, checkpoint_dir=tmp_path,
                        on_round=stop_in_round(4))
    assert [p.name for p in list_checkpoints(tmp_path, "diloco")] == ["diloco-round000003.json"]
    seen = []
    got = train_resumable("diloco", X, Y, config, x_eval=X_EVAL, y_eval=Y_EVAL, resume_from=tmp_path,
                          on_round=seen.append)
    assert [r["round"] for r in seen] == [4, 5, 6]  # continues at the round after the saved one
    assert same_run(got, want)


def test_an_interrupt_in_the_first_round_saves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        train_resumable("diloco", X, Y, BASE, x_eval=X_EVAL, y_eval=Y_EVAL, checkpoint_dir=tmp_path,
                        on_round=stop_in_round(1))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["callback", "keep"])
def test_a_signal_while_a_round_ends_saves_the_round_the_history_holds(where, tmp_path, monkeypatch):
    """A real SIGINT landing while round 4 is being written to the history (``where="callback"``)
    or kept for the interrupt (``"keep"``) waits for both (``stop_signals.deferred``): the round
    saved is round 4, the last round the history holds, never round 3 beside a history of 4."""
    from diloco.runtime import stop_signals
    from diloco.tools.runs import training

    history = []

    def send_sigint():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the handler runs here, inside the block: it must only note the signal

    def on_round(record):
        history.append(record["round"])
        if where == "callback" and record["round"] == 4:
            send_sigint()

    real_frozen = training.frozen

    def frozen_then_signal(state):
        if where == "keep" and state.round == 4:
            send_sigint()
        return real_frozen(state)

    monkeypatch.setattr(training, "frozen", frozen_then_signal)
    with stop_signals.session(), pytest.raises(KeyboardInterrupt):
        train_resumable("diloco", X, Y, BASE, x_eval=X_EVAL, y_eval=Y_EVAL, checkpoint_dir=tmp_path,
                        on_round=on_round)
    assert history == [1, 2, 3, 4]
    assert [p.name for p in list_checkpoints(tmp_path, "diloco")] == ["diloco-round000004.json"]


@pytest.mark.parametrize("which", [1, 2])  # the arrays' write, the manifest's write
def test_a_signal_during_a_checkpoint_write_leaves_no_partial_file(which, tmp_path, monkeypatch):
    """The write after round 2 (``checkpoint_every=2``) is stopped in its ``which``-th file:
    no ``.tmp`` and no arrays without a manifest are left; round 2 is then written whole
    (the interrupt's save) and the resume is the uninterrupted run."""
    want = train_resumable("diloco", X, Y, BASE, x_eval=X_EVAL, y_eval=Y_EVAL)
    real_fsync, calls = os.fsync, []

    def fsync_then_stop(fd):  # a signal right after a file's bytes are written, before its rename
        real_fsync(fd)
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(".diloco-round000002"):
            calls.append(fd)
            if len(calls) == which:
                raise KeyboardInterrupt

    monkeypatch.setattr(atomic_files.os, "fsync", fsync_then_stop)
    saved_names = []

    def spy(path, round_index):
        saved_names.append(sorted(p.name for p in tmp_path.iterdir()))

    with pytest.raises(KeyboardInterrupt):
        train_resumable("diloco", X, Y, BASE, x_eval=X_EVAL, y_eval=Y_EVAL, checkpoint_dir=tmp_path,
                        checkpoint_every=2, on_checkpoint=spy)
    # the stop inside the write came first; the interrupt's save wrote round 2 again, whole
    assert len(calls) == which + 2 and saved_names == [["diloco-round000002.json", "diloco-round000002.npz"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["diloco-round000002.json", "diloco-round000002.npz"]
    got = train_resumable("diloco", X, Y, BASE, x_eval=X_EVAL, y_eval=Y_EVAL, resume_from=tmp_path)
    assert same_run(got, want)


def test_a_stopped_write_removes_its_own_files(tmp_path, monkeypatch):
    """``save_checkpoint`` alone: a stop during the manifest removes the arrays it had just written."""
    from diloco.tools.runs import checkpoint

    def stop(path, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "atomic_write_text", stop)
    state = train_resumable("diloco", X, Y, BASE.replace(rounds=1), x_eval=X_EVAL, y_eval=Y_EVAL)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(tmp_path, "diloco", 1, BASE, state.params, None, [], np.random.default_rng(0),
                                   [], "fingerprint")
    assert list(tmp_path.iterdir()) == []


def test_a_signal_that_breaks_a_clean_up_is_still_that_signal():
    """An error raised after a stop signal (a clean-up the signal cut short) is the signal again;
    with no signal raised, an error is itself."""
    from diloco.runtime import stop_signals

    with stop_signals.session():
        with pytest.raises(ValueError, match="its own"), stop_signals.signal_first():
            raise ValueError("its own")
        with pytest.raises(stop_signals.Stopped) as caught, stop_signals.signal_first():
            try:
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(1)
            finally:
                raise ValueError("Can't close the ZIP file while there is an open writing handle on it")
    assert caught.value.name == "SIGHUP" and isinstance(caught.value.__cause__, ValueError)


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # zipfile's close from __del__
@pytest.mark.parametrize("where", ["savez", "prune"])
def test_a_sighup_that_breaks_a_clean_up_ends_the_run_as_interrupted(where, tmp_path, monkeypatch, capsys):
    """The flake CI saw (exit 2, not 129): SIGHUP landed while ``np.savez`` zipped a checkpoint,
    between ``zipfile``'s ``_writing = True`` and the writer it returns, and the archive's close
    raised ``ValueError`` over the signal (``where="savez"``: the archive is now made whole first,
    ``npz_bytes``). ``"prune"``: a clean-up cut short by the signal raises ``OSError`` instead
    (``stop_signals.signal_first``). Either way the run ends interrupted by SIGHUP (129, one line,
    status "interrupted"), and the command it prints finishes it as the uninterrupted run."""
    import json
    import zipfile

    from cli_helpers import only_run_dir, run_cli

    from diloco.tools.runs import checkpoint

    argv = ["train", "-K", "2", "-H", "3", "--rounds", "6", "--hidden-sizes", "8", "--batch-size", "8", "-q",
            "--no-plots", "--checkpoint-every", "1"]
    assert run_cli([*argv, "--runs-dir", tmp_path / "clean"], capsys)[0] == 0
    owner, name = (zipfile._ZipWriteFile, "__init__") if where == "savez" else (checkpoint, "_prune")
    real, calls = getattr(owner, name), []

    def after_a_signal(*args, **kwargs):
        calls.append(1)
        if len(calls) == (40 if where == "savez" else 3):  # inside round 3's checkpoint
            try:
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(1)  # the handler raises here: zipfile's _writing stays True
            finally:
                if where == "prune":
                    raise OSError(5, "Input/output error")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, after_a_signal)
    status, _, err = run_cli([*argv, "--runs-dir", tmp_path / "runs"], capsys)
    monkeypatch.undo()
    run_dir = only_run_dir(tmp_path / "runs")
    line, = err.strip().splitlines()
    assert status == 129 and "interrupted by SIGHUP; round " in line, err
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    command = shlex.split(line.split(" with: ")[1])
    assert command[-3:-1] == ["train", "--resume"], line
    assert run_cli(command[-3:], capsys)[:3:2] == (0, "")
    want, got = np.load(only_run_dir(tmp_path / "clean") / "params-diloco.npz"), np.load(run_dir / "params-diloco.npz")
    assert all(want[k].tobytes() == got[k].tobytes() for k in want.files)


# --- the command line: train --rounds 200, SIGINT after round 25, resumed as printed --------------

ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
RUN = ["train", "--rounds", "200", "-K", "2", "-H", "20", "--hidden-sizes", "16", "--batch-size", "8", "-q",
       "--no-plots"]  # about 30 ms a round: the signal after round 25 lands long before round 200


def interrupted_after(rounds: int, runs_dir, cwd) -> tuple:
    """(process, its stderr, its run folder): ``RUN`` stopped by SIGINT once ``rounds`` rounds are written."""
    proc = subprocess.Popen([sys.executable, "-m", "diloco", *RUN, "--runs-dir", runs_dir], env=ENV, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, found = time.monotonic() + 120, []
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(runs_dir.glob("*/history.jsonl"))
            if found and len(found[0].read_bytes().splitlines()) >= rounds:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    found = list(runs_dir.glob("*/history.jsonl"))
    assert found, f"no run folder after {time.monotonic() - deadline + 120:.0f} s; exit {proc.returncode}: {err}"
    return proc, err, found[0].parent


@pytest.mark.slow
def test_train_200_rounds_stopped_at_round_25_resumes_at_26_and_ends_identical(tmp_path):
    clean = subprocess.run([sys.executable, "-m", "diloco", *RUN, "--runs-dir", tmp_path / "clean"], env=ENV,
                           capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, clean.stderr
    for attempt in range(3):  # a machine so loaded that the run ends before the signal: try again, then skip
        proc, err, run_dir = interrupted_after(25, tmp_path / f"runs{attempt}", tmp_path)
        if proc.returncode != 0:
            break
    else:
        pytest.skip("the run finished before the signal, three times")
    line, = err.strip().splitlines()
    match = re.fullmatch(r"diloco train: interrupted by SIGINT; round (\d+) of 200 is saved; "
                         r"continue from round (\d+) with: (.*)", line)
    assert match and proc.returncode == 130, line
    saved = int(match[1])
    assert 25 <= saved < 200 and int(match[2]) == saved + 1
    assert [p.name for p in list_checkpoints(run_dir / "checkpoints", "diloco")] == [
        f"diloco-round{saved:06d}.json"]
    resumed = subprocess.run(shlex.split(match[3]), cwd=tmp_path, env=ENV, capture_output=True, text=True,
                             timeout=600)  # the command as printed
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {shlex.split(match[3])[-1]}: diloco after round {saved}" in resumed.stdout
    clean_dir = next((tmp_path / "clean").iterdir())
    strip = [{k: v for k, v in r.items() if k != "time"} for r in read_jsonl(clean_dir / "history.jsonl")]
    assert [{k: v for k, v in r.items() if k != "time"} for r in read_jsonl(run_dir / "history.jsonl")] == strip
    want, got = np.load(clean_dir / "params-diloco.npz"), np.load(run_dir / "params-diloco.npz")
    assert all(want[k].tobytes() == got[k].tobytes() for k in want.files)
