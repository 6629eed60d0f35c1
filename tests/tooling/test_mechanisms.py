"""The paper's mechanisms (``diloco.core.mechanisms``): each against a hand computation, and the
defaults against the course's algorithm bit for bit.

Milestone-level checks of the keyword extensions of milestones 25-27 (shard weights,
dropped outer gradients, ``encode``, the baseline's schedule and clipping) are in
``tests/test_loop.py``; this file checks the helpers themselves, the config fields, the
outer optimizers, the similarity record and the fast engine's refusals.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from diloco import DiLoCoConfig
from diloco.adamw import AdamWState, init_adamw_state
from diloco.config import AdamWConfig
from diloco.core.mechanisms import (
    clip_by_global_norm,
    draw_dropped,
    inner_lr,
    mean_pairwise_cosine,
    normalised_weights,
    pseudo_grad_weights,
    train_worker,
)
from diloco.core.outer import outer_optimizer
from diloco.model import init_model_params
from diloco.outer import OuterState, init_outer_optimizer
from diloco.sharding import inner_train_worker
from diloco.tools.studies.ablations import trainer

pytestmark = pytest.mark.tooling

# The reference executor: the milestone trainer for the course's algorithm, else the driver on it.
reference_diloco = trainer("diloco")


def _outer_step(params, delta, state, config):
    """The config's outer optimizer's step (the registry's ``update``)."""
    return outer_optimizer(config).update(params, delta, state, config)


def blobs(seed, n=40, d=5, classes=3):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    x = rng.normal(0, 2, (classes, d))[y] + rng.normal(0, 1, (n, d))
    return x, y.astype(np.int64)


def small(**changes):
    base = dict(num_workers=3, inner_steps=4, rounds=3, batch_size=8, hidden_sizes=(6,), seed=3,
                inner=AdamWConfig(lr=0.02))
    return DiLoCoConfig(**{**base, **changes})


# --------------------------------------------------------------------------- the inner lr schedule


def test_constant_schedule_is_the_configured_lr():
    config = small()
    assert [inner_lr(config, s) for s in (1, 5, 12)] == [0.02, 0.02, 0.02]


def test_cosine_schedule_warms_up_linearly_then_decays_to_a_tenth():
    config = small(rounds=5, inner_steps=2, lr_schedule="cosine", warmup_steps=2, inner=AdamWConfig(lr=1.0))
    # T = 10 steps, W = 2: 0.5, 1.0, then 0.1 + 0.9 * (1 + cos(pi (s - 2) / 8)) / 2 down to 0.1 at s = 10
    expected = [0.5, 1.0] + [0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 2) / 8)) for s in range(3, 11)]
    np.testing.assert_allclose([inner_lr(config, s) for s in range(1, 11)], expected, rtol=1e-15)
    assert inner_lr(config, 10) == pytest.approx(0.1) and inner_lr(config, 2) == 1.0


# --------------------------------------------------------------------------- clipping


def test_clipping_rescales_to_the_max_norm_as_torch_does():
    grads = {"W1": np.array([[3.0]]), "b1": np.array([4.0])}  # global norm 5
    clipped, norm = clip_by_global_norm(grads, 1.0)
    assert norm == 5.0
    np.testing.assert_allclose(clipped["W1"], [[3.0 / (5.0 + 1e-6)]], rtol=1e-15)
    np.testing.assert_allclose(clipped["b1"], [4.0 / (5.0 + 1e-6)], rtol=1e-15)
    assert grads["W1"][0, 0] == 3.0, "clipping must not change its input"
    same, _ = clip_by_global_norm(grads, 10.0)
    assert same is grads, "below the threshold the gradients pass unchanged"
    assert clip_by_global_norm(grads, None)[0] is grads


# --------------------------------------------------------------------------- the worker


def worker_inputs(seed=0):
    x, y = blobs(seed)
    params = init_model_params((5, 6, 3), np.random.default_rng(seed))
    return params, init_adamw_state(params), x, y


def test_train_worker_at_the_defaults_is_milestone_20_bit_for_bit():
    params, state, x, y = worker_inputs()
    config = small()
    got = train_worker(params, state, x, y, config, np.random.default_rng(9))
    want = inner_train_worker(params, state, x, y, config.inner_steps, config.batch_size, config.inner,
                              np.random.default_rng(9))
    for key in params:
        assert np.array_equal(got[0][key], want[0][key]), key
        assert np.array_equal(got[1].m[key], want[1].m[key]) and np.array_equal(got[1].v[key], want[1].v[key])
    assert got[1].step == want[1].step and np.array_equal(got[2], want[2])


def test_train_worker_schedule_changes_the_steps_and_clipping_bounds_them():
    params, state, x, y = worker_inputs(1)
    plain = train_worker(params, state, x, y, small(), np.random.default_rng(2))
    scheduled = train_worker(params, state, x, y, small(lr_schedule="cosine", warmup_steps=2),
                             np.random.default_rng(2))
    assert np.array_equal(plain[2][0], scheduled[2][0]), "the first loss is taken before any step"
    assert not np.allclose(plain[0]["W1"], scheduled[0]["W1"]), "the schedule must change the steps"
    # Adam's first step is sign-like, so a clip shows from step 2 on, through the moments
    clipped = train_worker(params, state, x, y, small(clip_norm=1e-3), np.random.default_rng(2))
    assert not np.allclose(plain[0]["W1"], clipped[0]["W1"]), "clipping must change the moments after step 1"


# --------------------------------------------------------------------------- weights, drops, similarity


def test_shard_weights_are_sizes_for_noniid_and_uniform_for_iid_under_auto():
    shards = [(np.zeros((n, 2)), np.zeros(n, dtype=np.int64)) for n in (2, 3, 5)]
    assert pseudo_grad_weights(shards, small(iid=True)) is None
    assert pseudo_grad_weights(shards, small(iid=False)) == [2.0, 3.0, 5.0]
    assert pseudo_grad_weights(shards, small(iid=True, shard_weighting="size")) == [2.0, 3.0, 5.0]
    assert pseudo_grad_weights(shards, small(iid=False, shard_weighting="uniform")) is None
    assert normalised_weights(shards, small(iid=False)) == [0.2, 0.3, 0.5]
    assert normalised_weights(shards, small()) == [1 / 3] * 3


def test_drops_draw_nothing_at_p_zero_and_about_p_otherwise():
    rng = np.random.default_rng(0)
    before = rng.bit_generator.state
    assert draw_dropped(rng, small()) == [] and rng.bit_generator.state == before
    counts = [len(draw_dropped(rng, small(num_workers=8, drop_prob=0.3))) for _ in range(2000)]
    assert abs(np.mean(counts) / 8 - 0.3) < 0.02


def test_mean_pairwise_cosine_of_the_workers_own_pseudo_gradients():
    theta = {"W1": np.zeros((1, 2))}
    workers = [{"W1": -np.array([[1.0, 0.0]])}, {"W1": -np.array([[0.0, 1.0]])}, {"W1": -np.array([[1.0, 1.0]])}]
    # deltas (1,0), (0,1), (1,1): cosines 0, 1/sqrt(2), 1/sqrt(2)
    assert mean_pairwise_cosine(theta, workers) == pytest.approx((0 + 2 / math.sqrt(2)) / 3)
    assert mean_pairwise_cosine(theta, workers[:1]) is None
    assert mean_pairwise_cosine(theta, [theta, workers[0]]) is None, "a worker that did not move has no direction"


def test_similarity_appears_in_the_records_only_when_asked():
    x, y = blobs(4)
    plain = reference_diloco(x, y, small(rounds=2)).history
    tracked = reference_diloco(x, y, small(rounds=2, record_similarity=True)).history
    assert "pseudo_grad_cosine" not in plain[0]
    assert all(-1.0 <= r["pseudo_grad_cosine"] <= 1.0 for r in tracked)
    assert [r["eval_loss"] for r in plain] == [r["eval_loss"] for r in tracked], "recording must not change training"


# --------------------------------------------------------------------------- the outer optimizers


def test_outer_sgd_family_on_the_concept_pages_example():
    theta = {"W1": np.array([[1.0]])}
    delta = {"W1": np.array([[0.3]])}  # workers at 0.6 and 0.8
    zero = OuterState({"W1": np.zeros((1, 1))})
    steps = {}
    for name, changes in {"nesterov": {}, "heavy": {"nesterov": False}, "sgd": {"outer_momentum": 0.0}}.items():
        steps[name] = _outer_step(theta, delta, zero, small(outer_lr=0.7, **changes))[0]["W1"][0, 0]
    assert steps["nesterov"] == pytest.approx(1 - 0.7 * (0.3 + 0.9 * 0.3))  # 0.601
    assert steps["heavy"] == pytest.approx(1 - 0.7 * 0.3)
    assert steps["sgd"] == pytest.approx(1 - 0.7 * 0.3)


def test_outer_adam_is_adam_on_the_pseudo_gradient_with_a_large_epsilon():
    theta = {"W1": np.array([[1.0, -2.0]])}
    deltas = [np.array([[0.3, -0.1]]), np.array([[0.1, 0.2]])]
    config = small(outer_optimizer="adam", outer_lr=0.5, outer_momentum=0.9, outer_beta2=0.99, outer_eps=0.1)
    state, params = init_outer_optimizer(theta), theta
    m, v, expected = np.zeros((1, 2)), np.zeros((1, 2)), theta["W1"].copy()
    for t, delta in enumerate(deltas, start=1):
        params, state = _outer_step(params, {"W1": delta}, state, config)
        m, v = 0.9 * m + 0.1 * delta, 0.99 * v + 0.01 * delta**2
        expected = expected - 0.5 * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.99**t)) + 0.1)
        np.testing.assert_allclose(params["W1"], expected, rtol=1e-13)
        assert state.step == t
    np.testing.assert_allclose(state.second_moment["W1"], v, rtol=1e-13)


# --------------------------------------------------------------------------- config and engine


@pytest.mark.parametrize("changes, field", [
    ({"lr_schedule": "linear"}, "lr_schedule"), ({"warmup_steps": -1}, "warmup_steps"),
    ({"warmup_steps": 3}, "warmup_steps"), ({"clip_norm": 0.0}, "clip_norm"),
    ({"shard_weighting": "count"}, "shard_weighting"), ({"outer_optimizer": "nadam"}, "outer_optimizer"),
    ({"outer_beta2": 1.0}, "outer_beta2"), ({"outer_eps": 0.0}, "outer_eps"), ({"drop_prob": 1.0}, "drop_prob"),
    ({"drop_prob": -0.1}, "drop_prob"), ({"record_similarity": 1}, "record_similarity"),
])
def test_bad_mechanism_fields_are_named(changes, field):
    with pytest.raises((TypeError, ValueError), match=f"DiLoCoConfig.{field}"):
        DiLoCoConfig(**changes)


def test_the_config_round_trips_with_every_mechanism_set():
    config = DiLoCoConfig(lr_schedule="cosine", warmup_steps=5, clip_norm=1.0, shard_weighting="size",
                          outer_optimizer="adam", outer_beta2=0.95, outer_eps=0.05, drop_prob=0.3,
                          record_similarity=True)
    assert DiLoCoConfig.from_dict(config.to_dict()) == config
    assert DiLoCoConfig.from_dict({"rounds": 2}).drop_prob == 0.0, "an old config.json gets the defaults"


def test_the_fast_engine_weighs_by_shard_size_as_the_loop_does():
    engine = pytest.importorskip("diloco.core.trainers")
    x, y = blobs(5, n=31)  # 11, 10, 10: unequal IID shards
    config = small(shard_weighting="size")
    want = reference_diloco(x, y, config)
    for layout in ("stacked", "per-worker"):
        got = engine.train_diloco_fast(x, y, config, layout=layout)
        for key in want.params:
            np.testing.assert_allclose(got.params[key], want.params[key], rtol=1e-10, atol=1e-13, err_msg=key)
    uniform = reference_diloco(x, y, config.replace(shard_weighting="uniform"))
    assert not np.allclose(uniform.params["W1"], want.params["W1"]), "the weights must matter on unequal shards"


def test_carried_adam_state_is_an_adamw_state_shape():
    theta = {"W1": np.ones((2, 2))}
    _, state = _outer_step(theta, {"W1": np.full((2, 2), 0.1)}, init_outer_optimizer(theta),
                          small(outer_optimizer="adam"))
    assert isinstance(state, OuterState) and state.second_moment["W1"].shape == (2, 2)
    assert isinstance(AdamWState(state.step, state.momentum, state.second_moment), AdamWState)
