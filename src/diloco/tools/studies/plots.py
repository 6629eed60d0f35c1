"""PNG plots of runs and studies (matplotlib, from the ``cli`` extra).

Figures are built as plain ``matplotlib.figure.Figure`` objects and rendered with the
Agg canvas, so nothing here touches pyplot's global state or the interactive backend:
the same functions work in a script, under a test runner and in a notebook (where a
returned figure displays itself).

* ``plot_curves``: held-out loss and accuracy against round, step or bytes sent
  (log axis), one line per algorithm, all on the same axes.
* ``plot_study``: a study's final held-out loss and accuracy per variant, mean with a
  95% interval over seeds.
* ``plot_paper_study``: a paper study's mean curves and final values, and
  ``plot_scaling_gap``: the scaling study's gap to data parallelism against width.
* ``log_where_decades``: an axis goes to a log scale when its data spans decades (a loss
  from 2.3 down to 0.05, steps from 50 to 40,000), so no curve is squashed into a corner.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["require_matplotlib", "plot_curves", "plot_study", "save_figure", "save_run_plots", "log_where_decades",
           "decades", "study_curve_axis", "plot_paper_study", "plot_scaling_gap"]

def study_curve_axis(study: str) -> str:
    """The x axis of a study's curves: bytes where the study varies what is sent, steps otherwise."""
    return "bytes" if study in ("inner-steps", "compression") else "step"


_X_AXES = {
    "round": ("round", "outer round (synchronisation)", False),
    "step": ("step", "inner steps per worker", False),
    "bytes": ("cumulative_bytes", "bytes sent per worker (log scale)", True),
}

# DiLoCo lines take the tab10 colours in order; the synchronous baseline is always black, dashed.
_TAB10 = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
          "tab:cyan", "tab:gray")


def _line_styles(names) -> dict:
    styles, index, num_sync = {}, 0, 0
    for name in names:
        if name == "sync" or name.endswith("/ sync"):
            styles[name] = {"color": "black", "linestyle": ("--", ":", "-.")[num_sync % 3]}
            num_sync += 1
        else:
            styles[name] = {"color": _TAB10[index % len(_TAB10)], "linestyle": "-"}
            index += 1
    return styles


def require_matplotlib():
    """Import matplotlib's Figure, or say which extra to install."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots need matplotlib, from the 'cli' extra: pip install 'diloco[cli]'") from None
    return Figure


def save_figure(fig, path) -> Path:
    """Render ``fig`` to a PNG file with the Agg canvas, written atomically (never a 0-byte PNG)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from diloco.tools.runs.folders import atomic_write_bytes

    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return atomic_write_bytes(path, buffer.getvalue())


def decades(values) -> float:
    """``log10(max / min)`` of the positive finite ``values`` (0 with fewer than two)."""
    import math

    kept = [float(v) for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.log10(max(kept) / min(kept)) if len(kept) > 1 else 0.0


def log_where_decades(ax, axis: str, values, at_least: float = 1.0, formatter=None) -> bool:
    """Put ``ax``'s ``axis`` ("x" or "y") on a log scale when ``values`` span ``at_least`` decades,
    labelled 0.2, 0.5, 1, 2, 5 (or by ``formatter(value)``), not 2 x 10^-1."""
    span = decades(values)
    if span < at_least:
        return False
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    scale = ax.xaxis if axis == "x" else ax.yaxis
    subs = (1.0, 2.0, 5.0) if span <= 1.5 else (1.0, 3.0) if span <= 2.5 else (1.0,)  # labels that do not collide
    scale.set_major_locator(LogLocator(base=10, subs=subs, numticks=15))
    scale.set_major_formatter(FuncFormatter(lambda value, _pos: formatter(value) if formatter else f"{value:g}"))
    scale.set_minor_formatter(NullFormatter())
    return True


def _label(name: str) -> str:
    return {"diloco": "DiLoCo", "sync": "synchronous baseline"}.get(name, name)


def plot_curves(histories: dict, *, x: str = "round", title: str = "", left: str = "eval_loss"):
    """Held-out loss (left; or ``left="eval_perplexity"``, the char-LM's metric) and accuracy
    (right) per algorithm, on shared axes.

    Parameters
    ----------
    histories : dict of name -> list of history records
        E.g. ``{"diloco": result.history, "sync": baseline.history}``; records need
        ``eval_loss``, ``eval_accuracy`` and the x field.
    x : "round", "step" or "bytes"
        "bytes" plots against ``cumulative_bytes`` on a log axis (points at zero bytes,
        as with one worker, are left out).
    title : str

    Returns
    -------
    matplotlib.figure.Figure
    """
    if x not in _X_AXES:
        raise ValueError(f"x must be one of {sorted(_X_AXES)}, got {x!r}")
    Figure = require_matplotlib()
    key, xlabel, log = _X_AXES[x]
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    drawn, positions = _draw_curves(histories, ax_loss, ax_acc, key, log, left)
    left_label = "held-out perplexity" if left == "eval_perplexity" else "held-out loss (cross-entropy)"
    for ax, ylabel in ((ax_loss, left_label), (ax_acc, "held-out accuracy")):
        _curve_axis(ax, xlabel, ylabel, positions if log else None)
    if log_where_decades(ax_loss, "y", drawn):  # a loss falling by 10x or more: every part of the curve shows
        ax_loss.set_ylabel(f"{left_label} (log scale)")
    if title:
        fig.suptitle(title)
    return fig


def _draw_curves(histories: dict, ax_loss, ax_acc, key: str, log: bool, left: str) -> tuple[list, list]:
    """Each run's evaluated points (positive x only on a log axis) on both axes; the drawn
    left-axis values and x positions, for the axes' scales."""
    styles = _line_styles(histories)
    drawn, positions = [], []
    for name, records in histories.items():
        points = [r for r in records if r.get("eval_loss") is not None and (not log or (r.get(key) or 0) > 0)]
        if not points:
            continue
        xs = [r[key] for r in points]
        style = {**styles[name], "label": _label(name), "marker": "o" if len(xs) <= 30 else None, "markersize": 3}
        ax_loss.plot(xs, [r[left] for r in points], **style)
        drawn += [r[left] for r in points]
        positions += xs
        ax_acc.plot(xs, [r["eval_accuracy"] for r in points], **style)
    return drawn, positions


def _curve_axis(ax, xlabel: str, ylabel: str, log_positions) -> None:
    """Labels, grid, legend; x in bytes on a log scale (``log_positions``: the x values drawn),
    else whole numbers (rounds, steps)."""
    from matplotlib.ticker import MaxNLocator

    from diloco.tools.studies.study_stats import format_bytes

    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3, which="both")
    if log_positions is not None:  # bytes, as the CLI prints them
        log_where_decades(ax, "x", log_positions, at_least=0.0, formatter=format_bytes)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def save_run_plots(histories: dict, out_dir, *, title: str = "", left: str = "eval_loss") -> list[Path]:
    """The two plots of a run folder: ``heldout_vs_round.png`` and ``heldout_vs_bytes.png``."""
    out_dir = Path(out_dir)
    paths = []
    for x, name in (("round", "heldout_vs_round.png"), ("bytes", "heldout_vs_bytes.png")):
        suffix = "against round" if x == "round" else "against bytes communicated"
        fig = plot_curves(histories, x=x, title=f"{title} - {suffix}" if title else suffix, left=left)
        paths.append(save_figure(fig, out_dir / name))
    return paths


def plot_study(rows: list, *, title: str = "", xlabel: str = "variant"):
    """Final held-out loss and accuracy per variant: mean and 95% interval over seeds.

    Parameters
    ----------
    rows : list of dict
        As ``diloco.tools.studies.ablations.summarise`` returns: ``variant``, ``algo``, and
        ``eval_loss`` / ``eval_accuracy`` dicts with ``mean``, ``low``, ``high``.
    """
    Figure = require_matplotlib()
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    by_variant = {v: [r for r in rows if r["variant"] == v] for v in variants}
    width = 0.8 / max(len(group) for group in by_variant.values())
    colours = {"diloco": "tab:blue", "sync": "0.45"}
    fig = Figure(figsize=(max(8, 1.3 * len(variants) + 4), 4.4), layout="constrained")
    axes = fig.subplots(1, 2)
    labelled = set()
    for i, variant in enumerate(variants):
        group = by_variant[variant]
        for j, row in enumerate(group):
            x = i + (j - (len(group) - 1) / 2) * width
            label = None if row["algo"] in labelled else _label(row["algo"])
            labelled.add(row["algo"])
            for ax, metric in zip(axes, ("eval_loss", "eval_accuracy"), strict=True):
                stats = row[metric]
                ax.bar([x], [stats["mean"]], width=width * 0.9, color=colours.get(row["algo"], "tab:green"),
                       yerr=[[stats["mean"] - stats["low"]], [stats["high"] - stats["mean"]]], capsize=3,
                       label=label)
    for ax, ylabel in zip(axes, ("final held-out loss", "final held-out accuracy"), strict=True):
        ax.set_xticks(range(len(variants)), variants, rotation=20, ha="right")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{ylabel} (mean, 95% CI)")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(loc="upper left")
    accuracies = [r["eval_accuracy"]["low"] for r in rows]
    if accuracies:
        axes[1].set_ylim(max(0.0, min(accuracies) - 0.05), 1.0)
    if title:
        fig.suptitle(title)
    return fig


def plot_paper_study(summary: dict):
    """Two panels: the headline metric against steps per worker (mean over seeds, one
    line per arm), and each arm's final value with its 95% interval."""
    from matplotlib.figure import Figure

    from diloco.tools.studies.paper_report import metric_of

    field, name = metric_of(summary["task"])
    fig = Figure(figsize=(12, 4.4), layout="constrained")
    curves, finals = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    shown = name.removeprefix("held-out ")
    _paper_curves(curves, summary["rows"], field, shown)
    _final_bars(finals, summary["rows"], field)
    finals.set_xlabel(f"final held-out {shown}, mean and 95% CI over {len(summary['seeds'])} seeds")
    budget = (f"{summary['steps_per_worker']} steps per worker" if "steps_per_worker" in summary
              else "at equal simulated time" if "horizon_seconds" in summary else "")
    fig.suptitle(f"{summary['reference']}: {summary['title']}\n"
                 + ", ".join(part for part in (summary["task"], budget) if part), fontsize=10)
    return fig


def _paper_curves(curves, rows: list, field: str, shown: str) -> None:
    """Each arm's mean curve of the metric against steps per worker (log axes where they span decades)."""
    to_metric = np.exp if field == "eval_perplexity" else (lambda v: v)
    xs, ys = [], []
    for row in rows:
        steps = [point[0] for point in row["curve"]]
        values = to_metric(np.array([point[1] for point in row["curve"]]))
        curves.plot(steps, values, label=row["arm"],
                    linestyle="--" if row["algo"] == "sync" else "-", marker="o" if len(steps) <= 3 else None)
        xs, ys = xs + steps, ys + list(values)
    # Arms of 5,000 and 40,000 steps, a perplexity from 27 down to 6: log axes, or the curves hug a corner.
    log_x = log_where_decades(curves, "x", xs, at_least=2.0)
    log_y = log_where_decades(curves, "y", ys, at_least=0.5)
    curves.set_xlabel("inner steps per worker" + (" (log scale)" if log_x else ""))
    curves.set_ylabel(f"held-out {shown}" + (" (log scale)" if log_y else ""))
    curves.legend(fontsize=7)


def _final_bars(finals, rows: list, field: str) -> None:
    """Each arm's final metric as a bar with its 95% interval, the axis fitted to the intervals."""
    labels = [row["arm"] for row in rows]
    means = [row[field]["mean"] for row in rows]
    errors = [row[field]["half_width"] for row in rows]
    finals.barh(range(len(labels)), means, xerr=errors, color="tab:blue", alpha=0.7)
    finals.set_yticks(range(len(labels)), labels, fontsize=7)
    finals.invert_yaxis()
    low = min(m - e for m, e in zip(means, errors, strict=True))
    high = max(m + e for m, e in zip(means, errors, strict=True))
    finals.set_xlim(low - 0.1 * (high - low + 1e-9), high + 0.1 * (high - low + 1e-9))


def plot_scaling_gap(summary: dict):
    """The scaling study: DiLoCo's final held-out loss minus data parallelism's, seed by seed
    (mean and 95% interval), against the hidden width, one line per K."""
    from matplotlib.figure import Figure

    from diloco.tools.studies.study_stats import mean_interval

    rows = {row["arm"]: row for row in summary["rows"]}
    widths = sorted({int(label.rsplit("=", 1)[1]) for label in rows if label.startswith("DP")})
    fig = Figure(figsize=(6.5, 4.2))
    ax = fig.add_subplot()
    for k in sorted({int(label.split()[0][2:]) for label in rows if label.startswith("K=")}):
        means, errors = [], []
        for width in widths:
            dp, arm = rows.get(f"DP w={width}"), rows.get(f"K={k} w={width}")
            gap = mean_interval(np.subtract(arm["per_seed_eval_loss"], dp["per_seed_eval_loss"]))
            means.append(gap["mean"])
            errors.append(gap["half_width"])
        ax.errorbar(widths, means, yerr=errors, marker="o", capsize=3, label=f"DiLoCo K={k}")
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set(xscale="log", xlabel="hidden width", ylabel="held-out loss, DiLoCo minus data parallelism",
           title=f"Gap to data parallelism at a fixed token budget ({len(summary['seeds'])} seeds)")
    ax.minorticks_off()
    ax.set_xticks(widths, [str(w) for w in widths])
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
