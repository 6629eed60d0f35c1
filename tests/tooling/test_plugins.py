"""An inner optimizer and a codec added from outside the package, as a plugin would (issue 40).

``plugins/lion.py`` (Lion, one per-array rule) and ``plugins/randk.py`` (random-k with
error feedback, drawing from the round's generator) are registered here, by name, and run
on the reference and the fast executors (on MPI ranks: ``test_core.py``'s composition matrix
and ``test_mpi.py``'s ``--plugin``). Each is checked against a hand-written step that
shares no code with the package's lifts or collectives, and the two executors against
each other.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from tests.tooling.plugins import register, unregister
from tests.tooling.plugins.lion import LION, LionState
from tests.tooling.plugins.randk import RandomK

from diloco.config import AdamWConfig, DiLoCoConfig
from diloco.core.codecs import codec_for, codec_generators
from diloco.core.comm import all_reduce
from diloco.core.driver import train
from diloco.core.mechanisms import init_inner_state, inner_step
from diloco.core.registry import CODECS, INNER_OPTIMIZERS
from diloco.data import load_digits_split

BASE = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=2, hidden_sizes=(8,), batch_size=8, seed=2,
                    inner=AdamWConfig(lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.1))


@pytest.fixture(autouse=True)
def plugins():
    register()
    yield
    unregister()


def _runs(config, algo="diloco"):
    data = load_digits_split(seed=0)
    x, y = data.x_train[:121].astype(config.dtype), data.y_train[:121]
    return train(algo, x, y, config), train(algo, x, y, config, executor="fast")


def _assert_close(fast, ref, dtype="float64"):
    rtol, atol = (1e-10, 1e-12) if dtype == "float64" else (1e-5, 1e-6)
    for key in ref.params:
        np.testing.assert_allclose(fast.params[key], ref.params[key], rtol=rtol, atol=atol, err_msg=key)


# --- Lion ------------------------------------------------------------------------------------------

def _lion_by_hand(params, grads_per_step, lr, beta1, beta2, wd):
    """Lion as its paper writes it, one array and one step at a time."""
    params = {k: v.copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    for grads in grads_per_step:
        for key in params:
            c = beta1 * m[key] + (1 - beta1) * grads[key]
            params[key] = params[key] - lr * (np.sign(c) + wd * params[key])
            m[key] = beta2 * m[key] + (1 - beta2) * grads[key]
    return params, m


def test_a_config_names_lion_only_once_it_is_registered():
    INNER_OPTIMIZERS.unregister("lion")
    with pytest.raises(ValueError, match="inner_optimizer must be one of .*got 'lion'"):
        BASE.replace(inner_optimizer="lion")
    INNER_OPTIMIZERS.register("lion", LION)
    assert BASE.replace(inner_optimizer="lion").inner_optimizer == "lion"
    with pytest.raises(ValueError, match="registered already"):
        INNER_OPTIMIZERS.register("lion", LION)
    with pytest.raises(ValueError, match="built-in"):
        INNER_OPTIMIZERS.register("adamw", LION, replace=True)


def test_lion_steps_as_written_by_hand():
    config = BASE.replace(inner_optimizer="lion")
    rng = np.random.default_rng(0)
    params = {"W": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    grads = [{k: rng.standard_normal(v.shape) for k, v in params.items()} for _ in range(4)]
    state, got = init_inner_state(params, config), params
    assert isinstance(state, LionState)
    for g in grads:
        got, state = inner_step(got, state, g, config)
    expected, m = _lion_by_hand(params, grads, 0.01, 0.9, 0.99, 0.1)
    assert state.step == 4
    for key in params:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-14, atol=1e-15)
        np.testing.assert_allclose(state.momentum[key], m[key], rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("changes", [{}, {"lr_schedule": "cosine", "warmup_steps": 1}, {"dtype": "float32"}])
@pytest.mark.parametrize("algo", ["diloco", "sync"])
def test_lion_runs_alike_on_the_reference_and_the_fast_executor(algo, changes):
    config = BASE.replace(inner_optimizer="lion", **changes)
    ref, fast = _runs(config, algo)
    _assert_close(fast, ref, config.dtype)
    plain, _ = _runs(config.replace(inner_optimizer="adamw"), algo)
    assert any(not np.array_equal(plain.params[k], ref.params[k]) for k in ref.params), "Lion must change the run"


def test_lion_keeps_one_buffer_and_checkpoints_round_trip():
    config = BASE.replace(inner_optimizer="lion")
    assert LION.slots == ("momentum",)
    params = {"W": np.ones((2, 2)), "b": np.zeros(2)}
    state = LionState(3, {"W": np.full((2, 2), 0.5), "b": np.arange(2.0)})
    stored = LION.to_moments(state, params)
    assert not any(v.any() for v in stored.v.values())
    again = LION.from_moments(stored, config)
    assert again.step == 3 and all(np.array_equal(again.momentum[k], state.momentum[k]) for k in params)


# --- random-k --------------------------------------------------------------------------------------

def _randk_by_hand(base, workers, fraction, generators):
    """Each worker's outer gradient with ceil(fraction N) entries kept at the generator's draws, averaged."""
    out = {}
    for key, value in base.items():
        kept = []
        for k, theta in enumerate(workers):
            delta = (value - theta[key]).reshape(-1)
            index = generators[k].choice(delta.size, math.ceil(fraction * delta.size), replace=False)
            sparse = np.zeros_like(delta)
            sparse[index] = delta[index]
            kept.append(sparse)
        out[key] = (sum(kept) / len(kept)).reshape(value.shape)
    return out


def test_randk_is_chosen_by_name_with_its_own_options():
    spec = BASE.replace(family={"compress": "randk:fraction=0.25"}).family.comm
    codec = codec_for(spec, np.float64)
    assert isinstance(codec, RandomK) and codec.fraction == 0.25 and codec.lossy
    with pytest.raises(ValueError, match="fraction must be in"):
        codec_for(BASE.replace(family={"compress": "randk:fraction=2"}).family.comm, np.float64)
    with pytest.raises(ValueError, match="unexpected keyword"):
        codec_for(BASE.replace(family={"compress": "randk:fractoin=0.5"}).family.comm, np.float64)
    with pytest.raises(ValueError, match="configure.*the built-in codecs, not compress='randk'"):
        BASE.replace(family={"compress": "randk", "comm_dtype": "int8"})
    CODECS.unregister("randk")
    with pytest.raises(ValueError, match="compress must be one of"):
        BASE.replace(family={"compress": "randk"})
    CODECS.register("randk", RandomK)


def test_the_all_reduce_hands_each_worker_the_rounds_generator():
    rng = np.random.default_rng(4)
    base = {"W": rng.standard_normal((5, 4)), "b": rng.standard_normal(4)}
    workers = [{k: v + rng.standard_normal(v.shape) for k, v in base.items()} for _ in range(3)]
    spec = BASE.replace(family={"compress": "randk:fraction=0.3"}).family.comm
    got = all_reduce(dict(enumerate(workers)), spec, global_params=base, rngs=codec_generators(7, (1, 3, 0), range(3)))
    expected = _randk_by_hand(base, workers, 0.3, codec_generators(7, (1, 3, 0), range(3)))
    for key in base:  # the same entries kept; the mean's order of sums may differ by a rounding
        np.testing.assert_array_equal(got.delta[key] == 0, expected[key] == 0)
        np.testing.assert_allclose(got.delta[key], expected[key], rtol=1e-15, atol=1e-16)
    later = codec_generators(7, (2, 3, 0), range(3))
    other = all_reduce(dict(enumerate(workers)), spec, global_params=base, rngs=later)
    assert not np.array_equal(other.delta["W"], got.delta["W"]), "another round draws other indices"


@pytest.mark.parametrize("changes", [{}, {"error_feedback": True}])
def test_randk_runs_alike_on_the_reference_and_the_fast_executor(changes):
    config = BASE.replace(family={"compress": "randk:fraction=0.25", **changes})
    ref, fast = _runs(config)
    _assert_close(fast, ref)
    again, _ = _runs(config)
    for key in ref.params:
        np.testing.assert_array_equal(again.params[key], ref.params[key])  # the generators are the run's seed's
    dense, _ = _runs(BASE)
    assert any(not np.array_equal(dense.params[k], ref.params[k]) for k in ref.params), "random-k must change the run"


def test_lion_and_randk_together_on_both_executors():
    config = BASE.replace(inner_optimizer="lion", family={"compress": "randk:fraction=0.5", "error_feedback": True})
    ref, fast = _runs(config)
    _assert_close(fast, ref)


def test_the_command_line_runs_both_plugins_by_name(tmp_path, capsys):
    import json

    from tests.tooling.cli_helpers import TINY, only_run_dir, run_cli

    status, _, err = run_cli(["train", *TINY, "--no-plots", "--runs-dir", tmp_path, "--engine", "fast",
                              "--inner-optimizer", "lion", "--compress", "randk:fraction=0.5", "--error-feedback"],
                             capsys)
    assert status == 0, err
    config = json.loads((only_run_dir(tmp_path) / "config.json").read_text())["config"]
    assert config["inner_optimizer"] == "lion" and config["family"]["compress"] == "randk:fraction=0.5"
    status, _, err = run_cli(["train", *TINY, "--runs-dir", tmp_path / "bad", "--compress", "randk:fraction=3"],
                             capsys)
    assert status == 2 and "fraction must be in (0, 1]" in err
