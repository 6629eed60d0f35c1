"""``diloco study muon``: MuLoCo's claims (Thérien et al. 2025, arXiv 2505.23725) in miniature.

MuLoCo is DiLoCo with Muon as the inner optimizer (``DiLoCoConfig.inner_optimizer =
"muon"``, ``diloco.methods.muon``). The study runs, on one task (``--data shakespeare`` or
``--data mnist1d``) and over ``--seeds`` paired seeds:

* DiLoCo with AdamW and with Muon inside, at K = 1, 2, 4, 8 workers (``--values``), the
  same H, rounds, model and wire, so each pair sends the same bytes;
* the data-parallel baselines (the synchronous algorithm, K = the largest K) with each
  optimizer, for MuLoCo's "relative to their data parallel baselines";
* both at K = 4 with the core's fp4 (E2M1) wire and error feedback: the closest format we
  have to the paper's 2-bit quantisation (the 2-bit format of the sparse-outer-gradient
  method has not landed here).

Each optimizer's learning rate is tuned first, for every setting (DiLoCo at each K, the
data-parallel baseline) on tuning seeds (1000, ...) that are not the reported seeds, over
``ADAMW_GRID`` / the task's ``muon_grid`` (``--muon-lr`` fixes Muon's instead, ``--lr`` AdamW's); a
Muon arm's biases use AdamW at AdamW's tuned lr of the same setting, and the compressed
arms keep the uncompressed arms' lrs. Claims are judged seed by seed with
``diloco.tools.studies.paper_report`` (the verdict words of the results pages); a claim
about a *gap* (Muon's advantage growing with K, the gap to the data-parallel baseline,
the cost of compression) is an interaction, the per-seed difference of two paired
differences. ``--export DIR`` writes ``DIR/beyond-muon-<task>.json``, which
``docs/results-beyond.md`` renders (``render_named``, through ``results_page``, the one
renderer; ``python -m diloco.tools.studies.beyond_muon`` runs it on that page).
"""

from __future__ import annotations

import sys

import numpy as np

from diloco.config import MuonConfig
from diloco.tools.cli.errors import CliError
from diloco.tools.studies.paper_report import (
    NOT_RUN,
    claim_rows,
    difference_text,
    first_seen,
    interval_text,
    judge_claims,
    metric_of,
    number,
    percent_interval,
    summarise_arms,
    verdict,
)
from diloco.tools.studies.paper_runs import INNER_LR, MUON_LR, TuneStep, tune_arms, write_study
from diloco.tools.studies.paper_studies import Arm, Claim, outer_step_then_lr
from diloco.tools.studies.runner import Done, Plan, StudySpec, budget, check_seeds, check_tune_seeds, task_config
from diloco.tools.studies.study_stats import mean_interval
from diloco.tools.studies.summaries import exports

__all__ = ["TASKS", "KS", "ADAMW_GRID", "COMPRESSION_K", "PAPER", "setting", "muon_arms",
           "muon_claims", "lr_tuning", "lr_records", "interaction_specs", "judge_interactions", "MuonSpec",
           "render_section", "render_claims", "render_named"]

# Per task: the model, H, the budget (steps per worker), small enough that the whole study
# runs in minutes on one core, and Muon's lr grid (MNIST-1D's best lr sat at the lower edge
# of the char-LM's grid, so its grid starts lower).
TASKS = {
    "shakespeare": {"hidden_sizes": (64,), "inner_steps": 30, "steps": 300,
                    "muon_grid": (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)},
    "mnist1d": {"hidden_sizes": (128,), "inner_steps": 50, "steps": 1000,
                "muon_grid": (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)},
}
KS = (1, 2, 4, 8)
COMPRESSION_K = 4
ADAMW_GRID = (3e-4, 1e-3, 3e-3, 1e-2, 3e-2)

# The paper's words (arXiv 2505.23725: v2's abstract for the K claims, v1's for compression).
PAPER = {
    "absolute": "\"with K≥1 workers, MuLoCo (Muon inner optimizer DiLoCo) achieves superior performance to DiLoCo "
                "in absolute terms\" (abstract, v2)",
    "grows": "\"relative to AdamW, Muon yields more directionally correct pseudogradients as the number of "
             "workers (K) increases\" (abstract, v2)",
    "relative": "\"for K>2 it outperforms DiLoCo relative to their data parallel baselines\" (abstract, v2)",
    "lossless": "\"leveraging Muon as the inner optimizer for DiLoCo along with an error-feedback accumulator "
                "allows to aggressively compress the communicated delta to 2-bits with next to no performance "
                "degradation\" (abstract, v1)",
    "less_bytes": "\"MuLoCo (Muon inner optimizer DiLoCo) significantly outperforms DiLoCo while communicating 8X "
                  "less\" (abstract, v1)",
}
FP4 = ", fp4 + error feedback"  # the compressed arms' label suffix
LOSSLESS_MARGIN = 0.01  # "next to no degradation", read as less than 1% of the metric


def _label(optimizer: str, k: int, suffix: str = "") -> str:
    name = "DiLoCo (AdamW)" if optimizer == "adamw" else "MuLoCo (Muon)"
    return f"{name} K={k}{suffix}"


def _dp_label(optimizer: str, k: int) -> str:
    return f"data-parallel {'AdamW' if optimizer == 'adamw' else 'Muon'} (sync, K={k})"


def setting(algo: str, k: int) -> str:
    """The key of a setting's tuned lrs: ``"diloco K=4"``, ``"sync K=8"``."""
    return f"{algo} K={k}"


def _optimizer(optimizer: str, lrs: dict, muon: MuonConfig) -> dict:
    """The config changes of an arm's inner optimizer; ``lrs`` is ``{"adamw": lr, "muon": lr}``."""
    if optimizer == "adamw":
        return {"inner_optimizer": "adamw", "muon": MuonConfig().to_dict(), "inner": {"lr": lrs["adamw"]}}
    return {"inner_optimizer": "muon", "muon": {**muon.to_dict(), "lr": lrs["muon"]}, "inner": {"lr": lrs["adamw"]}}


def muon_arms(h: int, steps: int, ks, lrs: dict, muon: MuonConfig | None = None) -> list:
    """Every arm of the study (module doc), the DiLoCo arms recording worker agreement.

    ``lrs`` maps each ``setting(algo, k)`` to ``{"adamw": lr, "muon": lr}``.
    """
    muon = MuonConfig() if muon is None else muon
    if steps % h:
        raise ValueError(f"steps per worker ({steps}) must be a multiple of H={h}")

    def arm(label: str, algo: str, k: int, optimizer: str, **extra) -> Arm:
        return Arm(label, algo, {"num_workers": k, "inner_steps": h, "rounds": steps // h, **extra,
                                 **_optimizer(optimizer, lrs[setting(algo, k)], muon)})

    both, top = ("adamw", "muon"), max(ks)
    arms = [arm(_label(o, k), "diloco", k, o, record_similarity=k > 1) for k in ks for o in both]
    arms += [arm(_dp_label(o, top), "sync", top, o) for o in both]
    if COMPRESSION_K in ks:
        arms += [arm(_label(o, COMPRESSION_K, FP4), "diloco", COMPRESSION_K, o,
                     family={"comm_dtype": "fp4", "error_feedback": True}) for o in both]
    return arms


def muon_claims(ks) -> list:
    """The two-arm claims: MuLoCo beats DiLoCo at every K; fp4 + EF costs MuLoCo < 1%; MuLoCo
    compressed beats DiLoCo uncompressed."""
    claims = [Claim(f"MuLoCo beats DiLoCo at K={k} (equal bytes)", _label("muon", k), _label("adamw", k),
                    PAPER["absolute"]) for k in ks]
    if COMPRESSION_K in ks:
        fp4 = FP4
        claims.append(Claim(f"fp4 + error feedback costs MuLoCo (K={COMPRESSION_K}) less than "
                            f"{100 * LOSSLESS_MARGIN:.0f}%", _label("muon", COMPRESSION_K),
                            _label("muon", COMPRESSION_K, fp4), PAPER["lossless"], margin=LOSSLESS_MARGIN))
        claims.append(Claim(f"MuLoCo with fp4 + error feedback beats DiLoCo uncompressed (K={COMPRESSION_K}, "
                            f"~1/16 of its bytes)", _label("muon", COMPRESSION_K, fp4), _label("adamw", COMPRESSION_K),
                            PAPER["less_bytes"]))
    return claims


def interaction_specs(ks) -> list:
    """The gap claims: ``(text, paper, (a, b), (c, d), relative)``, judged on the per-seed
    ``(a - b) - (c - d)`` (positive when the paper holds); with ``relative`` each gap is
    divided by its second arm's value (a relative cost)."""
    low, top = min(ks), max(ks)
    specs = []
    if top > low:
        specs.append((f"Muon's advantage over AdamW (held-out metric) grows from K={low} to K={top}", PAPER["grows"],
                      (_label("adamw", top), _label("muon", top)), (_label("adamw", low), _label("muon", low)),
                      False))
    specs.append((f"MuLoCo is closer to its data-parallel baseline than DiLoCo to its own (K={top})", PAPER["relative"],
                  (_label("adamw", top), _dp_label("adamw", top)), (_label("muon", top), _dp_label("muon", top)),
                  False))
    if COMPRESSION_K in ks:
        fp4 = FP4
        specs.append((f"fp4 + error feedback costs Muon less than AdamW (K={COMPRESSION_K}, relative)",
                      PAPER["lossless"], (_label("adamw", COMPRESSION_K, fp4), _label("adamw", COMPRESSION_K)),
                      (_label("muon", COMPRESSION_K, fp4), _label("muon", COMPRESSION_K)), True))
    return specs


def judge_interactions(specs: list, rows: list, task: str) -> list:
    """Each gap claim with its paired interval and verdict (``paper_report.verdict``)."""
    by_arm = {row["arm"]: row for row in rows}
    field, _ = metric_of(task)
    judged = []
    for text, paper, first, second, relative in specs:
        arms = [by_arm.get(label) for label in (*first, *second)]
        if any(arm is None for arm in arms) or len({tuple(arm["seeds"]) for arm in arms}) != 1:
            judged.append({"text": text, "paper": paper, "verdict": NOT_RUN, "first_gap": None, "second_gap": None,
                           "metric_difference": None})
            continue
        a, b, c, d = (np.asarray(arm[f"per_seed_{field}"], dtype=np.float64) for arm in arms)
        gap1, gap2 = (a - b, c - d) if not relative else ((a - b) / b, (c - d) / d)
        difference = mean_interval(gap1 - gap2)
        judged.append({"text": text, "paper": paper, "relative": relative, "first": list(first),
                       "second": list(second), "first_gap": mean_interval(gap1), "second_gap": mean_interval(gap2),
                       "metric_difference": difference, "verdict": verdict(difference)})
    return judged


# --- the command ------------------------------------------------------------------------------

def lr_tuning(ks, grids: dict, base, muon: MuonConfig, steps: int) -> tuple[list, list]:
    """Each setting's lrs as probe arms (``tune <optimizer> <setting>``) and two ``TuneStep``:
    AdamW's inner lr on the AdamW probe, given to the Muon probe too (a Muon arm's biases use
    AdamW at AdamW's chosen lr of the same setting), then Muon's lr on the Muon probe."""
    h, lrs, probes, groups = base.inner_steps, {"adamw": base.inner.lr, "muon": muon.lr}, [], {"adamw": [], "muon": []}
    for algo, k in [("diloco", k) for k in ks] + [("sync", max(ks))]:
        shared = {"num_workers": k, "inner_steps": h, "rounds": steps // h}
        adamw, own = (Arm(f"tune {optimizer} {setting(algo, k)}", algo, {**shared, **_optimizer(optimizer, lrs, muon)})
                      for optimizer in ("adamw", "muon"))
        probes += [adamw, own]
        groups["adamw"].append((adamw.label, (adamw.label, own.label)))
        groups["muon"].append((own.label, (own.label,)))
    return probes, [TuneStep(INNER_LR, tuple(grids["adamw"]), tuple(groups["adamw"])),
                    TuneStep(MUON_LR, tuple(grids["muon"]), tuple(groups["muon"]))]


def lr_records(records: list, seeds) -> tuple[dict, list]:
    """``tune_arms``' records of ``lr_tuning`` as the export keeps them, setting by setting:
    ``({setting: {"adamw": lr, "muon": lr}}, [{optimizer, setting, lr, seeds, eval_loss}, ...])``."""
    order = list(dict.fromkeys(r["arm"].split(" ", 2)[2] for r in records))
    lrs, tuning = {}, []
    for record in sorted(records, key=lambda r: (order.index(r["arm"].split(" ", 2)[2]), r["step"])):
        _, optimizer, key = record["arm"].split(" ", 2)
        tuning.append({"optimizer": optimizer, "setting": key, "lr": record["value"], "seeds": list(seeds),
                       "eval_loss": record["eval_loss"]})
        if record["chosen"] and not np.isfinite(record["eval_loss"]):  # the best of the grid diverged: all did
            raise CliError(f"study muon: every {optimizer} lr of the grid diverged ({key})")
        if record["chosen"]:
            lrs.setdefault(key, {})[optimizer] = record["value"]
    return lrs, tuning


def outer_tuning_steps(arms: list, grids: dict) -> list:
    """Each DiLoCo arm's outer lr x momentum on itself, then its own lr again at the chosen pair
    (``paper_studies.outer_step_then_lr``: AdamW arms' ``inner.lr`` over ``grids["adamw"]``, Muon
    arms' ``muon.lr`` over ``grids["muon"]``); an fp4 arm takes the choices of its uncompressed
    arm at the same K. The synchronous arms have no outer step."""
    fp4, labels = FP4, {a.label for a in arms}
    groups = tuple((a.label, (a.label, *([a.label + fp4] if a.label + fp4 in labels else []))) for a in arms
                   if a.algo == "diloco" and not a.label.endswith(fp4))
    return outer_step_then_lr(groups, {a.label: a for a in arms}, grids["adamw"], (), grids["muon"])


def _ks(values) -> tuple:
    if not values:
        return KS
    try:
        ks = tuple(sorted({int(v) for v in values}))
    except ValueError:
        raise CliError(f"--values must be worker counts K (ints), got {list(values)}") from None
    if not ks or ks[0] < 1:
        raise CliError(f"--values: K must be positive ints, got {list(values)}")
    return ks


class MuonSpec(StudySpec):
    """``diloco study muon`` as a spec of the one runner (``runner.run_spec``). Its tuning, through
    ``tune_arms`` as every study's: each setting's AdamW and Muon lrs on probe arms first
    (``lr_tuning``, each grid tried as it is), the arms built at them, then each DiLoCo arm's
    outer step (``outer_tuning_steps``)."""

    name = "muon"

    def plan(self, args) -> Plan:
        from diloco.tools.cli.flags import load_dataset
        from diloco.tools.cli.run_setup import check_plotting, split_values

        task, config = task_config(args, TASKS, "muon", "shakespeare", own=("inner_steps",))
        spec = TASKS[task]
        muon = config.muon  # --muon-* flags (with --inner-optimizer muon) set Muon's other hyper-parameters
        base = config.replace(inner_optimizer="adamw", muon=MuonConfig())
        steps = budget(args, spec["steps"], config.inner_steps)
        seeds = check_seeds(args, config)
        tune_seeds = check_tune_seeds(args, seeds)
        ks = _ks(split_values(args.values) if getattr(args, "values", None) else None)
        check_plotting(args)
        data, data_info = load_dataset(args, config.dtype)
        grids = {"adamw": (args.lr,) if getattr(args, "lr", None) is not None else ADAMW_GRID,
                 "muon": (args.muon_lr,) if getattr(args, "muon_lr", None) is not None else spec["muon_grid"]}
        record = {"study": "muon", "task": task, "muon": muon.to_dict(), "steps_per_worker": steps, "seeds": seeds,
                  "tune_seeds": tune_seeds, "ks": list(ks), "grids": {k: list(v) for k, v in grids.items()}}
        arms = 2 * len(ks) + 2 + (2 if COMPRESSION_K in ks else 0)
        expected = (len(ks) + 1) * (len(grids["adamw"]) + len(grids["muon"])) * len(tune_seeds) + arms * len(seeds)
        fixed = getattr(args, "outer_lr", None) is not None or getattr(args, "outer_momentum", None) is not None
        return Plan("muon", f"study-muon-{task}", base, [], seeds, tune_seeds, [], data, data_info,
                    record, f"study muon (MuLoCo) on {task}: K in {list(ks)}, {len(seeds)} seeds, {steps} steps "
                    f"per worker", expected_runs=expected,
                    extra={"task": task, "steps": steps, "ks": ks, "muon": muon, "grids": grids,
                           "tune_outer": not fixed, "seeds_flag": args.seeds,
                           "num_samples": getattr(args, "num_samples", None)})

    def tune(self, plan: Plan, train, on_run) -> tuple[list, dict]:
        ks, grids, base, muon = plan.extra["ks"], plan.extra["grids"], plan.config, plan.extra["muon"]
        probes, steps = lr_tuning(ks, grids, base, muon, plan.extra["steps"])
        _, records = tune_arms(steps, probes, base, plan.data, plan.tune_seeds, run=train, on_run=on_run, extend=0)
        lrs, tuning = lr_records(records, plan.tune_seeds)
        arms, outer = muon_arms(base.inner_steps, plan.extra["steps"], ks, lrs, muon), []
        if plan.extra["tune_outer"]:
            arms, outer = tune_arms(outer_tuning_steps(arms, grids), arms, base, plan.data, plan.tune_seeds,
                                    run=train, on_run=on_run)
        return arms, {"tuned_lr": lrs, "tuning": tuning, "outer_tuning": outer}

    def summary(self, plan: Plan, done: Done) -> dict:
        task, steps, ks, extra = plan.extra["task"], plan.extra["steps"], plan.extra["ks"], plan.extra
        rows = summarise_arms(done.outcomes, done.arms)
        command = self.command(task, extra["seeds_flag"],
                               ("--total-steps", steps if steps != TASKS[task]["steps"] else None),
                               ("--values", ",".join(str(k) for k in ks) if ks != KS else None),
                               ("--num-samples", extra["num_samples"]))
        return {
            "study": "muon", "title": "MuLoCo: Muon as DiLoCo's inner optimizer",
            "reference": "MuLoCo, arXiv 2505.23725", "task": task, "data": plan.data_info,
            "config": plan.config.to_dict(), "muon": extra["muon"].to_dict(), "steps_per_worker": steps,
            "ks": list(ks), "seeds": plan.seeds, "tune_seeds": plan.tune_seeds, **done.tuning, "rows": rows,
            "claims": judge_claims(muon_claims(ks), rows, task),
            "gaps": judge_interactions(interaction_specs(ks), rows, task),
            "seconds": done.seconds, "cpu_seconds": done.cpu_seconds, "command": command,
        }

    def write(self, plan: Plan, summary: dict, done: Done, args) -> None:
        export, task = getattr(args, "export", None), plan.extra["task"]
        write_study(done.run_dir, summary, f"MuLoCo in miniature ({task})", render_section(summary, export), export,
                    f"beyond-muon-{task}", plots=not args.no_plots)



# --- the results page -------------------------------------------------------------------------

def _gap_text(stats, relative: bool) -> str:
    if stats is None:
        return "n/a"
    if relative:
        return percent_interval(stats, 2)
    return interval_text(stats)


def render_section(summary: dict, export="docs/assets/results") -> str:
    """Markdown for one task: the command (``--export EXPORT`` only when given), the tuning
    grid, the arms, the claims, the gap claims."""
    field, name = metric_of(summary["task"])
    lines = [*_run_lines(summary, export), *_lr_lines(summary), *_outer_lines(summary),
             *_arm_lines(summary, field, name),
             "", f"| claim | the paper | ours: {name}, the paper's better arm vs its worse arm "
                 "| paired difference (worse minus better) [95% CI] | verdict |", "|---|---|---|---|---|",
             *map(_claim_line, summary["claims"]), *map(_gap_line, summary["gaps"])]
    return "\n".join(lines) + "\n"


def _run_lines(summary: dict, export) -> list:
    """What was run: the command, its cost, the seeds and the setting."""
    cost = f"{summary['seconds'] / 60:.1f} min wall-clock"
    if summary.get("cpu_seconds") is not None:
        cost += f", {summary['cpu_seconds'] / 60:.1f} min of CPU"
    command = summary["command"] + (f" --export {export}" if export else "")
    return [f"Command: `.venv/bin/{command}` "
            f"({cost}, one process on a shared 2-core machine). Seeds {summary['seeds']}, "
            f"{summary['steps_per_worker']} steps per worker, H={summary['config']['inner_steps']}, "
            f"hidden sizes {summary['config']['hidden_sizes']}.", ""]


def _lr_lines(summary: dict) -> list:
    """The inner lr grid of every setting and optimizer, the chosen lr in bold."""
    lines = [f"Learning rates tuned per setting on seed(s) {summary['tune_seeds']} (final held-out loss at each "
             f"lr; **bold** the chosen one; a Muon arm's biases use AdamW at AdamW's chosen lr of the same setting; "
             f"the fp4 arms keep the lrs of DiLoCo K={COMPRESSION_K}):", "",
             "| setting | optimizer | held-out loss at each lr |", "|---|---|---|"]
    for key, chosen in summary["tuned_lr"].items():
        for optimizer in ("adamw", "muon"):
            cells = [f"{'**' if r['lr'] == chosen[optimizer] else ''}{r['lr']:g}: {number(r['eval_loss'], 4)}"
                     f"{'**' if r['lr'] == chosen[optimizer] else ''}"
                     for r in summary["tuning"] if r["setting"] == key and r["optimizer"] == optimizer]
            lines.append(f"| {key} | {optimizer} | {', '.join(cells)} |")
    return lines


def _outer_lines(summary: dict) -> list:
    """The outer step's tuning grid, or the outer step every DiLoCo arm took untuned."""
    if not summary.get("outer_tuning"):
        return ["", f"Outer step not tuned: outer lr {summary['config']['outer_lr']:g}, momentum "
                    f"{summary['config']['outer_momentum']:g} for every DiLoCo arm."]
    from diloco.tools.studies.tuning_table import render_tuning

    grid = render_tuning({"tune_seeds": summary["tune_seeds"], "tuning": summary["outer_tuning"]})
    return ["", "Then each DiLoCo arm's outer step, and its inner lr again at the chosen outer step "
                "(the fp4 arms take their uncompressed arm's choices):", *grid.splitlines()[1:]]


def _arm_lines(summary: dict, field: str, name: str) -> list:
    """One row per arm: bytes, the metric, the accuracy, the workers' pseudo-gradient cosine."""
    lines = ["", f"| arm | bytes sent per worker | {name}, mean [95% CI] | accuracy, mean [95% CI] "
                 "| workers' pseudo-gradient cosine |", "|---|---:|---|---|---|"]
    for row in summary["rows"]:
        cosine = row.get("pseudo_grad_cosine")
        lines.append(f"| {row['arm']} | {row['bytes_sent'] / 1e3:,.1f} kB | {interval_text(row[field], field=field)} "
                     f"| {interval_text(row['eval_accuracy'], field='eval_accuracy')} "
                     f"| {'n/a' if cosine is None else interval_text(cosine)} |")
    return lines


def _claim_line(claim: dict) -> str:
    """A claim's row: the two arms' metrics, the paired difference (relative with a margin), the verdict."""
    return (f"| {claim['text']} | {claim['paper']} | {number(claim['better_metric'])} vs "
            f"{number(claim['worse_metric'])} | {difference_text(claim, percent_digits=2)} | **{claim['verdict']}** |")


def _gap_line(gap: dict) -> str:
    """A gap claim's row: the two gaps, their difference, the verdict (or that it was not run)."""
    if gap["verdict"] == NOT_RUN:
        return f"| {gap['text']} | {gap['paper']} | not run | | **{NOT_RUN}** |"
    relative = gap["relative"]
    return (f"| {gap['text']} | {gap['paper']} | gap {_gap_text(gap['first_gap'], relative)} "
            f"({gap['first'][0]} minus {gap['first'][1]}) vs {_gap_text(gap['second_gap'], relative)} "
            f"({gap['second'][0]} minus {gap['second'][1]}) | {_gap_text(gap['metric_difference'], relative)} "
            f"| **{gap['verdict']}** |")


def render_claims(summaries: dict) -> str:
    """Markdown: every claim once, its verdict on each task (``summaries``: task -> summary) and
    the weakest of them (``combine_verdicts``)."""
    tasks = [task for task in TASKS if task in summaries]
    names = {"shakespeare": "char-LM (perplexity)", "mnist1d": "MNIST-1D (held-out loss)"}
    lines = ["| claim | the paper | " + " | ".join(f"{names[t]}: paired difference [95% CI], verdict" for t in tasks)
             + " | verdict |", "|---|---|" + "---|" * len(tasks) + "---|"]
    columns = [summaries[task] for task in tasks]
    claims = [(c["text"], c["paper"], c["text"]) for c, _ in first_seen(columns, _claims_and_gaps)]
    return "\n".join(lines + claim_rows(claims, columns, _task_cell, _claims_and_gaps)) + "\n"


def _claims_and_gaps(summary: dict) -> list:
    return summary["claims"] + summary["gaps"]


def _task_cell(_summary: dict, item: dict | None) -> str:
    """A claim's cell on one task: its paired difference and verdict, or that it was not run."""
    if item is None or item["verdict"] == NOT_RUN:
        return NOT_RUN
    return f"{_gap_text(item['metric_difference'], item.get('relative') or item.get('margin') is not None)}: " \
           f"{item['verdict']}"


def render_named(name: str, summaries: dict) -> str:
    """The page's block ``beyond-muon-<task>`` (or ``beyond-muon-claims``, every task's verdicts)
    from ``summaries`` (``summaries.load_summaries``)."""
    exported, task = exports(summaries, "beyond-muon"), name.removeprefix("beyond-muon-")
    if task == "claims":
        return render_claims(exported) if exported else "*Not run yet.*\n"
    return render_section(exported[task]) if task in exported else "*Not run yet.*\n"


if __name__ == "__main__":  # python -m diloco.tools.studies.beyond_muon: the page's blocks, by the one renderer
    from diloco.tools.studies.results_page import main

    raise SystemExit(main(sys.argv[1:] or ["docs/results-beyond.md"]))
