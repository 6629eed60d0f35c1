"""Running the paper studies' arms: the engine each arm gets, one run, tuning, a run cache.

``run_arm`` trains one ``Arm`` (a label, an algorithm and the config fields it changes)
with one seed, on the engine its config names (``arm_engine``; the study commands default to
``default_engine()``, the fast engine where it is installed, and honour ``--engine``), and
returns ``outcome_of`` its history: the final and best held-out metrics and the cost.
``tune_arms`` runs a study's tuning steps (``TuneStep``: a field, a grid, and which arm
is probed for which arms) on tuning seeds and keeps each group's best value; the inner
lr (``INNER_LR``) and the outer lr are tuned this way. ``RunCache``
(``diloco.tools.studies.run_cache``) stores outcomes by a hash of everything a run depends on
(algorithm, config changes, seed, data), so an arm that two studies share (DiLoCo at K = 8,
H = 50 is in five) is trained once per ``make results``.
The studies themselves (arms, claims) are in ``diloco.tools.studies.paper_studies``.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import NamedTuple

from diloco.config import DiLoCoConfig
from diloco.core.model_seam import model_for, model_kind
from diloco.corpus.shard_divergence import run_split_divergence
from diloco.tools.runs.atomic_files import atomic_write_text, write_json
from diloco.tools.studies.ablations import Arm, fast_engine_available, trainer
from diloco.tools.studies.run_cache import RunCache
from diloco.tools.studies.study_loop import run_arms

__all__ = ["Arm", "TuneStep", "INNER_LR", "OUTER_STEP", "OUTER_LR_GRID", "OUTER_MOMENTUM_GRID", "RunCache", "MUON_LR",
           "FEEDBACK_DECAY",
           "arm_engine", "outcome_of", "run_arm", "tune_arms", "outer_step_grid", "check_tuning_seeds", "write_study",
           "apply_value", "next_on_ladder", "per_arm", "around", "self_tuning", "past_the_edge", "JOINT_LADDERS",
           "with_warmup", "WARMUP_FRACTION"]

INNER_LR = "inner lr"  # the tuning field that sets ``inner.lr`` (every other field is a DiLoCoConfig field)
MUON_LR = "muon lr"  # the tuning field that sets ``muon.lr`` (a Muon arm's matrices; its biases keep ``inner.lr``)
FEEDBACK_DECAY = "feedback decay"  # sets ``family.topk_decay``: the error-feedback buffer's decay (SparseLoCo's beta)
# The outer step, tuned jointly: a field pair whose grid values are (outer lr, outer momentum) pairs.
OUTER_STEP = ("outer_lr", "outer_momentum")
OUTER_LR_GRID = (0.3, 0.5, 0.7, 1.0)
OUTER_MOMENTUM_GRID = (0.0, 0.5, 0.9)
# Warmup of the cosine schedule, a fraction of each arm's steps (the paper: 1,000 of 88,000, about 1%).
WARMUP_FRACTION = 0.02


class TuneStep(NamedTuple):
    """Tune ``field`` over ``grid``: for each ``(probe, targets)`` of ``groups``, the value
    at which arm ``probe`` does best on the tuning seeds is given to every arm of ``targets``.

    ``field`` may be a tuple of fields (``OUTER_STEP``), tuned jointly: each grid value is
    then a tuple of values, one per field."""

    field: str | tuple
    grid: tuple
    groups: tuple


def outer_step_grid(groups: tuple, lrs: tuple = OUTER_LR_GRID, momenta: tuple = OUTER_MOMENTUM_GRID) -> TuneStep:
    """The outer lr x outer momentum grid (every pair) as one ``TuneStep`` over ``groups``;
    ``tune_arms`` extends it past an edge that is chosen (``past_the_edge``)."""
    return TuneStep(OUTER_STEP, tuple((lr, mu) for lr in lrs for mu in momenta), groups)


def per_arm(arms, keep=None) -> tuple:
    """Each arm (each that ``keep(arm)`` accepts) tuned on itself: ``((label, (label,)), ...)``."""
    return tuple((a.label, (a.label,)) for a in arms if keep is None or keep(a))


def around(value: float) -> tuple:
    """``value`` and its two neighbours on the 1-3-10 ladder (``next_on_ladder``)."""
    return next_on_ladder(value, up=False), value, next_on_ladder(value, up=True)


def self_tuning(arms, grid: tuple) -> list:
    """Every arm on itself: its inner lr over ``grid``; then each DiLoCo arm's outer lr x momentum
    (``outer_step_grid``) and its inner lr again. The synchronous arms have no outer step."""
    diloco = per_arm(arms, lambda a: a.algo == "diloco")
    return [TuneStep(INNER_LR, grid, per_arm(arms)), outer_step_grid(diloco), TuneStep(INNER_LR, grid, diloco)]


def check_tuning_seeds(tuning_seeds, seeds) -> None:
    """A tuning seed is never a reported seed: the value chosen on it is judged on other runs."""
    shared = sorted(set(tuning_seeds) & set(seeds))
    if shared:
        raise ValueError(f"tuning seed(s) {shared} are also reported seeds; choose --seed so that the reported "
                         f"seeds stay below {min(tuning_seeds)}")

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


def apply_value(changes: dict, field: str, value) -> dict:
    """``changes`` with ``field`` set to ``value`` (``INNER_LR`` sets ``inner.lr``; a tuple of
    fields sets each to its value of the tuple ``value``)."""
    if isinstance(field, tuple):
        for one, v in zip(field, value, strict=True):
            changes = apply_value(changes, one, v)
        return changes
    if field == INNER_LR:
        return {**changes, "inner": {**changes.get("inner", {}), "lr": value}}
    if field == MUON_LR:
        return {**changes, "muon": {**changes.get("muon", {}), "lr": value}}
    if field == FEEDBACK_DECAY:
        return {**changes, "family": {**changes.get("family", {}), "topk_decay": value}}
    return {**changes, field: value}


def with_warmup(arms: list, base: DiLoCoConfig, fraction: float = WARMUP_FRACTION) -> list:
    """The arms as the studies run them.

    With ``base.lr_schedule == "cosine"``, every arm that sets no ``warmup_steps`` warms up
    over ``fraction`` of its own steps (``rounds * inner_steps``), at least one. Every DiLoCo
    arm of two workers or more records the workers' pseudo-gradient similarity (it changes
    no number of the run), so the same run has the same config, and one cache entry, in
    every study that needs it.
    """
    out = []
    for arm in arms:
        changes = dict(arm.changes)
        config = base.replace(**changes)
        if base.lr_schedule == "cosine" and "warmup_steps" not in changes:
            changes["warmup_steps"] = max(1, round(fraction * config.total_steps))
        if arm.algo == "diloco" and config.num_workers >= 2:
            changes["record_similarity"] = True
        out.append(arm._replace(changes=changes))
    return out


def arm_engine(config: DiLoCoConfig, algo: str, encode=None) -> str:
    """The engine an arm runs on: ``config.engine`` ("fast": the fast executor, which runs every
    task and mechanism; "reference": the milestone functions), "reference" where ``diloco.engine``
    is not installed (a learner workspace)."""
    return config.engine if fast_engine_available() else "reference"


def outcome_of(arm: Arm, seed: int, config: DiLoCoConfig, history: list, seconds: float, engine: str) -> dict:
    """The per-run result: final held-out metrics, the best held-out loss, the cost."""
    last = history[-1]
    cosines = [r["pseudo_grad_cosine"] for r in history if r.get("pseudo_grad_cosine") is not None]
    return {
        "arm": arm.label, "algo": arm.algo, "seed": int(seed), "num_workers": config.num_workers,
        "inner_steps": config.inner_steps, "rounds": config.rounds, "steps_per_worker": config.total_steps,
        "inner_lr": config.inner.lr,
        "eval_loss": last["eval_loss"], "eval_accuracy": last["eval_accuracy"],
        "eval_perplexity": last["eval_perplexity"], "eval_bits": last["eval_bits"],
        "best_eval_loss": min(r["eval_loss"] for r in history),
        "all_reduces": int(sum(r["all_reduces"] for r in history)), "bytes_sent": last["cumulative_bytes"],
        "pseudo_grad_cosine": sum(cosines) / len(cosines) if cosines else None,
        "curve": [[r["step"], r["eval_loss"]] for r in history],
        "seconds": seconds, "engine": engine,
    }


def run_arm(arm: Arm, base: DiLoCoConfig, seed: int, dataset, *, encode=None, on_round=None, cache=None,
            data_key=None) -> dict:
    """Train ``arm`` with ``seed`` on ``dataset``; return ``outcome_of`` its history (for the
    transformer also ``eval_position_loss``: ``TransformerModel.position_losses`` of the final model).

    With ``cache`` (a ``RunCache``), a run already in it is not trained again: its stored
    outcome comes back relabelled, with ``"cached": True``. Either way the outcome holds
    ``split_divergence``, the mean KL divergence of the run's shards (``diloco.corpus.shard_divergence``).
    """
    config = base.replace(**arm.changes, seed=int(seed))
    engine = arm_engine(config, arm.algo, encode)
    config = config.replace(engine=engine)
    if cache is None:
        return _train_arm(arm, config, seed, dataset, engine, encode, on_round)
    key = RunCache.key(arm.algo, config, seed, data_key)
    outcome, hit = cache.through(key, lambda: _train_arm(arm, config, seed, dataset, engine, encode, on_round),
                                 RunCache.legacy_key(arm.algo, config, seed, data_key))
    return outcome if not hit else {**_with_divergence(outcome, config, dataset, encode), "arm": arm.label,
                                    "cached": True}


def _train_arm(arm: Arm, config: DiLoCoConfig, seed: int, dataset, engine: str, encode, on_round) -> dict:
    """``run_arm``'s training, once the cache has no outcome."""
    train = trainer(arm.algo, engine)
    extra = {} if encode is None else {"encode": encode}
    start = time.perf_counter()
    result = train(dataset.x_train, dataset.y_train, config, x_eval=dataset.x_test, y_eval=dataset.y_test,
                   on_round=on_round, **extra)
    outcome = outcome_of(arm, seed, config, result.history, time.perf_counter() - start, engine)
    outcome = _with_divergence(outcome, config, dataset, encode)
    if model_kind(config).sequence_model:  # its held-out loss at each position of a window
        model = model_for(config, result.params)
        outcome["eval_position_loss"] = [float(v) for v in model.position_losses(result.params, dataset.x_test,
                                                                                 dataset.y_test)]
    return outcome


def _with_divergence(outcome: dict, config: DiLoCoConfig, dataset, encode) -> dict:
    """``outcome`` with ``split_divergence``: how non-IID the run's shards are
    (``diloco.corpus.shard_divergence.run_split_divergence``; measured here for a cached run from
    before it was recorded)."""
    if outcome.get("split_divergence") is not None:
        return outcome
    divergence = run_split_divergence(dataset.x_train, dataset.y_train, config, text=encode is not None)
    return {**outcome, "split_divergence": divergence}


def next_on_ladder(value: float, *, up: bool) -> float:
    """The next value past ``value`` on the 1-3-10 ladder (..., 0.01, 0.03, 0.1, 0.3, ...):
    up from 0.01 is 0.03, from 0.03 (or 0.02, 0.05) is 0.1; down from 0.01 is 0.003."""
    exponent = math.floor(math.log10(value))
    mantissa = value / 10.0 ** exponent
    if up:
        mantissa, exponent = (3, exponent) if mantissa < 3 - 1e-9 else (1, exponent + 1)
    else:
        mantissa, exponent = ((3, exponent) if mantissa > 3 + 1e-9 else (1, exponent) if mantissa > 1 + 1e-9
                              else (3, exponent - 1))
    return float(f"{mantissa * 10.0 ** exponent:.1g}")


# The outer step's ladders past the joint grid's ends: outer lr in finer steps than 1-3-10
# (a 3x jump from 1.0 overshoots), momentum halving its distance to 1. Momentum 0 is the
# lowest there is; a feedback decay of 1 (no decay) the highest.
JOINT_LADDERS = {"outer_lr": (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0, 5.6, 8.0, 11.0, 16.0),
                 "outer_momentum": (0.0, 0.5, 0.9, 0.95, 0.975),
                 FEEDBACK_DECAY: (0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)}


def _on_joint_ladder(field: str, value: float, up: bool) -> float | None:
    ladder = JOINT_LADDERS[field]
    beyond = [v for v in ladder if (v > value + 1e-12 if up else v < value - 1e-12)]
    return (beyond[0] if up else beyond[-1]) if beyond else None


def past_the_edge(field, grid: list, best, added: dict, extend: int) -> list:
    """The values to try next because ``best`` sits at an end of ``grid`` (``[]``: none).

    A one-field grid steps past its end on the 1-3-10 ladder (``next_on_ladder``). A joint
    grid (``OUTER_STEP``, or outer lr x ``FEEDBACK_DECAY``) steps one coordinate at a time,
    the others held at ``best``: for each field whose best value is its largest (smallest)
    in the grid, the next value on ``JOINT_LADDERS``. Each field and direction is extended at most ``extend`` times
    (``added`` counts them)."""
    if isinstance(field, str):
        fields, points, best_point = (field,), [(v,) for v in grid], (best,)
    else:
        fields, points, best_point = tuple(field), [tuple(v) for v in grid], tuple(best)
    more = []
    for i, name in enumerate(fields):
        values = sorted({point[i] for point in points})
        if len(values) < 2:
            continue
        for up, edge in ((True, values[-1]), (False, values[0])):
            if best_point[i] != edge or added.get((name, up), 0) >= extend:
                continue
            if isinstance(field, str):
                nxt = next_on_ladder(edge, up=up)
            else:
                nxt = _on_joint_ladder(name, edge, up)
            if nxt is None:
                continue
            added[(name, up)] = added.get((name, up), 0) + 1
            point = best_point[:i] + (nxt,) + best_point[i + 1:]
            more.append(point[0] if isinstance(field, str) else point)
    return more


def tune_arms(steps, arms: list, base: DiLoCoConfig, dataset, seeds, *, encode=None, on_run=None, cache=None,
              data_key=None, extend: int = 2, run=None) -> tuple[list, list]:
    """Run the tuning ``steps`` (``TuneStep``) in order, each on the arms as the previous left them.

    For each group, the probe arm runs every grid value on ``seeds``; the value with the
    lowest mean final held-out loss goes to the group's targets (the grid's argmin; ties go
    to the smaller value; a diverged candidate scores infinity). When that value is at an
    end of the grid, the grid is extended past it (``past_the_edge``: the 1-3-10 ladder, or
    for the outer lr x momentum grid one coordinate at a time on ``JOINT_LADDERS``; up to
    ``extend`` values on each side), so a chosen value is never the last one tried unless
    the limit is hit or the ladder ends (momentum 0; ``extend=0``: tried as it is). ``run``
    trains one candidate (``run_arm``'s signature; ``run_arm`` by default): a study with its
    own runner (the family studies) tunes through this same loop; an arm is any
    ``NamedTuple`` with ``label``, ``algo`` and ``changes``.

    Returns
    -------
    (tuned_arms, tuning)
        The arms with their tuned values in ``changes`` (labels unchanged), and one
        record per (probe, value): ``arm``, ``field``, ``value``, ``eval_loss`` (mean over
        seeds), ``targets``, ``chosen`` and ``step`` (the index of its ``TuneStep``: the inner
        lr may be tuned twice, before and after the outer step), in the order tried.
    """
    def train(arm, base, seed, dataset, history=None):  # a candidate: no history, the study's data key
        return (run or run_arm)(arm, base, seed, dataset, encode=encode, cache=cache, data_key=data_key)

    by_label = {arm.label: arm for arm in arms}
    tuning = []
    for index, step in enumerate(steps):
        for probe, targets in step.groups:
            grid, scores, best = _tune_group(step, by_label[probe], base, dataset, seeds, train, on_run, extend)
            tuning += [{"arm": probe, "field": step.field, "value": value, "eval_loss": scores[value],
                        "targets": list(targets), "chosen": value == best, "step": index} for value in grid]
            for label in targets:
                target = by_label[label]
                by_label[label] = target._replace(changes=apply_value(target.changes, step.field, best))
    return [by_label[arm.label] for arm in arms], tuning


def _tune_group(step, arm, base, dataset, seeds, train, on_run, extend: int) -> tuple[list, dict, object]:
    """One group of a ``TuneStep``: ``arm`` at every grid value on ``seeds`` (the one study loop),
    the grid extended past a chosen end; ``(grid tried, mean loss per value, the chosen value)``."""
    scores: dict = {}
    grid, added = list(step.grid), {}
    while True:
        for value in [v for v in grid if v not in scores]:
            candidate = arm._replace(changes=apply_value(arm.changes, step.field, value))
            losses = [o["eval_loss"] for o in run_arms([candidate], seeds, train, base, dataset, on_run=on_run)]
            mean = sum(losses) / len(losses)
            scores[value] = mean if math.isfinite(mean) else math.inf  # a diverged run loses, never ties
        best = min(scores, key=lambda v: (scores[v], v))
        more = past_the_edge(step.field, grid, best, added, extend)
        if not more:
            return grid, scores, best
        grid += [v for v in more if v not in grid]


def write_study(run_dir: Path, summary: dict, title: str, table: str, export, export_name: str, *,
                plots: bool = True, figure=None, preface: str = "") -> None:
    """A study's outputs: ``summary.json``, ``study.md`` (``# title``, ``preface``, then ``table``) and,
    with ``plots``, ``study.png`` (``figure(summary)``; by default each arm's curve and final value,
    ``diloco.tools.studies.plots.plot_paper_study``) in ``run_dir``; with ``export``
    (a folder, or None) also ``export/<export_name>.json`` (and, with ``plots`` and a
    ``figure`` given, the plot as ``.png``); then the table and the run folder on standard output."""
    write_json(run_dir / "summary.json", summary)
    atomic_write_text(run_dir / "study.md", f"# {title}\n\n{preface}{table}")
    if plots:
        from diloco.tools.studies.plots import plot_paper_study, save_figure

        save_figure((figure or plot_paper_study)(summary), run_dir / "study.png")
    if export:
        target = Path(export)
        target.mkdir(parents=True, exist_ok=True)
        write_json(target / f"{export_name}.json", summary)
        if plots and figure is not None:
            shutil.copyfile(run_dir / "study.png", target / f"{export_name}.png")
    print(table, end="")
    print(f"run folder: {run_dir} ({summary['seconds']:.0f} s)")
