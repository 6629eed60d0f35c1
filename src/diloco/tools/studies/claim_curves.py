"""Each headline claim's two arms against the tokens they trained on, and what each arm cost.

A paper study's summary (``paper_command``) holds, per arm, every seed's held-out loss after
each round (``per_seed_curve``, from ``paper_report.summarise_arms``). For a claim, this
module draws its two arms' mean loss against the tokens all workers have trained on, with
a band from the lowest to the highest seed (``plot_claim``), and tabulates per arm the
compute and the communication behind the claim (``render_claim_costs``): worker-steps,
tokens, all-reduces and the bytes each worker sent.

Tokens: a worker-step trains on ``batch_size`` examples; a transformer example is a
window of ``context`` characters, each one predicted, an MLP char-LM example predicts one
character and an MNIST-1D example is one sequence (counted as one).

``python -m diloco.tools.studies.claim_curves FOLDER`` writes ``FOLDER/<study>-<task>-claim<i>.png``
for the ``HEADLINE`` claims (``i``: the claim's place in its study's summary).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

__all__ = ["HEADLINE", "tokens_per_step", "arm_tokens", "claim_index", "plot_claim", "render_claim_costs",
           "write_plots", "main"]

# The claims drawn: (study, the start of the claim's text); the first claim that matches.
HEADLINE = (("table2", "DiLoCo beats the"), ("fig9", "DiLoCo with one worker"), ("splits", "non-IID speaker"),
            ("inner-muon", "Muon as the inner"), ("fragments", "Streaming P=2"))


def tokens_per_step(summary: dict, row: dict) -> int:
    """Predicted tokens (examples for MNIST-1D) one worker trains on in one step of ``row``'s arm."""
    config = {**summary["config"], **{k: v for k, v in row.get("changes", {}).items() if not isinstance(v, dict)}}
    per_example = summary["data"].get("context", 1) if config.get("model") == "transformer" else 1
    return int(config["batch_size"]) * int(per_example)


def arm_tokens(summary: dict, row: dict) -> int:
    """Tokens all of an arm's workers trained on over the run."""
    return int(row["steps_per_worker"]) * int(row["num_workers"]) * tokens_per_step(summary, row)


def _claim_rows(summary: dict, index: int) -> tuple[dict, dict, dict]:
    claim = summary["claims"][index]
    rows = {row["arm"]: row for row in summary["rows"]}
    return claim, rows[claim["better"]], rows[claim["worse"]]


def plot_claim(summary: dict, index: int):
    """The claim's two arms: mean held-out loss against tokens, band from lowest to highest seed."""
    from matplotlib.figure import Figure

    claim, better, worse = _claim_rows(summary, index)
    fig = Figure(figsize=(6.4, 4.0), layout="constrained")
    ax = fig.add_subplot()
    for row, role in ((better, "the paper's better arm"), (worse, "its worse arm")):
        steps = np.array([point[0] for point in row["curve"]], dtype=float)
        tokens = steps * row["num_workers"] * tokens_per_step(summary, row)
        seeds = np.array(row["per_seed_curve"], dtype=float)
        line, = ax.plot(tokens, seeds.mean(axis=0), label=f"{row['arm']} ({role})")
        ax.fill_between(tokens, seeds.min(axis=0), seeds.max(axis=0), color=line.get_color(), alpha=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("tokens trained on, all workers (log scale)")
    ax.set_ylabel("held-out loss (nats per token)")
    ax.legend(fontsize=7)
    ax.set_title(f"{claim['text']}\nmean of {len(better['seeds'])} seeds; band: lowest to highest seed; "
                 f"verdict: {claim['verdict']}", fontsize=8)
    return fig


def render_claim_costs(summaries: dict, order: list, task: str = "shakespeare") -> str:
    """Per claim, per arm: worker-steps, tokens, all-reduces and bytes each worker sent."""
    lines = ["| claim | arm | worker-steps | tokens | all-reduces | bytes sent per worker |",
             "|---|---|---:|---:|---:|---:|"]
    for study in order:
        summary = summaries.get((study, task))
        if summary is None:
            continue
        for index, claim in enumerate(summary["claims"]):
            for role, row in zip(("better", "worse"), _claim_rows(summary, index)[1:], strict=True):
                text = claim["text"] if role == "better" else ""
                lines.append(f"| {text} | {row['arm']} | {row['steps_per_worker'] * row['num_workers']:,} "
                             f"| {arm_tokens(summary, row):,} | {row['all_reduces']:,} "
                             f"| {_bytes(row['bytes_sent'])} |")
    return "\n".join(lines) + "\n"


def _bytes(count: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{int(count)} B"


def claim_index(summary: dict, start: str) -> int | None:
    """The place of the first claim whose text starts with ``start`` (None: no such claim)."""
    return next((i for i, claim in enumerate(summary["claims"]) if claim["text"].startswith(start)), None)


def write_plots(folder, claims=HEADLINE, task: str = "shakespeare") -> list[Path]:
    """``folder/<study>-<task>-claim<i>.png`` for each ``(study, text start)`` whose summary is there."""
    from diloco.tools.studies.plots import save_figure
    from diloco.tools.studies.results_page import load_summaries

    summaries = load_summaries(folder)
    written = []
    for study, start in claims:
        summary = summaries.get((study, task))
        index = None if summary is None else claim_index(summary, start)
        if index is not None:
            path = Path(folder) / f"{study}-{task}-claim{index}.png"
            written.append(save_figure(plot_claim(summary, index), path))
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diloco.tools.studies.claim_curves",
                                     description="plot each headline claim's two arms against tokens")
    parser.add_argument("folder", help="the summaries' folder (docs/assets/results/transformer)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not Path(args.folder).is_dir():
        print(f"claim_curves: {args.folder} is not a folder", file=sys.stderr)
        return 2
    for path in write_plots(args.folder):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
