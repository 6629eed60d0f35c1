"""Resume is bit-identical: a run stopped at any point and resumed ends exactly where an
uninterrupted run ends (params bit for bit, history equal), for DiLoCo and the baseline,
IID and non-IID, float32 and float64.

The first tests drive ``diloco.tools.runs.training.train_resumable`` in-process; the last ones
kill a real ``python -m diloco train`` process with SIGKILL at several points (between
rounds, in the middle of a round, in the middle of writing a checkpoint, at a moment
picked by the clock) and resume it with ``diloco train --resume``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import run_cli

from diloco import DiLoCoConfig
from diloco.core.driver import baseline_config
from diloco.data import load_digits_split
from diloco.tools.runs.checkpoint import list_checkpoints
from diloco.tools.runs.folders import read_jsonl
from diloco.tools.runs.training import train_resumable
from diloco.tools.studies.ablations import trainer

DATA = load_digits_split(0)
# The reference: the milestone trainer for the course's algorithm (IID, no mechanism), the
# driver on the reference executor otherwise (tests/tooling/test_core.py pins the two together).
MILESTONE_TRAINERS = {"diloco": trainer("diloco"), "sync": trainer("sync")}
CASES = [(algo, iid, dtype) for algo in ("diloco", "sync") for iid in (True, False) for dtype in ("float64", "float32")]


def tiny_config(iid=True, dtype="float64", rounds=4) -> DiLoCoConfig:
    return DiLoCoConfig(num_workers=3, inner_steps=3, rounds=rounds, hidden_sizes=(8,), batch_size=8, iid=iid,
                        alpha=0.3, dtype=dtype, seed=5)


def data(dtype):
    return DATA.x_train.astype(dtype), DATA.y_train, DATA.x_test.astype(dtype), DATA.y_test


def assert_same_run(got, want) -> None:
    assert list(got.params) == list(want.params)
    for key in want.params:
        assert got.params[key].dtype == want.params[key].dtype
        assert np.array_equal(got.params[key], want.params[key]), key  # bit for bit, not close
    assert got.history == want.history


@pytest.mark.parametrize("algo, iid, dtype", CASES)
def test_the_driver_is_the_milestone_trainer_bit_for_bit(algo, iid, dtype):
    """No drift between ``train_resumable`` and the milestones 26/27 it re-composes."""
    config, (x, y, x_eval, y_eval) = tiny_config(iid, dtype), data(dtype)
    want = MILESTONE_TRAINERS[algo](x, y, config, x_eval=x_eval, y_eval=y_eval)
    seen = []
    got = train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, on_round=seen.append)
    assert_same_run(got, want)
    assert seen == want.history


@pytest.mark.parametrize("algo, iid, dtype", CASES)
def test_resuming_from_every_round_boundary_is_bit_identical(algo, iid, dtype, tmp_path):
    config, (x, y, x_eval, y_eval) = tiny_config(iid, dtype), data(dtype)
    want = MILESTONE_TRAINERS[algo](x, y, config, x_eval=x_eval, y_eval=y_eval)

    def keep_a_copy(manifest: Path, round_index: int) -> None:
        """The folder a process killed right after this checkpoint would leave."""
        folder = tmp_path / f"after{round_index}"
        folder.mkdir()
        for path in (manifest, manifest.with_suffix(".npz")):
            shutil.copy(path, folder / path.name)

    train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, checkpoint_dir=tmp_path / "run",
                    checkpoint_every=1, on_checkpoint=keep_a_copy)
    for stop in range(1, config.rounds + 1):
        seen = []
        got = train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval,
                              resume_from=tmp_path / f"after{stop}", on_round=seen.append)
        assert_same_run(got, want)
        assert seen == want.history[stop:]  # only the remaining rounds are trained and reported


# The paper's mechanisms (diloco.core.mechanisms) change what the state holds or how a step is
# taken: an lr schedule and clipping (the step count), outer Adam (a second moment and a step),
# dropped outer gradients (each worker's own start and the run rng's draws), size weights.
MECHANISMS = {
    "cosine-clip": dict(lr_schedule="cosine", warmup_steps=4, clip_norm=0.5),
    "outer-adam": dict(outer_optimizer="adam", outer_lr=0.01),
    "drops": dict(drop_prob=0.4),
    "size-weights-similarity": dict(iid=False, shard_weighting="size", record_similarity=True),
}


@pytest.mark.parametrize("algo", ["diloco", "sync"])
@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_mechanisms_are_carried_and_resumed_bit_identically(algo, mechanism, tmp_path):
    config, (x, y, x_eval, y_eval) = tiny_config().replace(**MECHANISMS[mechanism]), data("float64")
    if algo == "sync":  # the baseline refuses the outer gradient's mechanisms (test_core.py); keeps the rest
        config = baseline_config(config)
    want = MILESTONE_TRAINERS[algo](x, y, config, x_eval=x_eval, y_eval=y_eval)
    copies = {}

    def keep_a_copy(manifest: Path, round_index: int) -> None:
        copies[round_index] = tmp_path / f"after{round_index}"
        copies[round_index].mkdir()
        for path in (manifest, manifest.with_suffix(".npz")):
            shutil.copy(path, copies[round_index] / path.name)

    got = train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, checkpoint_dir=tmp_path / "run",
                          checkpoint_every=1, on_checkpoint=keep_a_copy)
    assert_same_run(got, want)
    for stop in range(1, config.rounds):
        assert_same_run(train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval,
                                        resume_from=copies[stop]), want)


@pytest.mark.parametrize("algo", ["diloco", "sync"])
def test_the_character_level_task_resumes_bit_identically(algo, tmp_path):
    from diloco.text import OneHot, char_windows

    ids = np.random.default_rng(3).integers(0, 5, 400)
    x, y = char_windows(ids, 3)
    encode = OneHot(5, 3)
    config = tiny_config(dtype="float32").replace(num_workers=2)
    kwargs = dict(x_eval=x[-40:], y_eval=y[-40:], encode=encode)
    want = MILESTONE_TRAINERS[algo](x[:-40], y[:-40], config, **kwargs)
    train_resumable(algo, x[:-40], y[:-40], config, checkpoint_dir=tmp_path, checkpoint_every=2, **kwargs)
    for manifest in list_checkpoints(tmp_path, algo)[1:]:  # keep only round 2's checkpoint
        manifest.unlink()
        manifest.with_suffix(".npz").unlink()
    assert_same_run(train_resumable(algo, x[:-40], y[:-40], config, resume_from=tmp_path, **kwargs), want)


FAST_CASES = [(algo, iid, dtype, layout) for algo, iid, dtype in CASES for layout in ("stacked", "per-worker")
              if algo == "diloco" or layout == "stacked"]


@pytest.mark.parametrize("algo, iid, dtype, layout", FAST_CASES)
def test_the_fast_engine_resumes_bit_identically_too(algo, iid, dtype, layout, tmp_path, monkeypatch):
    pytest.importorskip("diloco.engine")
    from diloco.engine import fast

    # Force the layout ``auto`` would not pick for this size: both code paths must resume.
    monkeypatch.setattr(fast, "choose_layout", lambda *args, **kwargs: layout)
    config, (x, y, x_eval, y_eval) = tiny_config(iid, dtype).replace(engine="fast"), data(dtype)
    want = train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval)
    copies = {}

    def keep_a_copy(manifest: Path, round_index: int) -> None:
        copies[round_index] = tmp_path / f"after{round_index}"
        copies[round_index].mkdir()
        for path in (manifest, manifest.with_suffix(".npz")):
            shutil.copy(path, copies[round_index] / path.name)

    uninterrupted = train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, checkpoint_dir=tmp_path / "run",
                                    checkpoint_every=1, on_checkpoint=keep_a_copy)
    assert_same_run(uninterrupted, want)
    for stop in range(1, config.rounds):
        assert_same_run(train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval,
                                        resume_from=copies[stop]), want)


# --- a real process, killed with SIGKILL, resumed with --resume ------------------------------

KILLER = '''
"""python kill_at.py POINT ROUND diloco-args...: run `diloco`, SIGKILL itself at POINT of round ROUND."""
import os, signal, sys

import diloco.tools.runs.training as training
from diloco.tools.runs import checkpoint
from diloco.tools.cli.main import main

point, at = sys.argv[1], int(sys.argv[2])


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_round(path):
    name = os.path.basename(path)
    return int(name.split("round")[1][:6]) if "-round" in name and name.endswith((".npz", ".json")) else None


if point == "after-checkpoint":  # checkpoint ROUND is complete on disk, the next round not begun
    real_save = checkpoint.save_checkpoint

    def save(directory, algo, round_index, *args, **kwargs):
        path = real_save(directory, algo, round_index, *args, **kwargs)
        if round_index == at:
            die()
        return path

    training.save_checkpoint = save
elif point in ("mid-npz", "between-files"):  # the .npz written but not renamed / renamed, manifest not
    real_replace = os.replace
    suffix = ".npz" if point == "mid-npz" else ".json"

    def replace(source, target, *args, **kwargs):
        if checkpoint_round(str(target)) == at and str(target).endswith(suffix):
            die()
        return real_replace(source, target, *args, **kwargs)

    os.replace = replace
elif point == "mid-history":  # half of round ROUND's history line written
    real_write = os.write
    lines = []

    def write(fd, data):
        if data.startswith(b'{"algo"'):
            lines.append(data)
            if len(lines) == at:
                real_write(fd, data[: len(data) // 2])
                die()
        return real_write(fd, data)

    os.write = write
elif point == "mid-round":  # inside round ROUND, half-way through its inner steps
    import diloco.models.mlp as mlp
    import diloco.sharding as sharding
    steps_per_round = int(os.environ["STEPS_PER_ROUND"])
    calls = [0]

    def counting(real):
        def step(*args, **kwargs):
            calls[0] += 1
            if calls[0] == (at - 1) * steps_per_round + steps_per_round // 2:
                die()
            return real(*args, **kwargs)
        return step

    sharding.local_train_step = counting(sharding.local_train_step)  # DiLoCo's workers
    mlp.model_backward = counting(mlp.model_backward)  # the baseline's steps (MLPModel.loss_and_grads)
else:
    raise SystemExit(f"unknown point {point}")
sys.exit(main(sys.argv[3:]))
'''

SMALL = ["-K", "2", "-H", "3", "--rounds", "4", "--hidden-sizes", "8", "--batch-size", "8", "-q", "--no-plots"]
RUNS = {
    "diloco-iid-f64": ["train", "--algo", "diloco", *SMALL, "--checkpoint-every", "1"],
    "sync-noniid-f32": ["train", "--algo", "sync", *SMALL, "--noniid", "--dtype", "float32", "--checkpoint-every", "2"],
    "compare": ["compare", *SMALL, "--checkpoint-every", "1"],
    "fast-engine": ["train", "--algo", "diloco", *SMALL, "--engine", "fast", "--checkpoint-every", "1"],
}
KILLS = [
    ("diloco-iid-f64", "after-checkpoint", 2),
    ("diloco-iid-f64", "mid-round", 3),
    ("diloco-iid-f64", "mid-npz", 2),
    ("diloco-iid-f64", "between-files", 3),
    ("diloco-iid-f64", "mid-history", 2),
    ("sync-noniid-f32", "mid-round", 4),
    ("sync-noniid-f32", "between-files", 2),
    ("compare", "mid-round", 2),  # in the baseline's round 2: DiLoCo is complete, the baseline half-way
    ("fast-engine", "after-checkpoint", 1),
]


def _checkpoint_names(run_dir: Path) -> list:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def _left_after_checkpoint(run_dir, at):
    assert max(int(name[-11:-5]) for name in _checkpoint_names(run_dir) if name.endswith(".json")) == at


def _left_mid_npz(run_dir, at):
    assert any(name.startswith(f".diloco-round{at:06d}.npz.") for name in _checkpoint_names(run_dir))


def _left_between_files(run_dir, at):
    names = _checkpoint_names(run_dir)
    assert any(name.endswith(f"round{at:06d}.npz") for name in names)
    assert not any(name.endswith(f"round{at:06d}.json") for name in names)


def _left_mid_history(run_dir, at):
    assert not (run_dir / "history.jsonl").read_bytes().endswith(b"\n")  # a torn last line


def _left_mid_round(run_dir, at):
    assert read_jsonl(run_dir / "history.jsonl")[-1]["round"] == at - 1  # round `at` had begun, not ended


LEFT_BEHIND = {"after-checkpoint": _left_after_checkpoint, "mid-npz": _left_mid_npz,
               "between-files": _left_between_files, "mid-history": _left_mid_history, "mid-round": _left_mid_round}


def diloco_process(*argv, env_extra=None, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", **(env_extra or {})}
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, timeout=120, env=env,
                          **popen)


def finished_run(run_dir: Path, algos) -> tuple[dict, list]:
    """The final params of each algorithm and the history without its clock readings."""
    params = {}
    for algo in algos:
        with np.load(run_dir / f"params-{algo}.npz") as saved:
            params[algo] = {key: saved[key] for key in saved.files}
    history = [{k: v for k, v in record.items() if k != "time"}
               for record in read_jsonl(run_dir / "history.jsonl")]
    return params, history


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each run of ``RUNS``, never stopped: what every resumed run must reproduce exactly."""
    cache = {}

    def get(name):
        if name not in cache:
            folder = tmp_path_factory.mktemp(f"clean-{name}")
            done = diloco_process("-m", "diloco", *RUNS[name], "--runs-dir", folder)
            assert done.returncode == 0, done.stderr
            cache[name] = finished_run(only_folder(folder), _algos(name))
        return cache[name]

    return get


def only_folder(parent: Path) -> Path:
    (folder,) = [p for p in parent.iterdir() if p.is_dir()]
    return folder


def _algos(name: str) -> tuple:
    return ("diloco", "sync") if name == "compare" else (RUNS[name][RUNS[name].index("--algo") + 1],)


@pytest.mark.parametrize("name, point, at", KILLS)
def test_sigkill_then_resume_is_bit_identical(name, point, at, tmp_path, uninterrupted):
    script = tmp_path / "kill_at.py"
    script.write_text(KILLER)
    runs_dir = tmp_path / "runs"
    killed = diloco_process(script, point, at, *RUNS[name], "--runs-dir", runs_dir,
                            env_extra={"STEPS_PER_ROUND": "6"})  # K * H calls per round in both paths
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run_dir = only_folder(runs_dir)
    LEFT_BEHIND[point](run_dir, at)  # the kill struck where it was meant to
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "running"  # what a kill leaves
    command = RUNS[name][0]
    resumed = diloco_process("-m", "diloco", command, "--resume", run_dir, "-q", "--no-plots")
    assert resumed.returncode == 0, resumed.stderr
    params, history = finished_run(run_dir, _algos(name))
    want_params, want_history = uninterrupted(name)
    assert history == want_history
    for algo, want in want_params.items():
        assert list(params[algo]) == list(want)
        for key in want:
            assert np.array_equal(params[algo][key], want[key]), (algo, key)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert not [p for p in run_dir.rglob("*.tmp")]


def test_sigkill_from_outside_at_a_moment_picked_by_the_clock(tmp_path):
    """Not at a chosen line of code: the process is killed whenever it is, twice, and resumed twice."""
    argv = ["-K", "2", "-H", "10", "--rounds", "40", "--hidden-sizes", "16", "-q", "--no-plots",
            "--checkpoint-every", "3"]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    runs_dir = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "diloco", "train", *argv, "--runs-dir", str(runs_dir)], env=env)
    for attempt in range(2):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            found = list(runs_dir.glob("*/checkpoints/*.json"))
            if found and max(int(p.stem[-6:]) for p in found) >= 6 * (attempt + 1):
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        if attempt == 0:
            proc = subprocess.Popen([sys.executable, "-m", "diloco", "train", "--resume",
                                     str(only_folder(runs_dir)), "-q", "--no-plots"], env=env)
    run_dir = only_folder(runs_dir)
    resumed = diloco_process("-m", "diloco", "train", "--resume", run_dir, "-q", "--no-plots")
    assert resumed.returncode == 0, resumed.stderr
    clean = diloco_process("-m", "diloco", "train", *argv, "--runs-dir", tmp_path / "clean")
    assert clean.returncode == 0, clean.stderr
    assert _same(finished_run(run_dir, ["diloco"]), finished_run(only_folder(tmp_path / "clean"), ["diloco"]))


def _same(got, want) -> bool:
    (got_params, got_history), (want_params, want_history) = got, want
    return got_history == want_history and all(
        np.array_equal(got_params[a][k], want_params[a][k]) for a in want_params for k in want_params[a])


def test_a_run_stopped_while_its_folder_was_made_says_nothing_was_saved_and_starts_again_as_printed(tmp_path,
                                                                                                      capsys,
                                                                                                      monkeypatch):
    """SIGKILL between config.json and environment.json (``start_run``): no checkpoint, no code
    record. The resume says so and prints the command that starts the run again; that command,
    run as printed, trains the same run (same config, data and result)."""
    monkeypatch.chdir(tmp_path)
    argv = ["compare", "-K", "2", "-H", "2", "--rounds", "2", "--hidden-sizes", "8", "--batch-size", "8", "-q",
            "--no-plots", "--runs-dir", "runs"]
    assert run_cli(argv, capsys)[0] == 0
    (run_dir,) = Path("runs").iterdir()
    want = {p.name: dict(np.load(p)) for p in run_dir.glob("params-*.npz")}
    for name in ("environment.json", "summary.json", "history.jsonl", "params-diloco.npz", "params-sync.npz"):
        (run_dir / name).unlink()
    shutil.rmtree(run_dir / "checkpoints")
    status, _, err = run_cli(["compare", "--resume", run_dir], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "was stopped before its first round" in err and "nothing was saved; start it again with: " in err, err
    printed = shlex.split(err.strip().split("start it again with: ", 1)[1])
    status, _, err = run_cli([*printed[printed.index("compare"):], "-q", "--no-plots"], capsys)
    assert status == 0, err
    (again,) = [p for p in Path("runs").iterdir() if p != run_dir]
    got = {p.name: dict(np.load(p)) for p in again.glob("params-*.npz")}
    assert got.keys() == want.keys() and all(np.array_equal(got[f][k], want[f][k]) for f in want for k in want[f])
