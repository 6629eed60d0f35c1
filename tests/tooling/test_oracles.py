"""Every algorithm of the core equals its independent oracle (``tests/tooling/oracles``), on every executor.

Hypothesis draws small configurations, the awkward values included: asymmetric mixes,
unequal arrival groups, dropped workers and rounds where every worker is dropped,
unequal shards (non-IID, and batches larger than a shard), P not dividing H, every
overlap tau from 0 to H - 1, ties in top-k. For each, ``diloco.core.driver.train``
on the reference and the stacked executors must give the oracle's final params and,
round by round, its workers' losses, outer-gradient norm, held-out loss, dropped
workers and syncs (step, bytes, tau), to 1e-12 relative in float64. Only the public
API is read: ``TrainResult.params`` and ``history``.

Beside the drawn configurations: explicit examples of the awkward cases (so they are
run whatever Hypothesis draws), a hand-worked table of which fragment is sent and
merged after which step, and five fixed configurations on real MPI ranks.

``scripts/plant_core_mistakes.py`` plants realistic mistakes in the core, one at a
time (``core_mistakes.py``), and shows which of these tests catches each; every test
here catches at least one. The oracles found one core bug, now fixed: asynchronous
records named non-arriving workers as dropped.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from oracles import async_diloco, diloco, eager_diloco, fragment_schedule, streaming_diloco

from diloco import AdamWConfig, DiLoCoConfig
from diloco.config.sections import AsyncConfig, FamilyConfig, TransformerShape
from diloco.core.driver import train
from diloco.text import OneHot

EXECUTORS = ("reference", "fast")
RTOL = 1e-12
# The transformer's params: the core forms theta - mean_k theta_k, the oracle mean_k (theta - theta_k), and
# AdamW's division by sqrt(v) and the layer norms carry that last-bit difference a little further (1.2e-12 seen).
TRANSFORMER_RTOL = 1e-11
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- data, configurations and the comparison ------------------------------------------------------

def make_data(seed: int, rows: int, features: int = 5, classes: int = 3, duplicate: bool = False):
    """``(x, y, x_eval, y_eval)``: Gaussian features, every class present. With ``duplicate`` the
    four features are two, each twice (``[a, b, a, b]``): without weight decay rows i and i + 2 of
    W1 get the same outer gradient, so every magnitude in W1 is tied with its twin's."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows + 8, features))
    if duplicate:
        x = np.concatenate([x[:, :2], x[:, :2]], axis=1)
    y = rng.integers(0, classes, rows + 8)
    y[:classes] = np.arange(classes)
    return x[:rows], y[:rows], x[rows:], y[rows:]


def close(got, want, what: str, scale: float = 0.0, rtol: float = RTOL) -> None:
    """``|got - want| <= rtol * scale``, ``scale`` at least the largest magnitude of either."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = max(scale, float(np.max(np.abs(want), initial=0.0)), float(np.max(np.abs(got), initial=0.0)))
    error = float(np.max(np.abs(got - want), initial=0.0))
    assert error <= rtol * scale, f"{what}: off by {error:.3g} (relative {error / (scale or 1):.3g})"


def assert_matches(result, oracle, *, dropped: bool = True, extra=(), rtol: float = RTOL) -> None:
    """The core's params and history equal the oracle's (see the module doc)."""
    assert list(result.params) == list(oracle.params)
    # Relative to the model's scale: the core forms theta - mean_k theta_k, the papers
    # mean_k (theta - theta_k), which round alike only at the parameters' magnitude (a bias
    # that barely moved from 0 would otherwise ask for 1e-12 of its own 1e-11).
    scale = max(float(np.max(np.abs(value))) for value in oracle.params.values())
    for key, value in oracle.params.items():
        close(result.params[key], value, f"params[{key!r}]", scale, rtol)
    assert len(result.history) == len(oracle.rounds)
    for index, (record, entry) in enumerate(zip(result.history, oracle.rounds, strict=True), start=1):
        close(record["worker_losses"], entry["worker_losses"], f"round {index} worker_losses")
        close(record["pseudo_grad_norm"], entry["pseudo_grad_norm"], f"round {index} pseudo_grad_norm")
        close(record["eval_loss"], entry["eval_loss"], f"round {index} eval_loss")
        assert [[h, tau] for h, _, tau in record["syncs"]] == [[h, tau] for h, _, tau in entry["syncs"]], index
        close([s[1] for s in record["syncs"]], [s[1] for s in entry["syncs"]], f"round {index} sync bytes")
        if dropped:  # the record names them only with drop_prob > 0, the oracle always ([] without drops)
            assert record.get("dropped_workers", []) == entry["dropped"], f"round {index} dropped workers"
        for field, name in extra:
            assert record[field] == entry[name], f"round {index} {field}"


def run_all(config, data, oracle, **compare):
    x, y, x_eval, y_eval = data
    want = oracle(x, y, config, x_eval, y_eval)
    for executor in EXECUTORS:
        got = train("diloco", x, y, config, executor=executor, x_eval=x_eval, y_eval=y_eval, sync_fields=True)
        assert_matches(got, want, **compare)
    return want


@st.composite
def base_configs(draw, max_workers: int = 4, hidden=((), (3,), (4, 3))):
    """The fields every algorithm shares: workers, steps, rounds, shards, weights, drops, outer SGD."""
    drop_prob = draw(st.sampled_from([0.0, 0.0, 0.35, 0.7, 0.95]))
    iid = draw(st.booleans())
    return dict(
        num_workers=draw(st.integers(1, max_workers)), inner_steps=draw(st.integers(1, 4)),
        rounds=draw(st.integers(1, 3)), batch_size=draw(st.integers(1, 9)),
        hidden_sizes=draw(st.sampled_from(hidden)), seed=draw(st.integers(0, 2**16)), iid=iid,
        alpha=draw(st.sampled_from([0.2, 1.0, 5.0])),
        shard_weighting=draw(st.sampled_from(["auto", "uniform", "size"])),
        outer_lr=draw(st.sampled_from([0.3, 0.7, 1.0])), outer_momentum=draw(st.sampled_from([0.0, 0.5, 0.9])),
        nesterov=draw(st.booleans()), drop_prob=drop_prob,
        drop_rule=draw(st.sampled_from(["carry", "restart"])) if drop_prob else "carry",
        inner=AdamWConfig(lr=draw(st.sampled_from([0.01, 0.05])), weight_decay=draw(st.sampled_from([0.0, 0.01])),
                          beta1=draw(st.sampled_from([0.0, 0.9]))),
        inner_optimizer=draw(st.sampled_from(["adamw", "adamw", "sgd"])),
    )


def sparse_fields(draw, always: bool = False) -> dict:
    """``FamilyConfig`` fields of top-k (of the DCT) outer gradients with or without error
    feedback and its decay; ``{}`` (dense) a third of the time unless ``always``."""
    if not always and draw(st.integers(0, 2)) == 0:
        return {}
    feedback = draw(st.booleans())
    return dict(topk=draw(st.sampled_from([0.1, 0.25, 0.3, 0.5, 1.0])),
                topk_chunk=draw(st.sampled_from([1, 2, 3, 5, 8, 16])),
                topk_transform=draw(st.sampled_from(["none", "dct"])), error_feedback=feedback,
                topk_decay=draw(st.sampled_from([1.0, 0.9, 0.5])) if feedback else 1.0)


# --- DiLoCo, Algorithm 1: weights, drops under both rules ------------------------------------------

@FEW
@given(fields=base_configs(), rows=st.integers(12, 40))
@example(fields=dict(num_workers=3, inner_steps=3, rounds=3, batch_size=9, hidden_sizes=(4, 3), seed=7, iid=False,
                     alpha=0.2, shard_weighting="size", outer_lr=0.7, outer_momentum=0.9, nesterov=True,
                     drop_prob=0.35, drop_rule="restart", inner=AdamWConfig(lr=0.05)), rows=30)
@example(fields=dict(num_workers=2, inner_steps=3, rounds=2, batch_size=5, hidden_sizes=(4,), seed=11, iid=False,
                     alpha=0.2, shard_weighting="size", outer_lr=0.7, outer_momentum=0.9, nesterov=True,
                     drop_prob=0.0, drop_rule="carry", inner_optimizer="sgd",
                     inner=AdamWConfig(lr=0.05, weight_decay=0.01, beta1=0.9)), rows=24)  # SGD: momentum and decay
def test_diloco_equals_algorithm_1_with_weights_and_drops(fields, rows):
    config = DiLoCoConfig(**fields)
    run_all(config, make_data(fields["seed"], rows), diloco)


@pytest.mark.parametrize("rule", ["carry", "restart"])
def test_a_round_where_every_worker_is_dropped_moves_nothing_and_follows_the_rule(rule):
    """Seed 2 drops all three workers in round 3 (checked below), some in every other round: no
    outer step in round 3, the momentum kept for round 4, and the workers go on from their own
    params (carry) or the model (restart)."""
    config = DiLoCoConfig(num_workers=3, inner_steps=3, rounds=4, batch_size=4, hidden_sizes=(4,), seed=2,
                          iid=False, alpha=0.3, drop_prob=0.8, drop_rule=rule, inner=AdamWConfig(lr=0.05))
    want = run_all(config, make_data(1, 30), diloco)
    assert [entry["dropped"] for entry in want.rounds] == [[1, 2], [0, 1], [0, 1, 2], [0, 1]]


# --- the transformer: Algorithm 1 on the model seam's other model ---------------------------------

@st.composite
def transformer_configs(draw):
    """DiLoCo of a tiny transformer (``config.model``): heads that split d unevenly into the
    context, tied or untied output, weights, drops and (a third of the time) top-k."""
    fields = draw(base_configs(max_workers=3, hidden=((128,),)))
    width, heads = draw(st.sampled_from([(4, 1), (6, 3), (8, 2)]))
    shape = TransformerShape(d_model=width, n_heads=heads, n_layers=draw(st.integers(1, 2)), mlp_ratio=1,
                             tied=draw(st.booleans()))
    return DiLoCoConfig(**fields, model="transformer", transformer=shape, family=FamilyConfig(**sparse_fields(draw)))


def char_data(seed: int, rows: int, context: int, vocab: int = 5):
    """``(x, y, x_eval, y_eval)``: windows of ``context`` random token ids and the token after each."""
    ids = np.random.default_rng(seed).integers(0, vocab, rows + context + 6)
    ids[:vocab] = np.arange(vocab)
    x = np.lib.stride_tricks.sliding_window_view(ids[:-1], context).astype(np.float32)
    y = ids[context:]
    return x[:rows], y[:rows], x[rows:], y[rows:]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=transformer_configs(), rows=st.integers(12, 30), context=st.integers(1, 4))
@example(config=DiLoCoConfig(num_workers=3, inner_steps=3, rounds=2, batch_size=5, seed=3, iid=False, alpha=0.3,
                             drop_prob=0.35, inner=AdamWConfig(lr=0.05), model="transformer",
                             transformer=TransformerShape(d_model=6, n_heads=3, n_layers=2, mlp_ratio=1, tied=False)),
         rows=25, context=3)
def test_a_transformer_trained_with_diloco_equals_algorithm_1(config, rows, context):
    x, y, x_eval, y_eval = char_data(config.seed, rows, context)
    want = diloco(x, y, config, x_eval, y_eval, vocab_size=5)
    for executor in EXECUTORS:
        got = train("diloco", x, y, config, executor=executor, x_eval=x_eval, y_eval=y_eval, sync_fields=True,
                    encode=OneHot(5, context))
        assert_matches(got, want, rtol=TRANSFORMER_RTOL)


# --- sparse outer gradients: top-k and DCT with error feedback -------------------------------------

@st.composite
def sparse_configs(draw):
    """DiLoCo with top-k (of the DCT) outer gradients; ``ties``: a duplicated input column and no
    weight decay, so tied magnitudes straddle the cut of a chunk."""
    fields = draw(base_configs(hidden=((3,), (4, 3))))
    fields["rounds"] = draw(st.integers(1, 4))  # a residual kept through a drop shows from round 3
    ties = draw(st.booleans())
    if ties:
        fields["inner"] = AdamWConfig(lr=fields["inner"].lr, weight_decay=0.0)
    return DiLoCoConfig(**fields, family=FamilyConfig(**sparse_fields(draw, always=True))), ties


SPARSE = DiLoCoConfig(num_workers=3, inner_steps=3, rounds=3, batch_size=4, hidden_sizes=(4,), seed=4, iid=False,
                      alpha=0.3, drop_prob=0.35, inner=AdamWConfig(lr=0.05),
                      family=FamilyConfig(topk=0.3, topk_chunk=5, topk_transform="dct", error_feedback=True,
                                          topk_decay=0.9))


@FEW
@given(drawn=sparse_configs(), rows=st.integers(12, 40))
@example(drawn=(SPARSE, False), rows=30)  # worker 1 sends, is dropped, sends again: its residual waits
# W1 (4 x 4) is one chunk of 16 values in 8 tied pairs; k = ceil(0.3 * 16) = 5 is odd, so the cut
# splits a pair: the earlier of the two is sent.
@example(drawn=(SPARSE.replace(inner=AdamWConfig(lr=0.05, weight_decay=0.0), drop_prob=0.0,
                               family=FamilyConfig(topk=0.3, topk_chunk=16, error_feedback=True)), True), rows=30)
def test_topk_and_dct_with_error_feedback_equal_the_oracle(drawn, rows):
    config, ties = drawn
    run_all(config, make_data(config.seed, rows, duplicate=ties), diloco)


# --- Streaming DiLoCo: P fragments, pattern, tau, mix -----------------------------------------------

@st.composite
def streaming_configs(draw):
    fields = draw(base_configs(max_workers=3, hidden=((3,), (3, 4), (4, 3, 3))))
    layers = len(fields["hidden_sizes"]) + 1
    inner_steps = draw(st.integers(1, 7))
    fragments = draw(st.integers(1, min(layers, inner_steps)))
    family = FamilyConfig(fragments=fragments, pattern=draw(st.sampled_from(["strided", "sequential"])),
                          overlap=draw(st.integers(0, inner_steps - 1)),
                          mix=draw(st.sampled_from([1.0, 0.5, 0.25, 0.8]) | st.floats(0.05, 1.0)),
                          **sparse_fields(draw))
    return DiLoCoConfig(**{**fields, "inner_steps": inner_steps}, family=family)


@FEW
@given(config=streaming_configs(), rows=st.integers(12, 40))
@example(config=DiLoCoConfig(num_workers=3, inner_steps=5, rounds=3, batch_size=4, hidden_sizes=(4, 3, 3), seed=8,
                             iid=False, alpha=0.3, drop_prob=0.35, drop_rule="restart", inner=AdamWConfig(lr=0.05),
                             family=FamilyConfig(fragments=3, pattern="sequential", overlap=4, mix=0.3)), rows=30)
@example(config=DiLoCoConfig(num_workers=3, inner_steps=3, rounds=3, batch_size=4, hidden_sizes=(4, 3), seed=9,
                             iid=False, alpha=0.3, drop_prob=0.35, inner=AdamWConfig(lr=0.05),
                             family=FamilyConfig(fragments=2, overlap=1, mix=0.5, topk=0.3, topk_chunk=5,
                                                 error_feedback=True, topk_decay=0.9)), rows=30)
def test_streaming_diloco_equals_the_oracle_for_every_p_tau_and_mix(config, rows):
    run_all(config, make_data(config.seed, rows), streaming_diloco)


# Hand-worked: which fragment is sent, and merged, after which step (1-based over the run), for
# K = 2 workers of an MLP on 5 features and 3 classes. Fragment p syncs after step
# t_p = floor(p H / P) of every round (p = 0 after step H) and is merged tau steps later.
# Its sync sends its values once there and once back: 2 (K-1)/K N_p 8 = 8 N_p bytes.
HAND = {
    # P = 2, H = 4, tau = 1; hidden (3,): layer 1 has 5*3+3 = 18 values, layer 2 3*3+3 = 12.
    "P2 H4 tau1 strided": (dict(hidden_sizes=(3,), inner_steps=4), dict(fragments=2, overlap=1), [
        (2, "sync", 1), (3, "merge", 1), (4, "sync", 0), (5, "merge", 0),
        (6, "sync", 1), (7, "merge", 1), (8, "sync", 0)],
        [[2, 96.0, 1], [4, 144.0, 1]]),
    # P = 3, H = 4 (P does not divide H), tau = 3: t_p = 0, 1, 2; hidden (4, 2): 24, 10 and 9 values.
    "P3 H4 tau3 strided": (dict(hidden_sizes=(4, 2), inner_steps=4), dict(fragments=3, overlap=3), [
        (1, "sync", 1), (2, "sync", 2), (4, "sync", 0), (4, "merge", 1), (5, "sync", 1), (5, "merge", 2),
        (6, "sync", 2), (7, "merge", 0), (8, "sync", 0), (8, "merge", 1)],
        [[1, 80.0, 3], [2, 72.0, 3], [4, 192.0, 3]]),
    # P = 3, H = 5, tau = 0, sequential over 4 layers ([1, 2], [3], [4]): t_p = 0, 1, 3;
    # hidden (4, 2, 3): 24 + 10 = 34, 9 and 12 values.
    "P3 H5 tau0 sequential": (dict(hidden_sizes=(4, 2, 3), inner_steps=5),
                              dict(fragments=3, overlap=0, pattern="sequential"), [
        (1, "sync", 1), (1, "merge", 1), (3, "sync", 2), (3, "merge", 2), (5, "sync", 0), (5, "merge", 0),
        (6, "sync", 1), (6, "merge", 1), (8, "sync", 2), (8, "merge", 2), (10, "sync", 0), (10, "merge", 0)],
        [[1, 72.0, 0], [3, 96.0, 0], [5, 272.0, 0]]),
    # P = 1, H = 3, tau = 2: the whole model after step 3, merged after step 2 of the next round.
    "P1 H3 tau2": (dict(hidden_sizes=(3,), inner_steps=3), dict(fragments=1, overlap=2), [
        (3, "sync", 0), (5, "merge", 0), (6, "sync", 0)],
        [[3, 240.0, 2]]),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_the_hand_worked_fragment_table(name):
    fields, family_fields, events, syncs = HAND[name]
    family = FamilyConfig(**family_fields)
    config = DiLoCoConfig(num_workers=2, rounds=2, batch_size=3, seed=3, inner=AdamWConfig(lr=0.05), family=family,
                          **fields)
    assert fragment_schedule(family.fragments, config.inner_steps, family.overlap, config.rounds) == events
    x, y, x_eval, y_eval = make_data(0, 20)
    for executor in EXECUTORS:
        result = train("diloco", x, y, config, executor=executor, sync_fields=True)
        assert [record["syncs"] for record in result.history] == [syncs, syncs], executor
    want = streaming_diloco(x, y, config, x_eval, y_eval)
    assert [entry["syncs"] for entry in want.rounds] == [syncs, syncs]


# --- eager updates ---------------------------------------------------------------------------------

@st.composite
def eager_configs(draw):
    fields = draw(base_configs())
    fields.update(drop_prob=0.0, drop_rule="carry")  # eager updates need every fresh outer gradient
    return DiLoCoConfig(**fields, family=FamilyConfig(eager=True, **sparse_fields(draw)))


@FEW
@given(config=eager_configs(), rows=st.integers(12, 40))
@example(config=DiLoCoConfig(num_workers=3, inner_steps=3, rounds=3, batch_size=4, hidden_sizes=(4,), seed=5,
                             iid=False, alpha=0.3, inner=AdamWConfig(lr=0.05), family=FamilyConfig(eager=True)),
         rows=30)
@example(config=DiLoCoConfig(num_workers=3, inner_steps=3, rounds=3, batch_size=4, hidden_sizes=(4,), seed=5,
                             iid=False, alpha=0.3, inner=AdamWConfig(lr=0.05),
                             family=FamilyConfig(eager=True, topk=0.3, topk_chunk=5, error_feedback=True,
                                                 topk_decay=0.9)), rows=30)
def test_eager_updates_equal_the_oracle(config, rows):
    run_all(config, make_data(config.seed, rows), eager_diloco)


# --- asynchronous DiLoCo: arrival groups, delayed Nesterov, dynamic local steps --------------------

ASYNC_EXTRA = (("arrivals", "arrivals"), ("max_staleness", "max_staleness"), ("sim_cumulative_seconds", "seconds"))


@st.composite
def async_configs(draw):
    fields = draw(base_configs())
    workers = max(2, fields["num_workers"])
    period = draw(st.integers(0, 3))
    if period:
        fields.update(drop_prob=0.0, drop_rule="carry")  # delayed Nesterov counts arrivals: no drops
    section = AsyncConfig(asynchronous=True, delayed_nesterov=period, dynamic_local_steps=draw(st.booleans()),
                          step_times=tuple(draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])) for _ in range(workers)))
    family = FamilyConfig(mix=draw(st.sampled_from([1.0, 0.5, 0.3])), **sparse_fields(draw))
    return DiLoCoConfig(**{**fields, "num_workers": workers}, asynchrony=section, family=family)


@FEW
@given(config=async_configs(), rows=st.integers(12, 40))
@example(config=DiLoCoConfig(num_workers=3, inner_steps=4, rounds=3, batch_size=4, hidden_sizes=(4,), seed=6,
                             iid=False, alpha=0.5, inner=AdamWConfig(lr=0.05), family=FamilyConfig(mix=0.5),
                             asynchrony=AsyncConfig(asynchronous=True, step_times=(1.0, 1.5, 3.0),
                                                    delayed_nesterov=2, dynamic_local_steps=True)), rows=30)
@example(config=DiLoCoConfig(num_workers=3, inner_steps=3, rounds=3, batch_size=4, hidden_sizes=(4,), seed=1,
                             iid=False, alpha=0.3, drop_prob=0.35, inner=AdamWConfig(lr=0.05),
                             family=FamilyConfig(mix=0.3),
                             asynchrony=AsyncConfig(asynchronous=True, step_times=(1.0, 0.5, 2.0))), rows=30)
def test_asynchronous_diloco_equals_the_oracle(config, rows):
    run_all(config, make_data(config.seed, rows), async_diloco, dropped=False, extra=ASYNC_EXTRA)


def test_unequal_arrival_groups_are_applied_as_the_oracle_applies_them():
    """Workers 0 and 1 arrive together every 4 s, worker 2 every 8 s: groups of 2 then 3."""
    config = DiLoCoConfig(num_workers=3, inner_steps=4, rounds=3, batch_size=4, hidden_sizes=(4,), seed=2,
                          iid=False, alpha=0.5, inner=AdamWConfig(lr=0.05),
                          asynchrony=AsyncConfig(asynchronous=True, step_times=(1.0, 1.0, 2.0), delayed_nesterov=2))
    want = run_all(config, make_data(4, 30), async_diloco, extra=ASYNC_EXTRA)
    assert [entry["arrivals"] for entry in want.rounds] == [[0, 1, 0, 1, 2]] * 3


def test_asynchronous_records_name_only_arriving_workers_as_dropped():
    config = DiLoCoConfig(num_workers=3, inner_steps=4, rounds=2, batch_size=4, hidden_sizes=(4,), seed=1,
                          drop_prob=0.4, inner=AdamWConfig(lr=0.05),
                          asynchrony=AsyncConfig(asynchronous=True, step_times=(1.0, 0.5, 2.0)))
    x, y, x_eval, y_eval = make_data(0, 30)
    want = async_diloco(x, y, config, x_eval, y_eval)
    got = train("diloco", x, y, config, x_eval=x_eval, y_eval=y_eval)
    assert [record["dropped_workers"] for record in got.history] == [entry["dropped"] for entry in want.rounds]


# --- real MPI ranks: a few fixed configurations, one mpiexec job -------------------------------------

MPI_CASES = {
    "diloco, all dropped in round 3": (diloco, dict(num_workers=3, inner_steps=3, rounds=4, batch_size=4,
                                                    hidden_sizes=(4,), seed=2, iid=False, alpha=0.3, drop_prob=0.8)),
    "dct top-k, decay, weights, drops": (diloco, dict(
        num_workers=3, inner_steps=3, rounds=3, batch_size=4, hidden_sizes=(4,), seed=3, iid=False, alpha=0.3,
        drop_prob=0.35, drop_rule="restart", family=FamilyConfig(topk=0.3, topk_chunk=5, topk_transform="dct",
                                                                 error_feedback=True, topk_decay=0.9))),
    "streaming P3 H5 tau2 mix .3": (streaming_diloco, dict(  # merges after step 3, after H, in the next round
        num_workers=3, inner_steps=5, rounds=3, batch_size=4, hidden_sizes=(4, 2), seed=4, iid=False, alpha=0.5,
        drop_prob=0.35, family=FamilyConfig(fragments=3, overlap=2, mix=0.3))),
    "eager, weights": (eager_diloco, dict(num_workers=3, inner_steps=3, rounds=3, batch_size=4, hidden_sizes=(4,),
                                          seed=5, iid=False, alpha=0.3, family=FamilyConfig(eager=True))),
    "async, unequal groups, DN 2, DyLU": (async_diloco, dict(
        num_workers=3, inner_steps=4, rounds=3, batch_size=4, hidden_sizes=(4,), seed=6, iid=False, alpha=0.5,
        family=FamilyConfig(mix=0.5), asynchrony=AsyncConfig(asynchronous=True, step_times=(1.0, 1.5, 3.0),
                                                             delayed_nesterov=2, dynamic_local_steps=True))),
}


def mpi_case(name: str):
    """``(oracle, config, data)`` of one MPI case (every worker's AdamW at lr 0.05)."""
    oracle, fields = MPI_CASES[name]
    config = DiLoCoConfig(**fields, inner=AdamWConfig(lr=0.05))
    return oracle, config, make_data(config.seed, 30)


MPI_SCRIPT = """
import json, sys
from mpi4py import MPI
sys.path.insert(0, sys.argv[2])
from diloco.core.driver import train
import test_oracles as t

out = {}
for name in t.MPI_CASES:
    _, config, (x, y, x_eval, y_eval) = t.mpi_case(name)
    result = train("diloco", x, y, config, executor="mpi", comm=MPI.COMM_WORLD, timeout=120, x_eval=x_eval,
                   y_eval=y_eval, sync_fields=True)
    out[name] = {"params": {k: v.tolist() for k, v in result.params.items()}, "history": result.history}
if MPI.COMM_WORLD.rank == 0:
    json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_real_mpi_ranks_equal_the_oracles(tmp_path):
    pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")
    import json
    import subprocess
    import sys
    from pathlib import Path

    from cli_helpers import mpiexec

    from diloco.core.run_records import TrainResult

    (tmp_path / "run.py").write_text(MPI_SCRIPT, encoding="utf-8")
    done = subprocess.run([mpiexec(), "-n", "3", sys.executable, "run.py", "out.json", str(Path(__file__).parent)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    assert sorted(got) == sorted(MPI_CASES)
    for name, run in got.items():
        oracle, config, (x, y, x_eval, y_eval) = mpi_case(name)
        params = {key: np.array(value) for key, value in run["params"].items()}
        extra = ASYNC_EXTRA if config.asynchrony.asynchronous else ()
        assert_matches(TrainResult(params, run["history"]), oracle(x, y, config, x_eval, y_eval),
                       dropped=not config.asynchrony.asynchronous, extra=extra)


# --- the SGD inner optimizer (issue 41: the oracles once raised NotImplementedError for it) -----------

@pytest.mark.parametrize("momentum, weight_decay, drop_prob", [(0.9, 0.01, 0.0), (0.0, 0.0, 0.35), (0.5, 0.0, 0.7)])
def test_the_sgd_inner_optimizer_equals_the_oracle(momentum, weight_decay, drop_prob):
    """SGD with heavy-ball momentum (``oracles.common.inner_sgd``, written from PyTorch's
    documentation), each worker's momentum carried from round to round, with non-IID size weights
    and drops; a momentum step that read this step's gradient before the buffer, or that skipped
    the weight decay, is off in the first round."""
    config = DiLoCoConfig(num_workers=3, inner_steps=3, rounds=3, batch_size=4, hidden_sizes=(4,), seed=5, iid=False,
                          alpha=0.5, drop_prob=drop_prob, inner_optimizer="sgd",
                          inner=AdamWConfig(lr=0.05, beta1=momentum, weight_decay=weight_decay))
    run_all(config, make_data(2, 30), diloco)
