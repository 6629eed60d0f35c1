"""Running the paper studies' arms: the engine each arm gets, one run, outer-lr tuning.

``run_arm`` trains one ``Arm`` (a label, an algorithm and the config fields it changes)
with one seed, on the fast engine where ``arm_engine`` says it runs that config, and
returns ``outcome_of`` its history: the final and best held-out metrics and the cost.
``tune_outer_lr`` runs every value of a study's outer-learning-rate grid on tuning seeds
and keeps the best. The studies themselves (arms, claims) are in
``diloco.tools.studies.paper_studies``, which re-exports these names.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

from diloco.config import DiLoCoConfig
from diloco.tools.studies.ablations import fast_engine_available, trainer

if TYPE_CHECKING:
    from diloco.tools.studies.paper_studies import PaperStudy

__all__ = ["Arm", "arm_engine", "outcome_of", "run_arm", "tune_outer_lr"]


class Arm(NamedTuple):
    """One arm: ``changes`` are applied to the study's base config."""

    label: str
    algo: str  # "diloco" or "sync"
    changes: dict


def parse_numbers(values, kind, name: str) -> tuple:
    """``--values`` as numbers (H, K, p or outer lr); ``()`` when not given."""
    if not values:
        return ()
    try:
        numbers = tuple(kind(v) for v in values)
    except ValueError:
        raise ValueError(f"--values must be {name} values ({kind.__name__}), got {list(values)}") from None
    if any(v < 0 or (v == 0 and name != "p") for v in numbers):
        raise ValueError(f"--values: {name} must be positive, got {list(numbers)}")
    return numbers


def arm_engine(config: DiLoCoConfig, algo: str, encode=None) -> str:
    """``"fast"`` (the stacked executor, which runs every task and mechanism) where ``diloco.engine``
    is installed, else ``"reference"``."""
    return "fast" if fast_engine_available() else "reference"


def outcome_of(arm: Arm, seed: int, config: DiLoCoConfig, history: list, seconds: float, engine: str) -> dict:
    """The per-run result: final held-out metrics, the best held-out loss, the cost."""
    last = history[-1]
    cosines = [r["pseudo_grad_cosine"] for r in history if r.get("pseudo_grad_cosine") is not None]
    return {
        "arm": arm.label, "algo": arm.algo, "seed": int(seed), "num_workers": config.num_workers,
        "inner_steps": config.inner_steps, "rounds": config.rounds, "steps_per_worker": config.total_steps,
        "eval_loss": last["eval_loss"], "eval_accuracy": last["eval_accuracy"],
        "eval_perplexity": last["eval_perplexity"], "eval_bits": last["eval_bits"],
        "best_eval_loss": min(r["eval_loss"] for r in history),
        "all_reduces": int(sum(r["all_reduces"] for r in history)), "bytes_sent": last["cumulative_bytes"],
        "pseudo_grad_cosine": sum(cosines) / len(cosines) if cosines else None,
        "curve": [[r["step"], r["eval_loss"]] for r in history],
        "seconds": seconds, "engine": engine,
    }


def run_arm(arm: Arm, base: DiLoCoConfig, seed: int, dataset, *, encode=None, on_round=None) -> dict:
    """Train ``arm`` with ``seed`` on ``dataset``; return ``outcome_of`` its history."""
    config = base.replace(**arm.changes, seed=int(seed))
    engine = arm_engine(config, arm.algo, encode)
    config = config.replace(engine=engine)
    train = trainer(arm.algo, engine)
    extra = {} if encode is None else {"encode": encode}
    start = time.perf_counter()
    result = train(dataset.x_train, dataset.y_train, config, x_eval=dataset.x_test, y_eval=dataset.y_test,
                   on_round=on_round, **extra)
    return outcome_of(arm, seed, config, result.history, time.perf_counter() - start, engine)


def tune_outer_lr(study: PaperStudy, arms: list, base: DiLoCoConfig, dataset, seeds, *, encode=None,
                  on_run=None, values=None) -> tuple[list, list]:
    """For each arm of ``study.tune``: run every grid value on ``seeds``; keep the value with
    the lowest mean final held-out loss.

    Returns
    -------
    (tuned_arms, tuning)
        The arms with their tuned value in ``changes`` and in the label, and one record
        per (arm, value): ``arm``, ``field``, ``value``, ``eval_loss`` (mean over seeds).
    """
    tuned, tuning = [], []
    for arm in arms:
        field, grid = study.tune[arm.label]
        grid = parse_numbers(values, float, "outer lr") or grid
        scores = []
        for value in grid:
            candidate = Arm(arm.label, arm.algo, {**arm.changes, field: value})
            losses = []
            for seed in seeds:
                outcome = run_arm(candidate, base, seed, dataset, encode=encode)
                losses.append(outcome["eval_loss"])
                if on_run is not None:
                    on_run(outcome)
            mean = sum(losses) / len(losses)
            scores.append((mean, value))
            tuning.append({"arm": arm.label, "field": field, "value": value, "eval_loss": mean})
        best = min(scores)[1]
        tuned.append(Arm(f"{arm.label}, lr {best:g}", arm.algo, {**arm.changes, field: best}))
    return tuned, tuning
