"""Eager updates (diloco.core.synchronisers.EagerSync): which equivalences with DiLoCo hold, and which do not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diloco import DiLoCoConfig, train_diloco
from diloco.config.sections import FamilyConfig
from diloco.core.driver import train
from diloco.core.mechanisms import normalised_weights
from diloco.core.run_records import prepare_training
from diloco.core.sync import eager_outer_gradient
from diloco.core.trainers import train_eager
from diloco.data import load_digits_split


@pytest.fixture(scope="module")
def digits():
    return load_digits_split(seed=0)


def _runs(data, config, family):
    diloco = train_diloco(data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test)
    eager = train_eager(data.x_train, data.y_train, config, family, x_eval=data.x_test, y_eval=data.y_test)
    return diloco, eager


def test_one_worker_eager_updates_are_diloco(digits):
    # K = 1: Delta~ = Delta_1^(t) + (Delta^(t-1) - Delta_1^(t-1)) = Delta_1^(t)
    config = DiLoCoConfig(num_workers=1, inner_steps=4, rounds=4, hidden_sizes=(16,))
    diloco, eager = _runs(digits, config, FamilyConfig(eager=True))
    for key in diloco.params:
        assert np.array_equal(diloco.params[key], eager.params[key]), key
    assert [r["eval_loss"] for r in eager.history] == [r["eval_loss"] for r in diloco.history]


def test_without_overlap_eager_training_is_diloco_bit_for_bit(digits):
    config = DiLoCoConfig(num_workers=3, inner_steps=4, rounds=3, hidden_sizes=(16,))
    diloco, eager = _runs(digits, config, FamilyConfig(eager=True, overlap=0))
    for key in diloco.params:
        assert diloco.params[key].tobytes() == eager.params[key].tobytes(), key
    for ours, theirs in zip(eager.history, diloco.history, strict=True):
        assert {key: ours[key] for key in theirs} == theirs


def test_several_workers_with_overlap_are_not_diloco(digits):
    # the first round applies only Delta_k^(1) / K: the paper claims closeness, not equality
    config = DiLoCoConfig(num_workers=3, inner_steps=4, rounds=3, hidden_sizes=(16,))
    diloco, eager = _runs(digits, config, FamilyConfig(eager=True))
    assert not np.allclose(diloco.params["W1"], eager.params["W1"])
    assert all(r["syncs"] == [[4, r["bytes_sent"], 4]] for r in eager.history)  # overlapped by one round


@given(hnp.arrays(np.float64, (4, 3), elements=st.floats(-10, 10)),
       hnp.arrays(np.float64, (4, 3), elements=st.floats(-10, 10)))
def test_for_one_worker_the_eager_gradient_is_the_fresh_one(now, previous):
    # the previous average of one worker is its own previous gradient, which cancels exactly
    eager = eager_outer_gradient({"W": now}, {"W": previous}, {"W": previous}, 1.0)
    assert np.array_equal(eager["W"], now)


def test_eager_gradient_by_hand():
    now, before, average = {"W": np.array([4.0])}, {"W": np.array([2.0])}, {"W": np.array([3.0])}
    assert eager_outer_gradient(now, before, average, 0.5)["W"].tolist() == [4.0 / 2 + (3.0 - 2.0 / 2)]
    assert eager_outer_gradient(now, None, None, 0.25)["W"].tolist() == [1.0]  # round 1: own share only


@given(hnp.arrays(np.float64, (5, 3, 2), elements=st.floats(-10, 10)))
def test_the_average_corrects_the_local_stand_in_one_round_later(local):
    # local[t, k]: worker k's outer gradient in round t+1. Summed over rounds (outer SGD, lr 1),
    # what worker k applies is every complete average but the last, plus its last own share:
    # sum_t Delta~_k^(t) = sum_{t<T} Delta^(t) + Delta_k^(T) / K, so copies never drift apart.
    rounds, workers = local.shape[:2]
    averages = local.mean(axis=1)
    for k in range(workers):
        applied = np.zeros(2)
        for t in range(rounds):
            previous = None if t == 0 else {"W": local[t - 1, k]}
            average = None if t == 0 else {"W": averages[t - 1]}
            applied += eager_outer_gradient({"W": local[t, k]}, previous, average, 1.0 / workers)["W"]
        expected = averages[:-1].sum(axis=0) + local[-1, k] / workers
        np.testing.assert_allclose(applied, expected, atol=1e-9)


@given(hnp.arrays(np.float64, (4, 3, 2), elements=st.floats(-10, 10)),
       st.lists(st.floats(0.05, 10.0), min_size=3, max_size=3))
def test_with_shard_weights_the_average_corrects_each_workers_own_share(local, sizes):
    # The same sum with unequal shares w_k (shard-size weights): what worker k applies over the rounds
    # is every complete weighted average but the last, plus w_k times its last outer gradient.
    rounds, workers = local.shape[:2]
    shares = np.asarray(sizes) / sum(sizes)
    averages = np.einsum("k,tkd->td", shares, local)
    for k in range(workers):
        applied = np.zeros(2)
        for t in range(rounds):
            previous = None if t == 0 else {"W": local[t - 1, k]}
            average = None if t == 0 else {"W": averages[t - 1]}
            applied += eager_outer_gradient({"W": local[t, k]}, previous, average, float(shares[k]))["W"]
        expected = averages[:-1].sum(axis=0) + shares[k] * local[-1, k]
        np.testing.assert_allclose(applied, expected, atol=1e-8)


def test_eager_training_applies_each_workers_shard_share(digits):
    """Non-IID shards of unequal sizes, one round, outer SGD without momentum. With d_k = theta0 - phi_k
    (worker k's outer gradient, the same in every run below), DiLoCo moves theta0 by the mean of the d_k
    (uniform) or by sum_k w_k d_k (shard-size weights w); eager updates move each copy by w_k d_k and
    evaluate the w-weighted mean of the copies: theta0 - sum_k w_k^2 d_k. The two DiLoCo runs give the
    d_k (the core's trainer: the milestone loop has no shard weights); the eager run must match.
    Treating the shares as 1/K, or averaging the copies uniformly, fails."""
    base = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=1, hidden_sizes=(8,), iid=False, alpha=0.3, seed=3,
                        outer_lr=1.0, outer_momentum=0.0, nesterov=False)
    sized, uniform = base.replace(shard_weighting="size"), base.replace(shard_weighting="uniform")
    x, y = digits.x_train, digits.y_train
    _, _, shards, theta0 = prepare_training(x, y, sized)
    w = np.asarray(normalised_weights(shards, sized))
    assert abs(w[0] - w[1]) > 0.05, w  # unequal shards, or the shares are not told apart
    moved_uniform = {k: theta0[k] - v for k, v in train("diloco", x, y, uniform).params.items()}  # (d_0 + d_1) / 2
    moved_sized = {k: theta0[k] - v for k, v in train("diloco", x, y, sized).params.items()}  # w_0 d_0 + w_1 d_1
    eager = train_eager(x, y, sized, FamilyConfig(eager=True)).params
    for key in theta0:
        d0 = (moved_sized[key] - w[1] * 2 * moved_uniform[key]) / (w[0] - w[1])
        d1 = 2 * moved_uniform[key] - d0
        np.testing.assert_allclose(eager[key], theta0[key] - (w[0] ** 2 * d0 + w[1] ** 2 * d1), atol=1e-10,
                                   err_msg=key)


def test_eager_refuses_a_partial_overlap_and_fragments(digits):
    config = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=1, hidden_sizes=(8,))
    with pytest.raises(ValueError, match="overlap must be 0 or H"):
        train_eager(digits.x_train, digits.y_train, config, FamilyConfig(eager=True, overlap=2))
    with pytest.raises(ValueError, match="fragments must be 1"):
        FamilyConfig(eager=True, fragments=2)
