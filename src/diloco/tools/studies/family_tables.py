"""The family studies' results: time to a target loss, paired differences, tables, a plot.

``diloco study compression|streaming|bandwidth`` (``diloco.tools.studies.family_study``) turns
its outcomes into what it prints and writes with these: ``paired_difference`` (the mean
and 95% interval over seeds of one arm minus another, seed by seed), the compression and
streaming Markdown tables, and, for the bandwidth study, ``time_to_target`` (the
simulated network, ``diloco.core.netsim``, replayed over a run's history),
``bandwidth_rows``, its table and ``plot_time_to_target``. Re-exported by
``diloco.tools.studies.family_study``.
"""

from __future__ import annotations

import numpy as np

from diloco.core.netsim import parse_bandwidth, simulate
from diloco.tools.studies.study_stats import (
    RANGES,
    format_bytes,
    format_interval,
    mean_interval,
    table_text,
)

__all__ = ["time_to_target", "paired_difference", "bandwidth_rows", "plot_time_to_target"]


def time_to_target(history: list, num_workers: int, inner_steps: int, bandwidth: float, latency: float,
                   step_time: float, target: float) -> tuple[float | None, float]:
    """``(simulated seconds until the held-out loss first is <= target or None, utilisation)``."""
    sim = simulate(history, num_workers, inner_steps, bandwidth, latency, step_time)
    total = sim[-1]["sim_cumulative_seconds"]
    utilisation = len(history) * inner_steps * step_time / total
    for record, fields in zip(history, sim, strict=True):
        if record["eval_loss"] is not None and record["eval_loss"] <= target:
            return fields["sim_cumulative_seconds"], utilisation
    return None, utilisation


def paired_difference(outcomes, variant: str, reference: str, field: str) -> dict:
    """Mean and 95% interval over seeds of ``field(variant) - field(reference)``, seed by seed.

    The arms of a study share each seed's shards, initial model and mini-batches, so the
    paired difference is far tighter than the difference of the two means' intervals.
    """
    ref = {o["seed"]: o[field] for o in outcomes if o["variant"] == reference}
    return mean_interval([o[field] - ref[o["seed"]] for o in outcomes if o["variant"] == variant])


def _quality(row: dict, outcomes, reference: str) -> str:
    """A row's first cells: the arm, its held-out accuracy and loss (clipped to their ``RANGES``,
    marked when clipped) and its loss minus ``reference``'s, paired over seeds."""
    acc, loss = (format_interval(row[field], 4, RANGES[field]) for field in ("eval_accuracy", "eval_loss"))
    d = paired_difference(outcomes, row["variant"], reference, "eval_loss")
    return f"| {row['variant']} | {acc} | {loss} | {d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}] "


def compression_table(rows, outcomes) -> str:
    native = next((r for r in rows if r["variant"] == "native"), rows[0])
    lines = ["| wire format | held-out accuracy [95% CI] | held-out loss [95% CI] | loss minus the first arm's, "
             "paired [95% CI] | bytes/worker | compression vs the first arm |", "|---|---|---|---|---:|---:|"]
    lines += [f"{_quality(row, outcomes, native['variant'])}| {format_bytes(row['bytes_sent'])} "
              f"| {native['bytes_sent'] / row['bytes_sent']:.1f}x |" for row in rows]
    return table_text(lines)


def streaming_table(rows, outcomes) -> str:
    peaks = {}
    for outcome in outcomes:
        peaks.setdefault(outcome["variant"], outcome["peak_sync_bytes"])
    reference = peaks[rows[0]["variant"]]
    lines = ["| arm | held-out accuracy [95% CI] | held-out loss [95% CI] | loss minus the first arm's, paired "
             "[95% CI] | peak bytes/sync | peak vs first arm | bytes/worker |", "|---|---|---|---|---:|---:|---:|"]
    lines += [f"{_quality(row, outcomes, rows[0]['variant'])}| {format_bytes(peaks[row['variant']])} "
              f"| {reference / peaks[row['variant']]:.2f}x lower | {format_bytes(row['bytes_sent'])} |" for row in rows]
    return table_text(lines)


def bandwidth_rows(outcomes, bandwidths, latency: float, step_time: float, target: float) -> list:
    """Per arm and bandwidth: mean time to target over the seeds that reach it, and utilisation."""
    rows = []
    for label in dict.fromkeys(o["variant"] for o in outcomes):
        runs = [o for o in outcomes if o["variant"] == label]
        cells = []
        for text in bandwidths:
            bandwidth = parse_bandwidth(text)
            pairs = [time_to_target(run["history"], run["num_workers"], run["inner_steps"], bandwidth, latency,
                                    step_time, target) for run in runs]
            reached = [t for t, _ in pairs if t is not None]
            cells.append({"bandwidth": text, "reached": len(reached), "runs": len(runs),
                          "seconds": mean_interval(reached) if reached else None,
                          "utilization": float(np.mean([u for _, u in pairs]))})
        rows.append({"variant": label, "cells": cells,
                     "final_loss": mean_interval([run["eval_loss"] for run in runs])})
    return rows


def plot_time_to_target(rows, bandwidths, target: float):
    """Simulated seconds to the target loss against bandwidth, one line per arm (log-log).

    A point is the mean over the seeds that reached the target: filled when every seed did,
    hollow when only some did (the legend says how many). An arm no seed brought to the
    target is not drawn and is named in the title, so the legend lists only what the axes
    show.
    """
    from diloco.tools.studies.plots import require_matplotlib

    fig = require_matplotlib()(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    rates = [parse_bandwidth(b) for b in bandwidths]
    never, partial = [], False
    for row in rows:
        drawn = _draw_arm(ax, rates, row)
        if drawn is None:
            never.append(row["variant"])
        partial = partial or bool(drawn)
    drawn = len(rows) > len(never)
    title = "Time to target against bandwidth" if drawn else f"No arm reached loss {target:g} at any bandwidth"
    notes = (["hollow: the mean of the seeds that reached it"] if partial else []) + (
        [f"never reached: {', '.join(never)}"] if never and drawn else [])
    # A log axis needs a positive value: when no arm reached the target, a linear one.
    ax.set(xscale="log", yscale="log" if drawn else "linear", xlabel="bandwidth (bit/s)",
           ylabel=f"simulated seconds to loss {target:.3g}")
    ax.set_title("\n".join([title, *notes]), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _seeds_note(cells: list) -> str:
    """The legend's note on an arm: nothing when every seed reached the target at every bandwidth."""
    counts = sorted({(c["reached"], c["runs"]) for c in cells})
    if counts == [(cells[0]["runs"],) * 2]:
        return ""
    return f" ({counts[0][0]}/{counts[0][1]} seeds)" if len(counts) == 1 else " (some seeds)"


def _draw_arm(ax, rates: list, row: dict) -> bool | None:
    """One arm's line and points (hollow where only some seeds reached the target); None when no
    seed reached it at any bandwidth (nothing drawn), else whether a point is hollow."""
    cells = row["cells"]
    seconds = [c["seconds"]["mean"] if c["seconds"] is not None else np.nan for c in cells]
    if not np.isfinite(seconds).any():
        return None
    (line,) = ax.plot(rates, seconds, "-", label=row["variant"] + _seeds_note(cells))
    hollow = False
    for rate, value, cell in zip(rates, seconds, cells, strict=True):
        full = cell["reached"] == cell["runs"]
        hollow = hollow or not full
        ax.plot([rate], [value], "o", color=line.get_color(), markerfacecolor=line.get_color() if full else "white")
    return hollow


def bandwidth_table(rows, bandwidths) -> str:
    head = "| arm | final held-out loss | " + " | ".join(bandwidths) + " |"
    lines = [head, "|---|---|" + "---:|" * len(bandwidths)]
    for row in rows:
        cells = []
        for cell in row["cells"]:
            if cell["seconds"] is None or cell["reached"] < cell["runs"]:
                cells.append(f"not reached ({cell['reached']}/{cell['runs']})")
            else:
                cells.append(f"{cell['seconds']['mean']:.3g} s ({100 * cell['utilization']:.0f}%)")
        lines.append(f"| {row['variant']} | {row['final_loss']['mean']:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
