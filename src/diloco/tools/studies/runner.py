"""One study runner: a study is a spec, the runner runs any spec the same way.

A spec (``StudySpec``) is small parts behind one protocol, as scikit-learn's estimators
are (``fit``, ``predict``) and optax's transforms (``init``, ``update``):

* ``plan(args) -> Plan``: the flags read and checked (one-line ``CliError``), the data
  loaded, and the study made concrete: its base config, its arms (``paper_runs.Arm``),
  seeds, tuning seeds and tuning steps (``paper_runs.TuneStep``), what ``config.json``
  records, and how one run is trained (``Plan.run``: ``paper_runs.run_arm`` unless the
  study runs its arms its own way);
* ``tune(plan, train, on_run) -> (arms, tuning)``: ``paper_runs.tune_arms`` over the
  plan's steps unless the spec says otherwise;
* ``summary(plan, done) -> dict``: the statistics and the claims' verdicts;
* ``write(plan, summary, done, args)``: the run folder's report, the export and the
  table on standard output.

``run_spec(spec, args)`` does the rest, once for every study: the run folder
(``config.json``, a ``"running"`` summary until the end, ``results.jsonl`` one line per
finished run, tuning runs with ``"phase": "tune"``), the BLAS thread limit, the progress
bar, the tuning, every arm on every seed, and the run cache. Every finished run is kept
in the cache (``--run-cache DIR``, by default ``RUNS_DIR/study-cache``), so rerunning the
same command goes on from the runs already done instead of from zero; a signal (Ctrl-C)
says how many runs are kept and the command that continues.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from diloco.config import AdamWConfig
from diloco.runtime import stop_signals
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.run_setup import progress_factory, start_run, thread_limit
from diloco.tools.runs.faults import quiet_numpy, run_outcome
from diloco.tools.runs.folders import JsonlWriter, write_json
from diloco.tools.studies.ablations import default_engine
from diloco.tools.studies.paper_runs import check_tuning_seeds, run_arm, tune_arms
from diloco.tools.studies.run_cache import RunCache
from diloco.tools.studies.study_loop import run_arms

__all__ = ["Plan", "Done", "StudySpec", "run_spec", "study_cache", "check_seeds", "check_tune_seeds", "task_of",
           "task_config", "budget", "DEFAULT_CACHE", "TUNE_SEED_BASE"]

DEFAULT_CACHE = "study-cache"  # under --runs-dir: where a study keeps its finished runs without --run-cache


class Plan(NamedTuple):
    """A study as its spec made it from the flags: everything the runner needs to run it."""

    name: str  # the study ("table2", "sparse"): the run folder's default name and the progress label
    folder: str  # the run folder's default name (``--name`` replaces it, ``run_setup.start_run``)
    config: object  # DiLoCoConfig: the base every arm changes
    arms: list  # Arm-like NamedTuples (label, algo, changes)
    seeds: list
    tune_seeds: list
    tuning: list  # paper_runs.TuneStep, run in order by tune_arms; [] tunes nothing
    data: object  # diloco.data.Dataset
    data_info: dict
    record: dict  # config.json's fields besides the config and the data
    banner: str  # the first line printed (not with -q)
    run: Callable | None = None  # trains one (arm, base, seed, dataset) -> outcome; None: paper_runs.run_arm
    runner: str | None = None  # the run cache's name for ``run``'s runs (None: the study's name)
    expected_runs: int = 0  # the progress bar's total (tuning runs before any extension included)
    extra: dict | None = None  # whatever the spec's summary needs besides
    label_key: str = "arm"  # the outcome's field naming its arm
    replay: Callable | None = None  # (stored outcome, history writer): a cached evaluation run's rounds
    guard: Callable | None = None  # checks each round written to history.jsonl (the divergence guard)
    stop_fields: Callable | None = None  # (finished outcomes) -> what an early end's summary.json adds


class Done(NamedTuple):
    """What the runner hands the spec's summary: the tuned arms and every run."""

    arms: list
    tuning: object  # the spec's tune() records (tune_arms': one dict per candidate)
    outcomes: list  # the evaluation runs, arm by arm, seed by seed
    tuned: list  # the tuning runs
    threads: int
    seconds: float
    cpu_seconds: float
    run_dir: Path
    history: object = None  # the run folder's HistoryWriter (history.jsonl): the evaluation runs' rounds


class StudySpec:
    """The protocol of a study (module doc). ``name`` names it; ``plan``, ``summary`` and
    ``write`` are the study's own; ``tune`` defaults to the plan's tuning steps."""

    name: str = ""

    def plan(self, args) -> Plan:
        raise NotImplementedError

    def tune(self, plan: Plan, train: Callable, on_run: Callable) -> tuple[list, object]:
        if not plan.tuning:
            return plan.arms, []
        return tune_arms(plan.tuning, plan.arms, plan.config, plan.data, plan.tune_seeds, run=train, on_run=on_run)

    def summary(self, plan: Plan, done: Done) -> dict:
        raise NotImplementedError

    def command(self, task: str, seeds: int, *flags: tuple) -> str:
        """The command a summary records: ``diloco study NAME --data TASK --seeds SEEDS``, then
        each ``(flag, value)`` of ``flags`` whose value is given (not None)."""
        words = ["diloco study", self.name, "--data", task, "--seeds", str(seeds)]
        return " ".join(words + [str(word) for flag, value in flags if value is not None for word in (flag, value)])

    def write(self, plan: Plan, summary: dict, done: Done, args) -> None:
        raise NotImplementedError


# --- checks the specs share -------------------------------------------------------------------

def task_of(args, tasks, study: str, default: str = "digits") -> str:
    """``--data``, one of ``tasks`` (a one-line ``CliError`` otherwise)."""
    task = getattr(args, "data", None) or default
    if task not in tasks:
        raise CliError(f"study {study} runs on --data {' or --data '.join(tasks)}, got --data {task}")
    return task


def task_config(args, tasks: dict, study: str, default: str = "digits", own: tuple = (), **fields) -> tuple:
    """``(task, config)``: ``--data`` (``task_of``), and the flags over the task's model, its inner
    AdamW (where ``tasks`` gives one), the default engine, ``fields`` and the task's ``own`` fields."""
    from diloco.tools.cli.flags import build_config

    task = task_of(args, tasks, study, default)
    spec = tasks[task]
    inner = {"inner": AdamWConfig(**spec["inner"])} if "inner" in spec else {}
    return task, build_config(args, {"hidden_sizes": spec["hidden_sizes"], **inner, "engine": default_engine(),
                                     **fields, **{name: spec[name] for name in own}})


def budget(args, default: int, h: int, *, multiple: bool = True, rounds: bool = True) -> int:
    """Steps per worker: ``--total-steps``, else (with ``rounds``) ``--rounds`` x ``h``, else
    ``default``; a positive int and, with ``multiple``, a multiple of H (a one-line ``CliError``)."""
    steps = getattr(args, "total_steps", None)
    if steps is None:
        steps = args.rounds * h if rounds and getattr(args, "rounds", None) is not None else default
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1 or (multiple and steps % h):
        raise CliError(f"--total-steps must be {f'a positive multiple of H={h}' if multiple else 'a positive int'}, "
                       f"got {steps!r}")
    return steps


def check_seeds(args, config, at_least: int = 2, why: str = "paired intervals") -> list:
    """The reported seeds, ``--seed`` on; at least ``at_least`` of them."""
    if args.seeds < at_least:
        raise CliError(f"--seeds must be at least {at_least} for {why}, got {args.seeds}")
    return list(range(config.seed, config.seed + args.seeds))


# Tuning seeds start here, far from the evaluation seeds (0, 1, ...), so a value is never chosen
# on the runs it is then judged on.
TUNE_SEED_BASE = 1000


def check_tune_seeds(args, seeds, base: int = TUNE_SEED_BASE, count: int | None = None) -> list:
    """The tuning seeds, ``base`` on (``--tune-seeds`` of them unless ``count``), none of them reported."""
    count = getattr(args, "tune_seeds", 1) if count is None else count
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise CliError(f"--tune-seeds must be a positive int, got {count!r}")
    tuning = [base + i for i in range(count)]
    try:
        check_tuning_seeds(tuning, seeds)
    except ValueError as exc:
        raise CliError(f"--seed: {exc}") from None
    return tuning


# --- the runner -------------------------------------------------------------------------------

def study_cache(args) -> RunCache:
    """``--run-cache DIR``, else ``RUNS_DIR/study-cache``: where every finished run is kept."""
    directory = getattr(args, "run_cache", None) or Path(args.runs_dir) / DEFAULT_CACHE
    try:
        return RunCache(directory)
    except ValueError as exc:
        raise CliError(f"--run-cache: {exc}") from None


def _runner_name(plan: Plan, arm) -> str:
    """The cache's runner name of ``arm``'s runs: the plan's, with any field of the arm beyond
    ``label``, ``algo`` and ``changes`` (a family variant's ``family``), which the config does not hold."""
    extra = {k: v for k, v in arm._asdict().items() if k not in ("label", "algo", "changes")}
    name = plan.runner or plan.name
    return name if not extra else f"{name} {json.dumps(extra, sort_keys=True, default=str)}"


def cached(plan: Plan, cache: RunCache) -> Callable:
    """One run of ``plan`` (``train(arm, base, seed, dataset, history=None)``), read from ``cache``
    when stored; ``history`` (a ``HistoryWriter``, evaluation runs only) goes to the plan's own
    run, and a stored run is replayed into it (``Plan.replay``)."""
    if plan.run is None:
        def train(arm, base, seed, dataset, history=None, **_):
            return run_arm(arm, base, seed, dataset, encode=dataset.encode, cache=cache, data_key=plan.data_info)
        return train

    def train_own(arm, base, seed, dataset, history=None, **_):
        config = base.replace(**arm.changes, seed=int(seed))
        key = RunCache.key(arm.algo, config, seed, plan.data_info, runner=_runner_name(plan, arm))
        outcome, hit = cache.through(key, lambda: plan.run(arm, base, seed, dataset) if history is None
                                     else plan.run(arm, base, seed, dataset, history=history))
        if not hit:
            return outcome
        stored = {**outcome, plan.label_key: arm.label, "cached": True}  # relabelled: another study may have stored it
        if history is not None and plan.replay is not None:
            plan.replay(stored, history)
        return stored
    return train_own


def _again(cache: RunCache) -> str:
    """The command that continues: this one again (it reads the runs kept in ``cache``)."""
    from diloco.tools.cli.invocation import command, shown_path

    if sys.argv[1:2] == ["study"]:
        return command(shlex.join(sys.argv[1:]))
    return f"the same diloco study command (it reads them from {shown_path(cache.directory)})"


def _kept(finished: int, cache: RunCache) -> str:
    """The interrupt line's end: what is kept, and the command that goes on from it."""
    if not finished:
        return f"no run had finished; start it again with: {_again(cache)}"
    return f"{finished} finished run(s) of the study are kept in the run cache; continue from there with: " \
           f"{_again(cache)}"


class _Progress:
    """``results.jsonl`` one line per finished run, the progress bar, the runs counted."""

    def __init__(self, plan: Plan, run_dir: Path, quiet: bool) -> None:
        self.results = JsonlWriter(run_dir / "results.jsonl")
        make_bar = progress_factory(quiet)
        total = plan.expected_runs or len(plan.arms) * len(plan.seeds)
        self.bar = None if make_bar is None else make_bar(total=total, desc=plan.name, unit="run")
        self.tuned, self.outcomes, self.label_key = [], [], plan.label_key

    def __call__(self, outcome: dict, phase: str = "tune") -> None:
        # a run's rounds are in history.jsonl (and in its cached outcome, to replay them), not here
        self.results.write_line({**{k: v for k, v in outcome.items() if k != "history"}, "phase": phase})
        (self.tuned if phase == "tune" else self.outcomes).append(outcome)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{outcome.get(self.label_key)} seed {outcome.get('seed')}")
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _train_all(spec: StudySpec, plan: Plan, train: Callable, progress: _Progress, history) -> tuple[list, object]:
    """Tune, then every arm on every seed (their rounds to ``history``); ``(tuned arms, tuning records)``."""
    arms, tuning = spec.tune(plan, train, progress)
    run_arms(arms, plan.seeds, train, plan.config, plan.data, history=history,
             on_run=lambda outcome: progress(outcome, "eval"))
    return arms, tuning


def run_spec(spec: StudySpec, args) -> int:
    """Run ``spec`` from the parsed flags ``args`` (module doc); 0 when done."""
    plan = spec.plan(args)
    threads, limit = thread_limit(args, plan.config, plan.data)
    cache = study_cache(args)
    run_dir, history = start_run(args, "study", plan.folder, plan.config, plan.data_info,
                                 {**plan.record, "blas_threads": threads, "run_cache": str(cache.directory)},
                                 guard=plan.guard)
    if not args.quiet:
        print(plan.banner)
    progress = _Progress(plan, run_dir, args.quiet)

    def stopped(status: str, reason: str, extra: dict) -> None:
        own = {} if plan.stop_fields is None else plan.stop_fields(progress.outcomes)
        write_json(run_dir / "summary.json", {"command": "study", "study": plan.name, "status": status,
                                              "reason": reason, **extra, "runs_completed": len(progress.tuned)
                                              + len(progress.outcomes), "run_cache": str(cache.directory), **own})

    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        with run_outcome(stopped), quiet_numpy(), limit:
            try:
                with stop_signals.signal_first():
                    arms, tuning = _train_all(spec, plan, cached(plan, cache), progress, history)
            except (TypeError, ValueError) as exc:
                raise CliError(f"study {plan.name}: {exc}") from None
            except KeyboardInterrupt as exc:
                exc.kept = _kept(len(progress.tuned) + len(progress.outcomes), cache)
                raise
    finally:
        progress.close()
    done = Done(arms, tuning, progress.outcomes, progress.tuned, threads, time.perf_counter() - started,
                time.process_time() - cpu_started, run_dir, history)
    spec.write(plan, spec.summary(plan, done), done, args)
    return 0
