"""``diloco study inner-steps|outer-optimizer|noniid|workers``: the ablations as specs of the one runner.

An ablation is data (``ablations.Study``: its base config, its arms for the chosen
``--values``, its claim); ``AblationSpec`` runs any such study through the one runner
(``runner.run_spec``): every arm on every seed, each run kept in the run cache (runner
name ``"ablation"``), so an interrupted study run again goes on from its finished runs.
Every variant is checked (``diloco.tools.cli.preflight``) before the run folder is made;
every round of every run passes the divergence guard (``check_record``, through the
history writer), a cached run's rounds too, as they are replayed into ``history.jsonl``.
The report: ``summary.json`` (the rows, mean and 95% interval over seeds), ``study.md``
and, unless ``--no-plots``, ``study.png`` and ``study_curves.png``; a failing report keeps
the status ``"completed"`` (``late_step``).
"""

from __future__ import annotations

import json

from diloco._validation import milestone
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flags import build_config, load_dataset
from diloco.tools.cli.preflight import check_run
from diloco.tools.cli.run_setup import check_plotting, max_loss_flag, resolve_trainer, study_values
from diloco.tools.runs.faults import late_step
from diloco.tools.runs.folders import atomic_write_text, write_json
from diloco.tools.runs.training import check_record
from diloco.tools.studies.ablations import (
    Study,
    default_engine,
    markdown_table,
    mean_curves,
    replay_rounds,
    run_variant,
    summarise,
)
from diloco.tools.studies.paper_report import judge_claims, render_claims_table
from diloco.tools.studies.runner import Done, Plan, StudySpec

__all__ = ["AblationSpec", "ablation_arms", "judge_study_claims", "study_preface", "save_study_plots"]

LOSS = "held-out loss"  # the metric a study's claims are judged on (``paper_report.metric_of``: the loss)


def _total_steps(args, study: Study, config):
    """``--total-steps`` (the inner-steps study only) as the config's budget: ``rounds`` single steps."""
    if args.total_steps is None:
        return config
    if study.name != "inner-steps":
        raise CliError("--total-steps applies only to the inner-steps study")
    if args.total_steps < 1:
        raise CliError(f"--total-steps must be a positive int, got {args.total_steps}")
    return config.replace(inner_steps=1, rounds=args.total_steps)


def _runnable(args, config, variants):
    """``config`` on an engine that runs every variant: the fast engine by default where it
    is installed (a learner workspace lacks it), else the reference one; ``--engine`` as given."""
    if getattr(args, "engine", None) is None and config.engine == "fast":
        try:
            for variant in variants:
                resolve_trainer(variant.algo, config.replace(**variant.changes))
        except CliError:
            config = config.replace(engine="reference")
    for variant in variants:
        resolve_trainer(variant.algo, config.replace(**variant.changes))
    return config


def ablation_arms(args, study: Study):
    """The study's config (its base under the flags), values and variants, each runnable here."""
    config = _total_steps(args, study, build_config(args, {"engine": default_engine(), **study.base}))
    values = study_values(args, study.default_values)
    try:
        variants = study.variants(config, values)
    except ValueError as exc:
        raise CliError(f"--values: {exc}") from None
    return _runnable(args, config, variants), values, variants


def _guard(max_loss):
    """The divergence guard of every round, naming the variant and the seed."""
    def guard(record):
        check_record(record, record["algo"], max_loss, context=f"variant {record['variant']}, seed {record['seed']}")
    return guard


def judge_study_claims(claims, rows: list) -> list:
    """``claims`` judged on ``rows`` (``summarise``'s) as ``paper_report.judge_claims`` judges the
    paper's: the paired per-seed difference of final held-out losses, its interval, its verdict."""
    arms = [{**row, "arm": row["variant"], "per_seed_eval_loss": row["per_seed_loss"]} for row in rows]
    return judge_claims(list(claims), arms, LOSS)


def _rendered(summary: dict) -> str:
    """The metrics table and, for a study with claims, the claims' table with their verdicts."""
    table = markdown_table(summary["rows"])
    if "claims" not in summary:
        return table
    return table + "\n" + render_claims_table({"task": LOSS, "claims": summary["claims"]})


class AblationSpec(StudySpec):
    """An ablation (``ablations.Study``) as a spec of the one runner (module doc)."""

    def __init__(self, study: Study) -> None:
        self.study, self.name = study, study.name

    def record(self, values, seeds: list, variants: list) -> dict:
        """What config.json records of the study: its name, title, claim, values, seeds and arms."""
        study = self.study
        return {"study": study.name, "title": study.title, "claim": study.claim, "values": list(values),
                "seeds": seeds, "variants": [v._asdict() for v in variants]}

    def plan(self, args) -> Plan:
        study = self.study
        config, values, variants = ablation_arms(args, study)
        check_plotting(args)
        data, data_info = load_dataset(args, config.dtype)
        for variant in variants:
            check_run(config.replace(**variant.changes), data, checkpointing=False, label=f"variant {variant.label}")
        max_loss = max_loss_flag(args)
        seeds = list(range(config.seed, config.seed + args.seeds))
        record = {**self.record(values, seeds, variants), "max_loss": max_loss}
        banner = (f"study {study.name}: {len(variants)} variants x {len(seeds)} seeds on {data_info['name']}; "
                  f"claim: {study.claim}")
        # at a trainer's depth, as inside train_diloco: the engines' per-round evaluation skips its
        # checks, so a blow-up reaches the guard (diverged, round and worker) instead of a NaN check
        return Plan(study.name, f"study-{study.name}", config, variants, seeds, [], [], data, data_info, record,
                    banner, run=milestone(run_variant), runner="ablation", label_key="variant",
                    replay=replay_rounds, guard=_guard(max_loss),
                    stop_fields=lambda finished: {"rows": summarise(finished) if finished else []})

    def summary(self, plan: Plan, done: Done) -> dict:
        rows = summarise(done.outcomes)
        summary = {"command": "study", "study": self.name, "status": "completed", "claim": self.study.claim,
                   "seeds": plan.seeds, "rows": rows}
        return summary if not self.study.claims else {**summary, "claims": judge_study_claims(self.study.claims, rows)}

    def write(self, plan: Plan, summary: dict, done: Done, args) -> None:
        write_json(done.run_dir / "summary.json", summary)
        table = _rendered(summary)
        with late_step(done.run_dir / "summary.json", summary, "report and plots"):  # stays "completed"
            _write_report(args, self.study, plan, summary["rows"], table, done)
        print(table, end="")
        print(f"run folder: {done.run_dir}")


def _write_report(args, study: Study, plan: Plan, rows: list, table: str, done: Done) -> None:
    """study.md and, unless --no-plots, study.png and study_curves.png."""
    setting = f", inner AdamW `{json.dumps(plan.config.inner.to_dict())}`"
    atomic_write_text(done.run_dir / "study.md",
                      f"# Study {study.name}: {study.title}\n\n{study_preface(study, plan, setting)}{table}")
    if not args.no_plots:
        save_study_plots(study, rows, done, f"{study.title}: mean over {len(plan.seeds)} seeds")


def study_preface(study: Study, plan: Plan, setting: str) -> str:
    """study.md's lines before the table: the claim, the data, the seeds, the base config and
    ``setting`` (what else the study fixed)."""
    info = plan.data_info
    base = {k: v for k, v in plan.config.to_dict().items() if k != "inner"}
    return (f"Claim tested: {study.claim}.\n\nData: {info['name']} ({info['num_train']} train / "
            f"{info['num_test']} held-out). Seeds: {plan.seeds}. Base config: `{json.dumps(base)}`{setting}.\n\n"
            f"Final held-out metrics, mean and 95% Student-t interval over seeds:\n\n")


def save_study_plots(study: Study, rows: list, done: Done, curves_title: str) -> None:
    """``study.png`` (each arm's final metrics) and ``study_curves.png`` (the mean held-out curves)."""
    from diloco.tools.studies.plots import plot_curves, plot_study, save_figure, study_curve_axis

    save_figure(plot_study(rows, title=study.title, xlabel=study.xlabel), done.run_dir / "study.png")
    save_figure(plot_curves(mean_curves(done.history.records), x=study_curve_axis(study.name), title=curves_title),
                done.run_dir / "study_curves.png")

