"""Each headline claim's two arms against what they trained on, and what each arm cost.

A paper study's summary (``paper_command``) holds, per arm, every seed's held-out loss after
each round (``per_seed_curve``, from ``paper_report.summarise_arms``). For a claim, this
module draws its two arms' mean loss against the tokens all workers have trained on, with
a band from the lowest to the highest seed (``plot_claim``), and tabulates per arm the
compute and the communication behind the claim (``render_claim_costs``): worker-steps,
tokens, all-reduces and the bytes each worker sent.

Tokens (``token_unit``, ``tokens_per_step``): a worker-step trains on ``batch_size``
examples. On a text task a token is a predicted character: a transformer example is a
window of ``context`` characters, each one predicted, an MLP char-LM example predicts one
character. On a classification task (MNIST-1D) the unit is the example, one sequence.

Each results tier has its headline claims and tasks (``TIERS``): ``mlp``, docs/results.md,
on both tasks; ``transformer``, docs/results-transformer.md, on the char-LM.
``python -m diloco.tools.studies.claim_curves FOLDER [--tier mlp|transformer]`` writes
``FOLDER/<study>-<task>-claim<i>.png`` for the tier's claims (``i``: the claim's place in its
study's summary); a summary without ``per_seed_curve`` (written before it was recorded) is
skipped with a note.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.core.model_seam import MODEL_KINDS
from diloco.core.netsim import all_reduce_seconds
from diloco.tools.studies.summaries import TASKS, load_summaries

__all__ = ["render_claim_clock", "first_reaching", "TRANSFORMER_HEADLINE", "MLP_HEADLINE", "TIERS", "CLOCKS", "Clock",
           "arm_costs", "token_unit", "tokens_per_step", "arm_tokens",
           "claim_index", "every_claim", "headline_claims", "plot_claim", "render_claim_costs", "write_plots",
           "main"]

# The claims drawn: (study, the start of the claim's text); the first claim that matches.
TRANSFORMER_HEADLINE = (("table2", "DiLoCo beats the"), ("fig9", "DiLoCo with one worker"),
                        ("splits", "non-IID speaker"), ("inner-muon", "Muon as the inner"),
                        ("fragments", "Streaming P=2"))
# docs/results.md's, on each of TASKS: Table 2's DiLoCo against both baselines, Fig. 9, Fig. 8's IID
# drop and the harshest label skew, which its summary ("In short") quotes.
MLP_HEADLINE = (("table2", "DiLoCo beats the 8x-batch"), ("table2", "DiLoCo beats the 1-worker"),
                ("fig9", "DiLoCo with one worker"), ("fig8", "IID, a dropped worker carries on"),
                ("splits", "non-IID label skew a=0.1:"))
TIERS = {"mlp": (MLP_HEADLINE, tuple(TASKS)), "transformer": (TRANSFORMER_HEADLINE, ("shakespeare",))}


class Clock(NamedTuple):
    """A simulated cluster for the wall-clock panel (``diloco.core.netsim``'s alpha-beta model): one
    worker-step takes ``step_time`` seconds; an all-reduce in which each worker sends ``b`` bytes takes
    ``all_reduce_seconds(b, K, bandwidth, latency)``, with nothing overlapped."""

    step_time: float  # seconds per worker-step
    bandwidth: float  # bits per second
    latency: float  # seconds per message

    def describe(self) -> str:
        return (f"{self.step_time * 1e3:g} ms a worker-step, {self.bandwidth / 1e6:g} Mbit/s, "
                f"{self.latency * 1e3:g} ms latency")


# The transformer tier's clock: the fast engine's worker-step at batch 16 (10.7 ms, make bench-transformer,
# benchmarks/results.md) and workers joined by a wide-area link (100 Mbit/s, 10 ms), where the paper places
# DiLoCo. The MLP pages keep their one panel (against tokens).
CLOCKS = {"transformer": Clock(step_time=0.0107, bandwidth=100e6, latency=0.010)}


def token_unit(summary: dict) -> str:
    """What ``tokens_per_step`` counts: ``"token"`` (a predicted character) where the data
    are text windows (the summary's data record their ``context``), ``"example"`` otherwise."""
    return "token" if "context" in summary["data"] else "example"


def tokens_per_step(summary: dict, row: dict) -> int:
    """Tokens (``token_unit``: examples for MNIST-1D) one worker trains on in one step of ``row``'s arm."""
    config = {**summary["config"], **{k: v for k, v in row.get("changes", {}).items() if not isinstance(v, dict)}}
    sequence_model = MODEL_KINDS[config.get("model", DiLoCoConfig().model)].sequence_model  # scored at every position
    per_example = summary["data"].get("context", 1) if sequence_model else 1
    return int(config["batch_size"]) * int(per_example)


def arm_tokens(summary: dict, row: dict) -> int:
    """Tokens all of an arm's workers trained on over the run."""
    return int(row["steps_per_worker"]) * int(row["num_workers"]) * tokens_per_step(summary, row)


def _claim_rows(summary: dict, index: int) -> tuple[dict, dict, dict]:
    claim = summary["claims"][index]
    rows = {row["arm"]: row for row in summary["rows"]}
    return claim, rows[claim["better"]], rows[claim["worse"]]


def arm_costs(summary: dict, row: dict, clock: Clock | None = None) -> dict:
    """After each round of ``row``'s curve: the ``tokens`` all workers have trained on, the ``bytes``
    each worker has sent and (with ``clock``) the simulated ``seconds`` since the start. The bytes and
    all-reduces of a round are the run's totals over its rounds (every round of these arms is alike)."""
    steps = np.array([point[0] for point in row["curve"]], dtype=float)
    rounds = steps / row["inner_steps"]
    out = {"tokens": steps * row["num_workers"] * tokens_per_step(summary, row),
           "bytes": rounds * row["bytes_sent"] / row["rounds"]}
    if clock is not None:
        reduces = row["all_reduces"] / row["rounds"]
        each = all_reduce_seconds(row["bytes_sent"] / max(row["all_reduces"], 1), row["num_workers"],
                                  clock.bandwidth, clock.latency)
        out["seconds"] = rounds * (row["inner_steps"] * clock.step_time + reduces * each)
    return out


def plot_claim(summary: dict, index: int, clock: Clock | None = None):
    """The claim's two arms: mean held-out loss against tokens, band from lowest to highest seed; with
    ``clock``, two more panels: against the bytes each worker sent and against simulated wall-clock.

    Raises ``ValueError`` when an arm has no ``per_seed_curve`` (a summary written before it was recorded).
    """
    from matplotlib.figure import Figure

    claim, better, worse = _claim_rows(summary, index)
    missing = [row["arm"] for row in (better, worse) if not row.get("per_seed_curve")]
    if missing:
        raise ValueError(f"claim {claim['text']!r}: arm(s) {missing} have no per_seed_curve; rerun the study")
    unit = token_unit(summary)
    panels = [("tokens", f"{unit}s trained on, all workers")]
    if clock is not None:
        panels += [("bytes", "bytes sent per worker"), ("seconds", "simulated wall-clock seconds")]
    fig = Figure(figsize=(6.4 if clock is None else 13.5, 4.0), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, label) in zip(axes, panels, strict=True):
        _panel(ax, summary, (better, worse), name, clock)
        ax.set_xlabel(f"{label} (log scale)" if ax.get_xscale() == "log" else label)
        ax.set_ylabel(f"held-out loss (nats per {unit})")
    axes[0].legend(fontsize=7)
    clocked = "" if clock is None else f"\nsimulated cluster: {clock.describe()}"
    fig.suptitle(f"{claim['text']}\nmean of {len(better['seeds'])} seeds; band: lowest to highest seed; "
                 f"verdict: {claim['verdict']}{clocked}", fontsize=8)
    return fig


def _panel(ax, summary: dict, rows, name: str, clock: Clock | None) -> None:
    """One panel: each arm's mean and seed band against ``name`` (``arm_costs``); an arm that sends
    nothing has no place on the bytes axis and is named in the panel instead."""
    from diloco.tools.studies.plots import log_where_decades

    drawn, silent = [], []
    for row, role in zip(rows, ("the paper's better arm", "its worse arm"), strict=True):
        x = arm_costs(summary, row, clock)[name]
        seeds = np.array(row["per_seed_curve"], dtype=float)
        if name == "bytes" and not x.any():
            silent.append(row["arm"])
            ax.plot([], [])  # keeps each arm's colour across the panels
            continue
        line, = ax.plot(x, seeds.mean(axis=0), label=f"{row['arm']} ({role})")
        ax.fill_between(x, seeds.min(axis=0), seeds.max(axis=0), color=line.get_color(), alpha=0.2)
        drawn.extend(x)
    if silent:
        ax.text(0.02, 0.02, "sends nothing: " + "; ".join(silent), transform=ax.transAxes, fontsize=7)
    if drawn:
        log_where_decades(ax, "x", [v for v in drawn if v > 0], at_least=0.0,
                          formatter=lambda count: f"{count:,.0f}" if count >= 1 else f"{count:g}")


def render_claim_costs(places: list) -> str:
    """Per claim (``(study, summary, index)``, from ``every_claim`` or ``headline_claims``), per
    arm: worker-steps, tokens (``token_unit``), all-reduces and bytes each worker sent."""
    unit = token_unit(places[0][1]) if places else "token"
    lines = [f"| claim | arm | worker-steps | {unit}s | all-reduces | bytes sent per worker |",
             "|---|---|---:|---:|---:|---:|"]
    for _study, summary, index in places:
        claim, *rows = _claim_rows(summary, index)
        for role, row in zip(("better", "worse"), rows, strict=True):
            text = claim["text"] if role == "better" else ""
            lines.append(f"| {text} | {row['arm']} | {row['steps_per_worker'] * row['num_workers']:,} "
                         f"| {arm_tokens(summary, row):,} | {row['all_reduces']:,} "
                         f"| {_bytes(row['bytes_sent'])} |")
    return "\n".join(lines) + "\n"


def first_reaching(values, losses, target: float) -> float | None:
    """The first of ``values`` (tokens, bytes or seconds after each round) at which ``losses`` (the
    mean curve, same rounds) is at or below ``target``; None when it never is."""
    where = np.flatnonzero(np.asarray(losses, dtype=float) <= target)
    return float(np.asarray(values, dtype=float)[where[0]]) if where.size else None


def render_claim_clock(places: list, clock: Clock) -> str:
    """Per claim, per arm, on ``clock``: the simulated seconds of the whole run, and those until the
    arm's mean curve first reaches the loss both arms reach (the higher of their last mean losses)."""
    lines = [f"Simulated cluster: {clock.describe()}, nothing overlapped (`claim_curves.CLOCKS`).", "",
             "| claim | arm | last held-out loss | simulated seconds, whole run | loss both reach | "
             "simulated seconds to reach it |", "|---|---|---:|---:|---:|---:|"]
    for _study, summary, index in places:
        claim, *rows = _claim_rows(summary, index)
        target = max(row["curve"][-1][1] for row in rows)
        for role, row in zip(("better", "worse"), rows, strict=True):
            seconds = arm_costs(summary, row, clock)["seconds"]
            reached = first_reaching(seconds, [point[1] for point in row["curve"]], target)
            lines.append(f"| {claim['text'] if role == 'better' else ''} | {row['arm']} | {row['curve'][-1][1]:.4f} "
                         f"| {seconds[-1]:,.1f} | {target:.4f} | {reached:,.1f} |")
    return "\n".join(lines) + "\n"


def _bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


def claim_index(summary: dict, start: str) -> int | None:
    """The place of the first claim whose text starts with ``start`` (None: no such claim)."""
    return next((i for i, claim in enumerate(summary["claims"]) if claim["text"].startswith(start)), None)


def every_claim(summaries: dict, order, task: str) -> list:
    """``(study, summary, index)`` for every claim of each study in ``order`` whose summary is there."""
    return [(study, summaries[(study, task)], index) for study in order if (study, task) in summaries
            for index in range(len(summaries[(study, task)]["claims"]))]


def headline_claims(summaries: dict, claims, task: str) -> list:
    """``(study, summary, index)`` for each ``(study, text start)`` of ``claims`` whose summary and claim are there."""
    places = []
    for study, start in claims:
        summary = summaries.get((study, task))
        index = None if summary is None else claim_index(summary, start)
        if index is not None:
            places.append((study, summary, index))
    return places


def write_plots(folder, claims, tasks, clock: Clock | None = None) -> list[Path]:
    """``folder/<study>-<task>-claim<i>.png`` for each of ``claims`` on each of ``tasks`` whose
    summary is there (``plot_claim``, with ``clock``); one without ``per_seed_curve`` is skipped
    with a note on stderr."""
    from diloco.tools.studies.plots import save_figure

    summaries = load_summaries(folder)
    written = []
    for task in tasks:
        for study, summary, index in headline_claims(summaries, claims, task):
            try:
                figure = plot_claim(summary, index, clock)
            except ValueError as error:
                print(f"claim_curves: {study}-{task}: skipped: {error}", file=sys.stderr)
                continue
            written.append(save_figure(figure, Path(folder) / f"{study}-{task}-claim{index}.png"))
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diloco.tools.studies.claim_curves",
                                     description="plot each headline claim's two arms against tokens")
    parser.add_argument("folder", help="the summaries' folder (docs/assets/results, or its transformer/)")
    parser.add_argument("--tier", choices=sorted(TIERS), default="mlp",
                        help="whose headline claims: mlp (docs/results.md, default) or transformer")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not Path(args.folder).is_dir():
        print(f"claim_curves: {args.folder} is not a folder", file=sys.stderr)
        return 2
    for path in write_plots(args.folder, *TIERS[args.tier], CLOCKS.get(args.tier)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
