"""Part 4 - sharding and the local worker: milestones 16-20.

Rows of ``x`` carry their own id in column 0, so a test can tell exactly which examples
went where. Expected values are hand-worked (``tests/fixtures/m16.json`` .. ``m20.json``)
or come from plain-NumPy oracles written in this file, never from the package itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco.adamw import AdamWState
from diloco.config import AdamWConfig
from diloco.model import cross_entropy_loss, model_backward, model_forward
from diloco.sharding import (
    iid_shard_dataset,
    inner_train_worker,
    local_train_step,
    noniid_shard_dataset,
    sample_worker_batch,
)
from helpers import (
    DTYPES,
    HALF_EXAMPLES,
    adamw_oracle,
    adamw_state,
    as_params,
    assert_close,
    assert_no_shared_memory,
    assert_params_close,
    assert_state_close,
    assert_unchanged,
    load_fixture,
    snapshot,
)
from strategies import labelled_data, layer_sizes, mlp_params, seeds

# --------------------------------------------------------------------------- helpers



def with_ids(data):
    """Overwrite column 0 of ``x`` with the row index, so each row names itself."""
    x, y = data
    x = x.copy()
    x[:, 0] = np.arange(x.shape[0])
    return x, y


id_data = labelled_data(min_n=1, max_n=40).map(with_ids)


def row_ids(x_part):
    return x_part[:, 0].astype(np.int64)


def check_partition(shards, x, y, num_workers):
    """Disjoint, covering, pairs aligned, dtypes kept; returns the shards' row ids."""
    assert isinstance(shards, list), f"expected a list of shards, got {type(shards).__name__}"
    assert len(shards) == num_workers, f"expected {num_workers} shards, got {len(shards)}"
    ids = []
    for k, shard in enumerate(shards):
        assert len(shard) == 2, f"shard {k} must be a pair (x_k, y_k)"
        x_k, y_k = shard
        assert x_k.ndim == 2 and x_k.shape[1] == x.shape[1], f"shard {k}: x_k has shape {x_k.shape}"
        assert y_k.shape == (x_k.shape[0],), f"shard {k}: y_k has shape {y_k.shape} for {x_k.shape[0]} rows"
        assert x_k.dtype == x.dtype and y_k.dtype == y.dtype, (
            f"shard {k}: dtypes ({x_k.dtype}, {y_k.dtype}) differ from the data's ({x.dtype}, {y.dtype})")
        shard_ids = row_ids(x_k)
        np.testing.assert_array_equal(x_k, x[shard_ids], err_msg=f"shard {k}: rows of x were altered")
        np.testing.assert_array_equal(y_k, y[shard_ids], err_msg=f"shard {k}: (x, y) pairs are not aligned")
        ids.append(shard_ids)
    every = np.concatenate(ids)
    assert len(every) == len(set(every.tolist())), "an example appears in two shards (or twice in one)"
    assert sorted(every.tolist()) == list(range(x.shape[0])), "the shards do not cover the whole dataset"
    return ids


def assert_shards_hold(shards, expected_shards):
    """Shard k holds exactly the (row id, label) pairs of ``expected_shards[k]`` (in any order)."""
    assert len(shards) == len(expected_shards), f"expected {len(expected_shards)} shards, got {len(shards)}"
    for k, (shard, expected) in enumerate(zip(shards, expected_shards, strict=True)):
        got_pairs = sorted(zip(shard[0][:, 0].tolist(), shard[1].tolist(), strict=True))
        expected_pairs = sorted(zip(np.asarray(expected["x"])[:, 0].tolist(), expected["y"], strict=True))
        assert got_pairs == expected_pairs, f"shard {k}: expected (x, y) pairs {expected_pairs}, got {got_pairs}"


def fixture_data(inputs, dtype=np.float64):
    return np.asarray(inputs["x"], dtype=dtype), np.asarray(inputs["y"], dtype=np.int64)


# --------------------------------------------------------------------------- m16 iid_shard_dataset


@pytest.mark.m16
def test_iid_shard_dataset_fixture():
    fixture = load_fixture("m16")
    inputs = fixture["inputs"]
    x, y = fixture_data(inputs)
    # The literal draw quoted in the fixture is NumPy's, checked here against NumPy itself.
    assert np.random.default_rng(inputs["seed"]).permutation(len(y)).tolist() == [2, 4, 3, 6, 5, 0, 1]
    shards = iid_shard_dataset(x, y, inputs["num_workers"], np.random.default_rng(inputs["seed"]))
    assert_shards_hold(shards, fixture["expected"]["shards"])


@pytest.mark.m16
@given(data=id_data, num_workers=st.integers(1, 8), seed=seeds())
def test_iid_shard_dataset_partitions_evenly(data, num_workers, seed):
    x, y = data
    num_workers = min(num_workers, x.shape[0])
    shards = iid_shard_dataset(x, y, num_workers, np.random.default_rng(seed))
    ids = check_partition(shards, x, y, num_workers)
    sizes = [len(i) for i in ids]
    assert max(sizes) - min(sizes) <= 1, f"IID shard sizes must differ by at most 1, got {sizes}"


@pytest.mark.m16
@pytest.mark.parametrize("dtype", DTYPES)
def test_iid_shard_dataset_is_pure(dtype):
    x = np.column_stack([np.arange(10.0), np.linspace(-1, 1, 10)]).astype(dtype)
    y = np.arange(10) % 3
    before = snapshot((x, y))
    shards = iid_shard_dataset(x, y, 3, np.random.default_rng(0))
    assert_unchanged(before, (x, y), "x, y")
    assert_no_shared_memory(shards, (x, y), "iid_shard_dataset")
    check_partition(shards, x, y, 3)
    # one worker: the whole dataset, still as new arrays
    (x_1, y_1), = iid_shard_dataset(x, y, 1, np.random.default_rng(0))
    assert_no_shared_memory((x_1, y_1), (x, y), "iid_shard_dataset with one worker")


@pytest.mark.m16
def test_iid_shard_dataset_shuffles_with_the_generator():
    x = np.arange(100.0)[:, None]
    y = np.arange(100) % 4
    contiguous = list(range(50))
    first = [row_ids(iid_shard_dataset(x, y, 2, np.random.default_rng(seed))[0][0]) for seed in range(3)]
    for ids in first:
        assert sorted(ids.tolist()) != contiguous, (
            "shard 0 holds exactly the first half of the data: shuffle with rng.permutation before cutting")
    assert any(not np.array_equal(np.sort(first[0]), np.sort(other)) for other in first[1:]), (
        "different seeds gave the same shards: draw the permutation from rng")
    again = iid_shard_dataset(x, y, 2, np.random.default_rng(0))
    np.testing.assert_array_equal(row_ids(again[0][0]), first[0], err_msg="same seed must give the same shards")


@pytest.mark.m16
def test_iid_shard_dataset_keeps_labels_with_rows():
    # Labels equal the row id mod 7: a separate shuffle of y would break this almost surely.
    x = np.arange(60.0)[:, None]
    y = np.arange(60) % 7
    for seed in range(3):
        for x_k, y_k in iid_shard_dataset(x, y, 4, np.random.default_rng(seed)):
            np.testing.assert_array_equal(y_k, row_ids(x_k) % 7, err_msg="(x, y) pairs were separated")


@pytest.mark.m16
def test_iid_shard_dataset_rejects_bad_input():
    x, y = np.zeros((3, 2)), np.zeros(3, dtype=np.int64)
    with pytest.raises(ValueError, match="num_workers"):
        iid_shard_dataset(x, y, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="num_workers"):
        iid_shard_dataset(x, y, 0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        iid_shard_dataset(x, y, 2, 0)
    with pytest.raises(ValueError, match="y"):
        iid_shard_dataset(x, y[:2], 2, np.random.default_rng(0))


# --------------------------------------------------------------------------- m17 noniid_shard_dataset


def label_skew(shards, num_classes):
    """(mean distinct classes per worker, mean total-variation distance to the global label mix)."""
    all_labels = np.concatenate([y_k for _, y_k in shards])
    global_mix = np.bincount(all_labels, minlength=num_classes) / len(all_labels)
    classes, distances = [], []
    for _, y_k in shards:
        mix = np.bincount(y_k, minlength=num_classes) / len(y_k)
        classes.append(np.count_nonzero(mix))
        distances.append(0.5 * np.abs(mix - global_mix).sum())
    return float(np.mean(classes)), float(np.mean(distances))


@pytest.mark.m17
def test_noniid_shard_dataset_fixture():
    fixture = load_fixture("m17")
    inputs = fixture["inputs"]
    x, y = fixture_data(inputs)
    # The draws quoted in the fixture, checked against NumPy itself (not the package).
    rng = np.random.default_rng(inputs["seed"])
    assert rng.permutation(np.array([0, 1, 2, 3])).tolist() == [0, 1, 2, 3]
    assert np.floor(rng.dirichlet([0.5, 0.5])[0] * 4) == 0
    assert rng.permutation(np.array([4, 5, 6, 7])).tolist() == [5, 7, 6, 4]
    assert np.floor(rng.dirichlet([0.5, 0.5])[0] * 4) == 3
    shards = noniid_shard_dataset(x, y, inputs["num_workers"], np.random.default_rng(inputs["seed"]),
                                  alpha=inputs["alpha"])
    assert_shards_hold(shards, fixture["expected"]["shards"])


@pytest.mark.m17
@given(data=id_data, num_workers=st.integers(1, 8), seed=seeds(),
       alpha=st.sampled_from([0.01, 0.1, 0.5, 2.0, 100.0]))
def test_noniid_shard_dataset_partitions_without_empty_shards(data, num_workers, seed, alpha):
    x, y = data
    num_workers = min(num_workers, x.shape[0])
    shards = noniid_shard_dataset(x, y, num_workers, np.random.default_rng(seed), alpha=alpha)
    ids = check_partition(shards, x, y, num_workers)
    assert all(len(i) >= 1 for i in ids), f"every shard must be non-empty, got sizes {[len(i) for i in ids]}"


@pytest.mark.m17
def test_noniid_shard_dataset_skew_grows_as_alpha_shrinks():
    num_classes, per_class, num_workers = 10, 30, 5
    y = np.repeat(np.arange(num_classes), per_class)
    x = np.arange(len(y), dtype=np.float64)[:, None]
    summary = {}
    for alpha in (0.05, 1.0, 100.0):
        stats = [label_skew(noniid_shard_dataset(x, y, num_workers, np.random.default_rng(seed), alpha=alpha),
                            num_classes) for seed in range(20)]
        summary[alpha] = np.mean(stats, axis=0)  # (mean classes per worker, mean TV distance)
    classes = {a: s[0] for a, s in summary.items()}
    distance = {a: s[1] for a, s in summary.items()}
    report = f"mean classes per worker {classes}, mean TV distance {distance}"
    assert classes[0.05] < 6.5 < 9.5 < classes[100.0], "alpha 0.05 must give few classes per worker: " + report
    assert classes[0.05] < classes[1.0] - 2.0, "fewer classes per worker as alpha shrinks: " + report
    assert distance[0.05] > distance[1.0] + 0.1 > distance[100.0] + 0.2, (
        "label skew must grow as alpha shrinks: " + report)
    assert distance[100.0] < 0.15, "alpha 100 must be close to IID: " + report


@pytest.mark.m17
def test_noniid_shard_dataset_fills_empty_workers():
    # As many workers as examples and a tiny alpha: most workers get nothing from the
    # Dirichlet cut, and the fix-up must still give each exactly one example.
    x = np.arange(6.0)[:, None]
    y = np.array([0, 0, 0, 1, 1, 1])
    for seed in range(5):
        shards = noniid_shard_dataset(x, y, 6, np.random.default_rng(seed), alpha=0.01)
        ids = check_partition(shards, x, y, 6)
        assert [len(i) for i in ids] == [1] * 6


@pytest.mark.m17
def test_noniid_shard_dataset_unsorted_labels_and_an_empty_worker():
    """Labels in no particular order (classes first seen in the order 2, 0, 1), and a
    Dirichlet draw that leaves worker 1 with nothing: it must take one example from the
    largest shard, worker 3, and every other example stays where the draw put it."""
    y = np.array([2, 0, 1, 2, 0, 1, 1, 2, 0, 2, 1])
    x = np.column_stack([np.arange(11.0), np.linspace(-1.0, 1.0, 11)])
    # The documented draws, class by class in increasing label order, checked against NumPy
    # itself: (permuted rows of the class, cut points floor(cumsum(p)[:-1] * n_c)).
    rng = np.random.default_rng(17)
    for rows, permuted, cuts in (([1, 4, 8], [1, 8, 4], [0, 0, 1]),  # class 0: 0 | 0 | 1 | 2 rows
                                 ([2, 5, 6, 10], [5, 2, 10, 6], [2, 2, 2]),  # class 1: 2 | 0 | 0 | 2
                                 ([0, 3, 7, 9], [0, 7, 3, 9], [1, 1, 3])):  # class 2: 1 | 0 | 2 | 1
        assert rng.permutation(np.array(rows)).tolist() == permuted
        assert np.floor(np.cumsum(rng.dirichlet([0.5] * 4))[:-1] * len(rows)).astype(int).tolist() == cuts
    # So the draw gives worker 0 rows {5, 2, 0}, worker 1 none, worker 2 {1, 7, 3} and worker 3
    # {8, 4, 10, 6, 9}, the largest, which gives one of its rows to worker 1.
    shards = noniid_shard_dataset(x, y, 4, np.random.default_rng(17), alpha=0.5)
    ids = [set(i.tolist()) for i in check_partition(shards, x, y, 4)]
    assert ids[0] == {5, 2, 0} and ids[2] == {1, 7, 3}, (
        f"workers 0 and 2 keep their Dirichlet rows {{0, 2, 5}} and {{1, 3, 7}}, got {sorted(ids[0])} and "
        f"{sorted(ids[2])} (are the classes taken in increasing order, each class's own rows permuted?)")
    assert len(ids[1]) == 1 and ids[1] | ids[3] == {8, 4, 10, 6, 9}, (
        f"the empty worker 1 takes one row from the largest shard, worker 3 ({{4, 6, 8, 9, 10}}); "
        f"got worker 1 {sorted(ids[1])}, worker 3 {sorted(ids[3])}")


@pytest.mark.m17
@pytest.mark.parametrize("dtype", DTYPES)
def test_noniid_shard_dataset_is_pure_and_reproducible(dtype):
    x = np.column_stack([np.arange(24.0), np.ones(24)]).astype(dtype)
    y = np.arange(24) % 4
    before = snapshot((x, y))
    shards = noniid_shard_dataset(x, y, 3, np.random.default_rng(7), alpha=0.3)
    assert_unchanged(before, (x, y), "x, y")
    assert_no_shared_memory(shards, (x, y), "noniid_shard_dataset")
    check_partition(shards, x, y, 3)
    again = noniid_shard_dataset(x, y, 3, np.random.default_rng(7), alpha=0.3)
    for (x_a, y_a), (x_b, y_b) in zip(shards, again, strict=True):
        np.testing.assert_array_equal(x_a, x_b, err_msg="same seed must give the same shards")
        np.testing.assert_array_equal(y_a, y_b)


@pytest.mark.m17
def test_noniid_shard_dataset_rejects_bad_input():
    x, y = np.zeros((4, 2)), np.array([0, 1, 0, 1])
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="alpha"):
        noniid_shard_dataset(x, y, 2, rng, alpha=0.0)
    with pytest.raises(ValueError, match="alpha"):
        noniid_shard_dataset(x, y, 2, rng, alpha=-1.0)
    with pytest.raises(ValueError, match="num_workers"):
        noniid_shard_dataset(x, y, 5, rng)
    with pytest.raises(TypeError, match="rng"):
        noniid_shard_dataset(x, y, 2, 42)


# --------------------------------------------------------------------------- m18 sample_worker_batch


@pytest.mark.m18
def test_sample_worker_batch_fixture():
    fixture = load_fixture("m18")
    inputs = fixture["inputs"]
    x_shard = np.asarray(inputs["x_shard"], dtype=np.float64)
    y_shard = np.asarray(inputs["y_shard"], dtype=np.int64)
    draw = np.random.default_rng(inputs["seed"]).choice(len(y_shard), size=inputs["batch_size"], replace=False)
    assert draw.tolist() == [3, 4, 2]  # NumPy's draw, as quoted in the fixture
    x_batch, y_batch = sample_worker_batch(x_shard, y_shard, inputs["batch_size"],
                                           np.random.default_rng(inputs["seed"]))
    assert_close(x_batch, np.asarray(fixture["expected"]["x_batch"]), rtol=0, what="x_batch")
    np.testing.assert_array_equal(y_batch, fixture["expected"]["y_batch"], err_msg="y_batch")


@pytest.mark.m18
@given(data=id_data, batch_size=st.integers(1, 40), seed=seeds())
def test_sample_worker_batch_shapes_alignment_and_replacement(data, batch_size, seed):
    x, y = data
    before = snapshot((x, y))
    x_batch, y_batch = sample_worker_batch(x, y, batch_size, np.random.default_rng(seed))
    assert_unchanged(before, (x, y), "x_shard, y_shard")
    assert_no_shared_memory((x_batch, y_batch), (x, y), "sample_worker_batch")
    assert x_batch.shape == (batch_size, x.shape[1]), f"x_batch: expected shape {(batch_size, x.shape[1])}"
    assert y_batch.shape == (batch_size,), f"y_batch: expected shape {(batch_size,)}, got {y_batch.shape}"
    assert x_batch.dtype == x.dtype and y_batch.dtype == y.dtype
    ids = row_ids(x_batch)
    assert ids.min() >= 0 and ids.max() < x.shape[0]
    np.testing.assert_array_equal(x_batch, x[ids], err_msg="rows of x were altered")
    np.testing.assert_array_equal(y_batch, y[ids], err_msg="(x, y) pairs are not aligned")
    if batch_size <= x.shape[0]:
        assert len(set(ids.tolist())) == batch_size, (
            f"batch_size {batch_size} <= {x.shape[0]} examples: sample without replacement, got rows {ids}")


@pytest.mark.m18
def test_sample_worker_batch_with_replacement_when_batch_exceeds_shard():
    x, y = np.arange(3.0)[:, None], np.array([0, 1, 2])
    x_batch, y_batch = sample_worker_batch(x, y, 300, np.random.default_rng(0))
    ids = row_ids(x_batch)
    np.testing.assert_array_equal(y_batch, ids)
    counts = np.bincount(ids, minlength=3)
    assert np.all(counts > 50), f"with replacement every row should be drawn about 100 times, got {counts}"


@pytest.mark.m18
def test_sample_worker_batch_larger_than_the_shard_draws_each_row_independently():
    """7 rows from a shard of 3 (two copies and a remainder): ``rng.integers(0, n, 7)``,
    every row drawn on its own, not the shard repeated or permutations stacked."""
    assert np.random.default_rng(5).integers(0, 3, size=7).tolist() == [2, 2, 0, 2, 1, 1, 1]  # NumPy's draw
    x, y = np.column_stack([np.arange(3.0), [0.5, -1.0, 2.0]]), np.array([4, 5, 6])
    x_batch, y_batch = sample_worker_batch(x, y, 7, np.random.default_rng(5))
    assert row_ids(x_batch).tolist() == [2, 2, 0, 2, 1, 1, 1], f"rows drawn: {row_ids(x_batch).tolist()}"
    np.testing.assert_array_equal(y_batch, [6, 6, 4, 6, 5, 5, 5], err_msg="y_batch")


@pytest.mark.m18
def test_sample_worker_batch_full_batch_is_a_permutation():
    x = np.column_stack([np.arange(8.0), np.arange(8.0) ** 2])
    y = np.arange(8) % 3
    x_batch, y_batch = sample_worker_batch(x, y, 8, np.random.default_rng(3))
    assert sorted(row_ids(x_batch).tolist()) == list(range(8)), "batch_size == n must use every row once"
    np.testing.assert_array_equal(y_batch, row_ids(x_batch) % 3)


@pytest.mark.m18
def test_sample_worker_batch_uses_and_advances_the_generator():
    x, y = np.arange(50.0)[:, None], np.arange(50) % 5
    rng = np.random.default_rng(11)
    first = row_ids(sample_worker_batch(x, y, 10, rng)[0])
    second = row_ids(sample_worker_batch(x, y, 10, rng)[0])
    assert not np.array_equal(first, second), "two draws from one generator gave the same batch"
    again = row_ids(sample_worker_batch(x, y, 10, np.random.default_rng(11))[0])
    np.testing.assert_array_equal(again, first, err_msg="same seed must give the same batch")
    other = row_ids(sample_worker_batch(x, y, 10, np.random.default_rng(12))[0])
    assert not np.array_equal(other, first), "different seeds gave the same batch"
    assert not np.array_equal(np.sort(first), np.arange(10)), "the batch is the first rows, not a random draw"


@pytest.mark.m18
@pytest.mark.parametrize("dtype", DTYPES)
def test_sample_worker_batch_keeps_dtype(dtype):
    x, y = np.arange(6, dtype=dtype)[:, None], np.arange(6, dtype=np.int32)
    x_batch, y_batch = sample_worker_batch(x, y, 4, np.random.default_rng(0))
    assert x_batch.dtype == dtype and y_batch.dtype == np.int32


@pytest.mark.m18
def test_sample_worker_batch_rejects_bad_input():
    x, y = np.zeros((4, 2)), np.zeros(4, dtype=np.int64)
    with pytest.raises(TypeError, match="rng"):
        sample_worker_batch(x, y, 2, 0)
    with pytest.raises(ValueError, match="batch_size"):
        sample_worker_batch(x, y, 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="x_shard"):
        sample_worker_batch(np.zeros((0, 2)), np.zeros(0, dtype=np.int64), 1, np.random.default_rng(0))
    with pytest.raises(ValueError, match="y_shard"):
        sample_worker_batch(x, y[:3], 2, np.random.default_rng(0))


# --------------------------------------------------------------------------- oracles for 19-20


def oracle_loss_and_grads(params, x, y):
    """Loss and gradient from milestones 03, 05 and 06.

    Milestones 19 and 20 depend on them (see diloco.milestones): the grader runs these
    tests only once those have passed their own tests, so they serve as the oracle here
    instead of a second copy of backpropagation in the test file.
    """
    logits, cache = model_forward(params, x.astype(params["W1"].dtype))
    return cross_entropy_loss(logits, y), model_backward(params, cache, y)


adamw_configs = st.builds(
    AdamWConfig,
    lr=st.floats(1e-4, 0.5), beta1=st.floats(0.0, 0.99), beta2=st.floats(0.0, 0.9999),
    eps=st.sampled_from([1e-8, 1e-6, 1e-3]), weight_decay=st.floats(0.0, 1.0),
)


@st.composite
def training_problems(draw, dtype=np.float64, min_rows=1, max_rows=6):
    """An MLP, an AdamW state shaped like it (any step), a labelled batch and a config."""
    sizes = draw(layer_sizes(max_layers=2, max_width=4))
    params = draw(mlp_params(sizes=sizes, dtype=dtype))
    step = draw(st.integers(0, 6))
    m = {k: draw(st.sampled_from([0.0, 0.1, -0.3])) * np.ones_like(p) for k, p in params.items()}
    v = {k: draw(st.sampled_from([0.0, 0.01, 2.0])) * np.ones_like(p) for k, p in params.items()}
    if step == 0:  # a fresh state: the moments are still zero
        m = {k: np.zeros_like(p) for k, p in params.items()}
        v = {k: np.zeros_like(p) for k, p in params.items()}
    n = draw(st.integers(min_rows, max_rows))
    x = draw(st.lists(st.floats(-3, 3), min_size=n * sizes[0], max_size=n * sizes[0]))
    x = np.asarray(x, dtype=dtype).reshape(n, sizes[0])
    y = np.asarray(draw(st.lists(st.integers(0, sizes[-1] - 1), min_size=n, max_size=n)), dtype=np.int64)
    return params, AdamWState(step, m, v), x, y, draw(adamw_configs)


# --------------------------------------------------------------------------- m19 local_train_step


@pytest.mark.m19
def test_local_train_step_fixture():
    fixture = load_fixture("m19")
    inputs, expected = fixture["inputs"], fixture["expected"]
    params = as_params(inputs["params"])
    state = adamw_state(**inputs["adam_state"])
    x = np.asarray(inputs["x_batch"], dtype=np.float64)
    y = np.asarray(inputs["y_batch"], dtype=np.int64)
    new_params, new_state, loss = local_train_step(params, state, x, y, AdamWConfig(**inputs["config"]))
    assert_close(loss, expected["loss_before_step"], rtol=1e-12, what="loss (before the step)")
    assert_params_close(new_params, as_params(expected["new_params"]), rtol=0, atol=1e-8, what="new_params")
    exp_state = adamw_state(**expected["new_state"])
    assert_state_close(new_state, exp_state, rtol=1e-12, atol=1e-15)


@pytest.mark.m19
@given(problem=training_problems())
@HALF_EXAMPLES
def test_local_train_step_matches_closed_form_adamw(problem):
    params, state, x, y, cfg = problem
    before = snapshot((params, state, x, y))
    new_params, new_state, loss = local_train_step(params, state, x, y, cfg)
    assert_unchanged(before, (params, state, x, y), "params, adam_state, x_batch, y_batch")
    assert_no_shared_memory((new_params, new_state), (params, state, x, y), "local_train_step")
    expected_loss, grads = oracle_loss_and_grads(params, x, y)
    exp_params, exp_state = adamw_oracle(params, state, grads, cfg)
    assert isinstance(loss, float), f"the loss must be a Python float, got {type(loss).__name__}"
    assert_close(loss, expected_loss, rtol=1e-10, atol=1e-12, what="loss before the step")
    # The oracle's gradients differ from the package's by rounding (~1e-16 absolute). Adam's
    # step g / (|g| + eps) amplifies that by up to 1/eps where |g| ~ eps, so the parameter
    # tolerance scales with lr / eps; a wrong formula moves the params by far more.
    atol = 1e-12 + cfg.lr * 1e-14 / cfg.eps
    assert_params_close(new_params, exp_params, rtol=1e-9, atol=atol, what="new_params")
    assert_state_close(new_state, exp_state, rtol=1e-9, atol=1e-12)


@pytest.mark.m19
def test_local_train_step_reports_the_loss_before_the_step():
    params = {"W1": np.array([[0.5, -0.5], [0.0, 1.0]]), "b1": np.array([0.1, -0.1])}
    x, y = np.array([[1.0, 2.0], [-1.0, 0.5]]), np.array([0, 1])
    cfg = AdamWConfig(lr=0.1, weight_decay=0.0)
    before_loss, _ = oracle_loss_and_grads(params, x, y)
    new_params, _, loss = local_train_step(params, adamw_state(params), x, y, cfg)
    after_loss, _ = oracle_loss_and_grads(new_params, x, y)
    assert abs(before_loss - after_loss) > 1e-3  # the step changes the loss
    assert_close(loss, before_loss, rtol=1e-12, what="returned loss (must be measured before the step)")


@pytest.mark.m19
def test_local_train_step_advances_the_step_and_carries_moments():
    params = {"W1": np.array([[0.5, -0.5], [0.2, 1.0]]), "b1": np.array([0.1, -0.1])}
    x, y = np.array([[1.0, 2.0]]), np.array([1])
    cfg = AdamWConfig(lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.05)
    state = adamw_state(params, step=7, m=0.2, v=0.5)
    new_params, new_state, _ = local_train_step(params, state, x, y, cfg)
    _, grads = oracle_loss_and_grads(params, x, y)
    exp_params, exp_state = adamw_oracle(params, state, grads, cfg)
    assert new_state.step == 8, f"step 7 -> 8 expected, got {new_state.step}"
    assert_state_close(new_state, exp_state)
    assert_params_close(new_params, exp_params, rtol=1e-12, what="new_params (bias correction uses step 8)")


@pytest.mark.m19
def test_local_train_step_two_layers_keeps_float32():
    params = {"W1": np.array([[0.5, -1.0, 0.3], [0.2, 0.4, -0.6]], np.float32), "b1": np.zeros(3, np.float32),
              "W2": np.array([[1.0, -1.0], [0.5, 0.5], [-0.3, 0.8]], np.float32),
              "b2": np.array([0.1, 0.0], np.float32)}
    x = np.array([[1.0, 2.0], [0.5, -1.5], [2.0, 0.0]], np.float32)
    y = np.array([0, 1, 1])
    cfg = AdamWConfig(lr=0.01)
    new_params, new_state, loss = local_train_step(params, adamw_state(params, step=2), x, y, cfg)
    for tree, what in ((new_params, "new_params"), (new_state.m, "state.m"), (new_state.v, "state.v")):
        for key, value in tree.items():
            assert value.dtype == np.float32, f"{what}[{key!r}] must stay float32, got {value.dtype}"
    params64 = {k: v.astype(np.float64) for k, v in params.items()}
    expected_loss, grads = oracle_loss_and_grads(params64, x.astype(np.float64), y)
    exp_params, _ = adamw_oracle(params64, adamw_state(params64, step=2), grads, cfg)
    assert_close(loss, expected_loss, rtol=1e-5, what="loss")
    assert_params_close(new_params, exp_params, rtol=1e-5, atol=1e-6, what="float32 new_params")


@pytest.mark.m19
def test_local_train_step_rejects_bad_input():
    params = {"W1": np.ones((2, 2)), "b1": np.zeros(2)}
    x, y = np.ones((1, 2)), np.array([0])
    with pytest.raises(TypeError, match="config"):
        local_train_step(params, adamw_state(params), x, y, {"lr": 0.1})
    with pytest.raises(TypeError, match="state"):
        local_train_step(params, (0, {}, {}), x, y, AdamWConfig())
    bad_state = adamw_state({"W1": np.ones((2, 3)), "b1": np.zeros(3)})
    with pytest.raises(ValueError, match="state"):
        local_train_step(params, bad_state, x, y, AdamWConfig())
    with pytest.raises(ValueError, match="y_batch"):
        local_train_step(params, adamw_state(params), x, np.array([2]), AdamWConfig())
    with pytest.raises(ValueError, match="x_batch"):
        local_train_step(params, adamw_state(params), np.ones(2), y, AdamWConfig())


# --------------------------------------------------------------------------- m20 inner_train_worker


def oracle_worker(params, state, x, y, num_steps, batch_size, cfg, rng):
    """Plain NumPy: H AdamW steps, each on ``rng.choice`` batch as the docstring specifies."""
    losses = []
    for _ in range(num_steps):
        n = len(y)
        if batch_size <= n:
            idx = rng.choice(n, size=batch_size, replace=False)
        else:
            idx = rng.integers(0, n, size=batch_size)
        loss, grads = oracle_loss_and_grads(params, x[idx], y[idx])
        params, state = adamw_oracle(params, state, grads, cfg)
        losses.append(loss)
    return params, state, np.array(losses)


def small_problem(dtype=np.float64, n=12):
    rng = np.random.default_rng(123)
    params = {"W1": rng.normal(size=(3, 4)).astype(dtype), "b1": np.zeros(4, dtype),
              "W2": rng.normal(size=(4, 3)).astype(dtype), "b2": np.full(3, 0.1, dtype)}
    x = rng.normal(size=(n, 3)).astype(dtype)
    y = np.arange(n) % 3
    return params, x, y


@pytest.mark.m20
def test_inner_train_worker_fixture():
    fixture = load_fixture("m20")
    inputs, expected = fixture["inputs"], fixture["expected"]
    got_params, got_state, losses = inner_train_worker(
        as_params(inputs["params"]), adamw_state(**inputs["adam_state"]),
        np.asarray(inputs["x_shard"], dtype=np.float64), np.asarray(inputs["y_shard"], dtype=np.int64),
        inputs["num_inner_steps"], inputs["batch_size"], AdamWConfig(**inputs["config"]),
        np.random.default_rng(inputs["seed"]))
    assert_params_close(got_params, as_params(expected["worker_params"]), rtol=0, atol=1e-8, what="worker_params")
    exp_state = adamw_state(**expected["adam_state"])
    # atol 1e-8: the eps in the denominator moves step 1 by ~2e-9 away from the round numbers
    assert_state_close(got_state, exp_state, rtol=0, atol=1e-8)
    assert_close(losses, np.asarray(expected["losses"]), rtol=0, atol=1e-8, what="losses (each before its step)")


@pytest.mark.m20
@pytest.mark.parametrize("batch_size", [4, 12, 20])
def test_inner_train_worker_matches_step_by_step_oracle(batch_size):
    params, x, y = small_problem()
    cfg = AdamWConfig(lr=0.05, weight_decay=0.1)
    state = adamw_state(params, step=3, m=0.01, v=0.02)
    before = snapshot((params, state, x, y))
    got_params, got_state, losses = inner_train_worker(params, state, x, y, 5, batch_size, cfg,
                                                       np.random.default_rng(9))
    assert_unchanged(before, (params, state, x, y), "params, adam_state, x_shard, y_shard")
    assert_no_shared_memory((got_params, got_state, losses), (params, state, x, y), "inner_train_worker")
    exp_params, exp_state, exp_losses = oracle_worker(params, state, x, y, 5, batch_size, cfg,
                                                                   np.random.default_rng(9))
    assert isinstance(losses, np.ndarray) and losses.shape == (5,) and losses.dtype == np.float64, (
        f"losses must be a float64 array of shape (5,), got {type(losses).__name__} "
        f"{getattr(losses, 'shape', '')}")
    assert_close(losses, exp_losses, rtol=1e-10, what="losses (each before its step, a new batch every step)")
    assert_params_close(got_params, exp_params, rtol=1e-9, atol=1e-12, what="worker_params")
    assert_state_close(got_state, exp_state, rtol=1e-9, atol=1e-12)


@pytest.mark.m20
def test_inner_train_worker_full_batch_does_not_depend_on_the_draw():
    # batch_size == shard size: every step sees the whole shard, whatever the permutation.
    params, x, y = small_problem(n=6)
    cfg = AdamWConfig(lr=0.02)
    got = [inner_train_worker(params, adamw_state(params), x, y, 4, 6, cfg, np.random.default_rng(seed))
           for seed in (0, 1)]
    exp_params, _, exp_losses = oracle_worker(params, adamw_state(params), x, y, 4, 6, cfg,
                                                           np.random.default_rng(5))
    for got_params, got_state, losses in got:
        assert got_state.step == 4
        assert_close(losses, exp_losses, rtol=1e-10, what="full-batch losses")
        assert_params_close(got_params, exp_params, rtol=1e-9, atol=1e-12, what="full-batch worker_params")


@pytest.mark.m20
@given(horizon=st.integers(1, 4), batch_size=st.integers(1, 8), seed=seeds(), start=st.integers(0, 3))
@HALF_EXAMPLES
def test_inner_train_worker_carries_adamw_state_across_calls(horizon, batch_size, seed, start):
    params, x, y = small_problem(n=8)
    cfg = AdamWConfig(lr=0.03, beta1=0.8, beta2=0.9)
    # a fresh state, or a warm one as a later round would carry
    state = adamw_state(params, step=start, m=0.05, v=0.01) if start else adamw_state(params)
    one_params, one_state, one_losses = inner_train_worker(params, state, x, y, 2 * horizon, batch_size, cfg,
                                                           np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    mid_params, mid_state, first = inner_train_worker(params, state, x, y, horizon, batch_size, cfg, rng)
    assert mid_state.step == start + horizon, f"state.step: expected {start + horizon}, got {mid_state.step}"
    two_params, two_state, second = inner_train_worker(mid_params, mid_state, x, y, horizon, batch_size, cfg, rng)
    assert one_state.step == two_state.step == start + 2 * horizon
    assert_close(np.concatenate([first, second]), one_losses, rtol=1e-12, what="losses of H + H vs 2H steps")
    assert_params_close(two_params, one_params, rtol=1e-12, atol=1e-15, what="params after H + H vs 2H steps")
    assert_params_close(two_state.m, one_state.m, rtol=1e-12, atol=1e-15, what="state.m after H + H vs 2H")
    assert_params_close(two_state.v, one_state.v, rtol=1e-12, atol=1e-15, what="state.v after H + H vs 2H")


@pytest.mark.m20
def test_inner_train_worker_zero_steps_returns_a_copy():
    params, x, y = small_problem()
    state = adamw_state(params, step=5, m=0.3, v=0.4)
    before = snapshot((params, state))
    got_params, got_state, losses = inner_train_worker(params, state, x, y, 0, 4, AdamWConfig(),
                                                       np.random.default_rng(0))
    assert_params_close(got_params, params, rtol=0, what="worker_params after 0 steps")
    assert_no_shared_memory(got_params, (params, state), "worker_params after 0 steps")
    assert_state_close(got_state, before[1], rtol=0)
    assert isinstance(losses, np.ndarray) and losses.shape == (0,), f"losses must have shape (0,), got {losses!r}"
    assert_unchanged(before, (params, state), "params, adam_state")


@pytest.mark.m20
def test_inner_train_worker_keeps_float32():
    params, x, y = small_problem(dtype=np.float32)
    got_params, got_state, losses = inner_train_worker(params, adamw_state(params), x, y, 3, 5, AdamWConfig(),
                                                       np.random.default_rng(0))
    for tree, what in ((got_params, "worker_params"), (got_state.m, "state.m"), (got_state.v, "state.v")):
        for key, value in tree.items():
            assert value.dtype == np.float32, f"{what}[{key!r}] must stay float32, got {value.dtype}"
    assert losses.shape == (3,) and np.all(np.isfinite(losses))
    # The docstring's contract holds in a float32 run too: the losses are a float64 array
    # (Python floats from cross_entropy_loss stored as float64), not the params' dtype.
    assert losses.dtype == np.float64, f"losses must be float64 even for float32 params, got {losses.dtype}"


@pytest.mark.m20
def test_inner_train_worker_rejects_bad_input():
    params, x, y = small_problem()
    state = adamw_state(params)
    with pytest.raises(ValueError, match="num_inner_steps"):
        inner_train_worker(params, state, x, y, -1, 4, AdamWConfig(), np.random.default_rng(0))
    with pytest.raises(ValueError, match="batch_size"):
        inner_train_worker(params, state, x, y, 2, 0, AdamWConfig(), np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        inner_train_worker(params, state, x, y, 2, 4, AdamWConfig(), 0)
    with pytest.raises(TypeError, match="config"):
        inner_train_worker(params, state, x, y, 2, 4, None, np.random.default_rng(0))
    # The shard is checked even when no step will touch it (H = 0).
    with pytest.raises(ValueError, match="y_shard"):
        inner_train_worker(params, state, x, y[:-1], 0, 4, AdamWConfig(), np.random.default_rng(0))
    with pytest.raises(ValueError, match="x_shard"):
        inner_train_worker(params, state, x[:0], y[:0], 0, 4, AdamWConfig(), np.random.default_rng(0))
    with pytest.raises(TypeError, match="adam_state"):
        inner_train_worker(params, None, x, y, 2, 4, AdamWConfig(), np.random.default_rng(0))
