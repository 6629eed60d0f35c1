"""Resume is bit-identical: a run stopped at any point and resumed ends exactly where an
uninterrupted run ends (params bit for bit, history equal), for DiLoCo and the baseline,
IID and non-IID, float32 and float64.

The first tests drive ``diloco.tools.training.train_resumable`` in-process; the last ones
kill a real ``python -m diloco train`` process with SIGKILL at several points (between
rounds, in the middle of a round, in the middle of writing a checkpoint, at a moment
picked by the clock) and resume it with ``diloco train --resume``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from diloco import DiLoCoConfig, train_diloco, train_synchronous_baseline
from diloco.data import load_digits_split
from diloco.tools.checkpoint import list_checkpoints, load_checkpoint
from diloco.tools.training import train_resumable

DATA = load_digits_split(0)
MILESTONE_TRAINERS = {"diloco": train_diloco, "sync": train_synchronous_baseline}
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


FAST_CASES = [(algo, iid, dtype, layout) for algo, iid, dtype in CASES for layout in ("stacked", "per-worker")
              if algo == "diloco" or layout == "stacked"]


@pytest.mark.parametrize("algo, iid, dtype, layout", FAST_CASES)
def test_the_fast_engine_resumes_bit_identically_too(algo, iid, dtype, layout, tmp_path, monkeypatch):
    pytest.importorskip("diloco.engine")
    from diloco.engine import trainers

    # Force the layout ``auto`` would not pick for this size: both code paths must resume.
    monkeypatch.setattr(trainers, "choose_layout", lambda *args, **kwargs: layout)
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
