"""The ``compare``, ``train`` and ``study`` sub-commands of ``diloco``.

* ``diloco compare``: DiLoCo and the synchronous baseline at equal compute, one
  progress bar per run, a table at the end (``make demo``).
* ``diloco train --algo diloco|sync``: one run.
* ``diloco study NAME``: one of the paper's ablations over several seeds
  (``diloco.tools.cli.study_command``).

Every command writes a run folder (see ``diloco.tools.runs.folders``) and, unless ``--no-plots``,
PNG plots (``diloco.tools.studies.plots``). The flags live in ``diloco.tools.cli.flags``; the steps
every training command shares (progress bars, threads, ``start_run``) in
``diloco.tools.cli.run_setup``, re-exported here. User errors raise ``CliError``: one line,
exit status 2.

``train`` and ``compare`` train through ``diloco.tools.runs.training.train_resumable`` (the
milestone functions, or the fast engine with ``--engine fast``): a checkpoint every
``--checkpoint-every`` rounds and after the last, the final parameters as
``params-<algo>.npz``, the divergence guard, and ``--resume RUN_DIR``
(``diloco.tools.runs.resume``). Everything that can be checked runs before the run folder is
made (``diloco.tools.cli.preflight``); after that, every early end leaves a truthful
``summary.json`` status (``diloco.tools.runs.faults``). See docs/failure-and-recovery.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.core.driver import baseline_config
from diloco.core.model_seam import model_kind
from diloco.corpus.ngram import baseline_sentence, dataset_baselines
from diloco.corpus.shard_divergence import split_report, split_sentence
from diloco.data import Dataset
from diloco.evaluation import communication_savings
from diloco.loop import num_values
from diloco.tools.cli.config_file import run_file_settings
from diloco.tools.cli.family_run import check_family, family_summary, print_family, run_with_family
from diloco.tools.cli.flags import (
    DEFAULT_MAX_LOSS,
    add_config_flags,
    add_data_flags,
    add_execution_flags,
    add_output_flags,
    add_recovery_flags,
    build_config,
    load_dataset,
)
from diloco.tools.cli.paper_flags import add_paper_study_flags
from diloco.tools.cli.plot_command import save_run_pictures
from diloco.tools.cli.preflight import check_run, check_text_run
from diloco.tools.cli.run_progress import RunProgress
from diloco.tools.cli.run_setup import (
    check_plotting,
    max_loss_flag,
    progress_factory,
    resolve_trainer,
    start_run,
    thread_limit,
)
from diloco.tools.runs.faults import late_step, quiet_numpy, run_outcome
from diloco.tools.runs.folders import HistoryWriter, atomic_write_bytes, npz_bytes, read_json, write_json
from diloco.tools.runs.resume import CHECKPOINT_DIR, plan_resume, record_code_change
from diloco.tools.runs.training import train_resumable
from diloco.tools.studies.ablations import STUDIES, TRAINERS, format_bytes
from diloco.tools.studies.paper_studies import PAPER_STUDIES

__all__ = ["add_parsers", "run_compare", "run_train", "savings_sentence", "progress_factory", "check_plotting",
           "start_run", "resolve_trainer", "thread_limit", "max_loss_flag"]

_ALGO_NAMES = {"diloco": "DiLoCo", "sync": "sync"}


def add_parsers(subparsers) -> None:
    from diloco.tools.cli.study_command import run_study_command

    compare = subparsers.add_parser(
        "compare", help="DiLoCo against the synchronous baseline at equal compute (make demo)",
        description="Train DiLoCo and the synchronous data-parallel baseline at equal compute and compare "
                    "held-out loss, accuracy and bytes communicated.")
    for add in (add_config_flags, add_data_flags, add_execution_flags, add_recovery_flags, add_output_flags):
        add(compare)
    compare.set_defaults(func=run_compare)

    train = subparsers.add_parser("train", help="one run of DiLoCo or of the synchronous baseline",
                                  description="Train one model and write a run folder.")
    train.add_argument("--algo", choices=sorted(TRAINERS), help="diloco (default) or sync")
    for add in (add_config_flags, add_data_flags, add_execution_flags, add_recovery_flags, add_output_flags):
        add(train)
    train.set_defaults(func=run_train)

    study = subparsers.add_parser(
        "study", help="one of the paper's ablations over several seeds (mean, 95%% interval)",
        description="Ablations at small scale: " + "; ".join(f"{s.name}: {s.title}" for s in STUDIES.values()))
    from diloco.tools.studies.family_study import FAMILY_STUDIES  # compression, streaming, bandwidth

    names = sorted(STUDIES) + sorted(PAPER_STUDIES)  # the paper's artefacts: diloco.tools.studies.paper_command
    names += sorted(FAMILY_STUDIES) + ["sparse", "async", "muon"]  # beyond DiLoCo: tools.studies.beyond_*
    study.add_argument("study", choices=names, metavar="NAME", help=", ".join(names))
    study.add_argument("--seeds", type=int, default=3, help="seeds per variant, from --seed on (3)")
    study.add_argument("--values", metavar="V1,V2,...",
                       help="values to sweep: H for inner-steps, K for workers, alphas for noniid, "
                            "optimizers (nesterov,fedavg,momentum) for outer-optimizer")
    study.add_argument("--total-steps", type=int, help=total_steps_help())
    add_paper_study_flags(study)
    study.add_argument("--target-loss", type=float, metavar="LOSS",
                       help="bandwidth study: the held-out loss whose simulated time is compared (default: the "
                            "lowest every run of every arm reaches)")
    for add in (add_config_flags, add_data_flags, add_execution_flags, add_output_flags):
        add(study)
    add_recovery_flags(study, resume=False)
    study.set_defaults(func=run_study_command)


def total_steps_help() -> str:
    """``--total-steps``' help, its defaults read from the studies that own them (never retyped)."""
    from diloco.tools.studies.beyond_muon import TASKS as MUON_TASKS
    from diloco.tools.studies.beyond_sparse import TASKS as SPARSE_TASKS
    from diloco.tools.studies.paper_studies import TASKS as PAPER_TASKS

    inner = STUDIES["inner-steps"].base

    def per_task(tasks: dict) -> str:
        return ", ".join(f"{task} {spec['steps']}" for task, spec in tasks.items())

    return (f"inner-steps study: steps per worker, a multiple of every H ({inner['rounds'] * inner['inner_steps']}); "
            f"paper studies: the budget, steps per worker ({per_task(PAPER_TASKS)}); muon ({per_task(MUON_TASKS)}); "
            f"sparse ({per_task(SPARSE_TASKS)})")


# --- one run ----------------------------------------------------------------------------------

def _progress(algo: str, config: DiLoCoConfig, done: int, bar, quiet: bool, following: int):
    """The run's progress within its rounds and its estimate (``diloco.tools.cli.run_progress``); None under -q."""
    if quiet:
        return None

    def write(line: str) -> None:
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    return RunProgress(_ALGO_NAMES[algo], config, done, write=write, bar=bar, following=following)


def _train_one(algo: str, config: DiLoCoConfig, data: Dataset, history: HistoryWriter, make_bar, run_dir: Path,
               *, start=None, checkpoint_every=None, max_loss=None, family=None, quiet=False, following=0):
    """Train ``algo`` with checkpoints in ``run_dir/checkpoints``; save ``params-<algo>.npz``.
    ``following``: algorithms the command trains after this one (for the run's estimate)."""
    if algo == "sync":  # compare: the baseline without DiLoCo's outer-gradient settings
        config = baseline_config(config)
    done = start.round if start is not None else 0
    bar = None if make_bar is None else make_bar(total=config.rounds, initial=done, desc=f"{_ALGO_NAMES[algo]:<7}",
                                                 unit="round", leave=True)
    watch = _progress(algo, config, done, bar, quiet, following)

    def after(record):
        if watch is not None:
            watch.round_ended(record)
        if bar is not None:
            bar.set_postfix(acc=f"{record['eval_accuracy']:.3f}", loss=f"{record['eval_loss']:.3f}")
            bar.update(1)

    previous = [r["time"] for r in history.for_algo(algo) if r.get("time") is not None]
    clock = time.perf_counter()
    def resumable(on_round):
        return train_resumable(algo, data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test,
                               encode=data.encode,
                               checkpoint_dir=run_dir / CHECKPOINT_DIR, checkpoint_every=checkpoint_every,
                               resume_from=start, max_loss=max_loss, on_round=on_round)

    try:
        with contextlib.nullcontext() if watch is None else watch.listening():  # steps within a round
            result = run_with_family(algo, family, config, data, history.callback(
                algo, after=after, time_offset=previous[-1] if previous else 0.0), resumable)
    finally:
        if bar is not None:
            bar.close()
    atomic_write_bytes(run_dir / f"params-{algo}.npz", npz_bytes(result.params))
    return result, time.perf_counter() - clock


def _algo_summary(algo: str, records: list, seconds, num_params: int | None) -> dict:
    last = records[-1] if records else {}
    return {
        "rounds_completed": len(records),
        "eval_loss": last.get("eval_loss"),
        "eval_accuracy": last.get("eval_accuracy"),
        "eval_perplexity": last.get("eval_perplexity"),
        "eval_bits": last.get("eval_bits"),
        "best_eval_accuracy": max((r["eval_accuracy"] for r in records), default=None),
        "inner_loss": last.get("inner_loss"),
        "all_reduces": sum(r["all_reduces"] for r in records),
        "bytes_sent_per_worker": last.get("cumulative_bytes", 0.0),
        "wall_seconds": seconds,
        "num_params": num_params,
    }


def _summary(command: str, status: str, history: HistoryWriter, algos, **fields) -> dict:
    """``summary.json`` of a run that did not complete: what finished, and why it stopped."""
    return {"command": command, "status": status, **fields,
            "algorithms": {algo: _algo_summary(algo, history.for_algo(algo), None, None) for algo in algos}}


def _print_table(summary: dict, savings_factor: float) -> None:
    text = summary.get("data", {}).get("name") == "shakespeare"  # the char-LM: perplexity and bits per char
    header = (f"{'algorithm':<10}{'held-out loss':>14}" + (f"{'perplexity':>11}{'bits/char':>10}" if text else "")
              + f"{'held-out acc':>13}{'all-reduces':>13}{'bytes/worker':>14}{'savings':>9}{'wall s':>8}")
    print(header)
    print("-" * len(header))
    for algo, row in summary["algorithms"].items():
        factor = savings_factor if algo == "diloco" else 1.0
        lm = f"{row['eval_perplexity']:>11.3f}{row['eval_bits']:>10.3f}" if text else ""
        print(f"{_ALGO_NAMES[algo]:<10}{row['eval_loss']:>14.4f}{lm}{row['eval_accuracy']:>13.4f}"
              f"{row['all_reduces']:>13d}{format_bytes(row['bytes_sent_per_worker']):>14}"
              f"{factor:>8.0f}x{row['wall_seconds']:>8.1f}")


def _savings(config: DiLoCoConfig, num_params: int) -> dict:
    report = communication_savings(num_params, config.num_workers, config.inner_steps, config.rounds,
                                   bytes_per_value=np.dtype(config.dtype).itemsize)
    return report._asdict()


# --- the commands ---------------------------------------------------------------------------

def _new_run(args, command: str, algos: tuple) -> dict:
    """Everything checked, then the run folder made: the state a fresh run starts from."""
    config = build_config(args)
    for algo in algos:
        resolve_trainer(algo, config)  # an absent engine fails before anything is written
    family = check_family(args, command, algos, config)
    check_plotting(args)
    check_text_run(args, config)  # --data shakespeare: its memory, before the windows are made
    data, data_info = load_dataset(args, config.dtype)
    check_run(config, data)  # classes, K against n, memory, the library's own checks
    threads, limit = thread_limit(args, config, data)
    split = split_report(data.x_train, data.y_train, config, text=data.encode is not None)
    saved = run_file_settings(args, command)  # --config run/config.json: the run's guard and checkpoints too
    max_loss = max_loss_flag(args, saved.get("max_loss", DEFAULT_MAX_LOSS))
    every = args.checkpoint_every or saved.get("checkpoint_every")
    name = f"{command}-{'-'.join(algos) if command == 'train' else data_info['name']}"
    run_dir, history = start_run(args, command, name, config, data_info,
                                 {"algorithms": list(algos), "blas_threads": threads,
                                  "checkpoint_every": every, "max_loss": max_loss, "split": split})
    return dict(run_dir=run_dir, config=config, data=data, data_info=data_info, history=history, limit=limit,
                starts={}, checkpoint_every=every, max_loss=max_loss, algos=algos, family=family, split=split)


def _already_complete(plan) -> bool:
    """Every algorithm's last round is checkpointed and ``summary.json`` says "completed": nothing to do."""
    if any(start is None or start.round < start.config.rounds for start in plan.starts.values()):
        return False
    try:
        summary = read_json(plan.run_dir / "summary.json")
    except (OSError, ValueError):
        return False
    return isinstance(summary, dict) and summary.get("status") == "completed" and "algorithms" in summary


def _resumed_run(args, command: str, algos: tuple) -> dict | None:
    """A stopped run's folder, checked (``plan_resume``), its history cut back to its checkpoints;
    None (and the run's saved table) when the run is already complete: then nothing is
    written but the repair of a torn last history line."""
    plan = plan_resume(args, command, algos)
    if _already_complete(plan):
        summary = read_json(plan.run_dir / "summary.json")
        rounds = ", ".join(f"{a} {s.round} of {s.config.rounds} rounds" for a, s in plan.starts.items())
        for note in plan.notes:  # a torn last line of history.jsonl, repaired
            print(note)
        print(f"{plan.run_dir} is already complete ({rounds}): nothing to resume. Its results:")
        _print_table(summary, summary.get("communication", {}).get("savings_factor", 1.0))
        return None
    for algo in plan.algos:
        resolve_trainer(algo, plan.config)
    check_plotting(args)
    threads, limit = thread_limit(args, plan.config, plan.data)
    history = HistoryWriter(plan.run_dir / "history.jsonl")
    history.restart(plan.history)
    record_code_change(plan, history)  # --allow-code-change: environment.json and the next record
    resumed_from = {algo: start.round if start else 0 for algo, start in plan.starts.items()}
    write_json(plan.run_dir / "summary.json", {"command": command, "status": "running", "pid": os.getpid(),
                                               "resumed_from": resumed_from})
    if not args.quiet:
        for note in plan.notes:
            print(note)
        print(f"resuming {plan.run_dir}: " + ", ".join(f"{a} after round {c.round if c else 0}"
                                                        for a, c in plan.starts.items()))
    every = args.checkpoint_every or plan.saved.get("checkpoint_every")
    return dict(run_dir=plan.run_dir, config=plan.config, data=plan.data, data_info=plan.data_info, history=history,
                limit=limit, starts=plan.starts, checkpoint_every=every,
                max_loss=max_loss_flag(args, plan.saved.get("max_loss", DEFAULT_MAX_LOSS)), algos=plan.algos,
                family=check_family(args, command, plan.algos, plan.config), split=plan.saved.get("split"))


def _run_algorithms(args, command: str, algos: tuple) -> int:
    make_bar = progress_factory(args.quiet)
    run = _resumed_run(args, command, algos) if args.resume else _new_run(args, command, algos)
    if run is None:  # a completed run "resumed"
        return 0
    run_dir, config, data, data_info, history = (run[k] for k in ("run_dir", "config", "data", "data_info",
                                                                   "history"))
    algos = run["algos"]
    if not args.quiet:
        _print_setup(data_info, config, run["split"])
    results, seconds = {}, {}

    def stopped(status: str, reason: str, extra: dict) -> None:
        write_json(run_dir / "summary.json", _summary(command, status, history, algos, reason=reason, **extra))

    with run_outcome(stopped), quiet_numpy(), run["limit"]:
        for algo in algos:
            results[algo], seconds[algo] = _train_one(
                algo, config, data, history, make_bar, run_dir, start=run["starts"].get(algo),
                checkpoint_every=run["checkpoint_every"], max_loss=run["max_loss"], family=run["family"],
                quiet=args.quiet, following=len(algos) - 1 - algos.index(algo))
        history.verify()  # the file holds every round: a lost history is a failure, never "completed"
        summary, savings, family_extra = _completed_summary(command, run, results, seconds)
        write_json(run_dir / "summary.json", summary)
        plots = []
        if not args.no_plots:  # the same pictures as `diloco plot RUN_DIR` (diloco.tools.cli.plot_command)
            with late_step(run_dir / "summary.json", summary, "plots"):  # stays "completed", says "plots": failed
                plots = save_run_pictures({algo: history.for_algo(algo) for algo in algos}, run_dir, config,
                                          data_info)
    _print_results(summary, savings, family_extra, data, config)
    print(f"run folder: {run_dir}" + (f" ({', '.join(p.name for p in plots)})" if plots else ""))
    return 0


def _print_setup(data_info: dict, config: DiLoCoConfig, split: dict | None) -> None:
    print(f"{data_info['name']}: {data_info['num_train']} train / {data_info['num_test']} held-out examples; "
          f"K={config.num_workers} workers, H={config.inner_steps} inner steps, {config.rounds} rounds "
          f"({config.total_steps} steps per worker, batch {config.batch_size})")
    if split is not None:  # None: a run folder from before the split was measured
        print(split_sentence(split))


def _completed_summary(command: str, run: dict, results: dict, seconds: dict) -> tuple[dict, dict, dict]:
    """summary.json of a completed run, its communication savings and the family's part of it."""
    config, history, algos = run["config"], run["history"], run["algos"]
    num_params = num_values(next(iter(results.values())).params)
    family_extra, savings = family_summary(run["family"], config, {a: history.for_algo(a) for a in algos},
                                           num_params, _savings(config, num_params))
    summary = {
        "command": command, "status": "completed", "data": run["data_info"],
        "algorithms": {algo: _algo_summary(algo, history.for_algo(algo), seconds[algo], num_params)
                       for algo in algos},
        "communication": savings,
        "split": run["split"],
        "params": {algo: f"params-{algo}.npz" for algo in algos},
        **family_extra,
    }
    return summary, savings, family_extra


def _print_results(summary: dict, savings: dict, family_extra: dict, data: Dataset, config: DiLoCoConfig) -> None:
    """The table, the n-gram baselines of a character-level task, the family's lines, the savings."""
    _print_table(summary, savings["savings_factor"])
    if data.encode is not None:  # the char-LM: what character statistics alone reach on the same held-out text
        print(baseline_sentence(dataset_baselines(data, data.encode.vocab_size,
                                                  every_position=model_kind(config).sequence_model)))
    print_family(family_extra)
    if "diloco" in summary["algorithms"]:
        print(savings_sentence(_measured(savings, summary["algorithms"])))


def _measured(savings: dict, algorithms: dict) -> dict:
    """``savings`` with the all-reduces and bytes the runs recorded, when both algorithms ran (an
    asynchronous run's arrivals, dropped or encoded outer gradients differ from the plain model)."""
    if set(algorithms) != {"diloco", "sync"}:
        return savings
    diloco, sync = algorithms["diloco"], algorithms["sync"]
    measured = {"sync_all_reduces": sync["all_reduces"], "diloco_all_reduces": diloco["all_reduces"]}
    if diloco["bytes_sent_per_worker"]:
        measured["savings_factor"] = sync["bytes_sent_per_worker"] / diloco["bytes_sent_per_worker"]
    return {**savings, **measured}


def savings_sentence(savings) -> str:
    """The summary's line on communication: how much less often, and how many fewer bytes.

    With H = 1 DiLoCo all-reduces as often as the baseline; with H > 1 it is
    ``sync_all_reduces / diloco_all_reduces`` (= H) times less often. The byte factor is
    printed only when it is not 1 (a narrower wire format saves bytes even at H = 1).
    """
    exact = savings["sync_all_reduces"] / savings["diloco_all_reduces"]
    ratio = f"{exact:.0f}" if abs(exact - round(exact)) < 1e-9 else f"{exact:.1f}"
    factor = savings["savings_factor"]
    if exact > 1:
        often = f"DiLoCo all-reduces {ratio}x less often than the synchronous baseline"
    else:
        often = "DiLoCo all-reduces as often as the synchronous baseline (H = 1)"
    if round(factor, 6) == 1:
        return often + ": the same bytes per worker"
    shown = f"{factor:.0f}" if abs(factor - round(factor)) < 1e-9 else f"{factor:.1f}"
    return often + f": {shown}x fewer bytes per worker"


def run_compare(args) -> int:
    return _run_algorithms(args, "compare", ("diloco", "sync"))


def run_train(args) -> int:
    algo = args.algo or (None if args.resume else run_file_settings(args, "train").get("algo")) or "diloco"
    return _run_algorithms(args, "train", (algo,))
