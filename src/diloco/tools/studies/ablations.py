"""The DiLoCo paper's ablations at small scale: definitions, runs and statistics.

Four studies, each a list of variants (a label, an algorithm and the config fields it
changes) run over several seeds:

* ``inner-steps``: H in {1, 5, 20, 50, 200} at a fixed total of steps per worker
  (``rounds = total_steps / H``, 400 steps by default), against the synchronous baseline.
* ``outer-optimizer``: outer Nesterov (lr 0.7, momentum 0.9), SGD lr 1 (= FedAvg) and
  plain heavy-ball momentum (lr 0.7, momentum 0.9), on IID and on non-IID shards.
* ``noniid``: IID shards against Dirichlet label skew for several alpha, DiLoCo and the
  baseline.
* ``workers``: K in {1, 2, 4, 8, 16} at fixed per-worker compute (same rounds, H and
  batch size per worker), so more workers means more total compute.

Unless the user's flags say otherwise, every study uses K = 8 workers and the
``DiLoCoConfig`` defaults; the last three take 8 rounds of H = 25 (200 steps per worker),
small enough for two CPU cores. Studies run on ``default_engine()``: the fast engine
(``diloco.engine``, equal to the milestone path up to rounding) where it is installed.
``trainer(algo, engine)`` is the one place that picks the training function.

Each study is data (``Study``); ``diloco study NAME`` runs it through the one study runner
(``ablation_spec.AblationSpec``: the run cache, resuming, the report), and ``run_study`` (the
notebooks' call) runs the same arms with the same loop (``study_loop.run_arms``) and the same
run (``run_variant``), without the cache. ``summarise`` reduces the per-seed results to a mean
and a 95% Student-t interval, ``markdown_table`` prints them (both in
``diloco.tools.studies.study_stats``, re-exported here). NumPy only: progress bars and plots
live in the CLI.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
import time
from collections.abc import Callable
from typing import NamedTuple

from diloco.config import DiLoCoConfig
from diloco.core import shard_reuse
from diloco.core.driver import is_course_algorithm, train
from diloco.core.hooks import NetworkTimer, callbacks
from diloco.corpus.shard_divergence import run_split_divergence
from diloco.loop import train_diloco, train_synchronous_baseline
from diloco.tools.studies.study_loop import run_arms
from diloco.tools.studies.study_stats import (
    format_bytes,
    markdown_table,
    mean_curves,
    mean_interval,
    summarise,
    t_quantile_975,
)

__all__ = [
    "Arm", "Variant", "Study", "STUDIES", "TRAINERS", "trainer", "default_engine", "fast_engine_available",
    "shared_shards",
    "t_quantile_975", "mean_interval", "run_study", "run_variant", "outcome_fields", "replay_rounds",
    "summarise", "mean_curves", "markdown_table", "format_bytes",
]

# The reference path: the milestone functions of diloco.loop.
TRAINERS = {"diloco": train_diloco, "sync": train_synchronous_baseline}


def fast_engine_available() -> bool:
    """Whether ``diloco.engine`` is installed (it is not in a learner workspace)."""
    return importlib.util.find_spec("diloco.engine") is not None


def shared_shards():
    """A block in which runs that split the same data with the same seed share the shards
    (``diloco.core.shard_reuse.reusing``): a command's runs, a study's. In a learner workspace (no fast
    engine) a null block: there the splitting functions are the learner's own, and every run calls them."""
    return shard_reuse.reusing() if fast_engine_available() else contextlib.nullcontext()


def default_engine() -> str:
    """The engine of studies and notebooks: ``"fast"`` where it exists, else ``"reference"``."""
    return "fast" if fast_engine_available() else "reference"


def trainer(algo: str, engine: str = "reference") -> Callable:
    """The training function of ``algo`` ("diloco" or "sync") on ``engine``.

    ``"reference"`` gives ``TRAINERS[algo]`` (the milestone functions, looked up at call
    time); ``"fast"`` gives ``diloco.core.trainers.FAST_TRAINERS[algo]``, the same algorithm, equal up
    to rounding.

    Raises
    ------
    ValueError
        Unknown ``algo`` or ``engine``, or ``"fast"`` where ``diloco.engine`` is absent.
    """
    if algo not in TRAINERS:
        raise ValueError(f"algo must be one of {sorted(TRAINERS)}, got {algo!r}")
    if engine == "reference":
        return functools.partial(_reference, algo)
    if engine != "fast":
        raise ValueError(f"engine must be 'reference' or 'fast', got {engine!r}")
    if not fast_engine_available():
        raise ValueError("engine 'fast' is not part of a learner workspace (it implements every milestone): "
                         "use --engine reference, which runs your functions")
    from diloco.core.trainers import FAST_TRAINERS

    return FAST_TRAINERS[algo]


def _reference(algo: str, x, y, config, **kwargs):
    """The milestone function of ``algo`` (26 or 27) for the course's algorithm, else the one
    driver on the reference executor (which steps the workers with the milestone functions)."""
    if is_course_algorithm(config, kwargs.get("encode")):
        kwargs.pop("encode", None)
        return TRAINERS[algo](x, y, config, **kwargs)
    on_round = kwargs.pop("on_round", None)
    hooks = ([NetworkTimer(config)] if config.family.simulates_network else []) + list(callbacks(on_round))
    return train(algo, x, y, config, executor="reference", hooks=hooks, **kwargs)


class Arm(NamedTuple):
    """One arm of a study (every study's: ``paper_runs`` re-exports it): ``changes`` are applied
    to the study's base config."""

    label: str
    algo: str  # "diloco" or "sync"
    changes: dict


Variant = Arm  # the ablations' first name for it


class Study(NamedTuple):
    """A named study, as data: the one runner runs it (``ablation_spec.AblationSpec``).

    ``base`` holds config fields the study sets before the user's flags apply;
    ``variants(config, values)`` lists the arms for the chosen values (``values`` are
    strings from ``--values`` or ``default_values``). ``claims`` (``paper_studies.Claim``:
    two arms by label, the one expected better first, an optional margin) are judged seed
    by seed on the final held-out loss, their verdicts in the report; the ablations state
    their ``claim`` in words only.
    """

    name: str
    title: str
    claim: str
    xlabel: str
    base: dict
    default_values: tuple
    variants: Callable[[DiLoCoConfig, tuple], list]
    claims: tuple = ()


def _ints(values, name: str) -> list[int]:
    try:
        out = [int(v) for v in values]
    except ValueError:
        raise ValueError(f"{name} values must be integers, got {list(values)}") from None
    if any(v <= 0 for v in out):
        raise ValueError(f"{name} values must be positive, got {out}")
    return out


def _inner_steps_variants(config: DiLoCoConfig, values) -> list[Variant]:
    total = config.total_steps
    variants = []
    for h in _ints(values, "inner steps H"):
        if total % h:
            raise ValueError(f"total steps per worker ({total}) must be a multiple of every H, not of {h}; "
                             f"set --total-steps")
        variants.append(Variant(f"H={h}", "diloco", {"inner_steps": h, "rounds": total // h}))
    # The baseline does not depend on H; its records come every H_ref steps.
    reference = 50 if total % 50 == 0 else variants[-1].changes["inner_steps"]
    variants.append(Variant("sync", "sync", {"inner_steps": reference, "rounds": total // reference}))
    return variants


_OUTER = {
    "nesterov": ("Nesterov lr0.7 m0.9", {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": True}),
    "fedavg": ("FedAvg (SGD lr1)", {"outer_lr": 1.0, "outer_momentum": 0.0, "nesterov": False}),
    "momentum": ("momentum lr0.7 m0.9", {"outer_lr": 0.7, "outer_momentum": 0.9, "nesterov": False}),
}


# An IID variant of a study whose base may be non-IID: IID shards have no split to skew.
_IID = {"iid": True, "noniid_split": "label"}


def _outer_variants(config: DiLoCoConfig, values) -> list[Variant]:
    unknown = sorted(set(values) - set(_OUTER))
    if unknown:
        raise ValueError(f"outer optimizers must be among {sorted(_OUTER)}, got {unknown}")
    variants = []
    noniid = "non-IID speaker" if config.noniid_split == "speaker" else f"non-IID a={config.alpha:g}"
    for setting, sharding in (("IID", _IID), (noniid, {"iid": False})):
        for key in values:
            label, changes = _OUTER[key]
            variants.append(Variant(f"{setting} / {label}", "diloco", {**changes, **sharding}))
        variants.append(Variant(f"{setting} / sync", "sync", dict(sharding)))
    return variants


def _noniid_variants(config: DiLoCoConfig, values) -> list[Variant]:
    try:
        alphas = [float(v) for v in values]
    except ValueError:
        raise ValueError(f"alpha values must be numbers, got {list(values)}") from None
    if any(not (a > 0 and math.isfinite(a)) for a in alphas):
        raise ValueError(f"alpha values must be positive, got {alphas}")
    if config.noniid_split == "speaker":
        raise ValueError("the noniid study sweeps alpha, which --noniid-split speaker does not use (compare it "
                         "with IID through train or compare, or the outer-optimizer study)")
    settings = [("IID", _IID)] + [(f"alpha={a:g}", {"iid": False, "alpha": a}) for a in alphas]
    return [Variant(label, algo, dict(changes)) for label, changes in settings for algo in ("diloco", "sync")]


def _workers_variants(config: DiLoCoConfig, values) -> list[Variant]:
    return [Variant(f"K={k}", "diloco", {"num_workers": k}) for k in _ints(values, "workers K")]


# Small enough for 2 CPU cores: 8 rounds of H = 25 (200 steps per worker), K = 8 unless varied.
_SMALL = {"rounds": 8, "inner_steps": 25}

STUDIES = {
    "inner-steps": Study(
        "inner-steps", "Inner steps H at fixed total compute",
        "quality degrades slowly as H grows, while communication falls as 1/H",
        "inner steps H (rounds = total steps / H)",
        {"rounds": 8, "inner_steps": 50}, ("1", "5", "20", "50", "200"), _inner_steps_variants),
    "outer-optimizer": Study(
        "outer-optimizer", "Outer optimizer, IID and non-IID",
        "outer Nesterov momentum beats FedAvg (outer SGD lr 1), compared on IID and on non-IID shards "
        "at one lr each (the paper tunes each: see `diloco study fig6`)",
        "outer optimizer", {"alpha": 0.1, **_SMALL}, ("nesterov", "fedavg", "momentum"), _outer_variants),
    "noniid": Study(
        "noniid", "IID against label-skewed (Dirichlet alpha) shards",
        "DiLoCo is robust to non-IID shards",
        "data split", dict(_SMALL), ("0.1", "0.5", "1", "10"), _noniid_variants),
    "workers": Study(
        "workers", "Number of workers K at fixed per-worker compute",
        "more workers help at fixed per-worker compute",
        "workers K", dict(_SMALL), ("1", "2", "4", "8", "16"), _workers_variants),
}

def run_variant(variant: Variant, config: DiLoCoConfig, seed: int, dataset, history=None) -> dict:
    """Train one arm of a study with ``seed``; its outcome (``run_study``'s fields).

    ``history`` (a ``HistoryWriter``, or anything with its ``callback``) receives every round,
    tagged with ``variant`` and ``seed``; the outcome then keeps those rounds as ``history``,
    so a run read back from the run cache can be replayed into a study's ``history.jsonl``.
    """
    run_config = config.replace(**variant.changes, seed=int(seed))
    rounds: list = []
    on_round = None
    if history is not None:
        write = history.callback(variant.algo, variant=variant.label, seed=int(seed))

        def on_round(record):
            rounds.append(dict(record))
            write(record)
    start = time.perf_counter()
    encode = getattr(dataset, "encode", None)  # the char-LM's encoder (one-hot or token windows)
    result = trainer(variant.algo, run_config.engine)(
        dataset.x_train, dataset.y_train, run_config, x_eval=dataset.x_test, y_eval=dataset.y_test,
        on_round=on_round, **({} if encode is None else {"encode": encode}))
    outcome = {**outcome_fields(variant, seed, run_config, result.history, time.perf_counter() - start),
               "split_divergence": run_split_divergence(dataset.x_train, dataset.y_train, run_config,
                                                        text=encode is not None)}
    return outcome if history is None else {**outcome, "history": rounds}


def outcome_fields(variant, seed: int, config: DiLoCoConfig, history: list, seconds: float) -> dict:
    """What every study run of an arm reports: its arm and seed, its shape, its final held-out
    metrics and training loss, its all-reduces and bytes sent per worker, its seconds."""
    last = history[-1]
    return {"variant": variant.label, "algo": variant.algo, "seed": int(seed), "rounds": config.rounds,
            "inner_steps": config.inner_steps, "num_workers": config.num_workers, "eval_loss": last["eval_loss"],
            "eval_accuracy": last["eval_accuracy"], "inner_loss": last["inner_loss"],
            "all_reduces": int(sum(r["all_reduces"] for r in history)), "bytes_sent": last["cumulative_bytes"],
            "seconds": seconds}


def replay_rounds(outcome: dict, history) -> None:
    """A stored run's rounds (``run_variant``'s ``history``) into ``history``, through the callback
    they first went through: the same records, but for their ``time``."""
    write = history.callback(outcome["algo"], variant=outcome["variant"], seed=outcome["seed"])
    for record in outcome.get("history", []):
        write(record)


def run_study(study: Study, config: DiLoCoConfig, dataset, seeds, values=None, *, history=None,
              on_run_end=None) -> list[dict]:
    """Run every variant of ``study`` for every seed (``run_variant``); return one result per run.

    The runs share the shards a seed cuts (``shared_shards``), as the command line's do; they read
    the training data as read-only arrays (``shard_reuse.unwritable``: the caller's own when they
    are, else a copy), which ``diloco.core.shard_reuse`` can fingerprint once for all of them.

    The study loop is the one runner's (``study_loop.run_arms``); ``diloco study NAME`` runs
    the same arms through the runner itself, with the run cache (``ablation_spec``).

    Parameters
    ----------
    study : Study
    config : DiLoCoConfig
        The base config (study ``base`` and the user's choices already applied).
    dataset : diloco.data.Dataset
    seeds : iterable of int
    values : tuple of str, optional
        The values to sweep; ``study.default_values`` if None.
    history : diloco.tools.runs.folders.HistoryWriter, optional
        Receives every round, tagged with ``variant`` and ``seed``.
    on_run_end : callable, optional
        ``on_run_end(result)`` after each run.

    Returns
    -------
    list of dict
        ``variant, algo, seed, rounds, inner_steps, num_workers, eval_loss,
        eval_accuracy, inner_loss, all_reduces, bytes_sent, seconds, split_divergence`` per
        run (``diloco.corpus.shard_divergence.run_split_divergence``: how non-IID its shards are),
        and ``history`` (its rounds) when ``history`` is given.
    """
    variants = study.variants(config, tuple(study.default_values if values is None else values))
    with shared_shards():
        if shard_reuse.is_reusing() and hasattr(dataset, "_replace"):  # read-only data: fingerprinted once
            dataset = dataset._replace(x_train=shard_reuse.unwritable(dataset.x_train),
                                       y_train=shard_reuse.unwritable(dataset.y_train))
        return run_arms(variants, list(seeds), run_variant, config, dataset, history=history, on_run=on_run_end)
