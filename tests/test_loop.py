"""Part 6 - the DiLoCo round, the training loop and the synchronous baseline: milestones 25-27.

Expected values are hand-worked (``tests/fixtures/m25.json`` .. ``m27.json``), come
from reference loops written in this file out of the earlier milestones, or (for the
baseline with K > 1) from stored runs of an independent loop,
``tests/fixtures/m27_reference.npz``, built by ``tests/tooling/make_m27_snapshot.py``. All
follow the random-stream order that ``loop.py`` documents:

* ``prepare_training``: ``rng = default_rng(config.seed)`` unless a generator is given;
  shard with ``rng`` (IID or non-IID); then ``init_model_params((d_in, *hidden_sizes, C), rng)``.
* every round (DiLoCo and baseline alike): ``worker_rngs = rng.spawn(K)``; worker k
  draws all its mini-batches of the round from ``worker_rngs[k]``.

Because the reference DiLoCo loop (through ``inner_train_worker``) and the reference
baseline loop both draw worker k's batches from that same child stream, the two
algorithms provably see the same mini-batches once both match their references.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco.adamw import init_adamw_state
from diloco.config import AdamWConfig, DiLoCoConfig
from diloco.data import load_digits_split
from diloco.evaluation import classification_accuracy, evaluate_loss
from diloco.loop import run_diloco_round, train_diloco, train_synchronous_baseline
from diloco.model import init_model_params
from diloco.outer import OuterState, init_outer_optimizer
from diloco.sharding import (
    iid_shard_dataset,
    inner_train_worker,
    local_train_step,
    noniid_shard_dataset,
    sample_worker_batch,
)
from helpers import (
    DTYPES,
    FEW_EXAMPLES,
    FIXTURES,
    adamw_state,
    as_params,
    assert_close,
    assert_no_shared_memory,
    assert_params_close,
    assert_unchanged,
    load_fixture,
    snapshot,
    tolerance,
)

# --------------------------------------------------------------------------- helpers


def tiny_data(seed, num_examples=24, num_features=3, num_classes=3, dtype=np.float64):
    """Separable-ish Gaussian blobs built with plain NumPy; every class present."""
    rng = np.random.default_rng(seed)
    y = np.arange(num_examples) % num_classes
    centres = rng.normal(0.0, 2.0, (num_classes, num_features))
    x = centres[y] + rng.normal(0.0, 1.0, (num_examples, num_features))
    return x.astype(dtype), y.astype(np.int64)


def tiny_config(**changes):
    """A small, fast experiment; ``changes`` override any field (``inner`` as a dict)."""
    inner = AdamWConfig(**{"lr": 0.05, "weight_decay": 0.1, **changes.pop("inner", {})})
    base = dict(num_workers=2, inner_steps=2, rounds=2, batch_size=4, hidden_sizes=(4,), outer_lr=0.7,
                outer_momentum=0.9, seed=0)
    base.update(changes)
    return DiLoCoConfig(inner=inner, **base)



def layer_sizes_for(x, y, config):
    return (x.shape[1], *config.hidden_sizes, int(y.max()) + 1)


def round_inputs(seed, num_workers, dtype=np.float64, warm=False, hidden_sizes=(4,), shard_sizes=None):
    """Global params, outer state, worker states and shards for one round, built in the test.

    Five examples per worker, dealt round-robin, unless ``shard_sizes`` gives each shard's
    size. ``warm`` gives every worker a non-fresh AdamW state (step 3, random moments) and
    the outer optimizer a non-zero momentum, as in a later round.
    """
    rng = np.random.default_rng(seed)
    sizes = [5] * num_workers if shard_sizes is None else list(shard_sizes)
    x, y = tiny_data(seed, num_examples=sum(sizes), dtype=dtype)
    if shard_sizes is None:
        shards = [(x[k::num_workers], y[k::num_workers]) for k in range(num_workers)]
    else:
        shards = list(zip(np.split(x, np.cumsum(sizes)[:-1]), np.split(y, np.cumsum(sizes)[:-1]), strict=True))
    params = init_model_params((x.shape[1], *hidden_sizes, 3), rng, dtype=dtype)
    if warm:
        states = [
            adamw_state(step=3,
                        m={key: rng.normal(0.0, 0.1, value.shape).astype(dtype) for key, value in params.items()},
                        v={key: rng.uniform(0.0, 0.05, value.shape).astype(dtype) for key, value in params.items()})
            for _ in range(num_workers)
        ]
        outer = OuterState({key: rng.normal(0.0, 0.1, value.shape).astype(dtype) for key, value in params.items()})
    else:
        states = [adamw_state(params) for _ in range(num_workers)]
        outer = OuterState({key: np.zeros_like(value) for key, value in params.items()})
    return params, outer, states, shards


def independent_workers(params, states, shards, config, rng):
    """Each worker's round computed on its own, with the streams the round documents."""
    worker_rngs = rng.spawn(config.num_workers)
    return [
        inner_train_worker(params, state, x_k, y_k, config.inner_steps, config.batch_size, config.inner, rng_k)
        for (x_k, y_k), state, rng_k in zip(shards, states, worker_rngs, strict=True)
    ]


def numpy_mean(dicts):
    return {key: np.mean([d[key] for d in dicts], axis=0) for key in dicts[0]}


def plain_adamw_training(x, y, config):
    """Single-worker plain AdamW training, in DiLoCo's random-stream order."""
    rng = np.random.default_rng(config.seed)
    ((x_k, y_k),) = iid_shard_dataset(x, y, 1, rng)
    params = init_model_params(layer_sizes_for(x, y, config), rng, dtype=np.dtype(config.dtype))
    state = init_adamw_state(params)
    losses = []
    for _ in range(config.rounds):
        child = rng.spawn(1)[0]
        for _ in range(config.inner_steps):
            x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, child)
            params, state, loss = local_train_step(params, state, x_batch, y_batch, config.inner)
            losses.append(loss)
    return params, state, losses


def assert_outer_step(result, params, outer, worker_params, config):
    """``result`` took one outer step from ``params`` on the plain mean of ``worker_params``."""
    mean_worker = numpy_mean(worker_params)
    delta = {key: params[key] - mean_worker[key] for key in params}  # old minus new
    lr, mu = config.outer_lr, config.outer_momentum
    momentum = {key: mu * outer.momentum[key] + delta[key] for key in params}
    if config.nesterov:
        expected = {key: params[key] - lr * (delta[key] + mu * momentum[key]) for key in params}
    else:
        expected = {key: params[key] - lr * momentum[key] for key in params}
    assert_params_close(result.outer_state.momentum, momentum, rtol=1e-10, atol=1e-13, what="outer momentum")
    assert_params_close(result.global_params, expected, rtol=1e-10, atol=1e-13, what="new global params")
    norm = np.sqrt(sum(np.sum(d * d) for d in delta.values()))
    assert_close(result.record["pseudo_grad_norm"], norm, rtol=1e-10, what="pseudo_grad_norm")


def assert_history_equal(got, expected, what="history"):
    assert len(got) == len(expected), f"{what}: {len(got)} records vs {len(expected)}"
    for i, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a == b, f"{what}[{i}] differs:\n  {a}\n  {b}"


def assert_same_run(got, expected, what):
    """Two TrainResults with bit-identical params and equal histories."""
    for key in expected.params:
        assert np.array_equal(got.params[key], expected.params[key]), f"{what}: params[{key!r}] differ"
    assert_history_equal(got.history, expected.history, what=f"{what}: history")


def snapshotting_callback(rng):
    """``(seen, on_round)``: on_round keeps a deep copy of each record when it is called, and
    how many child streams the run's generator ``rng`` had spawned by then."""
    seen = []

    def on_round(record):
        seen.append((copy.deepcopy(record), rng.bit_generator.seed_seq.n_children_spawned))

    return seen, on_round


def check_on_round_timing(train):
    """``train(x, y, config, **kw)`` calls on_round with each finished record right after its round."""
    x, y = tiny_data(8, num_examples=31)  # 31 = 11 + 10 + 10: unequal shards too
    x_eval, y_eval = tiny_data(9, num_examples=12)
    config = tiny_config(num_workers=3, inner_steps=2, rounds=3)
    rng = np.random.default_rng(config.seed)
    seen, on_round = snapshotting_callback(rng)
    result = train(x, y, config, x_eval=x_eval, y_eval=y_eval, rng=rng, on_round=on_round)
    assert [spawned for _, spawned in seen] == [3, 6, 9], (
        "on_round(record of round r) must be called once per round, right after round r and before round r + 1 "
        f"spawns its 3 worker streams; the generator had spawned {[spawned for _, spawned in seen]} streams "
        "at the calls")
    assert [record for record, _ in seen] == result.history, (
        "on_round must receive the finished record (round, step, cumulative_bytes and the eval fields filled "
        "in), and it must not change after the call")


def check_given_generator_wins(train):
    """``train(..., rng=default_rng(7))`` with ``config.seed = 0`` is the run with ``config.seed = 7``."""
    x, y = tiny_data(3, num_examples=25)
    config = tiny_config(num_workers=3, rounds=3, seed=0)
    given_rng = train(x, y, config, rng=np.random.default_rng(7))
    assert_same_run(given_rng, train(x, y, config.replace(seed=7)),
                    "rng=default_rng(7) (config.seed 0) vs config.seed 7: everything must come from the given rng")
    own = train(x, y, config)
    assert not np.array_equal(own.params["W1"], given_rng.params["W1"]), "the given generator was ignored"


def num_values(params):
    return sum(value.size for value in params.values())


# --------------------------------------------------------------------------- m25 run_diloco_round


@pytest.mark.m25
def test_run_diloco_round_matches_hand_worked_fixture():
    fixture = load_fixture("m25")
    inputs, expected = fixture["inputs"], fixture["expected"]
    config = DiLoCoConfig.from_dict(inputs["config"])
    states = [adamw_state(**s) for s in inputs["worker_states"]]
    shards = [(np.array(x, dtype=np.float64), np.array(y, dtype=np.int64)) for x, y in inputs["shards"]]
    outer = OuterState(as_params(inputs["outer_momentum_before"]))
    result = run_diloco_round(as_params(inputs["global_params"]), outer, states, shards, config,
                              np.random.default_rng(inputs["seed"]))
    assert_params_close(result.global_params, as_params(expected["global_params"]), rtol=1e-12, atol=1e-15,
                        what="new global params")
    assert_params_close(result.outer_state.momentum, as_params(expected["outer_momentum"]), rtol=1e-9, atol=1e-15,
                        what="outer momentum")
    for k, (got, want) in enumerate(zip(result.worker_states, expected["worker_states"], strict=True)):
        assert got.step == want["step"], f"worker {k}: step {got.step}, expected {want['step']}"
        assert_params_close(got.m, as_params(want["m"]), rtol=1e-12, atol=1e-15, what=f"worker {k} m")
        assert_params_close(got.v, as_params(want["v"]), rtol=1e-12, atol=1e-15, what=f"worker {k} v")
    record = result.record
    for key in ("inner_loss", "pseudo_grad_norm", "bytes_sent"):
        assert_close(record[key], expected["record"][key], rtol=1e-12, what=f"record[{key!r}]")
    assert_close(record["worker_losses"], expected["record"]["worker_losses"], rtol=1e-12, what="worker_losses")
    assert record["all_reduces"] == expected["record"]["all_reduces"]


@pytest.mark.m25
@FEW_EXAMPLES
@given(seed=st.integers(0, 2**16), num_workers=st.integers(1, 3), inner_steps=st.integers(1, 3),
       warm=st.booleans(), dtype=st.sampled_from(DTYPES))
def test_fedavg_round_returns_the_average_of_independently_trained_workers(seed, num_workers, inner_steps, warm,
                                                                           dtype):
    """outer_lr = 1, outer_momentum = 0: theta - (theta - mean_k theta_k) = mean_k theta_k."""
    params, outer, states, shards = round_inputs(seed, num_workers, dtype=dtype, warm=warm)
    config = tiny_config(num_workers=num_workers, inner_steps=inner_steps, outer_lr=1.0, outer_momentum=0.0,
                         dtype=np.dtype(dtype).name)
    result = run_diloco_round(params, outer, states, shards, config, np.random.default_rng(seed + 1))
    workers = independent_workers(params, states, shards, config, np.random.default_rng(seed + 1))
    tol = tolerance(dtype)
    assert_params_close(result.global_params, numpy_mean([w[0] for w in workers]), what="FedAvg global params", **tol)
    for key, value in result.global_params.items():
        assert value.dtype == dtype, f"global_params[{key!r}] is {value.dtype}, expected {np.dtype(dtype)}"
    for k, (got, (_, want, losses)) in enumerate(zip(result.worker_states, workers, strict=True)):
        # each worker keeps its own state: neither reset nor averaged
        assert got.step == want.step == states[k].step + inner_steps
        assert_params_close(got.m, want.m, what=f"worker {k} AdamW m", **tol)
        assert_params_close(got.v, want.v, what=f"worker {k} AdamW v", **tol)
        assert_close(result.record["worker_losses"][k], losses.mean(), rtol=1e-6, what=f"worker {k} mean loss")


@pytest.mark.m25
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("warm", [False, True])
def test_round_takes_one_outer_momentum_step_on_old_minus_new(nesterov, warm):
    params, outer, states, shards = round_inputs(7, 3, warm=warm)
    config = tiny_config(num_workers=3, inner_steps=3, outer_lr=0.7, outer_momentum=0.9, nesterov=nesterov)
    result = run_diloco_round(params, outer, states, shards, config, np.random.default_rng(99))
    workers = independent_workers(params, states, shards, config, np.random.default_rng(99))
    assert_outer_step(result, params, outer, [w[0] for w in workers], config)


@pytest.mark.m25
@pytest.mark.parametrize("shard_sizes", [(6, 5, 5), (9, 4, 1, 2)], ids=["16-over-3", "skewed"])
def test_round_with_unequal_shards_counts_every_worker_once(shard_sizes):
    """n not divisible by K (as iid_shard_dataset cuts it), or very unequal shards: with the
    default (IID) config the pseudo-gradient is the plain mean over the K workers, whatever
    their shard sizes (not weighted by n_k), and so is inner_loss over the per-worker means."""
    num_workers = len(shard_sizes)
    params, outer, states, shards = round_inputs(13, num_workers, warm=True, shard_sizes=shard_sizes)
    assert [len(y_k) for _, y_k in shards] == list(shard_sizes)
    config = tiny_config(num_workers=num_workers, inner_steps=3, batch_size=4)  # > some shards: with replacement
    result = run_diloco_round(params, outer, states, shards, config, np.random.default_rng(21))
    workers = independent_workers(params, states, shards, config, np.random.default_rng(21))
    assert_outer_step(result, params, outer, [w[0] for w in workers], config)
    worker_means = [float(losses.mean()) for _, _, losses in workers]
    assert_close(result.record["worker_losses"], worker_means, rtol=1e-10, what="worker_losses (one mean each)")
    assert_close(result.record["inner_loss"], np.mean(worker_means), rtol=1e-10,
                 what="inner_loss (the plain mean over the workers)")
    assert len(result.worker_states) == num_workers, f"expected {num_workers} worker states"
    for k, (got, (_, want, _)) in enumerate(zip(result.worker_states, workers, strict=True)):
        assert_params_close(got.m, want.m, rtol=1e-10, atol=1e-13, what=f"worker {k} AdamW m")


@pytest.mark.m25
def test_carried_worker_states_change_the_round():
    """A round must use the states it is given (not fresh ones) and return step + H."""
    params, outer, fresh, shards = round_inputs(3, 2)
    _, _, warm, _ = round_inputs(3, 2, warm=True)
    config = tiny_config(inner_steps=2)
    from_fresh = run_diloco_round(params, outer, fresh, shards, config, np.random.default_rng(5))
    from_warm = run_diloco_round(params, outer, warm, shards, config, np.random.default_rng(5))
    assert [s.step for s in from_fresh.worker_states] == [2, 2]
    assert [s.step for s in from_warm.worker_states] == [5, 5], "step must continue from the carried state"
    assert not np.allclose(from_fresh.global_params["W1"], from_warm.global_params["W1"]), (
        "the workers' carried AdamW states were ignored (reset each round?)"
    )
    again = run_diloco_round(from_fresh.global_params, from_fresh.outer_state, from_fresh.worker_states, shards,
                             config, np.random.default_rng(6))
    assert [s.step for s in again.worker_states] == [4, 4]


@pytest.mark.m25
@pytest.mark.parametrize("dtype", DTYPES)
def test_round_record_counts_one_all_reduce_at_the_params_precision(dtype):
    params, outer, states, shards = round_inputs(11, 3, dtype=dtype)
    config = tiny_config(num_workers=3, inner_steps=3)
    record = run_diloco_round(params, outer, states, shards, config, np.random.default_rng(0)).record
    assert {"inner_loss", "worker_losses", "pseudo_grad_norm", "all_reduces", "bytes_sent"} <= set(record)
    assert record["all_reduces"] == 1
    itemsize = np.dtype(dtype).itemsize
    assert_close(record["bytes_sent"], 2 * (3 - 1) / 3 * num_values(params) * itemsize, rtol=1e-12,
                 what="bytes_sent")
    assert len(record["worker_losses"]) == 3
    assert_close(record["inner_loss"], np.mean(record["worker_losses"]), rtol=1e-12, what="inner_loss")


@pytest.mark.m25
@pytest.mark.parametrize("dtype", DTYPES)
def test_run_diloco_round_is_pure(dtype):
    params, outer, states, shards = round_inputs(2, 2, dtype=dtype, warm=True)
    inputs = (params, outer, states, shards)
    before = snapshot(inputs)
    result = run_diloco_round(params, outer, states, shards, tiny_config(dtype=np.dtype(dtype).name),
                              np.random.default_rng(0))
    assert_unchanged(before, inputs, what="global_params, outer_state, worker_states and shards")
    assert_no_shared_memory((result.global_params, result.outer_state, result.worker_states), inputs,
                            what="run_diloco_round result")
    for tree in (result.global_params, result.outer_state.momentum, result.worker_states[0].m):
        assert all(value.dtype == dtype for value in tree.values()), "dtype must follow the params"


@pytest.mark.m25
def test_run_diloco_round_is_deterministic_given_the_generator():
    params, outer, states, shards = round_inputs(4, 2)
    config = tiny_config()
    first = run_diloco_round(params, outer, states, shards, config, np.random.default_rng(8))
    second = run_diloco_round(params, outer, states, shards, config, np.random.default_rng(8))
    for key in params:
        assert np.array_equal(first.global_params[key], second.global_params[key])
    assert first.record == second.record


@pytest.mark.m25
def test_run_diloco_round_rejects_bad_input():
    params, outer, states, shards = round_inputs(1, 2)
    config = tiny_config()
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="shards"):
        run_diloco_round(params, outer, states, shards[:1], config, rng)
    with pytest.raises(ValueError, match="worker_states"):
        run_diloco_round(params, outer, states + states, shards, config, rng)
    with pytest.raises(TypeError, match="rng"):
        run_diloco_round(params, outer, states, shards, config, 0)
    with pytest.raises(TypeError, match="config"):
        run_diloco_round(params, outer, states, shards, config.inner, rng)
    with pytest.raises(ValueError, match="global_params"):
        run_diloco_round({"W1": params["W1"]}, outer, states, shards, config, rng)


# --------------------------------------------------------------------------- m26 train_diloco


def _fixture_case(marker):
    fixture = load_fixture(marker)
    inputs = fixture["inputs"]
    x, y = np.array(inputs["x"], dtype=np.float64), np.array(inputs["y"], dtype=np.int64)
    return fixture, x, y, DiLoCoConfig.from_dict(inputs["config"]), as_params(inputs["initial_params"])


def _check_fixture_history(history, expected):
    for key, values in expected.items():
        got = [record[key] for record in history]
        assert_close(got, values, rtol=1e-12, what=f"history {key!r}")
    assert all(record["eval_loss"] is None and record["eval_accuracy"] is None for record in history)


@pytest.mark.m26
def test_train_diloco_matches_hand_worked_fixture():
    fixture, x, y, config, initial = _fixture_case("m26")
    result = train_diloco(x, y, config)
    moved = {key: result.params[key] - initial[key] for key in initial}
    assert_params_close(moved, as_params(fixture["expected"]["displacement"]), rtol=0.0, atol=1e-9,
                        what="final params - initial params")
    _check_fixture_history(result.history, fixture["expected"]["history"])


@pytest.mark.m26
@FEW_EXAMPLES
@given(seed=st.integers(0, 2**16), inner_steps=st.integers(1, 3), rounds=st.integers(2, 3),
       batch_size=st.integers(1, 30), hidden=st.sampled_from([(), (3,), (4, 3)]))
def test_one_worker_fedavg_is_plain_adamw_training(seed, inner_steps, rounds, batch_size, hidden):
    """K = 1, outer_lr = 1, mu = 0: DiLoCo is AdamW on the whole data, state carried across rounds."""
    x, y = tiny_data(seed)
    config = tiny_config(num_workers=1, inner_steps=inner_steps, rounds=rounds, batch_size=batch_size,
                         hidden_sizes=hidden, outer_lr=1.0, outer_momentum=0.0, seed=seed)
    expected, _, _ = plain_adamw_training(x, y, config)
    assert_params_close(train_diloco(x, y, config).params, expected, rtol=1e-10, atol=1e-12,
                        what="DiLoCo with one worker vs plain AdamW")


@pytest.mark.m26
@pytest.mark.parametrize("iid", [True, False])
def test_train_diloco_is_setup_then_rounds_of_run_diloco_round(iid):
    """Documented order: shard, init, fresh worker/outer states, then carry everything round to round."""
    x, y = tiny_data(5, num_examples=30)
    config = tiny_config(num_workers=3, inner_steps=2, rounds=3, iid=iid, alpha=0.3, seed=5)
    rng = np.random.default_rng(5)
    if iid:
        shards = iid_shard_dataset(x, y, 3, rng)
    else:
        shards = noniid_shard_dataset(x, y, 3, rng, alpha=0.3)
    params = init_model_params(layer_sizes_for(x, y, config), rng)
    states = [init_adamw_state(params) for _ in range(3)]
    outer = init_outer_optimizer(params)
    records = []
    for _ in range(3):
        params, outer, states, record = run_diloco_round(params, outer, states, shards, config, rng)
        records.append(record)
    result = train_diloco(x, y, config)
    assert_params_close(result.params, params, rtol=0.0, atol=0.0, what="train_diloco vs its rounds")
    for got, want in zip(result.history, records, strict=True):
        for key in ("inner_loss", "worker_losses", "pseudo_grad_norm", "bytes_sent", "all_reduces"):
            assert got[key] == want[key], f"history {key!r}: {got[key]} vs {want[key]}"


@pytest.mark.m26
def test_train_diloco_history_and_evaluation():
    x, y = tiny_data(8, num_examples=30)
    x_eval, y_eval = tiny_data(9, num_examples=12, num_classes=4)  # label 3 only in the held-out part
    config = tiny_config(num_workers=3, inner_steps=4, rounds=3)
    seen = []
    result = train_diloco(x, y, config, x_eval=x_eval, y_eval=y_eval, on_round=seen.append)
    history = result.history
    assert [r["round"] for r in history] == [1, 2, 3]
    assert [r["step"] for r in history] == [4, 8, 12]
    assert seen == history, "on_round must be called once per round with the finished record"
    per_round = 2 * (3 - 1) / 3 * num_values(result.params) * 8
    assert_close([r["bytes_sent"] for r in history], [per_round] * 3, rtol=1e-12, what="bytes_sent")
    assert_close([r["cumulative_bytes"] for r in history], [per_round, 2 * per_round, 3 * per_round], rtol=1e-12,
                 what="cumulative_bytes")
    assert result.params["b2"].shape == (4,), "C = max label over train and held-out data + 1"
    for record in history:
        assert np.isfinite(record["eval_loss"]) and 0.0 <= record["eval_accuracy"] <= 1.0
    assert history[-1]["eval_loss"] == evaluate_loss(result.params, x_eval, y_eval)
    assert history[-1]["eval_accuracy"] == classification_accuracy(result.params, x_eval, y_eval)
    assert history[0]["eval_loss"] != history[-1]["eval_loss"], "evaluate after every round, not once"


@pytest.mark.m26
def test_train_diloco_same_seed_is_bit_identical_and_a_new_seed_differs():
    x, y = tiny_data(3)
    config = tiny_config(rounds=3)
    first = train_diloco(x, y, config)
    assert_same_run(train_diloco(x, y, config), first, "the same seed twice")
    assert_same_run(train_diloco(x, y, config, rng=np.random.default_rng(config.seed)), first,
                    "rng=None must mean default_rng(config.seed)")
    other = train_diloco(x, y, config.replace(seed=1))
    assert not np.array_equal(other.params["W1"], first.params["W1"]), "a different seed must give a different run"


@pytest.mark.m26
def test_train_diloco_draws_everything_from_the_given_generator():
    """A generator seeded apart from config.seed: shards, init and every round's worker
    streams come from it (re-seeding from config.seed for the rounds is a mistake)."""
    check_given_generator_wins(train_diloco)


@pytest.mark.m26
def test_train_diloco_on_round_sees_each_record_when_its_round_ends():
    check_on_round_timing(train_diloco)


@pytest.mark.m26
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_train_diloco_is_pure_and_keeps_the_dtype(dtype):
    x, y = tiny_data(4, dtype=np.dtype(dtype))
    x_eval, y_eval = tiny_data(5, num_examples=6, dtype=np.dtype(dtype))
    before = snapshot((x, y, x_eval, y_eval))
    result = train_diloco(x, y, tiny_config(dtype=dtype), x_eval=x_eval, y_eval=y_eval)
    assert_unchanged(before, (x, y, x_eval, y_eval), what="x, y, x_eval and y_eval")
    assert_no_shared_memory(result.params, (x, y, x_eval, y_eval), what="train_diloco params")
    for key, value in result.params.items():
        assert value.dtype == np.dtype(dtype), f"params[{key!r}] is {value.dtype}, expected {dtype}"
        assert np.all(np.isfinite(value))


@pytest.mark.m26
def test_train_diloco_rejects_bad_input():
    x, y = tiny_data(0)
    config = tiny_config()
    with pytest.raises(ValueError, match="x_eval"):
        train_diloco(x, y, config, x_eval=x)
    with pytest.raises(ValueError, match="x_eval"):
        train_diloco(x, y, config, x_eval=x[:, :2], y_eval=y)
    with pytest.raises(ValueError, match="y"):
        train_diloco(x, y[:-1], config)
    bad = x.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="x"):
        train_diloco(bad, y, config)
    with pytest.raises(TypeError, match="config"):
        train_diloco(x, y, config.inner)
    with pytest.raises(TypeError, match="rng"):
        train_diloco(x, y, config, rng=0)


@pytest.mark.m26
@pytest.mark.slow
def test_train_diloco_reaches_95_percent_on_held_out_digits():
    data = load_digits_split(0)
    result = train_diloco(data.x_train, data.y_train, DiLoCoConfig(), x_eval=data.x_test, y_eval=data.y_test)
    accuracy = result.history[-1]["eval_accuracy"]
    assert accuracy >= 0.95, f"DiLoCo (K=8, H=50, 10 rounds) reached only {accuracy:.3f} held-out accuracy"


# --------------------------------------------------------------------------- m27 train_synchronous_baseline


@pytest.mark.m27
def test_train_synchronous_baseline_matches_hand_worked_fixture():
    fixture, x, y, config, initial = _fixture_case("m27")
    result = train_synchronous_baseline(x, y, config)
    moved = {key: result.params[key] - initial[key] for key in initial}
    assert_params_close(moved, as_params(fixture["expected"]["displacement"]), rtol=0.0, atol=1e-9,
                        what="final params - initial params")
    _check_fixture_history(result.history, fixture["expected"]["history"])


CASE_FIELDS = ("seed", "K", "H", "rounds", "batch", "n")


def m27_reference_cases():
    """The stored runs of an independent data-parallel loop (tests/fixtures/README.md)."""
    with np.load(FIXTURES / "m27_reference.npz") as stored:
        cases = json.loads(str(stored["cases"]))
        return [
            pytest.param(tuple(case), {key.split("/", 1)[1]: stored[key] for key in stored.files
                                       if key.startswith(f"case{i}/")},
                         id="-".join(f"{name}{value}" for name, value in zip(CASE_FIELDS, case, strict=False)))
            for i, case in enumerate(cases)
        ]


@pytest.mark.m27
@pytest.mark.parametrize("case, expected", m27_reference_cases())
def test_baseline_averages_the_workers_gradients_into_one_adamw_step(case, expected):
    """Same shards, init and per-worker streams as DiLoCo; one AdamW step on the plain mean of
    the K gradients, also when n is not divisible by K (shards of unequal size)."""
    seed, num_workers, inner_steps, rounds, batch_size, num_examples = case
    x, y = tiny_data(seed, num_examples=num_examples)
    config = tiny_config(num_workers=num_workers, inner_steps=inner_steps, rounds=rounds, batch_size=batch_size,
                         seed=seed)
    result = train_synchronous_baseline(x, y, config)
    record_losses = expected["worker_losses"]
    assert_params_close(result.params, {key: value for key, value in expected.items() if key != "worker_losses"},
                        rtol=1e-10, atol=1e-12, what="baseline params")
    assert len(result.history) == rounds, f"expected {rounds} records, got {len(result.history)}"
    for r, (record, losses) in enumerate(zip(result.history, record_losses, strict=True)):
        assert_close(record["worker_losses"], losses, rtol=1e-10, what=f"record {r} worker_losses")
        assert_close(record["inner_loss"], losses.mean(), rtol=1e-10, what=f"record {r} inner_loss")


@pytest.mark.m27
@pytest.mark.parametrize("rounds, inner_steps", [(3, 1), (2, 3)])
def test_baseline_with_one_worker_is_plain_adamw_training(rounds, inner_steps):
    x, y = tiny_data(2)
    config = tiny_config(num_workers=1, inner_steps=inner_steps, rounds=rounds, batch_size=5, seed=2)
    expected, _, _ = plain_adamw_training(x, y, config)
    assert_params_close(train_synchronous_baseline(x, y, config).params, expected, rtol=1e-10, atol=1e-12,
                        what="baseline with one worker vs plain AdamW")


@pytest.mark.m27
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_baseline_history_is_aligned_with_diloco_rounds(dtype):
    x, y = tiny_data(6, num_examples=30)
    config = tiny_config(num_workers=3, inner_steps=4, rounds=3, dtype=dtype)
    seen = []
    result = train_synchronous_baseline(x, y, config, on_round=seen.append)
    history = result.history
    assert [r["round"] for r in history] == [1, 2, 3]
    assert [r["step"] for r in history] == [4, 8, 12], "a record every inner_steps steps, as DiLoCo's rounds"
    assert [r["all_reduces"] for r in history] == [4, 4, 4], "one all-reduce per step"
    per_step = 2 * (3 - 1) / 3 * num_values(result.params) * np.dtype(dtype).itemsize
    assert_close([r["bytes_sent"] for r in history], [4 * per_step] * 3, rtol=1e-12, what="bytes_sent")
    assert_close([r["cumulative_bytes"] for r in history], [4 * per_step, 8 * per_step, 12 * per_step],
                 rtol=1e-12, what="cumulative_bytes")
    assert seen == history
    assert all(r["eval_loss"] is None for r in history)
    assert all(value.dtype == np.dtype(dtype) for value in result.params.values())


@pytest.mark.m27
def test_baseline_ignores_the_outer_optimizer_and_is_deterministic():
    x, y = tiny_data(1)
    config = tiny_config()
    first = train_synchronous_baseline(x, y, config)
    second = train_synchronous_baseline(x, y, config.replace(outer_lr=0.1, outer_momentum=0.0, nesterov=False))
    assert_same_run(second, first, "the baseline has no outer optimizer")
    other = train_synchronous_baseline(x, y, config.replace(seed=3))
    assert not np.array_equal(other.params["W1"], first.params["W1"]), "a different seed must give a different run"


@pytest.mark.m27
def test_baseline_draws_everything_from_the_given_generator():
    """A generator seeded apart from config.seed: shards, init and every round's worker
    streams come from it (re-seeding from config.seed for the steps is a mistake)."""
    check_given_generator_wins(train_synchronous_baseline)


@pytest.mark.m27
def test_baseline_on_round_sees_each_record_when_its_round_ends():
    check_on_round_timing(train_synchronous_baseline)


@pytest.mark.m27
def test_baseline_is_pure_and_evaluates_each_record():
    x, y = tiny_data(4)
    x_eval, y_eval = tiny_data(5, num_examples=6)
    before = snapshot((x, y, x_eval, y_eval))
    result = train_synchronous_baseline(x, y, tiny_config(rounds=3), x_eval=x_eval, y_eval=y_eval)
    assert_unchanged(before, (x, y, x_eval, y_eval), what="x, y, x_eval and y_eval")
    assert_no_shared_memory(result.params, (x, y, x_eval, y_eval), what="baseline params")
    assert result.history[-1]["eval_loss"] == evaluate_loss(result.params, x_eval, y_eval)
    assert result.history[-1]["eval_accuracy"] == classification_accuracy(result.params, x_eval, y_eval)


@pytest.mark.m27
def test_train_synchronous_baseline_rejects_bad_input():
    x, y = tiny_data(0)
    config = tiny_config()
    with pytest.raises(ValueError, match="y_eval"):
        train_synchronous_baseline(x, y, config, y_eval=y)
    with pytest.raises(ValueError, match="y"):
        train_synchronous_baseline(x, y[:-2], config)
    with pytest.raises(TypeError, match="config"):
        train_synchronous_baseline(x, y, {"num_workers": 2})
    with pytest.raises(ValueError, match="num_workers"):
        train_synchronous_baseline(x[:1], y[:1], config)


@pytest.mark.m27
@pytest.mark.slow
def test_baseline_reaches_95_percent_on_held_out_digits():
    data = load_digits_split(0)
    result = train_synchronous_baseline(data.x_train, data.y_train, DiLoCoConfig(), x_eval=data.x_test,
                                        y_eval=data.y_test)
    accuracy = result.history[-1]["eval_accuracy"]
    assert accuracy >= 0.95, f"the synchronous baseline reached only {accuracy:.3f} held-out accuracy"


# ------------------------------------------------------------------ the paper's mechanisms (keyword extensions)
# Shard-size weights, dropped outer gradients (worker_starts), an input encoder (encode=),
# and the inner lr schedule and clipping of the baseline: diloco.mechanisms, composed by
# milestones 25-27. The oracles are written out here from the earlier milestones.


class OneHotOracle:
    """The encoder contract of ``diloco.text.OneHot`` in plain NumPy: windows (b, c) -> (b, c V)."""

    def __init__(self, vocab_size, context):
        self.vocab_size, self.context = vocab_size, context
        self.input_width, self.num_features = context, context * vocab_size

    def __call__(self, windows, dtype=np.float64):
        out = np.zeros((len(windows), self.num_features), dtype=dtype)
        for j in range(self.context):
            out[np.arange(len(windows)), j * self.vocab_size + windows[:, j].astype(int)] = 1.0
        return out


def text_like_data(seed, num_examples=30, context=3, vocab_size=4):
    """Index windows (float32, as diloco.text stores them) and a next 'character' for each."""
    rng = np.random.default_rng(seed)
    windows = rng.integers(0, vocab_size, (num_examples, context))
    labels = (windows.sum(axis=1) + rng.integers(0, 2, num_examples)) % vocab_size
    labels[:vocab_size] = np.arange(vocab_size)  # every class present
    return windows.astype(np.float32), labels.astype(np.int64)


@pytest.mark.m25
def test_round_weighs_non_iid_pseudo_gradients_by_shard_size():
    sizes = (2, 5, 9)
    params, outer, states, shards = round_inputs(4, 3, shard_sizes=sizes)
    fedavg = dict(num_workers=3, outer_lr=1.0, outer_momentum=0.0)  # the new model is the workers' average
    workers = [p for p, _, _ in independent_workers(params, states, shards, tiny_config(**fedavg),
                                                     np.random.default_rng(6))]
    weighted = {key: sum(n * w[key] for n, w in zip(sizes, workers, strict=True)) / sum(sizes) for key in params}
    noniid = run_diloco_round(params, outer, states, shards, tiny_config(iid=False, **fedavg), np.random.default_rng(6))
    assert_params_close(noniid.global_params, weighted, rtol=1e-10, atol=1e-13,
                        what="non-IID shards (shard_weighting 'auto'): the average weighted by shard size")
    for changes in ({"iid": True}, {"iid": False, "shard_weighting": "uniform"}):
        uniform = run_diloco_round(params, outer, states, shards, tiny_config(**changes, **fedavg),
                                   np.random.default_rng(6))
        assert_params_close(uniform.global_params, numpy_mean(workers), rtol=1e-10, atol=1e-13,
                            what=f"{changes}: the plain average")


@pytest.mark.m25
def test_round_leaves_dropped_outer_gradients_out_and_those_workers_carry_on():
    num_workers, p = 4, 0.5

    def drops(seed):  # the documented order: spawn the K worker streams, then draw the drops
        rng = np.random.default_rng(seed)
        children = rng.spawn(num_workers)
        return children, np.flatnonzero(rng.random(num_workers) < p).tolist()

    seed = next(s for s in range(100) if 0 < len(drops(s)[1]) < num_workers)
    children, dropped = drops(seed)
    params, outer, states, shards = round_inputs(seed, num_workers)
    own = {key: value + 0.05 for key, value in params.items()}  # worker 1 was dropped last round
    starts = [params, own, params, params]
    config = tiny_config(num_workers=num_workers, drop_prob=p, outer_lr=1.0, outer_momentum=0.0)
    result = run_diloco_round(params, outer, states, shards, config, np.random.default_rng(seed),
                              worker_starts=starts)
    assert result.record["dropped_workers"] == dropped
    workers = [inner_train_worker(start, state, x_k, y_k, config.inner_steps, config.batch_size, config.inner,
                                  child)[0]
               for start, state, (x_k, y_k), child in zip(starts, states, shards, children, strict=True)]
    kept = [k for k in range(num_workers) if k not in dropped]
    assert_params_close(result.global_params, numpy_mean([workers[k] for k in kept]), rtol=1e-10, atol=1e-13,
                        what="FedAvg over the workers whose outer gradient arrived")
    for k in range(num_workers):
        expected = workers[k] if k in dropped else result.global_params
        assert_params_close(result.worker_starts[k], expected, rtol=0, atol=0,
                            what=f"worker {k} starts next round from " + ("its own params" if k in dropped
                                                                          else "the new global params"))


@pytest.mark.m25
def test_round_renormalises_shard_size_weights_over_the_kept_workers():
    """Dropped outer gradients and non-IID shards together: the kept workers' shard-size
    weights are renormalised over the kept workers, ``w_k = n_k / sum_{j kept} n_j``.

    Worked by hand: one affine layer (2 -> 2) and all-zero inputs, so ``dW1 = 0`` and the
    logits are ``b1 = 0``; ``p = [1/2, 1/2]`` and ``db1 = p - onehot(y)``: ``[-1/2, 1/2]``
    for label 0, ``[1/2, -1/2]`` for label 1 (every row of a shard has the same label).
    One AdamW step from a fresh state (wd 0) moves ``b1`` by ``-lr g / (|g| + eps)``, so
    ``b1_k = [c, -c]`` (label 0) or ``[-c, c]`` (label 1), ``c = lr (1/2) / (1/2 + eps)``,
    and leaves ``W1`` where the worker started. With outer lr 1 and momentum 0 the new
    global model is ``sum_{k kept} w_k theta_k``. Shards of 1, 3 and 6 rows (labels 0, 1,
    0); worker 1 starts from its own params (it was dropped the round before).
    """
    sizes, labels = (1, 3, 6), (0, 1, 0)
    shards = [(np.zeros((n, 2)), np.full(n, label, dtype=np.int64)) for n, label in zip(sizes, labels, strict=True)]
    params = {"W1": np.array([[1.0, 2.0], [3.0, 4.0]]), "b1": np.zeros(2)}
    starts = [params, {"W1": params["W1"] + 1.0, "b1": np.zeros(2)}, params]
    config = tiny_config(num_workers=3, inner_steps=1, batch_size=2, iid=False, drop_prob=0.5, outer_lr=1.0,
                         outer_momentum=0.0, inner={"lr": 0.1, "weight_decay": 0.0})
    c = 0.1 * 0.5 / (0.5 + config.inner.eps)
    workers = [{"W1": start["W1"], "b1": np.array([c, -c]) if label == 0 else np.array([-c, c])}
               for start, label in zip(starts, labels, strict=True)]
    patterns = set()
    for seed in range(16):
        states = [adamw_state(params) for _ in range(3)]
        outer = OuterState({key: np.zeros_like(value) for key, value in params.items()})
        result = run_diloco_round(params, outer, states, shards, config, np.random.default_rng(seed),
                                  worker_starts=starts)
        dropped = result.record["dropped_workers"]
        kept = [k for k in range(3) if k not in dropped]
        patterns.add(tuple(dropped))
        if kept:
            total = sum(sizes[k] for k in kept)
            expected = {key: sum(sizes[k] / total * workers[k][key] for k in kept) for key in params}
        else:  # nothing arrived: no outer step
            expected = params
        assert_params_close(result.global_params, expected, rtol=1e-12, atol=1e-15,
                            what=f"seed {seed}, dropped {dropped}: kept workers {kept} weighted by "
                                 f"{[sizes[k] for k in kept]} / {sum(sizes[k] for k in kept)}")
        for k in dropped:
            assert_params_close(result.worker_starts[k], workers[k], rtol=1e-12, atol=1e-15,
                                what=f"seed {seed}: dropped worker {k} carries on from its own params")
    proper = {pattern for pattern in patterns if 0 < len(pattern) < 3}
    assert len(proper) >= 3, f"the seeds must drop several different proper subsets, saw {sorted(patterns)}"


@pytest.mark.m26
def test_train_diloco_with_drops_on_non_iid_shards_matches_its_rounds():
    """``train_diloco`` with ``iid=False`` and ``drop_prob > 0``: the rounds of
    ``run_diloco_round`` on the non-IID shards, with the starts carried between them."""
    x, y = tiny_data(7, num_examples=30)
    config = tiny_config(num_workers=3, rounds=3, drop_prob=0.5, seed=4, iid=False, alpha=0.3)
    result = train_diloco(x, y, config)
    rng = np.random.default_rng(config.seed)
    shards = noniid_shard_dataset(x, y, 3, rng, alpha=0.3)
    assert len({len(y_k) for _, y_k in shards}) > 1, "this seed must give shards of different sizes"
    params = init_model_params(layer_sizes_for(x, y, config), rng)
    states, outer, starts = [init_adamw_state(params) for _ in range(3)], init_outer_optimizer(params), [params] * 3
    for _ in range(config.rounds):
        params, outer, states, _, starts = run_diloco_round(params, outer, states, shards, config, rng,
                                                            worker_starts=starts)
    assert any(0 < len(record["dropped_workers"]) < 3 for record in result.history), "this seed drops a worker"
    assert_params_close(result.params, params, rtol=1e-12, atol=1e-15,
                        what="train_diloco (non-IID, drops) vs its rounds carrying worker_starts")


@pytest.mark.m25
def test_round_with_drops_needs_worker_starts():
    params, outer, states, shards = round_inputs(1, 2)
    with pytest.raises(ValueError, match="worker_starts"):
        run_diloco_round(params, outer, states, shards, tiny_config(drop_prob=0.3), np.random.default_rng(0))


@pytest.mark.m26
def test_train_diloco_with_an_encoder_trains_on_the_encoded_inputs():
    windows, labels = text_like_data(2)
    eval_windows, eval_labels = text_like_data(3, num_examples=10)
    encode = OneHotOracle(4, 3)
    config = tiny_config(num_workers=3, rounds=2)
    got = train_diloco(windows, labels, config, x_eval=eval_windows, y_eval=eval_labels, encode=encode)
    want = train_diloco(encode(windows), labels, config, x_eval=encode(eval_windows), y_eval=eval_labels)
    assert_params_close(got.params, want.params, rtol=1e-12, atol=1e-15, what="params: windows + encode vs one-hot")
    for mine, gold in zip(got.history, want.history, strict=True):
        assert_close(mine["eval_loss"], gold["eval_loss"], rtol=1e-12, what="held-out loss, evaluated encoded")


@pytest.mark.m26
def test_train_diloco_with_drops_carries_worker_starts_from_round_to_round():
    x, y = tiny_data(5, num_examples=30)
    config = tiny_config(num_workers=3, rounds=3, drop_prob=0.5, seed=2)
    result = train_diloco(x, y, config)
    rng = np.random.default_rng(config.seed)
    shards = iid_shard_dataset(x, y, 3, rng)
    params = init_model_params(layer_sizes_for(x, y, config), rng)
    states, outer, starts = [init_adamw_state(params) for _ in range(3)], init_outer_optimizer(params), [params] * 3
    for _ in range(config.rounds):
        params, outer, states, _, starts = run_diloco_round(params, outer, states, shards, config, rng,
                                                            worker_starts=starts)
    assert any(record["dropped_workers"] for record in result.history), "this seed drops an outer gradient"
    assert_params_close(result.params, params, rtol=1e-12, atol=1e-15,
                        what="train_diloco vs rounds that carry worker_starts (every worker starts at the init)")


@pytest.mark.m27
def test_baseline_with_an_encoder_trains_on_the_encoded_inputs():
    windows, labels = text_like_data(4)
    encode = OneHotOracle(4, 3)
    config = tiny_config(num_workers=2, rounds=2)
    got = train_synchronous_baseline(windows, labels, config, encode=encode)
    want = train_synchronous_baseline(encode(windows), labels, config)
    assert_params_close(got.params, want.params, rtol=1e-12, atol=1e-15, what="params: windows + encode vs one-hot")


@pytest.mark.m27
def test_baseline_clips_and_follows_the_inner_lr_schedule():
    import math

    from diloco.adamw import adamw_step
    from diloco.model import model_backward, model_forward

    x, y = tiny_data(6, num_examples=20)
    config = tiny_config(num_workers=2, inner_steps=3, rounds=2, lr_schedule="cosine", warmup_steps=2, clip_norm=0.5)
    result = train_synchronous_baseline(x, y, config)
    rng = np.random.default_rng(config.seed)
    shards = iid_shard_dataset(x, y, 2, rng)
    params = init_model_params(layer_sizes_for(x, y, config), rng)
    state, step, total, peak = init_adamw_state(params), 0, 6, config.inner.lr
    for _ in range(config.rounds):
        children = rng.spawn(2)
        for _ in range(config.inner_steps):
            grads = []
            for (x_k, y_k), child in zip(shards, children, strict=True):
                x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, child)
                _, cache = model_forward(params, x_batch)
                grads.append(model_backward(params, cache, y_batch))
            mean = {key: (grads[0][key] + grads[1][key]) / 2 for key in params}
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in mean.values()))
            coef = 0.5 / (norm + 1e-6)  # torch.nn.utils.clip_grad_norm_
            if coef < 1:
                mean = {key: g * coef for key, g in mean.items()}
            step += 1
            cosine = 0.5 * (1 + math.cos(math.pi * (step - 2) / (total - 2)))
            lr = peak * step / 2 if step <= 2 else peak * (0.1 + 0.9 * cosine)
            params, state = adamw_step(params, state, mean, AdamWConfig(lr=lr, weight_decay=config.inner.weight_decay))
    assert_params_close(result.params, params, rtol=1e-10, atol=1e-13,
                        what="baseline with warmup + cosine lr and gradient clipping")
