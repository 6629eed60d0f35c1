"""Paired statistics, verdicts and tables for the paper studies (``diloco.tools.studies.paper_studies``).

Arms of one study share the seed, hence the shards, the initial model and (at equal K)
the mini-batches, so they are compared seed by seed: for a claim "A is better than B"
the per-seed difference ``d_s = L_B(s) - L_A(s)`` of final held-out losses (positive when
the paper's ordering holds) gets a mean and a 95% Student-t interval
``mean +- t_{0.975, n-1} sd(d) / sqrt(n)``. The verdict of one claim on one task:

* **holds**: the interval lies above 0 (the paper's ordering, beyond seed noise);
* **holds partly**: the mean is above 0 but the interval reaches 0 (the mean only);
* **tie**: the interval spans 0 and the mean is 0 or below;
* **reversed**: the interval lies below 0 (the opposite ordering, beyond seed noise);
* **not run**: the study has no such arm on this task.

A robustness claim ("X costs less than a margin m", on the relative difference) reads the
same words off ``m - d``: *holds* when the whole interval is below the margin, *reversed*
when the whole interval is above it.

A claim tested on several tasks takes the weakest verdict of the tasks it was run on, in
the order holds > holds partly > tie > reversed: it *holds* only if it holds on every
task run, and one task's reversal makes it *reversed*. The per-task verdicts stand beside
it on the page.

The summaries these functions build are what ``diloco study ... --export DIR`` writes
(``DIR/<study>-<task>.json``) and what ``docs/results.md`` quotes (``render_*`` below,
checked by ``tests/tooling/test_results_page.py``).
"""

from __future__ import annotations

import math
from operator import itemgetter

import numpy as np

from diloco.tools.studies.study_stats import (
    CLIPPED_MARK,
    RANGES,
    clip_interval,
    mean_interval,
    mean_or_none,
    table_text,
)

__all__ = ["HOLDS", "PARTLY", "TIE", "REVERSED", "NOT_RUN", "paired_difference", "verdict", "combine_verdicts",
           "summarise_arms", "judge_claims", "arm_value", "render_arms_table", "render_claims_table", "render_tables",
           "render_paper_table", "first_seen", "claim_rows", "metric_of", "number", "interval_text",
           "percent_interval", "difference_text"]

HOLDS, PARTLY, TIE, REVERSED, NOT_RUN = "holds", "holds partly", "tie", "reversed", "not run"


def metric_of(task: str) -> tuple[str, str]:
    """``(field, name)`` of the headline metric: perplexity for text, held-out loss otherwise."""
    return ("eval_perplexity", "perplexity") if task == "shakespeare" else ("eval_loss", "held-out loss")


def paired_difference(worse: list, better: list) -> dict:
    """Mean and 95% t-interval of ``worse[s] - better[s]`` over seeds (``mean_interval``)."""
    if len(worse) != len(better) or not worse:
        raise ValueError(f"paired values need the same seeds, got {len(worse)} and {len(better)}")
    return mean_interval(np.asarray(worse, dtype=np.float64) - np.asarray(better, dtype=np.float64))


def verdict(difference: dict, margin: float | None = None) -> str:
    """The verdict word of one claim on one task (the module docstring defines them).

    ``difference`` is the paired ``worse - better`` (``mean``, ``low``, ``high``): positive
    when the paper's ordering holds. With ``margin`` (a robustness claim on the relative
    difference ``d``) the words are read off ``margin - d``.
    """
    mean, low, high = difference["mean"], difference["low"], difference["high"]
    if margin is not None:
        mean, low, high = margin - mean, margin - high, margin - low
    if low > 0:
        return HOLDS
    if high < 0:
        return REVERSED
    return PARTLY if mean > 0 else TIE


def combine_verdicts(verdicts: list) -> str:
    """One verdict for a claim from its per-task verdicts: the weakest of those run."""
    run = [v for v in verdicts if v != NOT_RUN]
    if not run:
        return NOT_RUN
    for word in (REVERSED, TIE, PARTLY):
        if word in run:
            return word
    return HOLDS


def summarise_arms(outcomes: list, arms: list) -> list:
    """One row per arm, in arm order: per-seed metrics and their mean and interval."""
    rows = []
    for arm in arms:
        runs = sorted((o for o in outcomes if o["arm"] == arm.label), key=lambda o: o["seed"])
        if runs:
            rows.append({**_arm_row(arm, runs), **_metrics(runs), **_curves(runs)})
    return rows


def _arm_row(arm, runs: list) -> dict:
    """What the arm is and costs: its settings (the first seed's), the mean seconds and shard KL."""
    first = runs[0]
    return {"arm": arm.label, "algo": arm.algo, "changes": arm.changes, "seeds": [r["seed"] for r in runs],
            **{k: first[k] for k in ("num_workers", "inner_steps", "rounds", "steps_per_worker", "all_reduces",
                                     "bytes_sent", "engine")},
            "seconds": float(np.mean([r["seconds"] for r in runs])),
            "split_divergence": mean_or_none([r.get("split_divergence") for r in runs])}


def _metrics(runs: list) -> dict:
    """Each held-out metric per seed and its mean and interval (clipped to what it can be); the
    workers' pseudo-gradient cosine where measured."""
    row = {}
    for field in ("eval_loss", "eval_perplexity", "eval_bits", "eval_accuracy", "best_eval_loss"):
        values = [r[field] for r in runs]
        row[field] = mean_interval(values, bounds=RANGES[field])
        row[f"per_seed_{field}"] = values
    cosines = [r["pseudo_grad_cosine"] for r in runs if r.get("pseudo_grad_cosine") is not None]
    row["pseudo_grad_cosine"] = mean_interval(cosines, bounds=RANGES["pseudo_grad_cosine"]) if cosines else None
    return row


def _curves(runs: list) -> dict:
    """The mean curve, each seed's (the plots' bands) and, for the transformer, the loss at each
    window position per seed."""
    steps = [point[0] for point in runs[0]["curve"]]
    row = {"curve": [[step, float(np.mean([r["curve"][i][1] for r in runs]))] for i, step in enumerate(steps)],
           "per_seed_curve": [[point[1] for point in r["curve"]] for r in runs]}
    if all(r.get("eval_position_loss") for r in runs):
        row["per_seed_eval_position_loss"] = [r["eval_position_loss"] for r in runs]
    return row


def judge_claims(claims: list, rows: list, task: str) -> list:
    """Each claim with its paired difference (final held-out loss, and the task's metric)."""
    by_arm = {row["arm"]: row for row in rows}
    field, _ = metric_of(task)
    judged = []
    for claim in claims:
        better, worse = by_arm.get(claim.better), by_arm.get(claim.worse)
        if better is None or worse is None or better["seeds"] != worse["seeds"]:
            continue
        if getattr(claim, "better_base", None) is not None:
            judged.append(_judge_contrast(claim, better, worse, by_arm))
            continue
        loss = paired_difference(worse["per_seed_eval_loss"], better["per_seed_eval_loss"])
        metric = paired_difference(worse[f"per_seed_{field}"], better[f"per_seed_{field}"])
        margin = getattr(claim, "margin", None)
        if margin is not None:  # the relative cost, seed by seed: (worse - better) / better
            worse_values = np.asarray(worse[f"per_seed_{field}"], dtype=np.float64)
            better_values = np.asarray(better[f"per_seed_{field}"], dtype=np.float64)
            metric = mean_interval((worse_values - better_values) / better_values)
        judged.append({**claim._asdict(), "loss_difference": loss, "metric_difference": metric,
                       "better_metric": better[field]["mean"], "worse_metric": worse[field]["mean"],
                       "verdict": verdict(metric, margin)})
    return judged


def _judge_contrast(claim, better: dict, worse: dict, by_arm: dict) -> dict:
    """A claim about two gaps, on the held-out loss, seed by seed: ``d = (worse - worse_base)
    - (better - better_base)``, positive when the gap of ``better`` to its base is smaller."""
    bases = by_arm.get(claim.better_base), by_arm.get(claim.worse_base)
    if any(b is None or b["seeds"] != better["seeds"] for b in bases):
        raise ValueError(f"claim {claim.text!r}: its base arms need the same seeds as its arms")
    gap_better = np.subtract(better["per_seed_eval_loss"], bases[0]["per_seed_eval_loss"])
    gap_worse = np.subtract(worse["per_seed_eval_loss"], bases[1]["per_seed_eval_loss"])
    difference = mean_interval(gap_worse - gap_better)
    return {**claim._asdict(), "loss_difference": difference, "metric_difference": difference,
            "better_metric": float(np.mean(gap_better)), "worse_metric": float(np.mean(gap_worse)),
            "metric": "loss gap", "verdict": verdict(difference)}


def number(value: float, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def interval_text(stats: dict, digits: int = 3, field: str | None = None) -> str:
    """``mean [low, high]``; with ``field`` clipped to its ``RANGES`` entry and marked when clipped."""
    if field is not None:
        stats = clip_interval(stats, RANGES[field])
    text = f"{number(stats['mean'], digits)} [{number(stats['low'], digits)}, {number(stats['high'], digits)}]"
    return text + (CLIPPED_MARK if stats.get("clipped") else "")


def arm_value(claim: dict, key: str) -> str:
    """A claim's ``better_metric`` or ``worse_metric``: the metric, or a loss gap for a contrast."""
    if claim.get("metric") == "loss gap":
        return f"gap {claim[key]:+.3f}"
    return number(claim[key])


def percent_interval(stats: dict, digits: int = 1) -> str:
    """A relative interval in percent: ``+m% [+l%, +h%]``."""
    return f"{100 * stats['mean']:+.{digits}f}% [{100 * stats['low']:+.{digits}f}%, {100 * stats['high']:+.{digits}f}%]"


def difference_text(claim: dict, digits: int = 3, percent_digits: int = 1) -> str:
    """The paired difference of a claim: absolute (``interval_text``), or relative (in %, with
    its margin) for a margin claim."""
    diff = claim["metric_difference"]
    if claim.get("margin") is None:
        return interval_text(diff, digits)
    return f"{percent_interval(diff, percent_digits)}, margin {100 * claim['margin']:.0f}%"


def render_arms_table(summary: dict) -> str:
    """Markdown: one row per arm, the headline metric and accuracy with their intervals and,
    where every row measured it, the arm's shards' mean KL divergence (mean over seeds,
    ``diloco.corpus.shard_divergence``; a summary exported before it was recorded has no column)."""
    field, name = metric_of(summary["task"])
    kl = bool(summary["rows"]) and all(row.get("split_divergence") is not None for row in summary["rows"])
    lines = [f"| arm | steps/worker | all-reduces | {name}, mean [95% CI] | accuracy, mean [95% CI] "
             f"| best {('loss' if field == 'eval_loss' else 'loss')} over rounds |"
             + (" shard KL (nats) |" if kl else ""),
             "|---|---:|---:|---|---|---:|" + ("---:|" if kl else "")]
    for row in summary["rows"]:
        metric = interval_text(row[field], field=field)
        accuracy = interval_text(row["eval_accuracy"], field="eval_accuracy")
        lines.append(f"| {row['arm']} | {row['steps_per_worker']} | {row['all_reduces']} | {metric} "
                     f"| {accuracy} | {number(row['best_eval_loss']['mean'])} |"
                     + (f" {row['split_divergence']:.4f} |" if kl else ""))
    return table_text(lines)


def render_claims_table(summary: dict) -> str:
    """Markdown: each claim, the two arms' means, the paired difference and the verdict.

    The arm columns are named for what they hold: the arm the *paper* calls better and
    the one it calls worse, whichever measured better here (the verdict says that).
    """
    _, name = metric_of(summary["task"])
    lines = [f"| claim | paper | {name} of the arm the paper finds better | {name} of the arm it finds worse "
             "| paired difference (worse minus better) [95% CI] | verdict |",
             "|---|---|---:|---:|---|---|"]
    for claim in summary["claims"]:
        lines.append(f"| {claim['text']} | {claim['paper']} | {arm_value(claim, 'better_metric')} "
                     f"| {arm_value(claim, 'worse_metric')} | {difference_text(claim)} "
                     f"| **{claim['verdict']}** |")
    return "\n".join(lines) + "\n"


def render_tables(summary: dict) -> str:
    """A study's two tables: its arms, then its claims."""
    return render_arms_table(summary) + "\n" + render_claims_table(summary)


PAPER_COLUMNS = (("shakespeare", "char-LM: perplexity"), ("mnist1d", "MNIST-1D: held-out loss"))


def render_paper_table(summaries: dict, order: list, columns: tuple = PAPER_COLUMNS) -> str:
    """The "paper against ours" table: one row per claim, one column per task.

    ``summaries`` maps ``(study, task)`` to an exported summary; ``order`` lists the
    studies in page order; ``columns`` the tasks and their headings (both tasks by
    default; the transformer page has one). A claim's cell for a task shows the two arms'
    metric means, the paired difference and that task's verdict; the last column combines
    them.
    """
    heads = " | ".join(f"{heading}, the paper's better arm vs its worse arm" for _, heading in columns)
    lines = [f"| claim (paper) | the paper | {heads} | verdict |", "|---|---|" + "---|" * len(columns) + "---|"]
    for study in order:
        tasks = [summaries.get((study, task)) for task, _ in columns]
        claims = [(f"{c['text']} ({summary['reference']})", c["paper"], c["text"]) for c, summary in first_seen(tasks)]
        lines += claim_rows(claims, tasks, _paper_cell)
    return "\n".join(lines) + "\n"


def _paper_cell(summary: dict | None, judged: dict | None) -> str:
    if judged is None:
        return "not run (arm not in this task's study)" if summary is not None else "not run"
    return (f"{arm_value(judged, 'better_metric')} vs {arm_value(judged, 'worse_metric')}; "
            f"diff {difference_text(judged)}: {judged['verdict']}")


def first_seen(summaries: list, items=itemgetter("claims")) -> list:
    """Each judged claim of ``summaries`` (``items`` of each; None: not run) once, by its text, in
    first-seen order: ``(claim, the summary it was first seen in)``."""
    seen: dict = {}
    for summary in summaries:
        for claim in [] if summary is None else items(summary):
            seen.setdefault(claim["text"], (claim, summary))
    return list(seen.values())


def claim_rows(claims: list, summaries: list, cell, items=itemgetter("claims")) -> list:
    """A claims-across-tasks table's rows, ``| name | paper | a cell per summary | **verdict** |``, for
    each ``(name, paper, text)`` of ``claims``: ``cell(summary, judged)`` (``judged``: the claim
    ``text`` among ``items(summary)``, None where not judged; ``summary`` None where not run), and
    the weakest verdict of the judged ones (``combine_verdicts``)."""
    lines = []
    for name, paper, text in claims:
        judged = [None if s is None else next((c for c in items(s) if c["text"] == text), None) for s in summaries]
        cells = " | ".join(cell(s, j) for s, j in zip(summaries, judged, strict=True))
        lines.append(f"| {name} | {paper} | {cells} | **{combine_verdicts([j['verdict'] for j in judged if j])}** |")
    return lines
