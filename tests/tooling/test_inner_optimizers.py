"""The inner-optimizer seam (diloco.core.inner): the registry, and SGD with momentum added through it.

SGD is checked against a hand-written loop of PyTorch's ``SGD(lr, momentum, dampening=0,
weight_decay)`` rule that shares no code with the registry; the fast executor's flat kernel
against the reference executor; a checkpoint's stored form round-trips exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from diloco.config import INNER_OPTIMIZER_NAMES, AdamWConfig, DiLoCoConfig
from diloco.core.driver import train
from diloco.core.inner import INNER_OPTIMIZERS, SGDState, inner_optimizer
from diloco.core.mechanisms import inner_step
from diloco.data import load_digits_split
from diloco.engine.optim import FAST_PATHS

BASE = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=2, hidden_sizes=(8,), batch_size=8, seed=2,
                    inner_optimizer="sgd", inner=AdamWConfig(lr=0.05, beta1=0.8, weight_decay=0.01))


def test_the_config_checks_against_the_registry_and_every_entry_has_a_flat_form():
    assert set(INNER_OPTIMIZER_NAMES) <= set(INNER_OPTIMIZERS)
    for name in INNER_OPTIMIZER_NAMES:
        assert INNER_OPTIMIZERS[name].flat is not None or name in FAST_PATHS, name
    with pytest.raises(ValueError, match=r"inner_optimizer must be one of \('adamw', 'muon', 'sgd'"):
        BASE.replace(inner_optimizer="lion")


def _sgd_by_hand(params, grads_per_step, lr, momentum, weight_decay):
    """PyTorch's SGD, one parameter at a time: d_p = g + wd p; buf = d_p at step 1, else mu buf + d_p; p -= lr buf."""
    params = {k: v.copy() for k, v in params.items()}
    buf = {}
    for grads in grads_per_step:
        for key in params:
            d_p = grads[key] + weight_decay * params[key]
            buf[key] = d_p.copy() if key not in buf else momentum * buf[key] + d_p
            params[key] = params[key] - lr * buf[key]
    return params, buf


def test_sgd_steps_as_pytorch_sgd_with_momentum_by_hand():
    rng = np.random.default_rng(0)
    params = {"W": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(4)]
    state = inner_optimizer(BASE).init(params, BASE)
    got = params
    for g in grads:
        got, state = inner_step(got, state, g, BASE)
    expected, buf = _sgd_by_hand(params, grads, 0.05, 0.8, 0.01)
    assert state.step == 4
    for key in params:
        np.testing.assert_array_equal(got[key], expected[key])
        np.testing.assert_array_equal(state.buffer[key], buf[key])


@pytest.mark.parametrize("changes", [{}, {"lr_schedule": "cosine", "warmup_steps": 1}, {"clip_norm": 0.05},
                                     {"dtype": "float32"}])
@pytest.mark.parametrize("algo", ["diloco", "sync"])
def test_the_stacked_kernel_equals_the_reference_for_sgd(algo, changes):
    data = load_digits_split(seed=0)
    config = BASE.replace(**changes)
    x = data.x_train[:121].astype(config.dtype)
    ref = train(algo, x, data.y_train[:121], config)
    fast = train(algo, x, data.y_train[:121], config, executor="fast")
    for key in ref.params:
        np.testing.assert_allclose(fast.params[key], ref.params[key], rtol=1e-10 if config.dtype == "float64" else 1e-5,
                                   atol=1e-12 if config.dtype == "float64" else 1e-6)
    plain = train(algo, x, data.y_train[:121], config.replace(inner_optimizer="adamw"))
    assert any(not np.array_equal(plain.params[k], ref.params[k]) for k in ref.params), "SGD must change the run"


@pytest.mark.parametrize("name", sorted(INNER_OPTIMIZERS))
def test_every_entrys_stored_form_round_trips_exactly(name):
    config = BASE.replace(inner_optimizer=name)
    rng = np.random.default_rng(1)
    params = {"W1": rng.standard_normal((4, 3)), "b1": rng.standard_normal(3)}
    entry = inner_optimizer(config)
    state = entry.init(params, config)
    for _ in range(2):
        params, state = entry.step(params, state, {k: rng.standard_normal(v.shape) for k, v in params.items()},
                                   config, lambda peak: peak)
    stored = entry.to_moments(state, params)
    assert list(stored.m) == list(stored.v) == list(params)
    again = entry.from_moments(stored, config)
    assert type(again) is type(state) and again.step == state.step == 2
    restored = entry.to_moments(again, params)
    for key in params:
        assert restored.m[key].tobytes() == stored.m[key].tobytes()
        assert restored.v[key].tobytes() == stored.v[key].tobytes()
    if name == "sgd":
        assert isinstance(state, SGDState)


def test_adamw_is_the_milestone_lifted_and_the_engines_kernel_equals_the_lifted_rule():
    """The reference's AdamW is ``adamw_step`` itself (bit for bit); the fast path registered for it
    (the folded kernel) agrees with the same rule lifted to (S, P) rows to 1e-10 over 50 steps."""
    from diloco.adamw import adamw_step, init_adamw_state
    from diloco.core.inner import ADAMW
    from diloco.engine.flat import flat_layout
    from diloco.engine.optim import adamw_scratch

    config = DiLoCoConfig(inner=AdamWConfig(lr=0.01, weight_decay=0.1), hidden_sizes=(8,))
    rng = np.random.default_rng(3)
    params = {"W": rng.standard_normal((4, 3)), "b": rng.standard_normal(3)}
    state, milestone = ADAMW.init(params, config), init_adamw_state(params)
    ours, theirs = params, params
    for _ in range(3):
        grads = {k: rng.standard_normal(v.shape) for k, v in params.items()}
        ours, state = ADAMW.step(ours, state, grads, config, lambda peak: peak)
        theirs, milestone = adamw_step(theirs, milestone, grads, config.inner)
    for key in params:
        assert ours[key].tobytes() == theirs[key].tobytes() and state.v[key].tobytes() == milestone.v[key].tobytes()

    rows = rng.standard_normal((3, 200))
    lifted, fast = [rows.copy(), np.zeros_like(rows), np.zeros_like(rows)], [rows.copy(), np.zeros_like(rows),
                                                                               np.zeros_like(rows)]
    layout = flat_layout({"x": rows[0]})
    lifted_update = ADAMW.flat(config, layout, None, None)
    fast_update = FAST_PATHS["adamw"](config, layout, None, adamw_scratch(rows.size, rows.dtype))
    for step in range(1, 51):
        grads = rng.standard_normal(rows.shape) * rng.uniform(0.01, 10)
        lifted_update(lifted[0], lifted[1:], grads.copy(), step, lambda peak: peak)
        fast_update(fast[0], tuple(fast[1:]), grads.copy(), step, lambda peak: peak)
    assert np.max(np.abs(fast[0] - lifted[0])) / np.max(np.abs(lifted[0])) <= 1e-10
    np.testing.assert_array_equal(fast[1], lifted[1])  # the moments are the milestone's arithmetic
