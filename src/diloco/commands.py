"""The ``compare``, ``train`` and ``study`` sub-commands of ``diloco``.

* ``diloco compare``: DiLoCo and the synchronous baseline at equal compute, one
  progress bar per run, a table at the end (``make demo``).
* ``diloco train --algo diloco|sync``: one run.
* ``diloco study NAME``: one of the paper's ablations over several seeds.

Every command writes a run folder (see ``diloco.runs``) and, unless ``--no-plots``,
PNG plots (``diloco.plots``). Every config field has a flag; ``--config FILE.json``
(a bare config, or a run folder's ``config.json``) sets the starting point and flags
override it. User errors raise ``CliError``: one line, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from diloco.cli import CliError
from diloco.config import DiLoCoConfig
from diloco.data import (
    DIGITS_PROVENANCE,
    MNIST1D_PROVENANCE,
    Dataset,
    load_digits_split,
    load_mnist1d,
    load_npz_dataset,
)
from diloco.evaluation import communication_savings
from diloco.loop import _num_values
from diloco.runs import HistoryWriter, create_run_dir, environment_record, write_json
from diloco.studies import STUDIES, TRAINERS, format_bytes, markdown_table, mean_curves, run_study, summarise

__all__ = ["add_parsers", "build_config", "load_dataset", "format_bytes"]

_ALGO_NAMES = {"diloco": "DiLoCo", "sync": "sync"}

# Flags of DiLoCoConfig fields: (flag(s), argparse options). Inner AdamW fields follow.
_CONFIG_FLAGS = {
    "num_workers": (("-K", "--num-workers", "--workers"), {"type": int, "metavar": "K",
                                                          "help": "K, the number of workers (8)"}),
    "inner_steps": (("-H", "--inner-steps"), {"type": int, "metavar": "H",
                                              "help": "H, inner AdamW steps per round (50)"}),
    "rounds": (("--rounds",), {"type": int, "help": "outer rounds; steps per worker = rounds * H (10)"}),
    "batch_size": (("--batch-size",), {"type": int, "help": "examples per worker per step (32)"}),
    "hidden_sizes": (("--hidden-sizes",), {"metavar": "W1,W2,...",
                                           "help": "hidden layer widths, comma-separated; '' for none (128)"}),
    "outer_lr": (("--outer-lr",), {"type": float, "help": "outer learning rate (0.7)"}),
    "outer_momentum": (("--outer-momentum",), {"type": float, "help": "outer momentum mu (0.9)"}),
    "nesterov": (("--nesterov",), {"action": argparse.BooleanOptionalAction,
                                   "help": "Nesterov (default) or plain heavy-ball outer momentum"}),
    "alpha": (("--alpha",), {"type": float, "help": "Dirichlet concentration of --noniid shards (0.5)"}),
    "seed": (("--seed",), {"type": int, "help": "seeds sharding, initialisation and batches (0)"}),
    "dtype": (("--dtype",), {"choices": ("float32", "float64"), "help": "parameter dtype (float64)"}),
}
_INNER_FLAGS = {
    "lr": (("--lr", "--inner-lr"), {"type": float, "help": "inner AdamW learning rate (1e-3)"}),
    "beta1": (("--beta1",), {"type": float, "help": "AdamW beta1 (0.9)"}),
    "beta2": (("--beta2",), {"type": float, "help": "AdamW beta2 (0.999)"}),
    "eps": (("--eps",), {"type": float, "help": "AdamW epsilon (1e-8)"}),
    "weight_decay": (("--weight-decay",), {"type": float, "help": "AdamW decoupled weight decay (0.01)"}),
}


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("experiment (every DiLoCoConfig field; flags override --config)")
    group.add_argument("--config", metavar="FILE.json", help="start from this config (a run's config.json works)")
    for name, (flags, options) in {**_CONFIG_FLAGS, **_INNER_FLAGS}.items():
        group.add_argument(*flags, dest=name, default=None, **options)
    sharding = group.add_mutually_exclusive_group()
    sharding.add_argument("--iid", dest="iid", action="store_true", default=None, help="IID shards (default)")
    sharding.add_argument("--noniid", dest="iid", action="store_false",
                          help="label-skewed shards: per class, Dirichlet(alpha) proportions across workers")


def _add_data_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--data", default="digits", metavar="digits|mnist1d|PATH.npz",
                       help="built-in digits (default), MNIST-1D (the 'mnist1d' extra; generated locally, cached), "
                            "or an .npz with arrays x, y and optionally x_test, y_test")
    group.add_argument("--split-seed", type=int, default=0,
                       help="seed of the train/test split when the data has no test part (0)")
    group.add_argument("--test-fraction", type=float, default=0.2,
                       help="held-out fraction when the data has no test part (0.2)")
    group.add_argument("--cache-dir", metavar="DIR",
                       help="where generated MNIST-1D is cached ($DILOCO_CACHE_DIR or ~/.cache/diloco)")


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--runs-dir", default="runs", metavar="DIR", help="parent of the run folder (runs)")
    group.add_argument("--name", help="run folder name after the time stamp (default: the command)")
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    group.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")


def add_parsers(subparsers) -> None:
    compare = subparsers.add_parser(
        "compare", help="DiLoCo against the synchronous baseline at equal compute (make demo)",
        description="Train DiLoCo and the synchronous data-parallel baseline at equal compute and compare "
                    "held-out loss, accuracy and bytes communicated.")
    for add in (_add_config_flags, _add_data_flags, _add_output_flags):
        add(compare)
    compare.set_defaults(func=run_compare)

    train = subparsers.add_parser("train", help="one run of DiLoCo or of the synchronous baseline",
                                  description="Train one model and write a run folder.")
    train.add_argument("--algo", choices=sorted(TRAINERS), default="diloco", help="diloco (default) or sync")
    for add in (_add_config_flags, _add_data_flags, _add_output_flags):
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
    for add in (_add_config_flags, _add_data_flags, _add_output_flags):
        add(study)
    study.set_defaults(func=run_study_command)


# --- configuration and data ----------------------------------------------------------------

def _parse_hidden(text: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise CliError(f"--hidden-sizes must be comma-separated integers such as 128,64, got {text!r}") from None


def _read_config_file(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise CliError(f"config file not found: {path}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CliError(f"cannot read config file {path}: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]  # a run folder's config.json
    if not isinstance(data, dict):
        raise CliError(f"config file {path} must hold a JSON object, got {type(data).__name__}")
    return data


def build_config(args, defaults: dict | None = None) -> DiLoCoConfig:
    """The config from (in increasing priority) the defaults, ``--config`` and the flags."""
    try:
        config = DiLoCoConfig(**(defaults or {}))
        if getattr(args, "config", None):
            data = _read_config_file(args.config)
            merged = {**config.to_dict(), **data}
            if isinstance(data.get("inner"), dict):
                merged["inner"] = {**config.inner.to_dict(), **data["inner"]}
            config = DiLoCoConfig.from_dict(merged)
        changes = {name: getattr(args, name) for name in _CONFIG_FLAGS if getattr(args, name, None) is not None}
        if "hidden_sizes" in changes:
            changes["hidden_sizes"] = _parse_hidden(changes["hidden_sizes"])
        if getattr(args, "iid", None) is not None:
            changes["iid"] = args.iid
        inner = {name: getattr(args, name) for name in _INNER_FLAGS if getattr(args, name, None) is not None}
        if inner:
            changes["inner"] = inner
        return config.replace(**changes) if changes else config
    except (TypeError, ValueError) as exc:
        raise CliError(f"invalid config: {exc}") from None


def load_dataset(args, dtype: str = "float64") -> tuple[Dataset, dict]:
    """The dataset named by ``--data`` (cast to ``dtype``) and a description for config.json."""
    spec = args.data
    try:
        if spec == "digits":
            data = load_digits_split(seed=args.split_seed, test_fraction=args.test_fraction)
            info = {"name": "digits", "provenance": DIGITS_PROVENANCE}
        elif spec == "mnist1d":
            data = load_mnist1d(cache_dir=args.cache_dir)
            info = {"name": "mnist1d", "provenance": MNIST1D_PROVENANCE}
        elif spec.endswith(".npz") or Path(spec).exists():
            data = load_npz_dataset(spec, test_fraction=args.test_fraction, seed=args.split_seed)
            info = {"name": Path(spec).stem, "path": str(Path(spec).resolve())}
        else:
            raise CliError(f"--data must be digits, mnist1d or a path to an .npz file, got {spec!r}")
    except FileNotFoundError as exc:
        raise CliError(f"--data: {exc}") from None
    except ImportError as exc:
        raise CliError(str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise CliError(f"--data: {exc}") from None
    data = Dataset(data.x_train.astype(dtype), data.y_train, data.x_test.astype(dtype), data.y_test)
    info.update(num_train=len(data.y_train), num_test=len(data.y_test), num_features=data.x_train.shape[1],
                num_classes=data.num_classes, split_seed=args.split_seed)
    return data, info


# --- shared machinery ---------------------------------------------------------------------

def _progress_factory(quiet: bool):
    """A function making progress bars, or making nothing when quiet or not on a terminal."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        raise CliError("progress bars need tqdm, from the 'cli' extra: pip install 'diloco[cli]' "
                       "(or pass --quiet)") from None
    return lambda **kwargs: tqdm(file=sys.stderr, dynamic_ncols=True, **kwargs)


def _check_plotting(args) -> None:
    if args.no_plots:
        return
    try:
        from diloco.plots import require_matplotlib

        require_matplotlib()
    except ImportError as exc:
        raise CliError(f"{exc} (or pass --no-plots)") from None


def _start_run(args, command: str, name: str, config: DiLoCoConfig, data_info: dict, extra: dict | None = None):
    run_dir = create_run_dir(args.runs_dir, args.name or name)
    write_json(run_dir / "config.json", {"command": command, **(extra or {}), "config": config.to_dict(),
                                         "data": data_info})
    write_json(run_dir / "environment.json", environment_record(seed=config.seed))
    return run_dir, HistoryWriter(run_dir / "history.jsonl")


def _train_one(algo: str, config: DiLoCoConfig, data: Dataset, history: HistoryWriter, make_bar):
    bar = None if make_bar is None else make_bar(total=config.rounds, desc=f"{_ALGO_NAMES[algo]:<7}",
                                                 unit="round", leave=True)

    def after(record):
        if bar is not None:
            bar.set_postfix(acc=f"{record['eval_accuracy']:.3f}", loss=f"{record['eval_loss']:.3f}")
            bar.update(1)

    start = time.perf_counter()
    try:
        result = TRAINERS[algo](data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test,
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
    _check_plotting(args)
    make_bar = _progress_factory(args.quiet)
    data, data_info = load_dataset(args, config.dtype)
    name = f"{command}-{'-'.join(algos) if command == 'train' else data_info['name']}"
    run_dir, history = _start_run(args, command, name, config, data_info,
                                  {"algorithms": list(algos)})
    if not args.quiet:
        print(f"{data_info['name']}: {data_info['num_train']} train / {data_info['num_test']} held-out examples; "
              f"K={config.num_workers} workers, H={config.inner_steps} inner steps, {config.rounds} rounds "
              f"({config.total_steps} steps per worker, batch {config.batch_size})")
    results, seconds = {}, {}
    try:
        for algo in algos:
            results[algo], seconds[algo] = _train_one(algo, config, data, history, make_bar)
    except KeyboardInterrupt:
        _interrupted(run_dir, command, history, algos)
        raise
    num_params = _num_values(next(iter(results.values())).params)
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
        from diloco.plots import save_run_plots

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


def run_study_command(args) -> int:
    study = STUDIES[args.study]
    defaults = dict(study.base)
    config = build_config(args, defaults)
    if args.total_steps is not None:
        if study.name != "inner-steps":
            raise CliError("--total-steps applies only to the inner-steps study")
        if args.total_steps < 1:
            raise CliError(f"--total-steps must be a positive int, got {args.total_steps}")
        config = config.replace(inner_steps=1, rounds=args.total_steps)
    if args.seeds < 1:
        raise CliError(f"--seeds must be a positive int, got {args.seeds}")
    values = tuple(v.strip() for v in args.values.split(",") if v.strip()) if args.values else study.default_values
    if not values:
        raise CliError("--values must list at least one value")
    try:
        variants = study.variants(config, values)
    except ValueError as exc:
        raise CliError(f"--values: {exc}") from None
    _check_plotting(args)
    make_bar = _progress_factory(args.quiet)
    data, data_info = load_dataset(args, config.dtype)
    seeds = list(range(config.seed, config.seed + args.seeds))
    spec = {"study": study.name, "title": study.title, "claim": study.claim, "values": list(values),
            "seeds": seeds, "variants": [v._asdict() for v in variants]}
    run_dir, history = _start_run(args, "study", f"study-{study.name}", config, data_info, spec)
    results_path = run_dir / "results.jsonl"
    results_path.touch()
    if not args.quiet:
        print(f"study {study.name}: {len(variants)} variants x {len(seeds)} seeds on {data_info['name']}; "
              f"claim: {study.claim}")
    bar = None if make_bar is None else make_bar(total=len(variants) * len(seeds), desc=study.name, unit="run")
    finished = []

    def on_run_start(variant, seed):
        if bar is not None:
            bar.set_postfix_str(f"{variant.label} seed {seed}")

    def on_run_end(outcome):
        finished.append(outcome)
        with results_path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(outcome) + "\n")
        if bar is not None:
            bar.update(1)

    try:
        run_study(study, config, data, seeds, values, history=history, on_run_start=on_run_start,
                  on_run_end=on_run_end)
    except KeyboardInterrupt:
        write_json(run_dir / "summary.json", {"command": "study", "study": study.name, "status": "interrupted",
                                              "runs_completed": len(finished), "rows": summarise(finished)
                                              if finished else []})
        raise
    except (TypeError, ValueError) as exc:
        raise CliError(f"study {study.name}: {exc}") from None
    finally:
        if bar is not None:
            bar.close()
    rows = summarise(finished)
    write_json(run_dir / "summary.json", {"command": "study", "study": study.name, "status": "completed",
                                          "claim": study.claim, "seeds": seeds, "rows": rows})
    table = markdown_table(rows)
    base = {k: v for k, v in config.to_dict().items() if k != "inner"}
    (run_dir / "study.md").write_text(
        f"# Study {study.name}: {study.title}\n\nClaim tested: {study.claim}.\n\n"
        f"Data: {data_info['name']} ({data_info['num_train']} train / {data_info['num_test']} held-out). "
        f"Seeds: {seeds}. Base config: `{json.dumps(base)}`, inner AdamW `{json.dumps(config.inner.to_dict())}`.\n\n"
        f"Final held-out metrics, mean and 95% Student-t interval over seeds:\n\n{table}", encoding="utf-8")
    if not args.no_plots:
        from diloco.plots import plot_curves, plot_study, save_figure

        save_figure(plot_study(rows, title=study.title, xlabel=study.xlabel), run_dir / "study.png")
        x_axis = "bytes" if study.name == "inner-steps" else "step"
        save_figure(plot_curves(mean_curves(history.records), x=x_axis,
                                title=f"{study.title}: mean over {len(seeds)} seeds"), run_dir / "study_curves.png")
    print(table, end="")
    print(f"run folder: {run_dir}")
    return 0
