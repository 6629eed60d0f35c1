"""The plots' axes read as the command line prints: whole rounds, bytes as ``format_bytes``."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from diloco.tools.studies.plots import plot_curves  # noqa: E402

pytestmark = pytest.mark.tooling


def history(rounds, bytes_per_round):
    return [{"round": r, "step": 50 * r, "cumulative_bytes": bytes_per_round * r, "eval_loss": 1.0 / r,
             "eval_accuracy": 0.5 + 0.05 * r} for r in range(1, rounds + 1)]


@pytest.mark.parametrize("rounds", [2, 5, 7])
def test_round_ticks_are_whole_numbers(rounds):
    fig = plot_curves({"diloco": history(rounds, 1e4), "sync": history(rounds, 5e5)}, x="round")
    for ax in fig.axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), f"fractional round ticks: {ticks}"


def test_byte_ticks_use_the_clis_units():
    fig = plot_curves({"diloco": history(5, 1e4), "sync": history(5, 5e5)}, x="bytes")
    ax = fig.axes[0]
    formatter = ax.xaxis.get_major_formatter()
    assert formatter(1e4, 0) == "10 kB" and formatter(2.5e6, 0) == "2.5 MB" and formatter(1e9, 0) == "1 GB"
