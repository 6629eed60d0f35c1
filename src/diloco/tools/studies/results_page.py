"""``docs/results.md`` from the studies' exported summaries: ``python -m diloco.tools.studies.results_page``.

The page's tables sit between markers::

    <!-- generated: NAME -->
    ...
    <!-- end: NAME -->

and each ``NAME`` is rendered here from ``docs/assets/results/<study>-<task>.json`` (what
``diloco study <study> --data <task> --export docs/assets/results`` writes):

* ``paper``: the "paper against ours" table, one row per claim (``render_paper_table``);
* ``<study>-<task>``: the study's arms and its claims with paired differences;
* ``similarity``: the workers' pseudo-gradient cosine similarity (Figs. 10-11), from ``fig8``;
* ``costs-<task>``: per headline claim (``claim_curves.MLP_HEADLINE``), each arm's
  worker-steps, tokens (examples for MNIST-1D), all-reduces and bytes per worker;
* ``compute``: what each study cost.

``docs/results-transformer.md`` has ``paper-transformer``, ``compute-transformer`` and
``costs-transformer`` (per claim, each arm's tokens and bytes: ``claim_curves``), rendered
from ``docs/assets/results/transformer/`` (``TRANSFORMER_ORDER``).
``docs/results-beyond.md`` has ``beyond-async*``, ``beyond-sparse-<task>`` and
``beyond-muon-<task>`` (and ``beyond-muon-claims``), each rendered by its study's module
(``render_named``) from ``beyond-<study>-<task>.json``.

``tests/tooling/test_results_page.py`` renders every block again and requires the page
to hold exactly that, so no number on the page can drift from the files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from diloco.tools.runs.folders import atomic_write_text
from diloco.tools.studies.paper_report import (
    interval_text,
    metric_of,
    render_paper_table,
    render_tables,
)
from diloco.tools.studies.summaries import (  # re-exported: the page's names, where they were
    FAMILY_ORDER,
    ORDER,
    STUDY_TASKS,
    TASKS,
    TRANSFORMER_ORDER,
    block_pattern,
    fill_blocks,
    load_summaries,
    missing_block,
)
from diloco.tools.studies.tuning_table import render_tuning  # re-exported

__all__ = ["ORDER", "TASKS", "STUDY_TASKS", "FAMILY_ORDER", "TRANSFORMER_ORDER", "BLOCK",
           "load_summaries", "render_block", "render_tuning", "block_names", "rebuild", "main"]

BLOCK = block_pattern(r"[\w.-]+")  # a beyond block may hold a dot (beyond-async-digits-spread0.5)


def _task_rows(summaries: dict, study: str) -> list:
    """``(task, row)`` for each row of ``study``'s summary on each task that has one."""
    return [(task, row) for task in TASKS for row in (summaries.get((study, task)) or {}).get("rows", [])]


def _similarity(summaries: dict) -> str:
    lines = ["| task | arm | mean pairwise cosine of the workers' pseudo-gradients [95% CI] "
             "| final perplexity (char-LM) or held-out loss (MNIST-1D) |", "|---|---|---|---:|"]
    for task, row in _task_rows(summaries, "fig8"):
        if row.get("pseudo_grad_cosine"):
            lines.append(f"| {task} | {row['arm']} | {interval_text(row['pseudo_grad_cosine'])} "
                         f"| {row[metric_of(task)[0]]['mean']:.3f} |")
    return "\n".join(lines) + "\n"


def _compute(summaries: dict, record: dict | None = None, order: list = ORDER, target: str = "make results") -> str:
    """Per study: budget, seeds, runs (of which read from the run cache) and wall time; then
    the whole ``make results`` run's wall time from ``make-results.json`` when it exists."""
    lines = ["| study | task | steps per worker | seeds | runs (from the cache) | wall time |",
             "|---|---|---:|---:|---:|---:|"]
    total = 0.0
    for study in order:
        for task in TASKS:
            summary = summaries.get((study, task))
            if summary is None:
                continue
            runs = sum(len(row["seeds"]) for row in summary["rows"]) + len(summary.get("tuning", [])) * max(
                1, len(summary.get("tune_seeds", [])))
            total += summary["seconds"]
            lines.append(f"| {study} | {task} | {summary['steps_per_worker']} | {len(summary['seeds'])} "
                         f"| {runs} ({summary.get('cached_runs', 0)}) | {summary['seconds'] / 60:.1f} min |")
    lines.append(f"| all, one after another | | | | | {total / 60:.1f} min |")
    last = (record or {}).get("last_run")
    if last:
        pieces = f", in {last['pieces']} pieces (`--minutes`)" if last.get("pieces", 1) > 1 else ""
        lines.append(f"| `{target}` ({len(last['jobs'])} commands, {last['parallel']} at a time{pieces}, "
                     f"finished {last['finished']}) | | | | | {last['seconds'] / 60:.1f} min |")
    return "\n".join(lines) + "\n"


def _convergence(summaries: dict) -> str:
    """Table 2's arms: the mean held-out loss at 80% of the run and at its end, the change
    between them, and the best over rounds; a run still falling has a negative change."""
    lines = ["| task | arm | held-out loss at 80% of the run | final held-out loss | change over the last 20% "
             "| best over rounds |", "|---|---|---:|---:|---:|---:|"]
    for task, row in _task_rows(summaries, "table2"):
        curve = row["curve"]
        late, final = curve[max(0, round(0.8 * len(curve)) - 1)][1], curve[-1][1]
        lines.append(f"| {task} | {row['arm']} | {late:.3f} | {final:.3f} | {final - late:+.3f} "
                     f"| {row['best_eval_loss']['mean']:.3f} |")
    return "\n".join(lines) + "\n"


def _family_compute(summaries: dict) -> str:
    lines = ["| study | seeds | rounds | runs (of which tuning) | wall time |", "|---|---:|---:|---:|---:|"]
    total = 0.0
    for study in FAMILY_ORDER:
        summary = summaries.get(("family", study))
        if summary is None:
            continue
        total += summary["seconds"]
        runs = len(summary["outcomes"]) + len(summary.get("tuning", []))
        lines.append(f"| {study} | {len(summary['seeds'])} | {summary['rounds']} | {runs} "
                     f"({len(summary.get('tuning', []))}) | {summary['seconds'] / 60:.1f} min |")
    lines.append(f"| all, one after another | | | | {total / 60:.1f} min |")
    return "\n".join(lines) + "\n"


POSITIONS = (1, 2, 3, 4, 8, 16, 32, 64)  # characters of context a prediction has


def render_positions(summaries) -> str:
    """Per run of ``summaries`` (one summary or several), the held-out loss of the predictions
    made from ``t`` characters of context (a window's position ``t``), mean over the seeds
    (``per_seed_eval_position_loss``, ``TransformerModel.position_losses``). An arm that is another
    study's run under a new name (the same per-seed losses) shares its line: ``A = B``."""
    runs = _position_runs([summaries] if isinstance(summaries, dict) or summaries is None else summaries)
    if not runs:
        return "*Not run: no summary with per-position losses.*\n"
    width = len(next(iter(runs.values()))[0]["per_seed_eval_position_loss"][0])
    shown = [t for t in POSITIONS if t <= width]
    lines = ["| arm | " + " | ".join(f"{t} chars" for t in shown) + " | all positions |",
             "|---|" + "---:|" * (len(shown) + 1)]
    for rows in runs.values():
        mean = np.mean(np.array(rows[0]["per_seed_eval_position_loss"], dtype=float), axis=0)
        names = " = ".join(dict.fromkeys(row["arm"] for row in rows))
        lines.append(f"| {names} | " + " | ".join(f"{mean[t - 1]:.4f}" for t in shown) + f" | {mean.mean():.4f} |")
    return "\n".join(lines) + "\n"


def _position_runs(summaries: list) -> dict:
    """The rows with per-position losses, grouped by run (their per-seed losses; else the arm)."""
    runs: dict = {}
    for summary in summaries:
        for row in (summary or {}).get("rows", []):
            if row.get("per_seed_eval_position_loss"):
                runs.setdefault(tuple(row.get("per_seed_eval_loss") or ()) or row["arm"], []).append(row)
    return runs


def _studies_of(summaries: dict) -> dict:
    return {k: v for k, v in summaries.items() if isinstance(k, tuple)}


def _costs_transformer(summaries: dict) -> str:
    from diloco.tools.studies.claim_curves import every_claim, render_claim_costs

    return render_claim_costs(every_claim(summaries, TRANSFORMER_ORDER, "shakespeare"))


def _clock_transformer(summaries: dict) -> str:
    from diloco.tools.studies.claim_curves import CLOCKS, TRANSFORMER_HEADLINE, headline_claims, render_claim_clock

    return render_claim_clock(headline_claims(summaries, TRANSFORMER_HEADLINE, "shakespeare"), CLOCKS["transformer"])


# The blocks named outright: name -> its rendering from the summaries.
_NAMED = {
    "paper": lambda s: render_paper_table(_studies_of(s), ORDER),
    "similarity": lambda s: _similarity(s),
    "compute": lambda s: _compute(s, s.get("make-results")),
    "compute-transformer": lambda s: _compute(s, s.get("make-results"), TRANSFORMER_ORDER,
                                              "make results-transformer"),
    "costs-transformer": _costs_transformer,
    "clock-transformer": _clock_transformer,
    "positions-transformer": lambda s: render_positions([s.get((study, "shakespeare"))
                                                         for study in TRANSFORMER_ORDER]),
    "paper-transformer": lambda s: render_paper_table(_studies_of(s), TRANSFORMER_ORDER,
                                                      (("shakespeare", "transformer char-LM: perplexity"),)),
    "convergence": lambda s: _convergence(s),
    "family-compute": lambda s: _family_compute(s),
}


def _costs(task: str, summaries: dict) -> str:
    """``costs-<task>``: the headline claims' costs on an MLP task."""
    from diloco.tools.studies.claim_curves import MLP_HEADLINE, headline_claims, render_claim_costs

    return render_claim_costs(headline_claims(summaries, MLP_HEADLINE, task))


def _family(name: str, summaries: dict) -> str:
    """``family-<study>``: one family study's block."""
    summary = summaries.get(("family", name.partition("-")[2]))
    if summary is None:
        return missing_block(name)
    from diloco.tools.studies.family_report import render_family_block

    return render_family_block(summary)


def _study(name: str, summaries: dict) -> str:
    """``<study>-<task>``: a paper study's arms, claims and tuning."""
    study, _, task = name.rpartition("-")
    summary = summaries.get((study, task))
    if summary is None:
        return missing_block(name)
    return render_tables(summary) + render_tuning(summary)


def _beyond(name: str, summaries: dict) -> str:
    """``beyond-<study>...``: a block of ``docs/results-beyond.md``, by its study's ``render_named``."""
    from diloco.tools.studies import beyond_async, beyond_muon, beyond_sparse

    study = {"async": beyond_async, "sparse": beyond_sparse, "muon": beyond_muon}[name.split("-")[1]]
    return study.render_named(name, summaries)


def render_block(name: str, summaries: dict) -> str:
    """The Markdown of block ``name`` (see the module docstring): a block named outright
    (``_NAMED``), ``costs-<task>``, ``family-<study>``, ``beyond-<study>...``, else ``<study>-<task>``."""
    if name.startswith("beyond-"):
        return _beyond(name, summaries)
    if name in _NAMED:
        return _NAMED[name](summaries)
    if name.startswith("costs-") and name.partition("-")[2] in TASKS:
        return _costs(name.partition("-")[2], summaries)
    if name.startswith("family-"):
        return _family(name, summaries)
    return _study(name, summaries)


def block_names(page: str) -> list:
    return [match.group("name") for match in BLOCK.finditer(page)]


def rebuild(page: str, summaries: dict) -> str:
    """``page`` with every generated block rendered again."""
    return fill_blocks(page, BLOCK, lambda name: render_block(name, summaries))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diloco.tools.studies.results_page",
                                     description="Render every generated block of a results page from the "
                                                 "studies' exported summaries.")
    parser.add_argument("page", nargs="?", default="docs/results.md", help="the page (docs/results.md)")
    parser.add_argument("results", nargs="?", help="the summaries' folder (the page's assets/results)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    page_path = Path(args.page)
    results = Path(args.results) if args.results else page_path.parent / "assets" / "results"
    page = page_path.read_text(encoding="utf-8")
    atomic_write_text(page_path, rebuild(page, load_summaries(results)))
    print(f"{page_path}: {len(block_names(page))} blocks rendered from {results}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
