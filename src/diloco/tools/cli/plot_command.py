"""``diloco plot RUN_DIR``: the pictures of a run or study folder, finished or not, and ``--follow``.

A run folder holds everything its pictures need: ``config.json`` (the config and the
data) and ``history.jsonl`` (one record per finished round, written as the run goes).
So the pictures can be drawn at any time, from a finished run, from one that was
interrupted (its finished rounds), or from one still training: ``--follow`` redraws
them whenever ``history.jsonl`` grows, until ``summary.json`` says the run has ended (or
Ctrl-C). ``train`` and ``compare`` draw the same pictures at their end through
``save_run_pictures``.

* ``train`` / ``compare`` folders: ``heldout_vs_round.png`` and ``heldout_vs_bytes.png``;
  the title names the data, K, H and every setting that differs from the defaults, as
  the flags that give it (``digits, K=8, H=50, --comm-dtype fp4``).
* study folders: ``study.png`` from ``summary.json`` once the study has finished (its
  rows and their curves), and, for the ablations and the family's studies, the curves
  of every run finished so far (``study_curves.png``, from ``history.jsonl``).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

from diloco.tools.cli.config_file import read_run_config
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flag_names import config_differences

__all__ = ["add_parsers", "run_plot", "run_title", "save_run_pictures", "plot_folder"]


def add_parsers(subparsers) -> None:
    plot = subparsers.add_parser(
        "plot", help="draw a run or study folder's pictures (finished, interrupted, or following one as it trains)",
        description="Draw the PNG pictures of a run folder (train, compare) or a study folder from the files it "
                    "holds, whether the run finished, was interrupted or is still training.")
    plot.add_argument("run_dir", metavar="RUN_DIR", help="a folder made by train, compare or study")
    plot.add_argument("--follow", action="store_true",
                      help="keep redrawing as the run writes new rounds, until it ends (or Ctrl-C)")
    plot.add_argument("--every", type=float, default=5.0, metavar="SECONDS",
                      help="with --follow: look for new rounds this often (5)")
    plot.set_defaults(func=run_plot)


def run_title(config, data_info: dict) -> str:
    """``digits, K=8, H=50`` and every setting that differs from the defaults, as its flag."""
    from diloco import DiLoCoConfig

    name = data_info.get("name", "data") if isinstance(data_info, dict) else "data"
    shown = config_differences(config, DiLoCoConfig(), skip=("seed", "rounds", "engine", "num_workers",
                                                                "inner_steps"))
    return ", ".join([f"{name}, K={config.num_workers}, H={config.inner_steps}", *shown])


def save_run_pictures(histories: dict, run_dir: Path, config, data_info: dict) -> list[Path]:
    """A train or compare folder's two pictures, titled by ``run_title``."""
    from diloco.tools.studies.plots import save_run_plots

    left = "eval_perplexity" if data_info.get("name") == "shakespeare" else "eval_loss"
    return save_run_plots(histories, run_dir, title=run_title(config, data_info), left=left)


def _records(path: Path) -> list:
    from diloco.tools.runs.folders import read_jsonl

    if not path.is_file():
        return []
    with warnings.catch_warnings():  # a run still writing: its last line may be half-appended
        warnings.simplefilter("ignore")
        return read_jsonl(path)


def _plot_run(run_dir: Path, saved: dict) -> list[Path]:
    from diloco import DiLoCoConfig

    config = DiLoCoConfig.from_dict(saved["config"])
    records = _records(run_dir / "history.jsonl")
    histories = {algo: [r for r in records if r.get("algo") == algo] for algo in saved["algorithms"]}
    histories = {algo: rows for algo, rows in histories.items() if rows}
    if not histories:
        return []
    return save_run_pictures(histories, run_dir, config, saved.get("data") or {})


def _plot_study(run_dir: Path, saved: dict) -> list[Path]:
    from diloco.tools.runs.folders import read_json
    from diloco.tools.studies.plots import plot_curves, plot_study, save_figure, study_curve_axis
    from diloco.tools.studies.study_stats import mean_curves, summarise

    paths = []
    summary = read_json(run_dir / "summary.json") if (run_dir / "summary.json").is_file() else {}
    rows = summary.get("rows") if isinstance(summary, dict) else None
    if rows and all("curve" in row for row in rows):  # the paper's studies and the beyond-DiLoCo ones
        from diloco.tools.studies.paper_command import plot_paper_study, plot_scaling_gap

        figure = plot_scaling_gap(summary) if summary.get("study") == "scaling" else plot_paper_study(summary)
        paths.append(save_figure(figure, run_dir / "study.png"))
    records = [r for r in _records(run_dir / "history.jsonl") if "variant" in r]
    if records:  # the ablations and the family's studies: every run finished so far
        results = _records(run_dir / "results.jsonl")
        title = saved.get("title") or run_dir.name
        if results and not paths:
            paths.append(save_figure(plot_study(summarise(results), title=title), run_dir / "study.png"))
        seeds = len({r.get("seed") for r in records})
        paths.append(save_figure(plot_curves(mean_curves(records), x=study_curve_axis(saved.get("study", "")),
                                             title=f"{title}: mean over {seeds} seed(s)"),
                                 run_dir / "study_curves.png"))
    return paths


def plot_folder(run_dir) -> list[Path]:
    """Draw the pictures of a run or study folder from its files; return them (none yet: [])."""
    run_dir = Path(run_dir)
    saved = read_run_config(run_dir, missing="give a folder made by train, compare or study")
    try:
        if isinstance(saved, dict) and saved.get("command") in ("train", "compare") and saved.get("algorithms"):
            return _plot_run(run_dir, saved)
        return _plot_study(run_dir, saved if isinstance(saved, dict) else {})
    except (KeyError, TypeError, ValueError) as exc:
        raise CliError(f"cannot plot {run_dir}: {exc}") from None


def _status(run_dir: Path) -> str | None:
    from diloco.tools.runs.folders import read_json

    try:
        summary = read_json(run_dir / "summary.json")
    except (OSError, ValueError):
        return None
    if isinstance(summary, dict) and "status" not in summary and "rows" in summary:
        return "completed"  # the paper's and the beyond-DiLoCo studies write their summary once, at the end
    return summary.get("status") if isinstance(summary, dict) else None


def _follow(run_dir: Path, every: float) -> int:
    seen, paths = None, []
    try:
        while True:
            history = run_dir / "history.jsonl"
            size = history.stat().st_size if history.is_file() else 0
            status = _status(run_dir)
            if size != seen:
                seen, paths = size, plot_folder(run_dir) or paths
                print(f"{time.strftime('%H:%M:%S')} {run_dir}: {len(_records(history))} record(s) drawn "
                      f"({', '.join(p.name for p in paths) or 'nothing to draw yet'})", flush=True)
            if status not in (None, "running"):
                paths = plot_folder(run_dir) or paths  # the last rounds, and a study's final pictures
                print(f"the run ended ({status}); pictures in {run_dir}")
                return 0
            time.sleep(every)
    except KeyboardInterrupt:
        print(f"stopped following {run_dir}; pictures in {run_dir}")
        return 0


def run_plot(args) -> int:
    from diloco.tools.cli.run_setup import check_plotting

    args.no_plots = False
    check_plotting(args)
    if not (args.every > 0):
        raise CliError(f"--every must be a positive number of seconds, got {args.every:g}")
    run_dir = Path(args.run_dir)
    if args.follow:
        plot_folder(run_dir)  # a wrong folder is refused before the first wait
        return _follow(run_dir, args.every)
    paths = plot_folder(run_dir)
    if not paths:
        raise CliError(f"{run_dir} has no finished round to draw yet (try again later, or --follow)")
    print(f"{run_dir}: {', '.join(p.name for p in paths)}")
    return 0
