"""Supporting modules: the frozen, validated configs and the data helpers.

``DiLoCoConfig`` and the data helpers are what ``train_diloco`` runs on, so their tests
carry the m26 marker; ``AdamWConfig`` is the ``config`` of ``local_train_step``, so m19.
Expected values are literal numbers or plain-NumPy computations.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from diloco.config import AdamWConfig, DiLoCoConfig
from diloco.data import Standardizer, load_digits, load_digits_split, make_synthetic, stratified_split
from helpers import DTYPES, assert_close, assert_unchanged, snapshot
from strategies import dtypes, seeds

# --------------------------------------------------------------------------- m19 AdamWConfig


@pytest.mark.m19
def test_adamw_config_defaults_are_torch_adamw_with_small_lr():
    config = AdamWConfig()
    assert (config.lr, config.beta1, config.beta2, config.eps, config.weight_decay) == (1e-3, 0.9, 0.999, 1e-8, 0.01)


@pytest.mark.m19
def test_adamw_config_is_frozen():
    config = AdamWConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 0.5


@pytest.mark.m19
@pytest.mark.parametrize(
    "field, value, error",
    [
        ("lr", 0.0, ValueError),
        ("lr", -1e-3, ValueError),
        ("lr", float("nan"), ValueError),
        ("lr", "0.1", TypeError),
        ("beta1", 1.0, ValueError),
        ("beta1", -0.1, ValueError),
        ("beta2", 1.5, ValueError),
        ("eps", 0.0, ValueError),
        ("weight_decay", -0.01, ValueError),
        ("weight_decay", True, TypeError),
    ],
)
def test_adamw_config_rejects_a_bad_value_naming_the_field(field, value, error):
    with pytest.raises(error, match=field):
        AdamWConfig(**{field: value})


@pytest.mark.m19
def test_adamw_config_rejects_a_decay_factor_that_is_not_positive():
    with pytest.raises(ValueError, match="weight_decay"):
        AdamWConfig(lr=0.5, weight_decay=2.0)  # 1 - lr * wd = 0 would zero every weight


@pytest.mark.m19
def test_adamw_config_to_dict_round_trips():
    config = AdamWConfig(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1)
    assert AdamWConfig(**json.loads(json.dumps(config.to_dict()))) == config


# --------------------------------------------------------------------------- m26 DiLoCoConfig


@pytest.mark.m26
def test_diloco_config_defaults_follow_the_paper_at_small_scale():
    config = DiLoCoConfig()
    assert (config.num_workers, config.inner_steps, config.rounds) == (8, 50, 10)
    assert (config.outer_lr, config.outer_momentum, config.nesterov) == (0.7, 0.9, True)
    assert config.hidden_sizes == (128,) and config.inner == AdamWConfig()
    assert config.total_steps == 500


@pytest.mark.m26
def test_diloco_config_is_frozen():
    config = DiLoCoConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.num_workers = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.inner.lr = 1.0


@pytest.mark.m26
@pytest.mark.parametrize(
    "field, value, error",
    [
        ("num_workers", 0, ValueError),
        ("num_workers", 2.0, TypeError),
        ("inner_steps", -5, ValueError),
        ("rounds", 0, ValueError),
        ("batch_size", True, TypeError),
        ("hidden_sizes", (16, 0), ValueError),
        ("hidden_sizes", "16", TypeError),
        ("outer_lr", 0.0, ValueError),
        ("outer_momentum", 1.0, ValueError),
        ("nesterov", 1, TypeError),
        ("iid", "yes", TypeError),
        ("alpha", 0.0, ValueError),
        ("seed", -1, ValueError),
        ("dtype", "float16", ValueError),
        ("inner", {"lr": 0.1}, TypeError),
    ],
)
def test_diloco_config_rejects_a_bad_value_naming_the_field(field, value, error):
    with pytest.raises(error, match=field):
        DiLoCoConfig(**{field: value})


@pytest.mark.m26
def test_diloco_config_replace_validates_again():
    config = DiLoCoConfig().replace(num_workers=4, inner={"lr": 0.01})
    assert config.num_workers == 4 and config.inner.lr == 0.01 and config.inner.beta1 == 0.9
    with pytest.raises(ValueError, match="inner_steps"):
        config.replace(inner_steps=0)


@pytest.mark.m26
def test_diloco_config_round_trips_through_json():
    config = DiLoCoConfig(num_workers=4, inner_steps=7, hidden_sizes=(32, 16), iid=False, alpha=0.1,
                          dtype="float32", inner=AdamWConfig(lr=0.02, weight_decay=0.0))
    text = json.dumps(config.to_dict())
    assert DiLoCoConfig.from_dict(json.loads(text)) == config
    assert DiLoCoConfig.from_dict({}) == DiLoCoConfig(), "missing keys take the defaults"


@pytest.mark.m26
@pytest.mark.parametrize(
    "data, name",
    [({"num_wrokers": 4}, "num_wrokers"), ({"inner": {"learning_rate": 0.1}}, "learning_rate")],
    ids=["top-level typo", "inner typo"],
)
def test_diloco_config_from_dict_rejects_unknown_fields(data, name):
    with pytest.raises(ValueError, match=name):
        DiLoCoConfig.from_dict(data)


@pytest.mark.m26
def test_diloco_config_from_dict_validates_values():
    with pytest.raises(ValueError, match="outer_momentum"):
        DiLoCoConfig.from_dict({"outer_momentum": 1.5})
    with pytest.raises(TypeError, match="config"):
        DiLoCoConfig.from_dict([("num_workers", 2)])


# --------------------------------------------------------------------------- m26 data


@pytest.mark.m26
@pytest.mark.parametrize("dtype", DTYPES)
def test_load_digits_is_the_1797_uci_digits(dtype):
    x, y = load_digits(dtype)
    assert x.shape == (1797, 64) and x.dtype == dtype
    assert y.shape == (1797,) and y.dtype == np.int64
    assert x.min() == 0 and x.max() == 16 and np.array_equal(x, np.round(x)), "pixel counts 0..16"
    counts = np.bincount(y)
    assert len(counts) == 10, f"labels must be 0..9, got {np.unique(y)}"
    assert np.all((counts >= 170) & (counts <= 190)), f"about 180 examples per class, got {counts}"
    assert counts.sum() == 1797


def unique_rows(num_examples=103, num_classes=4, seed=0):
    """Data whose column 0 is the row id, labels unbalanced across classes."""
    rng = np.random.default_rng(seed)
    x = np.column_stack([np.arange(num_examples, dtype=np.float64), rng.normal(size=num_examples)])
    y = np.minimum(rng.integers(0, num_classes + 2, num_examples), num_classes - 1)
    return x, y


@pytest.mark.m26
@given(seed=seeds(), test_fraction=st.sampled_from([0.1, 0.2, 0.25, 0.5, 0.7]))
def test_stratified_split_keeps_each_class_proportion_and_covers_the_data(seed, test_fraction):
    x, y = unique_rows(seed=seed % 1000)
    before = snapshot((x, y))
    split = stratified_split(x, y, test_fraction, np.random.default_rng(seed))
    assert_unchanged(before, (x, y), what="x and y")
    ids_train, ids_test = split.x_train[:, 0].astype(int), split.x_test[:, 0].astype(int)
    assert not set(ids_train) & set(ids_test), "train and test must be disjoint"
    assert sorted(np.concatenate([ids_train, ids_test])) == list(range(len(y))), "together exactly the data"
    assert np.array_equal(split.y_train, y[ids_train]) and np.array_equal(split.y_test, y[ids_test]), "pairs kept"
    for label in np.unique(y):
        n_c = int(np.sum(y == label))
        assert int(np.sum(split.y_test == label)) == int(round(test_fraction * n_c)), f"class {label}"


@pytest.mark.m26
def test_stratified_split_is_seeded_and_rejects_bad_arguments():
    x, y = unique_rows()
    first = stratified_split(x, y, 0.2, np.random.default_rng(4))
    second = stratified_split(x, y, 0.2, np.random.default_rng(4))
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="test_fraction"):
            stratified_split(x, y, bad, np.random.default_rng(0))
    with pytest.raises(TypeError, match="rng"):
        stratified_split(x, y, 0.2, 4)


@pytest.mark.m26
def test_digits_split_is_stratified_and_standardised_on_the_training_part_only():
    seed = 3
    data = load_digits_split(seed)
    raw = stratified_split(*load_digits(), 0.2, np.random.default_rng(seed))
    assert data.x_train.shape == (1438, 64) and data.x_test.shape == (359, 64)
    assert np.array_equal(data.y_train, raw.y_train) and np.array_equal(data.y_test, raw.y_test)
    mean, std = raw.x_train.mean(axis=0), raw.x_train.std(axis=0)
    std = np.where(std > 0, std, 1.0)  # always-blank pixels
    assert_close(data.x_train, (raw.x_train - mean) / std, rtol=1e-12, atol=1e-12, what="standardised x_train")
    assert_close(data.x_test, (raw.x_test - mean) / std, rtol=1e-12, atol=1e-12,
                 what="x_test standardised with the TRAINING mean and std")
    assert_close(data.x_train.mean(axis=0), np.zeros(64), atol=1e-10, what="training feature means")
    assert data.num_classes == 10


@pytest.mark.m26
def test_standardizer_maps_constant_features_to_zero_and_checks_columns():
    x_train = np.array([[1.0, 5.0], [3.0, 5.0]])
    scaler = Standardizer.fit(x_train)
    assert_close(scaler.mean, [2.0, 5.0], what="mean")
    assert_close(scaler.std, [1.0, 1.0], what="std (the constant column gets 1)")
    assert_close(scaler.transform(np.array([[4.0, 7.0]])), [[2.0, 2.0]], what="transform")
    with pytest.raises(ValueError, match="x"):
        scaler.transform(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="x_train"):
        Standardizer.fit(np.zeros((0, 2)))


@pytest.mark.m26
@given(seed=seeds(), num_examples=st.integers(1, 60), num_features=st.integers(1, 5),
       num_classes=st.integers(1, 7), dtype=dtypes)
def test_make_synthetic_shapes_balance_and_seed(seed, num_examples, num_features, num_classes, dtype):
    x, y = make_synthetic(num_examples, num_features, num_classes, np.random.default_rng(seed), dtype=dtype)
    assert x.shape == (num_examples, num_features) and x.dtype == dtype
    assert y.shape == (num_examples,) and y.dtype == np.int64
    counts = np.bincount(y, minlength=num_classes)
    assert len(counts) == num_classes and counts.max() - counts.min() <= 1, f"balanced to within one: {counts}"
    again = make_synthetic(num_examples, num_features, num_classes, np.random.default_rng(seed), dtype=dtype)
    assert np.array_equal(x, again[0]) and np.array_equal(y, again[1]), "same seed, same data"


@pytest.mark.m26
def test_make_synthetic_different_seeds_differ_and_bad_arguments_raise():
    x0, _ = make_synthetic(20, 3, 2, np.random.default_rng(0))
    x1, _ = make_synthetic(20, 3, 2, np.random.default_rng(1))
    assert not np.array_equal(x0, x1)
    with pytest.raises(ValueError, match="num_examples"):
        make_synthetic(0, 3, 2, np.random.default_rng(0))
    with pytest.raises(TypeError, match="num_classes"):
        make_synthetic(10, 3, 2.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="separation"):
        make_synthetic(10, 3, 2, np.random.default_rng(0), separation=-1.0)
    with pytest.raises(TypeError, match="rng"):
        make_synthetic(10, 3, 2, 0)
