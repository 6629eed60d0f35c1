"""What every training command does before and around its runs.

``diloco compare`` / ``diloco train`` (``diloco.tools.cli.commands``), ``diloco study``
(``diloco.tools.cli.study_command``, ``diloco.tools.studies.paper_command``,
``diloco.tools.studies.family_study``) share these steps: progress bars (tqdm, from the ``cli``
extra), the plotting check (matplotlib) made before anything is written, the trainer for
``--engine``, the BLAS thread policy (``diloco.tools.cli.threads``), the ``--max-loss`` guard
value, and ``start_run``, which makes the run folder with its ``config.json``,
``environment.json`` and a ``"running"`` summary, or removes it and raises ``CliError``.
Re-exported by ``diloco.tools.cli.commands``.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from pathlib import Path

from diloco.config import DiLoCoConfig
from diloco.data import Dataset
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flag_checks import check_flags
from diloco.tools.cli.flags import DEFAULT_MAX_LOSS
from diloco.tools.cli.preflight import check_run_count
from diloco.tools.cli.threads import ThreadsUnavailable, blas_threads, choose_threads
from diloco.tools.runs.faults import describe_os_error
from diloco.tools.runs.folders import HistoryWriter, create_run_dir, environment_record, write_json
from diloco.tools.runs.run_lock import lock_run_dir, release_runs
from diloco.tools.studies.ablations import trainer

__all__ = ["progress_factory", "check_plotting", "resolve_trainer", "thread_limit", "max_loss_flag",
           "start_run", "split_values", "study_values"]


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
        from diloco.tools.studies.plots import require_matplotlib

        require_matplotlib()
    except ImportError as exc:
        raise CliError(f"{exc} (or pass --no-plots)") from None


def resolve_trainer(algo: str, config: DiLoCoConfig):
    """``studies.trainer(algo, config.engine)``; a ``CliError`` when the engine is absent
    (checked before anything is written). Every engine runs every mechanism."""
    try:
        return trainer(algo, config.engine)
    except ValueError as exc:
        raise CliError(f"--engine {config.engine}: {exc}") from None


def thread_limit(args, config: DiLoCoConfig, data: Dataset):
    """``(threads, context manager)``: the BLAS thread policy (``diloco.tools.cli.threads``) for this run."""
    check_flags(args, config, data)  # flags with no effect here (diloco.tools.cli.flag_checks): the one call
    requested = getattr(args, "threads", None)
    layer_sizes = (data.x_train.shape[1], *config.hidden_sizes, data.num_classes)
    try:
        threads = choose_threads(layer_sizes, config.batch_size, requested=requested)
        return threads, blas_threads(threads, required=requested is not None)
    except (ValueError, ThreadsUnavailable) as exc:
        raise CliError(str(exc) if requested is None else f"--threads: {exc}") from None


def max_loss_flag(args, default: float | None = DEFAULT_MAX_LOSS) -> float | None:
    """``--max-loss`` as the guard takes it: ``default`` if not given (a resumed run's value), None for 'off'."""
    value = getattr(args, "max_loss", None)
    value = default if value is None else value
    return None if value is None or math.isinf(value) else value


def start_run(args, command: str, name: str, config: DiLoCoConfig, data_info: dict, extra: dict | None = None,
              *, guard=None):
    """Make the run folder and write ``config.json``, ``environment.json`` and a ``"running"`` summary.

    If any of that fails (read-only or full disk, a name too long), the half-made folder is
    removed and the ``OSError`` becomes a ``CliError``: no orphan folder is left behind.
    """
    runs_dir = Path(args.runs_dir)
    if runs_dir.exists() and not runs_dir.is_dir():
        raise CliError(f"--runs-dir {args.runs_dir} is a file, not a folder")
    if len((args.name or name).encode()) > 200:  # + the time stamp must stay under the usual 255-byte limit
        raise CliError(f"--name must be at most 200 bytes, got {len((args.name or name).encode())}")
    try:
        run_dir = create_run_dir(runs_dir, args.name or name)
    except OSError as exc:
        raise CliError(f"cannot create a run folder under --runs-dir {args.runs_dir}: "
                       f"{exc.strerror or exc}") from None
    try:
        lock_run_dir(run_dir, command)  # one writer per run folder (diloco.tools.runs.run_lock)
        write_json(run_dir / "config.json", {"command": command, **(extra or {}), "config": config.to_dict(),
                                             "data": data_info})
        write_json(run_dir / "environment.json", environment_record(seed=config.seed))
        write_json(run_dir / "summary.json", {"command": command, "status": "running", "pid": os.getpid()})
        history = HistoryWriter(run_dir / "history.jsonl", guard=guard)
    except BaseException as exc:  # a signal too: nothing half-made is left
        release_runs(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        if not isinstance(exc, (OSError, MemoryError)):
            raise
        reason = describe_os_error(exc) if isinstance(exc, OSError) else "out of memory"
        raise CliError(f"{reason} (the run folder was removed)") from None
    return run_dir, history


def split_values(text) -> tuple[str, ...]:
    """``--values V1,V2,...`` as a tuple of its non-empty, stripped items."""
    return tuple(v.strip() for v in text.split(",") if v.strip())


def study_values(args, default_values) -> tuple[str, ...]:
    """A study's ``--values`` (its defaults when not given), once ``--seeds`` is checked positive."""
    if args.seeds < 1:
        raise CliError(f"--seeds must be a positive int, got {args.seeds}")
    values = split_values(args.values) if args.values else default_values
    if not values:
        raise CliError("--values must list at least one value")
    check_run_count(args.seeds * len(values), flag="--seeds and --values")  # sizes bounded before any list
    return values
