"""The bandwidth study's plot: when no arm reaches the target (a log axis has nothing to show), and when
some arms reach it on only some seeds (drawn hollow, the legend says how many; the others named)."""

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


def test_an_arm_some_seeds_brought_to_the_target_is_drawn_hollow_and_the_others_named():
    """The docs' picture was empty: every arm reached the target on only some seeds."""
    partial = {"variant": "DiLoCo", "cells": [{"seconds": {"mean": 3.0}, "reached": 2, "runs": 5}] * 2}
    full = {"variant": "sync", "cells": [{"seconds": {"mean": 9.0}, "reached": 5, "runs": 5}] * 2}
    fig = plot_time_to_target([partial, full, _row("Streaming", False)], ["1Mbit", "1Gbit"], 0.5)
    ax = fig.axes[0]
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["DiLoCo (2/5 seeds)", "sync"]  # only what is drawn
    assert "never reached: Streaming" in ax.get_title() and "hollow" in ax.get_title()
    faces = {tuple(line.get_markerfacecolor()) if not isinstance(line.get_markerfacecolor(), str)
             else line.get_markerfacecolor() for line in ax.lines if line.get_marker() == "o"}
    assert "white" in faces and len(faces) == 2  # hollow DiLoCo points, filled (coloured) sync points
