"""Intervals that respect a metric's range, and tables that say when one was clipped.

The expected numbers are worked by hand from ``mean +- t_{0.975, n-1} s / sqrt(n)`` with the
tabulated ``t_{0.975, 2} = 4.303`` and ``t_{0.975, 1} = 12.706``.
"""

from __future__ import annotations

import math

import pytest

from diloco.tools.studies.paper_report import render_arms_table, render_claims_table, summarise_arms
from diloco.tools.studies.study_stats import (
    CLIPPED_MARK,
    CLIPPED_NOTE,
    RANGES,
    format_interval,
    markdown_table,
    mean_interval,
    summarise,
)

pytestmark = pytest.mark.tooling


def test_an_accuracy_interval_never_passes_one():
    # [1, 0.97, 1]: mean 0.99, s = sqrt(((0.01)^2 * 2 + 0.02^2) / 2) = sqrt(0.0003), h = 4.303 s / sqrt 3
    stats = mean_interval([1.0, 0.97, 1.0], bounds=RANGES["eval_accuracy"])
    half = 4.303 * math.sqrt(0.0003) / math.sqrt(3)
    assert stats["mean"] == pytest.approx(0.99) and stats["half_width"] == pytest.approx(half)
    assert stats["low"] == pytest.approx(0.99 - half) and stats["high"] == 1.0 and stats["clipped"] is True
    assert format_interval(stats) == f"0.9900 [{0.99 - half:.4f}, 1.0000]{CLIPPED_MARK}"


def test_a_loss_interval_never_goes_below_zero():
    # [0.01, 0.2]: mean 0.105, s = 0.19 / sqrt 2, h = 12.706 * s / sqrt 2 = 12.706 * 0.095 = 1.20707
    stats = mean_interval([0.01, 0.2], bounds=RANGES["eval_loss"])
    assert stats["low"] == 0.0 and stats["high"] == pytest.approx(0.105 + 1.20707) and stats["clipped"]


def test_an_interval_inside_the_range_is_neither_clipped_nor_marked():
    stats = mean_interval([0.5, 0.6, 0.7], bounds=RANGES["eval_accuracy"])
    assert stats["clipped"] is False
    assert stats["low"] == pytest.approx(0.6 - 4.303 * 0.1 / math.sqrt(3))
    assert CLIPPED_MARK not in format_interval(stats)
    unbounded = mean_interval([1.0, 0.97, 1.0])
    assert unbounded["high"] > 1.0 and unbounded["clipped"] is False, "without bounds nothing is clipped"


def outcome(variant, seed, accuracy, loss):
    return {"variant": variant, "algo": "diloco", "seed": seed, "eval_accuracy": accuracy, "eval_loss": loss,
            "all_reduces": 2, "bytes_sent": 1000.0, "seconds": 1.0}


def test_the_ablation_table_clips_and_says_so():
    rows = summarise([outcome("H=5", 0, 1.0, 0.01), outcome("H=5", 1, 0.97, 0.2), outcome("H=5", 2, 1.0, 0.02)])
    assert rows[0]["eval_accuracy"]["high"] == 1.0 and rows[0]["eval_loss"]["low"] == 0.0
    table = markdown_table(rows)
    assert "1.0000]" + CLIPPED_MARK in table and "[0.0000," in table
    assert table.rstrip().endswith(CLIPPED_NOTE)
    calm = markdown_table(summarise([outcome("H=5", s, 0.5 + 0.1 * s, 1.0 + 0.1 * s) for s in range(3)]))
    assert CLIPPED_MARK not in calm and CLIPPED_NOTE not in calm


class Arm:
    def __init__(self, label):
        self.label, self.algo, self.changes = label, "diloco", {}


def paper_outcome(arm, seed, accuracy, loss):
    return {"arm": arm, "seed": seed, "num_workers": 2, "inner_steps": 5, "rounds": 2, "steps_per_worker": 10,
            "all_reduces": 2, "bytes_sent": 1.0, "engine": "reference", "seconds": 1.0, "eval_loss": loss,
            "eval_perplexity": math.exp(loss), "eval_bits": loss / math.log(2), "eval_accuracy": accuracy,
            "best_eval_loss": loss, "curve": [[10, loss]]}


def test_the_paper_tables_clip_accuracy_and_name_the_arm_columns_for_what_they_hold():
    outcomes = [paper_outcome("A", s, acc, loss) for s, (acc, loss) in enumerate([(1.0, 0.01), (0.97, 0.2),
                                                                                    (1.0, 0.02)])]
    rows = summarise_arms(outcomes, [Arm("A")])
    assert rows[0]["eval_accuracy"]["high"] == 1.0 and rows[0]["eval_loss"]["low"] == 0.0
    assert rows[0]["eval_perplexity"]["low"] >= 1.0
    table = render_arms_table({"task": "mnist1d", "rows": rows})
    assert CLIPPED_MARK in table and table.rstrip().endswith(CLIPPED_NOTE)
    # An exported summary of before the clipping (no "clipped" key, low below 0) is clipped when rendered.
    old = dict(rows[0], eval_loss={"mean": 0.1, "low": -0.5, "high": 0.7, "half_width": 0.6, "n": 3})
    assert f"0.000, 0.700]{CLIPPED_MARK}" in render_arms_table({"task": "mnist1d", "rows": [old]})
    claims = render_claims_table({"task": "mnist1d", "claims": []})
    header = claims.splitlines()[0]
    assert "held-out loss of the arm the paper finds better" in header and "better arm:" not in header
