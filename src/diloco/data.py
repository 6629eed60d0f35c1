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
    FLOAT_DTYPES,
    api_checks,
    check_fits_in_memory,
    check_float_array,
    check_generator,
    check_labels,
    check_positive_int,
    check_real,
    check_seed,
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
    """A train/test split: ``x_*`` float (n, d), ``y_*`` int64 (n,).

    ``encode`` is None for features the model reads as they are; for the character-level
    task (``diloco.text``) the ``x_*`` are index windows and ``encode`` (a ``OneHot``)
    turns a batch of them into model inputs: pass it to the trainers as ``encode=``.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    encode: object = None

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
    api_checks.stratified_split(x, y)
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
    def fit(cls, x_train: np.ndarray) -> Standardizer:
        """Mean and spread per column of ``x_train`` (n >= 1 rows, d >= 1 columns).

        Columns of extreme magnitude (beyond 1e100, or below 1e-100 but not zero) are
        divided by their largest magnitude first, so squares neither overflow nor
        underflow: features scaled by 1e300 standardise like the same features unscaled.
        """
        check_float_array(x_train, "x_train", ndim=2)
        if x_train.shape[0] == 0:
            raise ValueError("x_train must hold at least one example to fit a standardizer")
        if x_train.shape[1] == 0:
            raise ValueError("x_train must have at least one feature (column) to fit a standardizer")
        with np.errstate(over="ignore", under="ignore"):  # extreme columns are redone below
            mean, std = x_train.mean(axis=0), x_train.std(axis=0)
        magnitude = np.abs(x_train).max(axis=0)
        extreme = (magnitude > 1e100) | ((magnitude < 1e-100) & (magnitude > 0))
        if extreme.any():
            scale = magnitude[extreme]
            scaled = x_train[:, extreme] / scale
            mean[extreme], std[extreme] = scale * scaled.mean(axis=0), scale * scaled.std(axis=0)
        return cls(mean, np.where(std > 0, std, 1.0))

    def transform(self, x: np.ndarray) -> np.ndarray:
        check_float_array(x, "x", ndim=2)
        if x.shape[1] != self.mean.shape[0]:
            raise ValueError(f"x must have {self.mean.shape[0]} columns, got shape {x.shape}")
        with np.errstate(over="ignore", invalid="ignore"):
            out = ((x - self.mean) / self.std).astype(x.dtype)
        if not np.isfinite(out).all():
            raise ValueError("x: standardised values overflow the dtype (x lies too far from the fitted mean)")
        return out


def load_digits_split(seed: int = 0, test_fraction: float = 0.2, *, dtype=np.float64) -> Dataset:
    """The digits, split (stratified, seeded) and standardised on the training part only."""
    seed = check_seed(seed, "seed")
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
    check_fits_in_memory(8 * (num_examples + num_classes) * (num_features + 1),
                         "num_examples, num_features and num_classes", "the data and the class centres")
    check_generator(rng)
    centres = rng.standard_normal((num_classes, num_features)) * separation
    y = rng.permutation(np.arange(num_examples) % num_classes)
    x = centres[y] + rng.standard_normal((num_examples, num_features))
    return x.astype(dtype), y.astype(np.int64)


# --- Data for the command line: user archives and MNIST-1D -------------------------------

__all__ += ["npy_header", "NPZ_ARRAYS", "MNIST1D_PROVENANCE", "load_npz_dataset", "default_cache_dir", "load_mnist1d"]

NPZ_ARRAYS = ("x", "y", "x_test", "y_test")

MNIST1D_PROVENANCE = (
    "MNIST-1D (S. Greydanus, 2020, arXiv:2011.14439), generated locally by the mnist1d "
    "package's make_dataset (Apache-2.0) from its built-in templates; nothing is downloaded."
)


def npy_header(handle) -> tuple[tuple, np.dtype]:
    """Shape and dtype of a ``.npy`` stream from its header, without reading (or allocating) the data."""
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
    else:
        raise ValueError(f".npy format version {version} is not one np.savez writes")
    return shape, dtype


def _check_declared_sizes(source: str, names) -> None:
    """Each array's header must not declare more data than its archive entry holds (a hostile
    file could otherwise make ``np.load`` try to allocate terabytes)."""
    import zipfile

    try:
        with zipfile.ZipFile(source) as archive:
            for name in names:
                info = archive.getinfo(f"{name}.npy")
                with archive.open(info) as handle:
                    shape, dtype = npy_header(handle)
                if dtype.hasobject:
                    raise ValueError(f"{source}: array '{name}' holds Python objects (a pickle); only arrays of "
                                     f"numbers are read")
                if int(np.prod(shape, dtype=object)) * dtype.itemsize > info.file_size:
                    raise ValueError(f"{source}: array '{name}' declares shape {shape} of {dtype}, more data than "
                                     f"the file holds")
    except (OSError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{source}: not a readable .npz archive ({exc})") from None


def _npz_features(archive, key: str, source: str, dtype) -> np.ndarray:
    x = archive[key]
    if x.dtype.kind not in "fiu":
        raise TypeError(f"{source}: array '{key}' must hold real numbers (float or int), got dtype {x.dtype}")
    if x.ndim < 2:
        raise ValueError(f"{source}: array '{key}' must be 2-D (n, d), got shape {x.shape}")
    if x.shape[0] == 0 or x.size == 0:
        raise ValueError(f"{source}: array '{key}' must hold at least one example and one feature, got shape {x.shape}")
    x = x.reshape(x.shape[0], -1).astype(dtype)  # images (n, h, w) become rows (n, h*w)
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{source}: array '{key}' must hold at least one example and one feature, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{source}: array '{key}' must contain only finite values (no NaN or Inf)")
    return x


def _npz_labels(archive, key: str, source: str, n: int, x_key: str) -> np.ndarray:
    y = archive[key]
    if y.dtype.kind not in "iu":
        raise TypeError(f"{source}: array '{key}' must hold integer class labels, got dtype {y.dtype} "
                        f"(convert with y.astype(int))")
    if y.ndim != 1:
        raise ValueError(f"{source}: array '{key}' must be 1-D (n,), got shape {y.shape}")
    if y.shape[0] != n:
        raise ValueError(f"{source}: arrays '{x_key}' and '{key}' must have the same length, got {n} and {y.shape[0]}")
    if y.min() < 0:
        raise ValueError(f"{source}: array '{key}' must hold non-negative class labels, got min {int(y.min())}")
    return y.astype(np.int64)


def _npz_source(path) -> str:
    """``path`` as a string, naming a file that exists (``TypeError``, ``ValueError``, ``FileNotFoundError``)."""
    import os

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike naming an .npz file, got {type(path).__name__}")
    source = os.fspath(path)
    if os.path.isdir(source):
        raise ValueError(f"{source}: is a folder, not an .npz file")
    if not os.path.isfile(source):
        raise FileNotFoundError(f"no such file: {source}")
    return source


def _open_npz(source: str):
    """The archive at ``source``, never unpickling; ``ValueError`` if it is not an ``.npz`` of named arrays."""
    import zipfile

    try:
        archive = np.load(source, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{source}: not a readable .npz archive ({exc})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ValueError(f"{source}: expected an .npz archive of named arrays (np.savez), got a single array")
    return archive


def _check_npz_names(source: str, names: set[str]) -> None:
    """``x`` and ``y`` present, nothing outside ``NPZ_ARRAYS``, ``x_test`` and ``y_test`` both or neither."""
    missing = [key for key in ("x", "y") if key not in names]
    if missing:
        raise ValueError(f"{source}: missing array(s) {missing}; an .npz needs 'x' (n, d) and 'y' (n,), "
                         f"optionally 'x_test' and 'y_test'")
    unknown = sorted(names - set(NPZ_ARRAYS))
    if unknown:
        raise ValueError(f"{source}: unknown array(s) {unknown}; allowed are {list(NPZ_ARRAYS)}")
    if ("x_test" in names) != ("y_test" in names):
        raise ValueError(f"{source}: 'x_test' and 'y_test' must be given together")


def _npz_arrays(archive, names: set[str], source: str, dtype) -> tuple:
    """``(x, y, x_test, y_test)`` from the archive, checked (the held-out pair None when it
    has none). A truncated member is a ``ValueError``."""
    import zipfile

    try:
        x = _npz_features(archive, "x", source, dtype)
        y = _npz_labels(archive, "y", source, x.shape[0], "x")
        if "x_test" not in names:
            return x, y, None, None
        x_test = _npz_features(archive, "x_test", source, dtype)
        y_test = _npz_labels(archive, "y_test", source, x_test.shape[0], "x_test")
    except (OSError, zipfile.BadZipFile) as exc:  # a truncated member
        raise ValueError(f"{source}: not a readable .npz archive ({exc})") from None
    if x_test.shape[1] != x.shape[1]:
        raise ValueError(f"{source}: 'x_test' must have {x.shape[1]} features like 'x', got shape {x_test.shape}")
    return x, y, x_test, y_test


def load_npz_dataset(path, *, test_fraction: float = 0.2, seed: int = 0, standardize: bool = True,
                     dtype=np.float64) -> Dataset:
    """A dataset from an ``.npz`` archive, validated.

    The archive holds ``x`` (n, d) real numbers and ``y`` (n,) integer labels in
    ``[0, C)``, and optionally a held-out part ``x_test``, ``y_test`` (both or neither).
    Arrays of more than two dimensions (images) are flattened to rows. Without a
    held-out part, ``stratified_split(x, y, test_fraction, default_rng(seed))`` makes
    one. With ``standardize``, features are standardised on the training part only.

    Raises
    ------
    FileNotFoundError
        No file at ``path``.
    ValueError, TypeError
        Not an ``.npz`` archive, a missing or unknown array, mismatched lengths or
        widths, NaN/Inf, a non-numeric ``x`` or non-integer ``y``, negative labels.
    """
    source = _npz_source(path)
    seed = check_seed(seed, "seed")
    test_fraction = check_real(test_fraction, "test_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
    if np.dtype(dtype) not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be float32 or float64, got {np.dtype(dtype)}")
    with _open_npz(source) as archive:
        names = set(archive.files)
        _check_npz_names(source, names)
        _check_declared_sizes(source, names)
        x, y, x_test, y_test = _npz_arrays(archive, names, source, dtype)
    if x_test is not None:
        split = Dataset(x, y, x_test, y_test)
    else:
        split = stratified_split(x, y, test_fraction, np.random.default_rng(seed))
    if not standardize:
        return split
    scaler = Standardizer.fit(split.x_train)
    return Dataset(scaler.transform(split.x_train), split.y_train, scaler.transform(split.x_test), split.y_test)


def default_cache_dir():
    """``$DILOCO_CACHE_DIR``, else ``$XDG_CACHE_HOME/diloco``, else ``~/.cache/diloco``."""
    import os
    from pathlib import Path

    if os.environ.get("DILOCO_CACHE_DIR"):
        return Path(os.environ["DILOCO_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "diloco"


def load_mnist1d(*, cache_dir=None, num_samples: int = 5000, seed: int = 42, dtype=np.float64) -> Dataset:
    """MNIST-1D: 10 classes of 1-D signals of length 40, generated locally and cached.

    The first call runs the ``mnist1d`` package's own generator (``make_dataset`` with
    its default arguments: templates from code, random padding, scaling, translation,
    noise and shear; 80/20 train/test split) and saves the result as
    ``mnist1d-n{num_samples}-seed{seed}.npz`` in ``cache_dir`` (default
    ``default_cache_dir()``); later calls read that file. Nothing is downloaded. The
    generator seeds NumPy's global random state; it is restored afterwards.

    Raises
    ------
    ImportError
        The ``mnist1d`` extra is not installed and the cache holds no copy.
    """
    import os
    import random
    from pathlib import Path

    num_samples = check_positive_int(num_samples, "num_samples")
    seed = check_seed(seed, "seed")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if cache.exists() and not cache.is_dir():
        raise ValueError(f"cache_dir {cache} is a file, not a folder")
    path = cache / f"mnist1d-n{num_samples}-seed{seed}.npz"
    if not path.is_file():
        try:
            from mnist1d.data import get_dataset_args, make_dataset
        except ImportError:
            raise ImportError("MNIST-1D needs the 'mnist1d' extra: pip install 'diloco[mnist1d]'") from None
        args = get_dataset_args()
        args.num_samples, args.seed = num_samples, seed
        numpy_state, python_state = np.random.get_state(), random.getstate()
        try:
            generated = make_dataset(args)
        finally:
            np.random.set_state(numpy_state)
            random.setstate(python_state)
        cache.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        np.savez_compressed(partial, x=generated["x"].astype(np.float64), y=generated["y"].astype(np.int64),
                            x_test=generated["x_test"].astype(np.float64),
                            y_test=generated["y_test"].astype(np.int64))
        os.replace(partial, path)  # never leave a half-written cache file
    return load_npz_dataset(path, standardize=False, dtype=dtype)
