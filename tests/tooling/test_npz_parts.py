"""``load_npz_dataset``'s held-out part: both arrays or neither, the width of x, a damaged member."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from diloco.data import load_npz_dataset

X, Y = np.random.default_rng(0).random((20, 3)), np.array([0, 1] * 10)


def test_a_held_out_part_is_used_as_given(tmp_path):
    path = tmp_path / "d.npz"
    np.savez(path, x=X, y=Y, x_test=X[:4], y_test=Y[:4])
    data = load_npz_dataset(path, standardize=False)
    assert np.array_equal(data.x_test, X[:4]) and np.array_equal(data.y_train, Y)


@pytest.mark.parametrize("arrays, message", [
    (dict(x_test=X[:4]), "'x_test' and 'y_test' must be given together"),
    (dict(y_test=Y[:4]), "'x_test' and 'y_test' must be given together"),
    (dict(x_test=X[:4, :2], y_test=Y[:4]), r"'x_test' must have 3 features like 'x', got shape \(4, 2\)"),
])
def test_a_bad_held_out_part_is_refused(tmp_path, arrays, message):
    path = tmp_path / "d.npz"
    np.savez(path, x=X, y=Y, **arrays)
    with pytest.raises(ValueError, match=message):
        load_npz_dataset(path)


def test_a_damaged_held_out_member_is_a_value_error_naming_the_file(tmp_path):
    """(The size check reads every member first, so it is caught there; the same wrapping in the
    arrays' read covers a file that changes between the two.)"""
    path = tmp_path / "damaged.npz"
    np.savez(path, x=X, y=Y, x_test=X[:4], y_test=Y[:4])
    info = zipfile.ZipFile(path).getinfo("x_test.npy")
    data = bytearray(path.read_bytes())
    data[info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size - 1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"damaged.npz: not a readable .npz archive \(Bad CRC-32"):
        load_npz_dataset(path)
