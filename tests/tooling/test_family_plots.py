"""The bandwidth study's plot when no arm reaches the target (a log axis has nothing to show)."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from diloco.tools.studies.family_tables import plot_time_to_target  # noqa: E402


def _row(name, reached):
    cell = {"seconds": {"mean": 2.5} if reached else None, "reached": 1 if reached else 0, "runs": 1}
    return {"variant": name, "cells": [cell, cell]}


@pytest.mark.parametrize("reached, scale", [(False, "linear"), (True, "log")])
def test_time_to_target_plot_draws_whether_or_not_a_target_was_reached(reached, scale, tmp_path):
    fig = plot_time_to_target([_row("DiLoCo", reached), _row("sync", False)], ["1Mbit", "1Gbit"], 0.5)
    fig.savefig(tmp_path / "plot.png")  # the draw that raised before
    assert fig.axes[0].get_yscale() == scale
