"""The ``compare``, ``train`` and ``study`` sub-commands of ``diloco``.

* ``diloco compare``: DiLoCo and the synchronous baseline at equal compute, one
  progress bar per run, a table at the end (``make demo``).
* ``diloco train --algo diloco|sync``: one run.
* ``diloco study NAME``: one of the paper's ablations over several seeds
  (``diloco.tools.study_command``).

Every command writes a run folder (see ``diloco.tools.runs``) and, unless ``--no-plots``,
PNG plots (``diloco.tools.plots``). The flags live in ``diloco.tools.flags``. User
errors raise ``CliError``: one line, exit status 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.data import Dataset
from diloco.evaluation import communication_savings
from diloco.loop import num_values
from diloco.tools.errors import CliError
from diloco.tools.flags import (
    add_config_flags,
    add_data_flags,
    add_execution_flags,
    add_output_flags,
    build_config,
    load_dataset,
)
from diloco.tools.runs import HistoryWriter, create_run_dir, environment_record, write_json
from diloco.tools.studies import STUDIES, TRAINERS, format_bytes, trainer
from diloco.tools.threads import ThreadsUnavailable, blas_threads, choose_threads

__all__ = ["add_parsers", "run_compare", "run_train", "progress_factory", "check_plotting", "start_run",
           "resolve_trainer", "thread_limit"]

_ALGO_NAMES = {"diloco": "DiLoCo", "sync": "sync"}


def add_parsers(subparsers) -> None:
    from diloco.tools.study_command import run_study_command

    compare = subparsers.add_parser(
        "compare", help="DiLoCo against the synchronous baseline at equal compute (make demo)",
        description="Train DiLoCo and the synchronous data-parallel baseline at equal compute and compare "
                    "held-out loss, accuracy and bytes communicated.")
    for add in (add_config_flags, add_data_flags, add_execution_flags, add_output_flags):
        add(compare)
    compare.set_defaults(func=run_compare)

    train = subparsers.add_parser("train", help="one run of DiLoCo or of the synchronous baseline",
                                  description="Train one model and write a run folder.")
    train.add_argument("--algo", choices=sorted(TRAINERS), default="diloco", help="diloco (default) or sync")
    for add in (add_config_flags, add_data_flags, add_execution_flags, add_output_flags):
        add(train)
    train.set_defaults(func=run_train)

    study = subparsers.add_parser(
        "study", help="one of the paper's ablations over several seeds (mean, 95%% interval)",
        description="Ablations at small scale: " + "; ".join(f"{s.name}: {s.title}" for s in STUDIES.values()))
    study.add_argument("study", choices=sorted(STUDIES), metavar="NAME", help=", ".join(sorted(STUDIES)))
    study.add_argument("--seeds", type=int, default=3, help="seeds per variant, from --seed on (3)")
    study.add_argument("--values", metavar="V1,V2,...",
                       help="values to sweep: H for inner-steps, K for workers, alphas for noniid, "
                            "optimizers (nesterov,fedavg,momentum) for outer-optimizer")
    study.add_argument("--total-steps", type=int,
                       help="inner-steps study: steps per worker, a multiple of every H (400)")
    for add in (add_config_flags, add_data_flags, add_execution_flags, add_output_flags):
        add(study)
    study.set_defaults(func=run_study_command)


# --- shared machinery ---------------------------------------------------------------------

def progress_factory(quiet: bool):
    """A function making progress bars, or making nothing when quiet or not on a terminal."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        raise CliError("progress bars need tqdm, from the 'cli' extra: pip install 'diloco[cli]' "
                       "(or pass --quiet)") from None
    return lambda **kwargs: tqdm(file=sys.stderr, dynamic_ncols=True, **kwargs)


def check_plotting(args) -> None:
    if args.no_plots:
        return
    try:
        from diloco.tools.plots import require_matplotlib

        require_matplotlib()
    except ImportError as exc:
        raise CliError(f"{exc} (or pass --no-plots)") from None


def resolve_trainer(algo: str, config: DiLoCoConfig):
    """``studies.trainer(algo, config.engine)``, a ``CliError`` when the engine is absent."""
    try:
        return trainer(algo, config.engine)
    except ValueError as exc:
        raise CliError(f"--engine {config.engine}: {exc}") from None


def thread_limit(args, config: DiLoCoConfig, data: Dataset):
    """``(threads, context manager)``: the BLAS thread policy (``diloco.tools.threads``) for this run."""
    requested = getattr(args, "threads", None)
    layer_sizes = (data.x_train.shape[1], *config.hidden_sizes, data.num_classes)
    try:
        threads = choose_threads(layer_sizes, config.batch_size, requested=requested)
        return threads, blas_threads(threads, required=requested is not None)
    except (ValueError, ThreadsUnavailable) as exc:
        raise CliError(str(exc) if requested is None else f"--threads: {exc}") from None


def start_run(args, command: str, name: str, config: DiLoCoConfig, data_info: dict, extra: dict | None = None):
    run_dir = create_run_dir(args.runs_dir, args.name or name)
    write_json(run_dir / "config.json", {"command": command, **(extra or {}), "config": config.to_dict(),
                                         "data": data_info})
    write_json(run_dir / "environment.json", environment_record(seed=config.seed))
    return run_dir, HistoryWriter(run_dir / "history.jsonl")


def _train_one(algo: str, config: DiLoCoConfig, data: Dataset, history: HistoryWriter, make_bar):
    train = resolve_trainer(algo, config)
    bar = None if make_bar is None else make_bar(total=config.rounds, desc=f"{_ALGO_NAMES[algo]:<7}",
                                                 unit="round", leave=True)

    def after(record):
        if bar is not None:
            bar.set_postfix(acc=f"{record['eval_accuracy']:.3f}", loss=f"{record['eval_loss']:.3f}")
            bar.update(1)

    start = time.perf_counter()
    try:
        result = train(data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test,
                       on_round=history.callback(algo, after=after))
    except (TypeError, ValueError) as exc:  # e.g. more workers than training examples
        raise CliError(f"cannot train {algo}: {exc}") from None
    finally:
        if bar is not None:
            bar.close()
    return result, time.perf_counter() - start


def _algo_summary(algo: str, records: list, seconds, num_params: int | None) -> dict:
    last = records[-1] if records else {}
    return {
        "rounds_completed": len(records),
        "eval_loss": last.get("eval_loss"),
        "eval_accuracy": last.get("eval_accuracy"),
        "best_eval_accuracy": max((r["eval_accuracy"] for r in records), default=None),
        "inner_loss": last.get("inner_loss"),
        "all_reduces": sum(r["all_reduces"] for r in records),
        "bytes_sent_per_worker": last.get("cumulative_bytes", 0.0),
        "wall_seconds": seconds,
        "num_params": num_params,
    }


def _interrupted(run_dir: Path, command: str, history: HistoryWriter, algos) -> None:
    """Ctrl-C: record what finished; every file already written stays as it is."""
    write_json(run_dir / "summary.json", {
        "command": command, "status": "interrupted",
        "algorithms": {algo: _algo_summary(algo, history.for_algo(algo), None, None) for algo in algos},
    })


def _print_table(summary: dict, savings_factor: float) -> None:
    header = (f"{'algorithm':<10}{'held-out loss':>14}{'held-out acc':>13}{'all-reduces':>13}"
              f"{'bytes/worker':>14}{'savings':>9}{'wall s':>8}")
    print(header)
    print("-" * len(header))
    for algo, row in summary["algorithms"].items():
        factor = savings_factor if algo == "diloco" else 1.0
        print(f"{_ALGO_NAMES[algo]:<10}{row['eval_loss']:>14.4f}{row['eval_accuracy']:>13.4f}"
              f"{row['all_reduces']:>13d}{format_bytes(row['bytes_sent_per_worker']):>14}"
              f"{factor:>8.0f}x{row['wall_seconds']:>8.1f}")


def _savings(config: DiLoCoConfig, num_params: int) -> dict:
    report = communication_savings(num_params, config.num_workers, config.inner_steps, config.rounds,
                                   bytes_per_value=np.dtype(config.dtype).itemsize)
    return report._asdict()


# --- the commands ---------------------------------------------------------------------------

def _run_algorithms(args, command: str, algos: tuple) -> int:
    config = build_config(args)
    for algo in algos:
        resolve_trainer(algo, config)  # an absent engine fails before anything is written
    check_plotting(args)
    make_bar = progress_factory(args.quiet)
    data, data_info = load_dataset(args, config.dtype)
    threads, limit = thread_limit(args, config, data)
    name = f"{command}-{'-'.join(algos) if command == 'train' else data_info['name']}"
    run_dir, history = start_run(args, command, name, config, data_info,
                                  {"algorithms": list(algos), "blas_threads": threads})
    if not args.quiet:
        print(f"{data_info['name']}: {data_info['num_train']} train / {data_info['num_test']} held-out examples; "
              f"K={config.num_workers} workers, H={config.inner_steps} inner steps, {config.rounds} rounds "
              f"({config.total_steps} steps per worker, batch {config.batch_size})")
    results, seconds = {}, {}
    try:
        with limit:
            for algo in algos:
                results[algo], seconds[algo] = _train_one(algo, config, data, history, make_bar)
    except KeyboardInterrupt:
        _interrupted(run_dir, command, history, algos)
        raise
    num_params = num_values(next(iter(results.values())).params)
    savings = _savings(config, num_params)
    summary = {
        "command": command, "status": "completed", "data": data_info,
        "algorithms": {algo: _algo_summary(algo, history.for_algo(algo), seconds[algo], num_params)
                       for algo in algos},
        "communication": savings,
    }
    write_json(run_dir / "summary.json", summary)
    plots = []
    if not args.no_plots:
        from diloco.tools.plots import save_run_plots

        plots = save_run_plots({algo: history.for_algo(algo) for algo in algos}, run_dir,
                               title=f"{data_info['name']}, K={config.num_workers}, H={config.inner_steps}")
    _print_table(summary, savings["savings_factor"])
    if "diloco" in algos:
        print(f"DiLoCo all-reduces {savings['sync_all_reduces'] // savings['diloco_all_reduces']}x less often than "
              f"the synchronous baseline: {savings['savings_factor']:.0f}x fewer bytes per worker")
    print(f"run folder: {run_dir}" + (f" ({', '.join(p.name for p in plots)})" if plots else ""))
    return 0


def run_compare(args) -> int:
    return _run_algorithms(args, "compare", ("diloco", "sync"))


def run_train(args) -> int:
    return _run_algorithms(args, "train", (args.algo,))
