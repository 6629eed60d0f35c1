"""Asynchronous DiLoCo (diloco.methods.asynchrony): the event queue worked by hand, dynamic
local updates, the speed draws, and the reductions: equal speeds arrive round-robin and
delayed Nesterov with N = K is DiLoCo's outer step (milestones 15, 22, 23) bit for bit; one
worker is DiLoCo with K = 1."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco.methods.asynchrony import (
    arrival_schedule,
    delayed_nesterov_step,
    draw_step_times,
    dynamic_local_steps,
    init_async_outer,
    synchronous_round_time,
)
from diloco.outer import OuterState, compute_outer_gradient, nesterov_param_update, update_outer_momentum
from diloco.params import average_params, subtract_params

LR, MU = 0.7, 0.9


def random_params(rng, dtype=np.float64):
    return {"W1": rng.standard_normal((3, 2)).astype(dtype), "b1": rng.standard_normal(2).astype(dtype)}


def test_a_heterogeneous_schedule_worked_by_hand():
    # Worker 0 takes 1 s per step, worker 1 takes 3 s; two steps each. Worker 0 arrives at
    # 2 and 4 s; at 6 s both arrive (applied 0 then 1), worker 1 three updates stale; both
    # restart from version 4.
    arrivals = arrival_schedule([1.0, 3.0], 2, 8)
    assert arrivals.worker.tolist() == [0, 0, 0, 1, 0, 0, 0, 1]
    assert arrivals.time.tolist() == [2, 4, 6, 6, 8, 10, 12, 12]
    assert arrivals.version.tolist() == [0, 1, 2, 0, 4, 5, 6, 4]
    assert arrivals.staleness.tolist() == [0, 0, 0, 3, 0, 0, 0, 3]
    # Worker 1 at 2.5 s per step arrives at 5 s. With a grace period of 1 s it is applied
    # together with worker 0's arrival at 4 s, and both restart at 5 s from version 3.
    assert arrival_schedule([1.0, 2.5], 2, 4).time.tolist() == [2, 4, 5, 6]
    grouped = arrival_schedule([1.0, 2.5], 2, 5, grace=1.0)
    assert grouped.time.tolist() == [2, 4, 5, 7, 9] and grouped.version.tolist() == [0, 1, 0, 3, 4]
    # Communication time adds to every trip.
    assert arrival_schedule([1.0, 3.0], 2, 2, comm_time=0.5).time.tolist() == [2.5, 5.0]


def test_dynamic_local_updates_worked_by_hand():
    # H_k = floor(H v_k / max v): speeds 1, 1/2, 1/4 and 1/3 of the fastest.
    assert dynamic_local_steps([1.0, 2.0, 4.0, 3.0], 8).tolist() == [8, 4, 2, 2]
    assert dynamic_local_steps([1.0, 100.0], 8, min_steps=2).tolist() == [8, 2]
    # With DyLU every round takes about the fastest worker's time: no one is stale twice over.
    times = [1.0, 2.0, 4.0]
    arrivals = arrival_schedule(times, dynamic_local_steps(times, 8), 9)
    assert arrivals.worker.tolist() == [0, 1, 2] * 3 and arrivals.staleness.max() == 2
    assert synchronous_round_time(times, 8) == 32.0 and synchronous_round_time(times, [8, 4, 2]) == 8.0


def test_draws_are_explicit_and_the_straggler_is_slower():
    a = draw_step_times(5, np.random.default_rng(3), spread=0.5)
    b = draw_step_times(5, np.random.default_rng(3), spread=0.5)
    assert np.array_equal(a, b) and len(set(a.tolist())) == 5
    straggled = draw_step_times(5, np.random.default_rng(3), spread=0.5, straggler=2, straggler_factor=4.0)
    assert straggled[2] == 4.0 * a[2] and np.array_equal(np.delete(straggled, 2), np.delete(a, 2))
    assert draw_step_times(3, np.random.default_rng(0), mean=0.2).tolist() == [0.2, 0.2, 0.2]


@given(st.integers(1, 6), st.integers(1, 5), st.floats(0.01, 10.0), st.integers(1, 4))
def test_equal_speeds_arrive_round_robin_from_the_same_model(workers, steps, step_time, rounds):
    arrivals = arrival_schedule([step_time] * workers, steps, workers * rounds)
    index = np.arange(workers * rounds)
    assert arrivals.worker.tolist() == (index % workers).tolist()
    assert arrivals.version.tolist() == (index // workers * workers).tolist()
    np.testing.assert_allclose(arrivals.time, np.repeat(np.arange(1, rounds + 1) * (steps * step_time), workers),
                               rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("workers", [1, 3, 4])
def test_delayed_nesterov_with_n_equal_k_is_diloco_bit_for_bit(dtype, workers):
    rng = np.random.default_rng(workers)
    theta = random_params(rng, dtype)
    state = init_async_outer(theta)
    diloco, outer = dict(theta), OuterState({k: np.zeros_like(v) for k, v in theta.items()})
    for _ in range(3):  # three rounds; every worker starts each round from the same model
        workers_params = [{k: v + rng.standard_normal(v.shape).astype(dtype) * 0.1 for k, v in diloco.items()}
                          for _ in range(workers)]
        pseudo_grads = [subtract_params(diloco, w) for w in workers_params]
        for g in pseudo_grads:
            theta, state = delayed_nesterov_step(theta, state, g, lr=LR, momentum=MU, period=workers)
        mean = average_params(pseudo_grads)  # milestone 15, then 22 and 23
        outer = update_outer_momentum(outer, mean, MU)
        diloco = nesterov_param_update(diloco, mean, outer, LR, MU)
        for key in theta:
            assert np.array_equal(theta[key], diloco[key]), key
            assert np.array_equal(state.outer.momentum[key], outer.momentum[key]), key
            assert theta[key].dtype == dtype
        assert state.pending == () and state.arrivals % workers == 0


def test_delayed_nesterov_between_momentum_steps_applies_g_over_n_as_the_paper_states():
    rng = np.random.default_rng(7)
    theta = random_params(rng)
    state = init_async_outer(theta)
    grads = [random_params(rng) for _ in range(6)]
    paper_theta, paper_m, total = dict(theta), {k: np.zeros_like(v) for k, v in theta.items()}, None
    for t, g in enumerate(grads, start=1):  # the paper's algorithm, written out
        total = g if total is None else {k: total[k] + g[k] for k in g}
        if t % 3 == 0:
            paper_m = {k: MU * paper_m[k] + total[k] / 3 for k in g}
            paper_theta = {k: paper_theta[k] - LR * (g[k] / 3 + MU * paper_m[k]) for k in g}
            total = None
        else:
            paper_theta = {k: paper_theta[k] - LR * g[k] / 3 for k in g}
        theta, state = delayed_nesterov_step(theta, state, g, lr=LR, momentum=MU, period=3)
        for key in theta:
            np.testing.assert_allclose(theta[key], paper_theta[key], rtol=1e-12, atol=1e-12)
        assert len(state.pending) == t % 3


def test_one_worker_is_diloco_with_k_1_and_dn_with_n_1_is_per_arrival_nesterov():
    rng = np.random.default_rng(11)
    arrivals = arrival_schedule([0.3], 5, 4)
    assert arrivals.worker.tolist() == [0] * 4 and arrivals.staleness.tolist() == [0] * 4
    theta = random_params(rng)
    dn_theta, dn_state = dict(theta), init_async_outer(theta)
    diloco, outer = dict(theta), OuterState({k: np.zeros_like(v) for k, v in theta.items()})
    for _ in arrivals.worker:
        worker = {k: v - 0.1 * rng.standard_normal(v.shape) for k, v in diloco.items()}
        delta = compute_outer_gradient(diloco, [worker])  # milestone 24 with K = 1
        outer = update_outer_momentum(outer, delta, MU)
        new_diloco = nesterov_param_update(diloco, delta, outer, LR, MU)
        g = subtract_params(diloco, worker)
        dn_theta, dn_state = delayed_nesterov_step(dn_theta, dn_state, g, lr=LR, momentum=MU, period=1)
        diloco = new_diloco
        for key in theta:
            assert np.array_equal(dn_theta[key], diloco[key])


def test_bad_input_names_the_argument():
    theta = {"W1": np.ones((2, 2))}
    state = init_async_outer(theta)
    with pytest.raises(ValueError, match="step_times"):
        arrival_schedule([1.0, -1.0], 2, 3)
    with pytest.raises(ValueError, match="step_times"):
        dynamic_local_steps([], 4)
    with pytest.raises(ValueError, match="local_steps"):
        arrival_schedule([1.0, 2.0], [2, 0], 3)
    with pytest.raises(ValueError, match="local_steps"):
        arrival_schedule([1.0, 2.0], [2, 2, 2], 3)
    with pytest.raises(ValueError, match="step_times"):
        synchronous_round_time(["fast", "slow"], 2)
    with pytest.raises(ValueError, match="momentum"):  # caught before the N-th arrival too
        delayed_nesterov_step(theta, state, theta, lr=LR, momentum=1.0, period=3)
    with pytest.raises(ValueError, match="num_arrivals"):
        arrival_schedule([1.0], 2, -1)
    with pytest.raises(TypeError, match="rng"):
        draw_step_times(3, 0)
    with pytest.raises(ValueError, match="straggler"):
        draw_step_times(3, np.random.default_rng(0), straggler=3)
    with pytest.raises(ValueError, match="pseudo_grad"):
        delayed_nesterov_step(theta, state, {"W1": np.ones((3, 2))}, lr=LR, momentum=MU, period=2)
    with pytest.raises(ValueError, match="period"):
        delayed_nesterov_step(theta, state, theta, lr=LR, momentum=MU, period=0)
    with pytest.raises(TypeError, match="state"):
        delayed_nesterov_step(theta, OuterState(theta), theta, lr=LR, momentum=MU, period=2)
