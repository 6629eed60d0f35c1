"""``diloco study NAME``: one of the paper's ablations over several seeds.

Every variant is checked (``diloco.tools.cli.preflight``) before the run folder is made; every
round of every run passes the divergence guard (``check_record``, through the history
writer); an early end leaves a ``summary.json`` status (``diloco.tools.runs.faults``); the
files are written atomically, ``results.jsonl`` one whole line per finished run.
"""

from __future__ import annotations

import json

from diloco._validation import milestone
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flags import build_config, load_dataset
from diloco.tools.cli.preflight import check_run
from diloco.tools.cli.run_setup import (
    check_plotting,
    max_loss_flag,
    progress_factory,
    resolve_trainer,
    start_run,
    study_values,
    thread_limit,
)
from diloco.tools.runs.faults import late_step, quiet_numpy, run_outcome
from diloco.tools.runs.folders import JsonlWriter, atomic_write_text, write_json
from diloco.tools.runs.training import check_record
from diloco.tools.studies.ablations import STUDIES, default_engine, markdown_table, mean_curves, run_study, summarise
from diloco.tools.studies.family_study import FAMILY_STUDIES
from diloco.tools.studies.paper_studies import PAPER_STUDIES

__all__ = ["run_study_command"]


def run_study_command(args) -> int:
    runner = _own_runner(args.study)
    if runner is not None:
        return runner(args)
    if getattr(args, "target_loss", None) is not None:
        raise CliError("--target-loss applies only to the bandwidth study")
    if args.study in PAPER_STUDIES:  # the paper's tables and figures: diloco.tools.studies.paper_command
        from diloco.tools.studies.paper_command import run_paper_study

        return run_paper_study(args)
    return _run_ablation(args, STUDIES[args.study])


def _own_runner(name: str):
    """The runner of a study with its own module (sparse, async, muon, the family's), else None."""
    if name == "sparse":  # SparseLoCo and DeMo at equal bytes: diloco.tools.studies.beyond_sparse
        from diloco.tools.studies.beyond_sparse import run_sparse_study

        return run_sparse_study
    if name == "async":  # asynchronous DiLoCo at equal simulated time: diloco.tools.studies.beyond_async
        from diloco.tools.studies.beyond_async import run_async_study

        return run_async_study
    if name == "muon":  # MuLoCo's claims: diloco.tools.studies.beyond_muon
        from diloco.tools.studies.beyond_muon import run_muon_study

        return run_muon_study
    if name in FAMILY_STUDIES:  # compression, streaming, bandwidth: diloco.tools.studies.family_study
        from diloco.tools.studies.family_study import run_family_study_command

        return run_family_study_command
    return None


def _ablation_variants(args, study):
    """The study's config (its base under the flags) and values, and its variants, each runnable here."""
    defaults = {"engine": default_engine(), **study.base}  # the fast engine unless --engine reference
    config = build_config(args, defaults)
    if args.total_steps is not None:
        if study.name != "inner-steps":
            raise CliError("--total-steps applies only to the inner-steps study")
        if args.total_steps < 1:
            raise CliError(f"--total-steps must be a positive int, got {args.total_steps}")
        config = config.replace(inner_steps=1, rounds=args.total_steps)
    values = study_values(args, study.default_values)
    try:
        variants = study.variants(config, values)
    except ValueError as exc:
        raise CliError(f"--values: {exc}") from None
    if getattr(args, "engine", None) is None and config.engine == "fast":
        try:  # the default engine, where it is installed (a learner workspace lacks it)
            for variant in variants:
                resolve_trainer(variant.algo, config.replace(**variant.changes))
        except CliError:
            config = config.replace(engine="reference")
    for variant in variants:
        resolve_trainer(variant.algo, config.replace(**variant.changes))
    return config, values, variants


class _RunLog:
    """Each finished run: a line of results.jsonl, a step of the progress bar, kept for the summary."""

    def __init__(self, run_dir, bar) -> None:
        self.results, self.bar, self.finished = JsonlWriter(run_dir / "results.jsonl"), bar, []

    def on_run_start(self, variant, seed) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{variant.label} seed {seed}")

    def on_run_end(self, outcome) -> None:
        self.results.write_line(outcome)
        self.finished.append(outcome)
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _run_ablation(args, study) -> int:
    config, values, variants = _ablation_variants(args, study)
    check_plotting(args)
    make_bar = progress_factory(args.quiet)
    data, data_info = load_dataset(args, config.dtype)
    for variant in variants:
        check_run(config.replace(**variant.changes), data, checkpointing=False, label=f"variant {variant.label}")
    threads, limit = thread_limit(args, config, data)
    max_loss = max_loss_flag(args)
    seeds = list(range(config.seed, config.seed + args.seeds))
    spec = {"study": study.name, "title": study.title, "claim": study.claim, "values": list(values),
            "seeds": seeds, "variants": [v._asdict() for v in variants], "blas_threads": threads,
            "max_loss": max_loss}

    def guard(record):
        check_record(record, record["algo"], max_loss, context=f"variant {record['variant']}, seed {record['seed']}")

    run_dir, history = start_run(args, "study", f"study-{study.name}", config, data_info, spec, guard=guard)
    if not args.quiet:
        print(f"study {study.name}: {len(variants)} variants x {len(seeds)} seeds on {data_info['name']}; "
              f"claim: {study.claim}")
    log = _RunLog(run_dir, None if make_bar is None else make_bar(total=len(variants) * len(seeds),
                                                                  desc=study.name, unit="run"))

    def stopped(status: str, reason: str, extra: dict) -> None:
        write_json(run_dir / "summary.json", {"command": "study", "study": study.name, "status": status,
                                              "reason": reason, **extra, "runs_completed": len(log.finished),
                                              "rows": summarise(log.finished) if log.finished else []})

    try:
        with run_outcome(stopped), quiet_numpy(), limit:
            # At a trainer's depth, as inside train_diloco: the engines' per-round evaluation skips its
            # checks, so a blow-up reaches the guard (diverged, round and worker) instead of a NaN check.
            milestone(run_study)(study, config, data, seeds, values, history=history, on_run_start=log.on_run_start,
                                 on_run_end=log.on_run_end)
            rows = summarise(log.finished)
            summary = {"command": "study", "study": study.name, "status": "completed", "claim": study.claim,
                       "seeds": seeds, "rows": rows}
            write_json(run_dir / "summary.json", summary)
            table = markdown_table(rows)
        with late_step(run_dir / "summary.json", summary, "report and plots"):  # stays "completed"
            _write_report(args, run_dir, study, config, data_info, seeds, rows, table, history)
    finally:
        log.close()
    print(table, end="")
    print(f"run folder: {run_dir}")
    return 0


def _write_report(args, run_dir, study, config, data_info: dict, seeds: list, rows: list, table: str,
                  history) -> None:
    """study.md and, unless --no-plots, study.png and study_curves.png."""
    base = {k: v for k, v in config.to_dict().items() if k != "inner"}
    atomic_write_text(run_dir / "study.md", (
        f"# Study {study.name}: {study.title}\n\nClaim tested: {study.claim}.\n\n"
        f"Data: {data_info['name']} ({data_info['num_train']} train / {data_info['num_test']} held-out). "
        f"Seeds: {seeds}. Base config: `{json.dumps(base)}`, "
        f"inner AdamW `{json.dumps(config.inner.to_dict())}`.\n\n"
        f"Final held-out metrics, mean and 95% Student-t interval over seeds:\n\n{table}"))
    if not args.no_plots:
        from diloco.tools.studies.plots import plot_curves, plot_study, save_figure, study_curve_axis

        save_figure(plot_study(rows, title=study.title, xlabel=study.xlabel), run_dir / "study.png")
        save_figure(plot_curves(mean_curves(history.records), x=study_curve_axis(study.name),
                                title=f"{study.title}: mean over {len(seeds)} seeds"),
                    run_dir / "study_curves.png")
