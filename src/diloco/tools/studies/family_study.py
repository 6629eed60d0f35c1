"""``diloco study compression|streaming|bandwidth``: the family's claims at small scale.

* ``compression``: the wire format of outer gradients (``--values`` among ``native``,
  ``float32``, ``bfloat16``, ``float16``, ``int8``, ``fp4``, ``fp4/tensor`` (one scale per
  tensor), ``fp4+ef`` (error feedback), ``pruneF`` (sign pruning a fraction F) and
  ``fp4+pruneF``). Claims: 4-bit outer gradients lose nothing (Streaming DiLoCo);
  pruning half of them costs 0.39% perplexity (DiLoCo, Table 6).
* ``streaming``: Streaming DiLoCo's ``P:TAU:MIX`` (``P:TAU:MIX:fp4`` with 4-bit outer
  gradients). Claim: the same quality at P times lower peak bandwidth.
* ``bandwidth``: sync, DiLoCo, Streaming DiLoCo and eager updates, trained once per
  seed, then the simulated network (``diloco.core.netsim``) at each bandwidth of
  ``--values``: simulated time to a target held-out loss (``--target-loss``) and compute
  utilisation. Claims: streaming and eager hide communication; eager updates close the
  gap at low bandwidth.

Every arm runs on the fast (stacked) executor, 8 workers, 24 rounds of H = 25, hidden
layers (64, 64, 64) (four layers, so P can be 4) unless the flags say otherwise. Before
the evaluation seeds, every arm's inner lr is tuned over ``INNER_GRID``, then each DiLoCo
arm's outer lr x momentum (``paper_runs.outer_step_grid``, extended past a chosen edge),
then its inner lr again, all on seed 1000 (``--outer-lr`` or ``--outer-momentum`` given: no
tuning). The
bandwidth study's target loss is, unless ``--target-loss`` is given, the lowest held-out
loss every run of every arm reaches (``reached_by_every_run``). With ``--export DIR`` the study's
runs, rows, claims and verdicts (``diloco.tools.studies.family_report``) are written to
``DIR/family-<study>.json``, the file ``docs/results-family.md`` is rendered from. The
rows reuse ``diloco.tools.studies.ablations``' statistics (mean and 95% Student-t interval
over seeds); the tables, the time to target and its plot are in
``diloco.tools.studies.family_tables``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import NamedTuple

from diloco.config.sections import FamilyConfig
from diloco.core.divergence import Diverged
from diloco.core.netsim import parse_bandwidth
from diloco.core.trainers import family_trainer
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flags import build_config, build_family, load_dataset
from diloco.tools.cli.run_setup import check_plotting, max_loss_flag, study_values
from diloco.tools.studies.ablation_spec import AblationSpec, save_study_plots, study_preface
from diloco.tools.studies.ablations import Study, default_engine, outcome_fields, replay_rounds, summarise
from diloco.tools.studies.family_report import family_claims, judge_family_claims, render_family_block
from diloco.tools.studies.family_tables import bandwidth_rows, plot_time_to_target, time_to_target
from diloco.tools.studies.paper_runs import self_tuning, tune_arms, write_study
from diloco.tools.studies.runner import Done, Plan, check_tune_seeds

__all__ = ["FAMILY_STUDIES", "FamilyVariant", "run_family_variant", "FamilySpec"]


class FamilyVariant(NamedTuple):
    """One arm: a label, ``"diloco"`` or ``"sync"``, config changes and family changes."""

    label: str
    algo: str
    changes: dict
    family: dict


def _compression_variants(config, values) -> list:
    variants = []
    for value in values:
        family: dict = {}
        for part in value.split("+"):
            if part == "native":
                continue
            if part in ("float32", "float16", "bfloat16", "int8", "fp4"):
                family["comm_dtype"] = part
            elif part == "fp4/tensor":
                family.update(comm_dtype="fp4", comm_block=0)
            elif part == "ef":
                family["error_feedback"] = True
            elif part.startswith("prune"):
                try:
                    family["sign_prune"] = float(part[len("prune"):])
                except ValueError:
                    raise ValueError(f"pruneF needs a fraction, got {part!r}") from None
            else:
                raise ValueError(f"unknown compression {part!r}: use native, float32, float16, bfloat16, int8, "
                                 f"fp4, fp4/tensor, ef, pruneF, joined by +")
        FamilyConfig(**family)  # validates
        variants.append(FamilyVariant(value, "diloco", {}, family))
    return variants


def _streaming_variants(config, values) -> list:
    variants = []
    for value in values:
        parts = value.split(":")
        try:
            fragments, tau, mix = int(parts[0]), int(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            raise ValueError(f"streaming values are P:TAU:MIX or P:TAU:MIX:fp4, got {value!r}") from None
        family = {"fragments": fragments, "overlap": tau, "mix": mix}
        if parts[3:] == ["fp4"]:
            family["comm_dtype"] = "fp4"
        elif parts[3:]:
            raise ValueError(f"streaming values are P:TAU:MIX or P:TAU:MIX:fp4, got {value!r}")
        FamilyConfig(**family).check_against(config)
        label = "DiLoCo (P=1)" if (fragments, tau, mix) == (1, 0, 1.0) and "comm_dtype" not in family else (
            f"P={fragments} tau={tau} mix={mix:g}" + (" fp4" if "comm_dtype" in family else ""))
        variants.append(FamilyVariant(label, "diloco", {}, family))
    return variants


def _bandwidth_variants(config, values) -> list:
    for value in values:
        parse_bandwidth(value)  # the values are bandwidths; the arms are fixed
    tau = max(1, config.inner_steps // 5)
    return [
        FamilyVariant("sync", "sync", {}, {}),
        FamilyVariant("DiLoCo", "diloco", {}, {}),
        FamilyVariant(f"Streaming P=4 tau={tau} mix=0.5 fp4", "diloco", {},
                      {"fragments": 4, "overlap": tau, "mix": 0.5, "comm_dtype": "fp4"}),
        FamilyVariant("eager", "diloco", {}, {"eager": True}),
    ]


_BASE = {"rounds": 24, "inner_steps": 25, "hidden_sizes": (64, 64, 64), "engine": default_engine()}
INNER_GRID = (3e-4, 1e-3, 3e-3)  # around AdamWConfig's default lr, 1e-3

FAMILY_STUDIES = {
    "compression": Study(
        "compression", "Wire formats of the outer gradients",
        "4-bit (fp4 E2M1) outer gradients are lossless (Streaming DiLoCo); pruning 50% of the outer gradient "
        "costs 0.39% perplexity (DiLoCo, Table 6)", "wire format", dict(_BASE),
        ("native", "bfloat16", "int8", "fp4", "fp4+ef", "prune0.5"), _compression_variants),
    "streaming": Study(
        "streaming", "Streaming DiLoCo: fragments P, overlap tau, mixing",
        "Streaming DiLoCo keeps DiLoCo's quality at P times lower peak bandwidth", "P:tau:mix", dict(_BASE),
        ("1:0:1", "2:0:1", "4:0:1", "4:5:1", "4:5:0.5", "4:5:0.5:fp4"), _streaming_variants),
    "bandwidth": Study(
        "bandwidth", "Simulated time to a target loss against bandwidth",
        "overlapping communication (Streaming DiLoCo, eager updates) keeps compute busy at low bandwidth; eager "
        "updates close DiLoCo's gap there", "bandwidth", dict(_BASE),
        ("100kbit", "1Mbit", "10Mbit", "100Mbit", "1Gbit"), _bandwidth_variants),
}


# What an outcome keeps of each round: the time to target's fields, and the curves' (a run read
# back from the run cache is replayed into history.jsonl from them, ``FamilySpec.replay``).
_ROUND_FIELDS = ("round", "step", "eval_loss", "eval_accuracy", "cumulative_bytes", "all_reduces", "bytes_sent",
                 "syncs")


def run_family_variant(variant, config, family: FamilyConfig, dataset, seed: int, *, history=None,
                       max_loss: float | None = None) -> dict:
    """Train one arm with ``seed``; its outcome (the ablations' fields, the peak bytes of a sync,
    the family settings and the rounds' ``_ROUND_FIELDS``). ``history`` receives every round."""
    run_config = config.replace(**variant.changes, seed=int(seed))
    run_family = family.replace(**variant.family, bandwidth=None, latency=0.0, step_time=None)
    train = family_trainer(variant.algo, run_family)
    on_round = None if history is None else history.callback(variant.algo, variant=variant.label, seed=int(seed))
    start = time.perf_counter()
    try:
        result = train(dataset.x_train, dataset.y_train, run_config, x_eval=dataset.x_test, y_eval=dataset.y_test,
                       on_round=on_round, max_loss=max_loss, executor=config.engine, encode=dataset.encode)
    except Diverged as exc:  # name the run: which arm, which seed
        raise Diverged(exc.algo, exc.round, exc.worker, exc.quantity, exc.step,
                       f"variant {variant.label}, seed {seed}") from None
    return {**outcome_fields(variant, seed, run_config, result.history, time.perf_counter() - start),
            "peak_sync_bytes": max(r.get("peak_sync_bytes", r["bytes_sent"] / r["all_reduces"])
                                   for r in result.history),
            "family": run_family.to_dict(),
            "history": [{k: r[k] for k in _ROUND_FIELDS if k in r} for r in result.history]}


def family_runner(config, family, max_loss=None):
    """``paper_runs.run_arm``'s signature over ``run_family_variant``. A tuning run (no
    ``history``) that diverges scores an infinite loss; an evaluation run (rounds to
    ``history``) raises ``Diverged``, naming the variant and the seed."""
    def run(variant, base, seed, dataset, history=None, **_):
        if history is not None:
            return run_family_variant(variant, config, family, dataset, seed, history=history, max_loss=max_loss)
        try:
            outcome = run_family_variant(variant, config, family, dataset, seed, max_loss=max_loss)
        except Diverged:
            return {"eval_loss": math.inf, "seed": int(seed)}
        return outcome if math.isfinite(outcome["eval_loss"]) else {**outcome, "eval_loss": math.inf}
    return run


def tune_outer_step(variants, config, family, dataset, seeds, max_loss=None) -> tuple:
    """``paper_runs.self_tuning`` over ``INNER_GRID`` run by ``paper_runs.tune_arms`` on ``seeds``."""
    return tune_arms(self_tuning(variants, INNER_GRID), variants, config, dataset, seeds,
                     run=family_runner(config, family, max_loss))


def reached_by_every_run(outcomes) -> float:
    """The bandwidth study's default target: the lowest held-out loss that every run (each
    arm, each seed) reaches at some round, the largest of the runs' best losses. Every arm
    then has a time to it on every seed, so each claim compares arms, not which runs got there."""
    return float(max(min(r["eval_loss"] for r in o["history"]) for o in outcomes))


def _seconds_to_target(outcomes, values, latency, step_time, target) -> dict:
    """``{(arm, bandwidth): {seed: simulated seconds to target, or None}}``."""
    out: dict = {}
    for outcome in outcomes:
        for text in values:
            t, _ = time_to_target(outcome["history"], outcome["num_workers"], outcome["inner_steps"],
                                  parse_bandwidth(text), latency, step_time, target)
            out.setdefault((outcome["variant"], text), {})[outcome["seed"]] = t
    return out


def _family_checks(args, study, config, family, values):
    """The variants of ``values`` checked against the config, and the bandwidth study's flags:
    ``(variants, family, target loss or None)``."""
    if args.total_steps is not None:
        raise CliError("--total-steps applies only to the inner-steps study")
    try:
        variants = study.variants(config, values)
        for variant in variants:
            if variant.algo == "diloco":
                family.replace(**variant.family).check_against(config.replace(**variant.changes))
    except (TypeError, ValueError) as exc:
        raise CliError(f"--values: {exc}") from None
    target = getattr(args, "target_loss", None)
    if study.name == "bandwidth":
        if family.step_time is None:
            family = family.replace(step_time=0.01)  # a fixed compute time: the table is reproducible
        if target is not None and not (math.isfinite(target) and target > 0):
            raise CliError(f"--target-loss must be a positive number, got {target}")
    elif target is not None:
        raise CliError("--target-loss applies only to the bandwidth study")
    return variants, family, target


class FamilySpec(AblationSpec):
    """``diloco study compression|streaming|bandwidth`` as a spec of the one runner
    (``runner.run_spec``): each run is ``family_runner``'s, cached with its variant's family."""

    def plan(self, args) -> Plan:
        study = self.study
        config, family = build_config(args, study.base), build_family(args)
        values = study_values(args, study.default_values)
        variants, family, target = _family_checks(args, study, config, family, values)
        check_plotting(args)
        data, data_info = load_dataset(args, config.dtype)
        seeds = list(range(config.seed, config.seed + args.seeds))
        tune = getattr(args, "outer_momentum", None) is None and getattr(args, "outer_lr", None) is None
        record = {**self.record(values, seeds, variants), "family": family.to_dict(), "target_loss": target}
        max_loss = max_loss_flag(args)
        return Plan(study.name, f"study-{study.name}", config, variants, seeds,
                    check_tune_seeds(args, seeds, count=1) if tune else [],
                    self_tuning(variants, INNER_GRID) if tune else [], data, data_info, record,
                    f"study {study.name}: {len(variants)} arms x {len(seeds)} seeds on {data_info['name']}; "
                    f"claim: {study.claim}", run=family_runner(config, family, max_loss),
                    runner=f"family {json.dumps(family.to_dict(), sort_keys=True)} max loss {max_loss}",
                    extra={"values": values, "family": family, "target": target}, label_key="variant",
                    replay=replay_rounds)

    def summary(self, plan: Plan, done: Done) -> dict:
        study, outcomes, values, family = self.study, done.outcomes, plan.extra["values"], plan.extra["family"]
        target = plan.extra["target"]
        summary = {"command": "study", "study": study.name, "status": "completed", "claim": study.claim,
                   "seeds": plan.seeds, "rows": summarise(outcomes)}
        seconds = None
        if study.name == "bandwidth":
            target = reached_by_every_run(outcomes) if target is None else target
            summary["bandwidth"] = bandwidth_rows(outcomes, values, family.latency, family.step_time, target)
            seconds = _seconds_to_target(outcomes, values, family.latency, family.step_time, target)
        claims = judge_family_claims(family_claims(study.name, [v.label for v in done.arms], values), outcomes,
                                     seconds)
        summary.update(claims=claims, tuning=done.tuning, tune_seeds=plan.tune_seeds, rounds=plan.config.rounds,
                       values=list(values), target_loss=target,
                       outcomes=[{k: v for k, v in o.items() if k not in ("history", "cached")} for o in outcomes],
                       seconds=done.seconds,
                       command=f"diloco study {study.name} --seeds {len(plan.seeds)} --rounds {plan.config.rounds}")
        return summary

    def write(self, plan: Plan, summary: dict, done: Done, args) -> None:
        study, export = self.study, getattr(args, "export", None)
        preface = study_preface(study, plan, f"; family flags `{json.dumps(plan.extra['family'].to_dict())}`")
        write_study(done.run_dir, summary, f"Study {study.name}: {study.title}", render_family_block(summary), export,
                    f"family-{study.name}", plots=False, preface=preface)
        if not args.no_plots:
            _plots(study, summary, plan, done, export)


def _plots(study, summary: dict, plan: Plan, done: Done, export) -> None:
    """``study.png``, ``study_curves.png`` (and ``time_to_target.png``) in the run folder; the
    exported plot (the bandwidth study's time to target, the others' final metrics)."""
    from diloco.tools.studies.plots import plot_study, save_figure

    values, target, rows = plan.extra["values"], summary["target_loss"], summary["rows"]
    save_study_plots(study, rows, done, f"{study.name}: held-out curves, mean over {len(plan.seeds)} seeds")
    if export:
        save_figure(plot_time_to_target(summary["bandwidth"], values, target) if study.name == "bandwidth"
                    else plot_study(rows, title=study.title, xlabel=study.xlabel),
                    Path(export) / f"family-{study.name}.png")
    if study.name == "bandwidth":
        save_figure(plot_time_to_target(summary["bandwidth"], values, target), done.run_dir / "time_to_target.png")

