"""Checks once per call tree: a direct call checks fully, nested milestone calls skip.

The milestone tests prove each function's checks on direct calls (their bad-input
tests). These tests prove the other half: inside a call tree the inner checks are
skipped, so their cost does not grow with the number of steps, and the depth
bookkeeping survives exceptions.
"""

from __future__ import annotations

import numpy as np
import pytest

import diloco
from diloco import _validation
from diloco._validation import call_depth, check_args
from diloco.config import AdamWConfig, DiLoCoConfig


def _problem(n=40, d=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    y = rng.integers(0, classes, n)
    params = diloco.init_model_params((d, 7, classes), np.random.default_rng(1))
    return x, y, params


def _count_array_checks(monkeypatch) -> list:
    calls = []
    original = check_args.check_float_array

    def counting(x, name, **kwargs):
        calls.append(name)
        return original(x, name, **kwargs)

    monkeypatch.setattr(check_args, "check_float_array", counting)
    return calls


def test_inner_train_worker_checks_its_arguments_once_whatever_the_steps(monkeypatch):
    x, y, params = _problem()
    calls = _count_array_checks(monkeypatch)
    counts = []
    for steps in (1, 25):
        calls.clear()
        diloco.inner_train_worker(params, diloco.init_adamw_state(params), x, y, steps, 8, AdamWConfig(),
                                  np.random.default_rng(0))
        counts.append(len(calls))
    # The worker's own checks only: the H steps' sampling, forward, loss, backward and
    # AdamW calls skip theirs, so the count does not grow with H.
    assert counts[0] == counts[1]
    assert calls.count("x_shard") == 1
    assert not {"x", "logits", "x_batch", "grads['W1']"} & set(calls)


def test_direct_calls_still_check(monkeypatch):
    x, y, params = _problem()
    calls = _count_array_checks(monkeypatch)
    logits, _ = diloco.model_forward(params, x)
    assert "x" in calls
    bad = dict(params, W1=np.full_like(params["W1"], np.nan))
    with pytest.raises(ValueError, match=r"params\['W1'\].*finite"):
        diloco.model_forward(bad, x)
    with pytest.raises(ValueError, match="labels"):
        diloco.cross_entropy_loss(logits, y + 10)


def test_training_checks_the_data_once_not_per_step(monkeypatch):
    x, y, _ = _problem(n=64)
    calls = _count_array_checks(monkeypatch)
    counts = []
    for rounds in (1, 4):
        calls.clear()
        config = DiLoCoConfig(num_workers=2, inner_steps=5, rounds=rounds, batch_size=4, hidden_sizes=(6,))
        diloco.train_diloco(x, y, config, x_eval=x, y_eval=y)
        diloco.train_synchronous_baseline(x, y, config, x_eval=x, y_eval=y)
        counts.append(len(calls))
    assert counts[0] == counts[1]  # nothing is checked per round or per step
    assert "x_shard" not in calls and "x_batch" not in calls and "x_eval" not in calls


def test_depth_is_restored_after_an_exception():
    x, y, params = _problem()
    assert call_depth() == 0
    with pytest.raises(ValueError):
        diloco.local_train_step(params, diloco.init_adamw_state(params), x, y + 10, AdamWConfig())
    assert call_depth() == 0
    # and a later direct call checks again
    with pytest.raises(ValueError, match="y_batch"):
        diloco.local_train_step(params, diloco.init_adamw_state(params), x, y + 10, AdamWConfig())


def test_outer_checkers_cover_what_they_pass_through():
    x, y, params = _problem()
    workers = [diloco.clone_params(params), diloco.clone_params(params)]
    with pytest.raises(ValueError, match="weights"):
        diloco.compute_outer_gradient(params, workers, weights=[-1.0, 1.0])
    with pytest.raises(ValueError, match="y_shard"):
        diloco.inner_train_worker(params, diloco.init_adamw_state(params), x, y + 10, 1, 4, AdamWConfig(),
                                  np.random.default_rng(0))
    config = DiLoCoConfig(num_workers=2, inner_steps=1, batch_size=4, hidden_sizes=(7,))
    states = [diloco.init_adamw_state(params)] * 2
    shards = [(x[:20], y[:20]), (x[20:, :3], y[20:])]
    with pytest.raises(ValueError, match=r"shards\[1\]\[0\]"):
        diloco.run_diloco_round(params, diloco.init_outer_optimizer(params), states, shards, config,
                                np.random.default_rng(0))
    with pytest.raises(TypeError, match=r"worker_states\[0\]"):
        diloco.run_diloco_round(params, diloco.init_outer_optimizer(params), [None, None], shards[:1] * 2,
                                config, np.random.default_rng(0))


def test_every_milestone_function_is_marked():
    from diloco.milestones import MILESTONES

    for m in MILESTONES:
        function = getattr(diloco, m.name)
        assert hasattr(function, "__wrapped__"), f"{m.name} is not decorated with @milestone"
    assert _validation.milestone.__name__ == "milestone"
