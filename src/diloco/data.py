"""Data: the bundled UCI handwritten digits, a stratified split, standardisation, and a
small synthetic generator for tests.

The digits (1,797 8x8 images, 10 classes) are the UCI "Optical Recognition of
Handwritten Digits" test set as scikit-learn ships it. Creators: E. Alpaydin and
C. Kaynak (1998); UCI Machine Learning Repository, DOI 10.24432/C50P49; licence
CC BY 4.0. They ship inside the package (``diloco/_datasets/digits.npz``, 45 kB), so
nothing is downloaded.
"""

from __future__ import annotations

from importlib import resources
from typing import NamedTuple

import numpy as np

from diloco._validation import (
    check_float_array,
    check_generator,
    check_labels,
    check_positive_int,
    check_real,
)

__all__ = [
    "DIGITS_PROVENANCE",
    "Dataset",
    "Standardizer",
    "load_digits",
    "stratified_split",
    "load_digits_split",
    "make_synthetic",
]

DIGITS_PROVENANCE = (
    "UCI Optical Recognition of Handwritten Digits (E. Alpaydin and C. Kaynak, 1998), "
    "UCI Machine Learning Repository, DOI 10.24432/C50P49, licence CC BY 4.0; "
    "the 1,797-image version shipped by scikit-learn."
)


class Dataset(NamedTuple):
    """A train/test split: ``x_*`` float (n, d), ``y_*`` int64 (n,)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray

    @property
    def num_classes(self) -> int:
        return int(max(self.y_train.max(), self.y_test.max())) + 1


def load_digits(dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits: ``x`` of shape (1797, 64), pixel counts 0..16 as ``dtype``;
    ``y`` int64 of shape (1797,), labels 0..9."""
    with resources.files("diloco._datasets").joinpath("digits.npz").open("rb") as handle:
        with np.load(handle) as archive:
            x, y = archive["x"], archive["y"]
    return x.astype(dtype), y.astype(np.int64)


def stratified_split(x: np.ndarray, y: np.ndarray, test_fraction: float, rng) -> Dataset:
    """Split so each class keeps (to within one example) the same train/test proportion.

    Per class, in increasing label order: shuffle its indices with ``rng.permutation``
    and send ``round(test_fraction * n_c)`` of them to the test part. Each part is then
    shuffled once more so classes are interleaved.

    Raises
    ------
    ValueError
        ``test_fraction`` outside (0, 1) or a split leaving a part empty.
    """
    check_float_array(x, "x", ndim=2)
    check_labels(y, "y", n=x.shape[0])
    test_fraction = check_real(test_fraction, "test_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
    check_generator(rng)
    train_idx, test_idx = [], []
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        num_test = int(round(test_fraction * len(members)))
        test_idx.append(members[:num_test])
        train_idx.append(members[num_test:])
    train = rng.permutation(np.concatenate(train_idx))
    test = rng.permutation(np.concatenate(test_idx))
    if train.size == 0 or test.size == 0:
        raise ValueError(f"test_fraction {test_fraction} leaves an empty train or test part for {len(y)} examples")
    return Dataset(x[train], y[train], x[test], y[test])


class Standardizer(NamedTuple):
    """Per-feature ``(x - mean) / std`` fitted on training data only.

    Features with zero spread in the training data (always-blank pixels) get
    ``std = 1``, so they map to a constant instead of dividing by zero.
    """

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x_train: np.ndarray) -> "Standardizer":
        check_float_array(x_train, "x_train", ndim=2)
        if x_train.shape[0] == 0:
            raise ValueError("x_train must hold at least one example to fit a standardizer")
        std = x_train.std(axis=0)
        return cls(x_train.mean(axis=0), np.where(std > 0, std, 1.0))

    def transform(self, x: np.ndarray) -> np.ndarray:
        check_float_array(x, "x", ndim=2)
        if x.shape[1] != self.mean.shape[0]:
            raise ValueError(f"x must have {self.mean.shape[0]} columns, got shape {x.shape}")
        return ((x - self.mean) / self.std).astype(x.dtype)


def load_digits_split(seed: int = 0, test_fraction: float = 0.2, *, dtype=np.float64) -> Dataset:
    """The digits, split (stratified, seeded) and standardised on the training part only."""
    x, y = load_digits(dtype)
    split = stratified_split(x, y, test_fraction, np.random.default_rng(seed))
    scaler = Standardizer.fit(split.x_train)
    return Dataset(scaler.transform(split.x_train), split.y_train, scaler.transform(split.x_test), split.y_test)


def make_synthetic(num_examples: int, num_features: int, num_classes: int, rng, *, separation: float = 3.0,
                   dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs: class ``c`` is ``N(mu_c, I)`` with ``mu_c ~ N(0, separation^2 I)``.

    Labels cycle ``0, 1, ..., C-1, 0, ...`` and are then shuffled, so classes are
    balanced to within one example.

    Returns
    -------
    x : ndarray of shape (num_examples, num_features), ``dtype``
    y : int64 ndarray of shape (num_examples,)
    """
    num_examples = check_positive_int(num_examples, "num_examples")
    num_features = check_positive_int(num_features, "num_features")
    num_classes = check_positive_int(num_classes, "num_classes")
    separation = check_real(separation, "separation", low=0.0)
    check_generator(rng)
    centres = rng.standard_normal((num_classes, num_features)) * separation
    y = rng.permutation(np.arange(num_examples) % num_classes)
    x = centres[y] + rng.standard_normal((num_examples, num_features))
    return x.astype(dtype), y.astype(np.int64)
