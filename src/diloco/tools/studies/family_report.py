"""The family studies' claims, verdicts and page blocks (``docs/results-family.md``).

``diloco study compression|streaming|bandwidth --export DIR`` writes
``DIR/family-<study>.json``: the runs (without their histories), the per-arm rows, the
outer-momentum tuning grid, the judged claims and, for the bandwidth study, the time to
target at every bandwidth. ``render_family_block`` turns one of those files back into the
page's Markdown; ``diloco.tools.studies.results_page`` puts it between the page's markers
and ``tests/tooling/test_results_page.py`` checks the page holds exactly that.

A claim is judged with the same five words as the paper's page
(``diloco.tools.studies.paper_report.verdict``): an ordering on the paired per-seed
difference, or a robustness claim ("costs under m") on the paired relative cost against
the margin ``m`` (``NO_LOSS_MARGIN`` for the "keeps quality" claims).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from diloco.tools.studies.paper_report import NOT_RUN, difference_text, verdict
from diloco.tools.studies.study_stats import mean_interval

__all__ = ["FamilyClaim", "NO_LOSS_MARGIN", "family_claims", "judge_family_claims",
           "render_family_block", "render_family_claims"]

# "Lossless", "keeps quality": the held-out loss may rise by less than this fraction.
NO_LOSS_MARGIN = 0.02


class FamilyClaim(NamedTuple):
    """``better`` beats ``worse`` on ``field`` (lower is better), or, with ``margin``, ``worse``
    costs less than ``margin`` relative to ``better``. ``field`` is ``eval_loss`` or
    ``seconds@<bandwidth>`` (simulated time to the target loss)."""

    text: str
    better: str
    worse: str
    paper: str
    margin: float | None = None
    field: str = "eval_loss"


def family_claims(study: str, labels: list, bandwidths=()) -> list:
    """The claims a study tests, among the arms it ran (``labels``)."""
    have = set(labels)
    claims = []
    if study == "compression":
        for arm, paper in (("fp4", "4-bit outer gradients with no loss of quality (Streaming DiLoCo)"),
                           ("int8", "8-bit outer gradients: no paper claim; the step below 16 bits"),
                           ("prune0.5", "pruning 50% costs 0.39% perplexity (DiLoCo, Table 6)")):
            claims.append(FamilyClaim(f"{arm} costs under {NO_LOSS_MARGIN:.0%} of held-out loss", "native", arm,
                                      paper, NO_LOSS_MARGIN))
        claims.append(FamilyClaim("fp4 with error feedback beats fp4 without", "fp4+ef", "fp4",
                                  "no paper claim: tests what error feedback does here"))
    elif study == "streaming":
        reference = labels[0]
        for arm in labels[1:]:
            claims.append(FamilyClaim(f"{arm} costs under {NO_LOSS_MARGIN:.0%} of held-out loss against DiLoCo",
                                      reference, arm, "Streaming DiLoCo: similar quality at lower peak bandwidth",
                                      NO_LOSS_MARGIN))
    elif study == "bandwidth":
        streaming = next((label for label in labels if label.startswith("Streaming")), None)
        for bandwidth in bandwidths[:2]:
            field = f"seconds@{bandwidth}"
            if streaming:
                claims.append(FamilyClaim(f"at {bandwidth}/s, Streaming DiLoCo reaches the target before DiLoCo",
                                          streaming, "DiLoCo", "Streaming DiLoCo: overlapping hides communication",
                                          field=field))
            claims.append(FamilyClaim(f"at {bandwidth}/s, eager updates reach the target before DiLoCo", "eager",
                                      "DiLoCo", "eager updates: close DiLoCo's gap at low bandwidth", field=field))
            claims.append(FamilyClaim(f"at {bandwidth}/s, DiLoCo reaches the target before sync", "DiLoCo", "sync",
                                      "DiLoCo: 500 times less communication (abstract)", field=field))
    return [c for c in claims if {c.better, c.worse} <= have]


def _per_seed(outcomes: list, label: str, field: str) -> dict:
    return {o["seed"]: o[field] for o in outcomes if o["variant"] == label}


def judge_family_claims(claims: list, outcomes: list, seconds: dict | None = None) -> list:
    """Each claim with its paired difference and verdict.

    ``seconds`` maps ``(arm, bandwidth)`` to ``{seed: simulated seconds or None}`` for the
    time claims; a claim whose arms did not reach the target on every seed is *not run*.
    """
    judged = []
    for claim in claims:
        values = _paired_values(claim, outcomes, seconds)
        missing = _missing(claim, values)
        judged.append(_judged(claim, *values) if missing is None else
                      {**claim._asdict(), "verdict": NOT_RUN, "metric_difference": None, "better_metric": None,
                       "worse_metric": None, "note": missing})
    return judged


def _paired_values(claim: FamilyClaim, outcomes: list, seconds: dict | None) -> tuple | None:
    """The two arms' values on the seeds both have (object arrays: a time may be None), or None."""
    if claim.field.startswith("seconds@"):
        bandwidth = claim.field.split("@", 1)[1]
        table = seconds or {}
        better, worse = table.get((claim.better, bandwidth)), table.get((claim.worse, bandwidth))
    else:
        better, worse = (_per_seed(outcomes, label, claim.field) for label in (claim.better, claim.worse))
    seeds = sorted(set(better or {}) & set(worse or {}))
    if not seeds:
        return None
    return (np.array([better[s] for s in seeds], dtype=object), np.array([worse[s] for s in seeds], dtype=object))


def _missing(claim: FamilyClaim, values: tuple | None) -> str | None:
    """Why ``claim`` cannot be judged (an arm missed the target on a seed, or under two seeds), else None."""
    if values is not None and not any(v is None for v in (*values[0], *values[1])) and len(values[0]) >= 2:
        return None
    missing = [label for label, v in ((claim.better, values[0]), (claim.worse, values[1]))
               if any(x is None for x in v)] if values is not None else []
    return f"{' and '.join(missing)} did not reach the target on every seed" if missing else "fewer than two seeds"


def _judged(claim: FamilyClaim, better, worse) -> dict:
    """The paired difference (relative against a margin) of the two arms, and its verdict."""
    b, w = better.astype(float), worse.astype(float)
    difference = mean_interval((w - b) / b) if claim.margin is not None else mean_interval(w - b)
    return {**claim._asdict(), "metric_difference": difference, "better_metric": float(b.mean()),
            "worse_metric": float(w.mean()), "verdict": verdict(difference, claim.margin)}


def _cell(value) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4g}"


def render_family_claims(claims: list) -> str:
    lines = ["| claim | the papers | the arm claimed better (or the reference) | the other arm "
             "| paired difference (other minus first) [95% CI] | verdict |", "|---|---|---:|---:|---|---|"]
    for claim in claims:
        diff = claim["metric_difference"]
        if diff is None:
            text = claim.get("note") or "not run"
        else:
            text = difference_text(claim, 4)
        unit = " s" if claim["field"].startswith("seconds@") else ""
        lines.append(f"| {claim['text']} | {claim['paper']} | {claim['better']}: {_cell(claim['better_metric'])}{unit} "
                     f"| {claim['worse']}: {_cell(claim['worse_metric'])}{unit} | {text} | **{claim['verdict']}** |")
    return "\n".join(lines) + "\n"


def render_family_block(summary: dict) -> str:
    """The Markdown of one family study's file: its table, its claims, its tuning grid (the paper
    studies' printout, ``tuning_table.render_tuning``; empty when nothing was tuned)."""
    from diloco.tools.studies.family_tables import bandwidth_table, compression_table, streaming_table
    from diloco.tools.studies.tuning_table import render_tuning

    study, rows, outcomes = summary["study"], summary["rows"], summary["outcomes"]
    if study == "compression":
        table = compression_table(rows, outcomes)
    elif study == "streaming":
        table = streaming_table(rows, outcomes)
    else:
        table = (f"Target: held-out loss {summary['target_loss']:.4f}, the lowest that every run of every arm "
                 f"reaches within its {summary['rounds']} rounds.\n\n"
                 + bandwidth_table(summary["bandwidth"], summary["values"]))
    return table + "\n" + render_family_claims(summary["claims"]) + render_tuning(summary)
