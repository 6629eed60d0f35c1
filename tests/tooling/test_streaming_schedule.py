"""Streaming DiLoCo's schedule where P does not divide H, and asymmetric mixing, by hand.

Through the public functions only (``diloco.core.schedule.sync_offsets`` and
``sync_steps``, ``diloco.core.trainers.train_streaming``): their names and signatures stay while
the training core is rewritten. Every expected value is worked out here, never taken
from the package.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from diloco import DiLoCoConfig
from diloco.config import AdamWConfig
from diloco.config.sections import FamilyConfig
from diloco.core.schedule import sync_offsets, sync_steps
from diloco.core.trainers import train_streaming

# --- offsets and sync steps: t_p = floor(p H / P), syncs at t with (t - t_p) mod H == 0 ----------


@pytest.mark.parametrize("fragments, inner_steps, offsets", [
    (3, 4, [0, 1, 2]),     # floor(4/3) = 1, floor(8/3) = 2 (round(8/3) would be 3)
    (3, 5, [0, 1, 3]),     # floor(5/3) = 1, floor(10/3) = 3 (p * (H // P) would give 2)
    (2, 3, [0, 1]),        # floor(3/2) = 1
    (4, 6, [0, 1, 3, 4]),  # floor(6/4) = 1, floor(12/4) = 3, floor(18/4) = 4
    (3, 3, [0, 1, 2]),     # P = H: every step one fragment
])
def test_offsets_round_p_h_over_p_down_when_p_does_not_divide_h(fragments, inner_steps, offsets):
    assert sync_offsets(fragments, inner_steps) == offsets


def test_sync_steps_of_three_fragments_in_four_step_rounds():
    # P = 3, H = 4, three rounds (12 steps): offsets 0, 1, 2.
    # fragment 0: t = 4, 8, 12; fragment 1: t - 1 in {0, 4, 8}; fragment 2: t - 2 in {0, 4, 8}.
    assert sync_steps(0, 3, 4, 12) == [4, 8, 12]
    assert sync_steps(1, 3, 4, 12) == [1, 5, 9]
    assert sync_steps(2, 3, 4, 12) == [2, 6, 10]
    assert sync_steps(2, 3, 4, 11) == [2, 6, 10] and sync_steps(0, 3, 4, 11) == [4, 8]
    # P = 3, H = 5 (offsets 0, 1, 3), ten steps
    assert [sync_steps(p, 3, 5, 10) for p in range(3)] == [[5, 10], [1, 6], [3, 8]]
    # each window of H consecutive steps (t0 + 1 .. t0 + H) holds exactly one sync of every fragment
    for t0 in range(0, 8):
        window = range(t0 + 1, t0 + 5)
        assert [sum(t in window for t in sync_steps(p, 3, 4, 12)) for p in range(3)] == [1, 1, 1]


def test_sync_steps_refuses_more_fragments_than_inner_steps():
    with pytest.raises(ValueError, match="fragments"):
        sync_offsets(5, 4)


def test_a_run_with_p_3_h_4_syncs_at_the_scheduled_steps():
    """``history[r]["syncs"]`` lists the in-round step of every fragment sync: 1 and 2
    (fragments 1 and 2), then 4 (fragment 0), in every round."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 3))
    y = np.arange(24) % 2
    config = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=2, batch_size=4, hidden_sizes=(4, 4), seed=1)
    history = train_streaming(x, y, config, FamilyConfig(fragments=3)).history
    for record in history:
        assert [step for step, _bytes, _tau in record["syncs"]] == [1, 2, 4]
        assert record["all_reduces"] == 3


# --- mixing: theta_local <- mix * theta_global + (1 - mix) * theta_local, mix = 0.25 ------------


def streaming_oracle(label_freq, inner: AdamWConfig, outer_lr, momentum, inner_steps, rounds, mix, tau):
    """The bias ``b`` of a one-layer model on all-zero inputs, trained by one worker.

    The logits are ``b`` (``x W = 0``), so the full-batch gradient is ``softmax(b) - f``
    with ``f`` the label frequencies, and ``W`` never moves. Written from the module's
    docstring: AdamW steps on the local copy; at every H-th step the outer gradient
    ``delta = g - local`` (one worker), ``m = mu m + delta``, ``g <- g - lr (delta + mu m)``;
    ``tau`` steps later the local copy becomes ``mix * g + (1 - mix) * local``.
    Returns the global ``b`` after the last round.
    """
    local, g = np.zeros(len(label_freq)), np.zeros(len(label_freq))
    m1, m2, mom = np.zeros_like(g), np.zeros_like(g), np.zeros_like(g)
    pending = []
    for t in range(1, inner_steps * rounds + 1):
        p = np.exp(local - local.max())
        grad = p / p.sum() - label_freq
        m1 = inner.beta1 * m1 + (1 - inner.beta1) * grad
        m2 = inner.beta2 * m2 + (1 - inner.beta2) * grad**2
        m_hat, v_hat = m1 / (1 - inner.beta1**t), m2 / (1 - inner.beta2**t)
        local = local - inner.lr * m_hat / (np.sqrt(v_hat) + inner.eps)  # weight_decay 0
        if t % inner_steps == 0:
            delta = g - local
            mom = momentum * mom + delta
            g = g - outer_lr * (delta + momentum * mom)
            pending.append((t + tau, g.copy()))
        for due in [item for item in pending if item[0] == t]:
            pending.remove(due)
            local = mix * due[1] + (1 - mix) * local
    return g


@pytest.mark.parametrize("tau", [0, 1])
def test_mix_a_quarter_weighs_the_global_fragment_by_a_quarter(tau):
    """One worker, full batches of 4 rows (labels 0, 0, 0, 1: ``f = [3/4, 1/4]``), all-zero
    inputs, one fragment, H = 2, two rounds: round 2 starts from the mixed local copy, so
    the final global bias shows which side ``mix`` weighs. ``mix = 0.25`` is asymmetric:
    swapping the two sides (``0.25 local + 0.75 global``) gives another result."""
    x, y = np.zeros((4, 1)), np.array([0, 0, 0, 1])
    inner = AdamWConfig(lr=0.1, weight_decay=0.0)
    config = DiLoCoConfig(num_workers=1, inner_steps=2, rounds=2, batch_size=4, hidden_sizes=(), inner=inner,
                          outer_lr=0.7, outer_momentum=0.9, seed=3)
    got = train_streaming(x, y, config, FamilyConfig(mix=0.25, overlap=tau)).params["b1"]
    freq = np.array([0.75, 0.25])
    expected = streaming_oracle(freq, inner, 0.7, 0.9, 2, 2, mix=0.25, tau=tau)
    swapped = streaming_oracle(freq, inner, 0.7, 0.9, 2, 2, mix=0.75, tau=tau)
    full = streaming_oracle(freq, inner, 0.7, 0.9, 2, 2, mix=1.0, tau=tau)
    assert np.abs(expected - swapped).min() > 1e-3 and np.abs(expected - full).min() > 1e-3, "the cases must differ"
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-13,
                               err_msg=f"mix = 0.25, tau = {tau}: got {got}, expected {expected} "
                                       f"(swapped sides would give {swapped}, mix = 1 gives {full})")


def test_the_oracle_itself_is_diloco_at_mix_one():
    """A check of the oracle by hand: one round, H = 1, from b = 0. Step 1 of Adam moves
    ``b`` by ``-lr g / (|g| + eps)`` with ``g = [1/2, 1/2] - [3/4, 1/4] = [-1/4, 1/4]``, so
    ``local = [c, -c]``, ``c = 0.1 (1/4) / (1/4 + eps)``; ``delta = -local``, ``m = delta``,
    ``g = 0 - 0.7 (delta + 0.9 delta) = 1.33 local``."""
    inner = AdamWConfig(lr=0.1, weight_decay=0.0)
    c = 0.1 * 0.25 / (0.25 + inner.eps)
    got = streaming_oracle(np.array([0.75, 0.25]), inner, 0.7, 0.9, 1, 1, mix=1.0, tau=0)
    assert math.isclose(got[0], 1.33 * c, rel_tol=1e-12) and math.isclose(got[1], -1.33 * c, rel_tol=1e-12)
