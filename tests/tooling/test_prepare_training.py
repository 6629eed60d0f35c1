"""``prepare_training``'s checks, one per part (data, held-out data, classes, memory), each with its message."""

from __future__ import annotations

import numpy as np
import pytest

from diloco.config import DiLoCoConfig
from diloco.core.run_records import prepare_training

X, Y = np.zeros((8, 3)), np.array([0, 1] * 4)
CONFIG = DiLoCoConfig(num_workers=2)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(x=np.zeros((0, 3)), y=np.zeros(0, int)), ValueError, "x must hold at least one example"),
    (dict(x=np.zeros((8, 0))), ValueError, r"x must have at least one feature \(column\)"),
    (dict(x_eval=np.zeros((0, 3)), y_eval=np.zeros(0, int)), ValueError, "x_eval must hold at least one example"),
    (dict(x_eval=np.zeros((2, 4)), y_eval=np.zeros(2, int)), ValueError, "x_eval must have 3 columns like x"),
    (dict(x_eval=np.zeros((2, 3))), ValueError, "x_eval and y_eval must be given together"),
    (dict(y=np.zeros(8, int)), ValueError, "y must hold at least two classes"),
    (dict(on_round=3), TypeError, "on_round must be callable"),
])
def test_each_bad_part_is_refused_with_its_own_message(kwargs, error, message):
    args = dict(x=X, y=Y, config=CONFIG) | kwargs
    with pytest.raises(error, match=message):
        prepare_training(**args)


def test_the_classes_are_the_largest_label_in_y_or_y_eval_plus_one():
    _, _, _, params = prepare_training(X, Y, CONFIG, x_eval=np.zeros((2, 3)), y_eval=np.array([0, 4]))
    assert params["b2"].shape == (5,)
    _, _, _, params = prepare_training(X, np.zeros(8, int), CONFIG, x_eval=np.zeros((2, 3)), y_eval=np.array([0, 1]))
    assert params["b2"].shape == (2,), "one training class and two held-out: two classes"


def test_a_model_too_large_for_memory_is_refused_before_it_is_made():
    with pytest.raises(ValueError, match="the model"):
        prepare_training(X, Y, DiLoCoConfig(num_workers=2, hidden_sizes=(1 << 20, 1 << 20)))
