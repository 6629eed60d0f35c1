"""The studies' statistics and tables: mean and 95% Student-t interval over seeds.

``mean_interval`` gives ``mean +- t_{0.975, n-1} s / sqrt(n)`` (``t_quantile_975``,
tabulated up to 30 degrees of freedom); ``summarise`` reduces per-seed results to one row
per variant, ``mean_curves`` averages history records over seeds, ``markdown_table`` and
``format_bytes`` print them. NumPy only. Re-exported by ``diloco.tools.studies.ablations``.

With few seeds the t-interval can run past what a metric can be: an accuracy above 1, a
loss below 0. ``RANGES`` gives each metric's possible range; an interval computed with
``bounds`` is clipped to it and says so (``"clipped": True``), and ``format_interval``
marks a clipped interval with ``CLIPPED_MARK``, which ``CLIPPED_NOTE`` explains under the
table.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["t_quantile_975", "mean_interval", "clip_interval", "format_interval", "summarise", "mean_curves",
           "markdown_table", "mean_or_none", "format_bytes", "RANGES", "CLIPPED_MARK", "CLIPPED_NOTE",
           "table_text"]

# The possible range (low, high) of each per-seed metric; None = unbounded on that side.
RANGES = {
    "eval_accuracy": (0.0, 1.0),
    "eval_loss": (0.0, None),
    "best_eval_loss": (0.0, None),
    "eval_bits": (0.0, None),
    "eval_perplexity": (1.0, None),
    "pseudo_grad_cosine": (-1.0, 1.0),
    "seconds": (0.0, None),
}
CLIPPED_MARK = "\u2020"  # a dagger after the interval
CLIPPED_NOTE = (f"{CLIPPED_MARK} the 95% t-interval ran past what the metric can be (accuracy in [0, 1], "
                "loss >= 0, perplexity >= 1) and is clipped to that range.")

# Two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t_quantile_975(df: int) -> float:
    """``t_{0.975, df}``: tabulated up to 30, then the Cornish-Fisher expansion
    ``z + (z^3 + z) / (4 df)`` (within 1e-3 of the exact value)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df)


def mean_interval(values, *, bounds=None) -> dict:
    """Mean and 95% t-interval ``mean +- t_{0.975, n-1} s / sqrt(n)`` of per-seed values.

    With a single value the interval collapses to the mean (``half_width`` 0, ``n`` 1).
    ``bounds = (low, high)`` (either may be None, see ``RANGES``) clips the interval to
    the metric's possible range: ``low`` and ``high`` are then ``max(low, mean - h)`` and
    ``min(high, mean + h)``, ``half_width`` stays the t half-width ``h``, and ``clipped``
    says whether a bound cut the interval.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("values must not be empty")
    mean = float(values.mean())
    half = 0.0
    if values.size > 1:
        half = t_quantile_975(values.size - 1) * float(values.std(ddof=1)) / math.sqrt(values.size)
    stats = {"mean": mean, "low": mean - half, "high": mean + half, "half_width": half, "n": int(values.size)}
    return clip_interval(stats, bounds)


def clip_interval(stats: dict, bounds=None) -> dict:
    """``stats`` (a ``mean_interval``) with ``low``/``high`` clipped to ``bounds``; a new dict.

    ``clipped`` is True when a bound cut the interval (or it was clipped before).
    """
    out = dict(stats)
    clipped = bool(stats.get("clipped", False))
    low_bound, high_bound = (None, None) if bounds is None else bounds
    if low_bound is not None and out["low"] < low_bound:
        out["low"], clipped = float(low_bound), True
    if high_bound is not None and out["high"] > high_bound:
        out["high"], clipped = float(high_bound), True
    out["clipped"] = clipped
    return out


def format_interval(stats: dict, digits: int = 4, bounds=None) -> str:
    """``mean [low, high]``, clipped to ``bounds``; a clipped interval ends in ``CLIPPED_MARK``."""
    stats = clip_interval(stats, bounds)
    text = f"{stats['mean']:.{digits}f} [{stats['low']:.{digits}f}, {stats['high']:.{digits}f}]"
    return text + (CLIPPED_MARK if stats["clipped"] else "")


def summarise(results: list[dict]) -> list[dict]:
    """One row per (variant, algo), in first-seen order: statistics over seeds."""
    groups: dict = {}
    for outcome in results:
        groups.setdefault((outcome["variant"], outcome["algo"]), []).append(outcome)
    rows = []
    for (variant, algo), runs in groups.items():
        rows.append({
            "variant": variant, "algo": algo, "seeds": [r["seed"] for r in runs],
            "eval_loss": mean_interval([r["eval_loss"] for r in runs], bounds=RANGES["eval_loss"]),
            "eval_accuracy": mean_interval([r["eval_accuracy"] for r in runs], bounds=RANGES["eval_accuracy"]),
            "per_seed_loss": [r["eval_loss"] for r in runs],
            "per_seed_accuracy": [r["eval_accuracy"] for r in runs],
            "all_reduces": runs[0]["all_reduces"], "bytes_sent": runs[0]["bytes_sent"],
            "seconds": float(np.mean([r["seconds"] for r in runs])),
            "split_divergence": mean_or_none([r.get("split_divergence") for r in runs]),
        })
    return rows


def mean_or_none(values: list) -> float | None:
    """The mean of ``values``, None if any is missing (a run that did not measure it)."""
    return None if not values or any(v is None for v in values) else float(np.mean(values))


def mean_curves(records: list[dict]) -> dict:
    """Average history records over seeds: ``{label: [record, ...]}`` per (variant, algo).

    Records are matched by round; each mean record holds ``round``, ``step``,
    ``cumulative_bytes``, ``eval_loss`` and ``eval_accuracy``.
    """
    grouped: dict = {}
    for record in records:
        variant, algo = record["variant"], record["algo"]
        label = variant if algo == "diloco" or algo in variant else f"{variant} / {algo}"
        grouped.setdefault(label, {}).setdefault(record["round"], []).append(record)
    curves = {}
    for label, by_round in grouped.items():
        curves[label] = [
            {"round": rnd, "step": group[0]["step"], "cumulative_bytes": group[0]["cumulative_bytes"],
             "eval_loss": float(np.mean([r["eval_loss"] for r in group])),
             "eval_accuracy": float(np.mean([r["eval_accuracy"] for r in group]))}
            for rnd, group in sorted(by_round.items())
        ]
    return curves


def format_bytes(value: float) -> str:
    """``1.35 MB`` style, decimal units."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if value >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.0f} B"


def markdown_table(rows: list[dict], *, digits: int = 4) -> str:
    """A Markdown table: held-out accuracy and loss (mean [95% CI], clipped to their
    ranges and marked when clipped, ``CLIPPED_NOTE`` under the table), per-seed accuracy,
    all-reduces, bytes per worker and, where every row measured it, the shards' mean KL
    divergence (``diloco.corpus.shard_divergence``, mean over seeds)."""
    kl = bool(rows) and all(row.get("split_divergence") is not None for row in rows)
    lines = [
        "| variant | algorithm | held-out accuracy, mean [95% CI] | held-out loss, mean [95% CI] "
        "| accuracy per seed | all-reduces | bytes/worker |" + (" shard KL (nats) |" if kl else ""),
        "|---|---|---|---|---|---:|---:|" + ("---:|" if kl else ""),
    ]
    for row in rows:
        acc, loss = (format_interval(row[field], digits, RANGES[field]) for field in ("eval_accuracy", "eval_loss"))
        per_seed = ", ".join(f"{v:.{digits}f}" for v in row["per_seed_accuracy"])
        lines.append(f"| {row['variant']} | {row['algo']} | {acc} | {loss} | {per_seed} | {row['all_reduces']} "
                     f"| {format_bytes(row['bytes_sent'])} |" + (f" {row['split_divergence']:.4f} |" if kl else ""))
    return table_text(lines)


def table_text(lines: list) -> str:
    """A table's lines joined, with ``CLIPPED_NOTE`` under it when an interval was clipped."""
    if any(CLIPPED_MARK in line for line in lines):
        lines = [*lines, "", CLIPPED_NOTE]
    return "\n".join(lines) + "\n"
