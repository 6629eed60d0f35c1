"""The shared positive-float flag type, as ``--max-loss`` and ``grade``'s timeouts use it."""

from __future__ import annotations

import argparse
import math

import pytest

from diloco.tools.cli.arg_types import positive_finite
from diloco.tools.cli.config_flags import _max_loss
from diloco.tools.grading.grade_command import _seconds


def test_a_positive_finite_number_is_kept():
    assert _max_loss("2.5") == 2.5 and _seconds("1e3") == 1000.0
    assert positive_finite(" 7 ", not_a_number="a", not_positive="b") == 7.0


@pytest.mark.parametrize("text", ["off", "OFF", " none "])
def test_off_is_no_threshold_for_max_loss_only(text):
    assert _max_loss(text) == math.inf
    with pytest.raises(argparse.ArgumentTypeError, match=rf"^must be a number of seconds, got {text!r}$"):
        _seconds(text)


@pytest.mark.parametrize("text, max_loss, seconds", [
    ("x", "must be a positive number or 'off'", "must be a number of seconds"),
    ("0", "must be a positive finite number or 'off'", "must be a positive number of seconds"),
    ("-1", "must be a positive finite number or 'off'", "must be a positive number of seconds"),
    ("nan", "must be a positive finite number or 'off'", "must be a positive number of seconds"),
    ("inf", "must be a positive finite number or 'off'", "must be a positive number of seconds"),
])
def test_each_flag_keeps_its_own_message(text, max_loss, seconds):
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        _max_loss(text)
    assert str(caught.value) == f"{max_loss}, got {text!r}"
    with pytest.raises(argparse.ArgumentTypeError) as caught:
        _seconds(text)
    assert str(caught.value) == f"{seconds}, got {text!r}"
