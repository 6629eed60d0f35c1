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

``tests/tooling/test_results_page.py`` renders every block again and requires the page
to hold exactly that, so no number on the page can drift from the files.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from diloco.tools.runs.folders import atomic_write_text
from diloco.tools.studies.paper_report import (
    interval_text,
    render_arms_table,
    render_claims_table,
    render_paper_table,
    verdict,
)
from diloco.tools.studies.paper_runs import FEEDBACK_DECAY
from diloco.tools.studies.paper_studies import claim_setting

__all__ = ["ORDER", "TASKS", "STUDY_TASKS", "FAMILY_ORDER", "BLOCK",
           "load_summaries", "render_block", "block_names", "rebuild", "main"]

ORDER = ["table2", "fig4", "fig6", "table3", "fig8", "fig9", "splits", "scaling"]
# docs/results-transformer.md: the same summaries' names in their own folder (assets/results/transformer)
TRANSFORMER_ORDER = ["table2", "fig9", "splits", "inner-muon", "fragments"]
TASKS = ["shakespeare", "mnist1d"]
STUDY_TASKS = {study: TASKS for study in ORDER} | {"scaling": ["shakespeare"]}  # what make results runs
FAMILY_ORDER = ["compression", "streaming", "bandwidth"]  # docs/results-family.md: family-<study>.json
BLOCK = re.compile(r"<!-- generated: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- end: (?P=name) -->", re.S)


def load_summaries(directory) -> dict:
    """``{(study, task): summary}`` for every ``<study>-<task>.json`` in ``directory``.

    Each claim's verdict is judged again from its stored paired interval by today's rule
    (``paper_report.verdict``), so a file written under an older vocabulary renders in the
    page's words, and its text names non-IID shards as ``paper_studies.claim_setting`` does.
    """
    summaries = {}
    record = Path(directory) / "make-results.json"
    if record.is_file():
        summaries["make-results"] = json.loads(record.read_text(encoding="utf-8"))
    for path in sorted(Path(directory).glob("*.json")):
        study, _, task = path.stem.rpartition("-")
        if study == "family" and task in FAMILY_ORDER:
            summaries[("family", task)] = json.loads(path.read_text(encoding="utf-8"))
            continue
        if (study in ORDER or study in TRANSFORMER_ORDER) and task in TASKS:
            summary = json.loads(path.read_text(encoding="utf-8"))
            for claim in summary.get("claims", []):
                claim["verdict"] = verdict(claim["metric_difference"], claim.get("margin"))
                if study in ("table3", "fig8"):  # one claim across the tasks, whichever split each uses
                    claim["text"] = claim_setting(claim["text"])
            summaries[(study, task)] = summary
    return summaries


def _similarity(summaries: dict) -> str:
    lines = ["| task | arm | mean pairwise cosine of the workers' pseudo-gradients [95% CI] "
             "| final perplexity (char-LM) or held-out loss (MNIST-1D) |", "|---|---|---|---:|"]
    for task in TASKS:
        summary = summaries.get(("fig8", task))
        if summary is None:
            continue
        field = "eval_perplexity" if task == "shakespeare" else "eval_loss"
        for row in summary["rows"]:
            if row.get("pseudo_grad_cosine"):
                lines.append(f"| {task} | {row['arm']} | {interval_text(row['pseudo_grad_cosine'])} "
                             f"| {row[field]['mean']:.3f} |")
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
        lines.append(f"| `{target}` ({len(last['jobs'])} commands, {last['parallel']} at a time, "
                     f"finished {last['finished']}) | | | | | {last['seconds'] / 60:.1f} min |")
    return "\n".join(lines) + "\n"


def _convergence(summaries: dict) -> str:
    """Table 2's arms: the mean held-out loss at 80% of the run and at its end, the change
    between them, and the best over rounds; a run still falling has a negative change."""
    lines = ["| task | arm | held-out loss at 80% of the run | final held-out loss | change over the last 20% "
             "| best over rounds |", "|---|---|---:|---:|---:|---:|"]
    for task in TASKS:
        summary = summaries.get(("table2", task))
        if summary is None:
            continue
        for row in summary["rows"]:
            curve = row["curve"]
            late = curve[max(0, round(0.8 * len(curve)) - 1)][1]
            final = curve[-1][1]
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


def render_block(name: str, summaries: dict) -> str:
    """The Markdown of block ``name`` (see the module docstring)."""
    if name == "paper":
        return render_paper_table({k: v for k, v in summaries.items() if isinstance(k, tuple)}, ORDER)
    if name == "similarity":
        return _similarity(summaries)
    if name == "compute":
        return _compute(summaries, summaries.get("make-results"))
    if name == "compute-transformer":
        return _compute(summaries, summaries.get("make-results"), TRANSFORMER_ORDER, "make results-transformer")
    if name == "costs-transformer":
        from diloco.tools.studies.claim_curves import every_claim, render_claim_costs

        return render_claim_costs(every_claim(summaries, TRANSFORMER_ORDER, "shakespeare"))
    if name.startswith("costs-") and name.partition("-")[2] in TASKS:
        from diloco.tools.studies.claim_curves import MLP_HEADLINE, headline_claims, render_claim_costs

        return render_claim_costs(headline_claims(summaries, MLP_HEADLINE, name.partition("-")[2]))
    if name == "paper-transformer":
        return render_paper_table({k: v for k, v in summaries.items() if isinstance(k, tuple)}, TRANSFORMER_ORDER,
                                  (("shakespeare", "transformer char-LM: perplexity"),))
    if name == "convergence":
        return _convergence(summaries)
    if name == "family-compute":
        return _family_compute(summaries)
    if name.startswith("family-"):
        summary = summaries.get(("family", name.partition("-")[2]))
        if summary is None:
            return f"*Not run: `docs/assets/results/{name}.json` is missing.*\n"
        from diloco.tools.studies.family_report import render_family_block

        return render_family_block(summary)
    study, _, task = name.rpartition("-")
    summary = summaries.get((study, task))
    if summary is None:
        return f"*Not run: `docs/assets/results/{name}.json` is missing.*\n"
    return render_arms_table(summary) + "\n" + render_claims_table(summary) + render_tuning(summary)


# A joint grid's fields, as its pairs are printed (``lr/mu``).
SHORT_FIELDS = {"outer_lr": "lr", "outer_momentum": "mu", FEEDBACK_DECAY: "beta"}


def render_tuning(summary: dict) -> str:
    """The tuning grid: per tuning step, field and probe arm, the mean final held-out loss at
    each value on the tuning seeds, the chosen value in bold, and the arms that took it.
    A joint field (the outer lr x momentum grid) prints each pair as ``lr/mu``."""
    if not summary.get("tuning"):
        return ""
    groups: dict = {}
    for entry in summary["tuning"]:
        field = tuple(entry["field"]) if isinstance(entry["field"], list) else entry["field"]
        groups.setdefault((entry.get("step", 0), field, entry["arm"]), []).append(entry)
    lines = ["", f"Tuning grid (final held-out loss, tuning seed(s) {summary['tune_seeds']}, which are not "
                 "reported seeds; chosen in bold: the grid's lowest):", ""]
    inner_passes: dict = {}
    for (_step, field, probe), entries in groups.items():
        entries = sorted(entries, key=lambda e: e["value"])
        cells = ", ".join(f"**{_value_text(e['value'])}: {e['eval_loss']:.3f}**" if e.get("chosen") else
                          f"{_value_text(e['value'])}: {e['eval_loss']:.3f}" for e in entries)
        targets = entries[0].get("targets", [probe])
        used = "" if targets == [probe] else f" (used by {', '.join(targets)})"
        inner_passes[(field, probe)] = inner_passes.get((field, probe), 0) + 1
        again = ", again at the chosen outer step" if inner_passes[(field, probe)] > 1 else ""
        lines.append(f"- {_field_text(field)} of {probe}{used}{again}: {cells}{_edge_note(field, entries)}")
    return "\n".join(lines) + "\n"


def _edge_note(field, entries: list) -> str:
    """For a joint grid: which of the chosen pair's values is the largest or smallest tried,
    since a value past it was not (a study that tries its grid as it is, or whose extension
    reached its limit or the end of its ladder)."""
    chosen = [e["value"] for e in entries if e.get("chosen")]
    if not isinstance(field, tuple) or not chosen:
        return ""
    edges = []
    for i, name in enumerate(field):
        values = sorted({e["value"][i] for e in entries})
        short = SHORT_FIELDS.get(name, name)
        if len(values) > 1 and chosen[0][i] in (values[0], values[-1]):
            edges.append(f"{short} {chosen[0][i]:g} is its {'largest' if chosen[0][i] == values[-1] else 'smallest'}")
    return f" (chosen at the grid's edge: {', '.join(edges)})" if edges else ""


def _field_text(field) -> str:
    if isinstance(field, tuple):
        return " x ".join(f.replace("_", " ") for f in field) + " (" + "/".join(
            SHORT_FIELDS.get(f, f) for f in field) + ")"
    return field.replace("_", " ")


def _value_text(value) -> str:
    return "/".join(f"{v:g}" for v in value) if isinstance(value, list | tuple) else f"{value:g}"


def block_names(page: str) -> list:
    return [match.group("name") for match in BLOCK.finditer(page)]


def rebuild(page: str, summaries: dict) -> str:
    """``page`` with every generated block rendered again."""
    return BLOCK.sub(lambda m: f"<!-- generated: {m.group('name')} -->\n{render_block(m.group('name'), summaries)}"
                               f"<!-- end: {m.group('name')} -->", page)


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
