"""``diloco train`` and ``compare`` under the family's flags (``diloco.tools.family_flags``).

``diloco.tools.commands`` calls these few hooks, so the commands stay as they are when no
family flag is given:

* ``check_family(args, command, algos, config)`` before the run folder is made: the
  ``FamilyConfig`` of the flags, or ``CliError``.
* ``run_with_family(algo, family, config, data, on_round, resumable)``: trains ``algo``.
  Plain DiLoCo and the baseline go through ``resumable`` (checkpoints and the divergence
  guard of ``diloco.tools.training``); a run whose algorithm the family changes
  (compression, fragments, eager) goes through ``diloco.family.family_trainer``, which
  has no checkpoints. A simulated network annotates the records either way.
* ``family_summary(family, config, records_by_algo, num_params, savings)``: the encoded
  communication report and the simulated time, for ``summary.json`` and the table.
"""

from __future__ import annotations

from diloco.family.config import FamilyConfig
from diloco.family.trainers import communication_report, family_trainer, network_callback
from diloco.tools.errors import CliError
from diloco.tools.family_flags import build_family, resolve_family_trainer

__all__ = ["check_family", "run_with_family", "family_summary", "print_family"]


def check_family(args, command: str, algos, config) -> FamilyConfig:
    """The family settings of a ``train``/``compare`` run, checked against its algorithms."""
    family = build_family(args)
    if getattr(args, "data", None) == "shakespeare" and not family.algorithm_is_diloco():
        raise CliError("the family's trainers take feature vectors, not the character-level task's windows: "
                       "use --data digits, mnist1d or an .npz with --comm-dtype/--fragments/--eager")
    for algo in algos:
        resolve_family_trainer(algo, family, None, strict=command == "train")
    changes_algorithm = "diloco" in algos and not family.algorithm_is_diloco()
    if changes_algorithm:
        try:
            family.check_against(config)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    if changes_algorithm and (getattr(args, "resume", None) or getattr(args, "checkpoint_every", None)):
        raise CliError("--checkpoint-every and --resume cover DiLoCo and the baseline only, not the family's "
                       "--comm-dtype/--sign-prune/--fragments/--overlap/--mix/--eager runs")
    return family


def run_with_family(algo: str, family: FamilyConfig | None, config, data, on_round, resumable):
    """Train ``algo``: ``resumable(on_round)``, or the family's trainer (see the module doc)."""
    if family is None or family == FamilyConfig():
        return resumable(on_round)
    callback = network_callback(family, config, on_round) if family.simulates_network else on_round
    if algo == "diloco" and not family.algorithm_is_diloco():
        if getattr(data, "encode", None) is not None:
            raise CliError("the family's trainers do not take an input encoder (the character-level task)")
        train = family_trainer(algo, family.replace(bandwidth=None, latency=0.0, step_time=None), None)
        try:
            return train(data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test,
                         on_round=callback)
        except (TypeError, ValueError) as exc:  # e.g. more fragments than layers
            raise CliError(f"cannot train {algo}: {exc}") from None
    return resumable(callback)


def family_summary(family: FamilyConfig | None, config, records_by_algo: dict, num_params: int,
                   savings: dict) -> tuple[dict, dict]:
    """``(extra summary fields, savings)``: savings at the encoded size when DiLoCo is encoded."""
    if family is None or family == FamilyConfig():
        return {}, savings
    extra: dict = {"family": family.to_dict()}
    if "diloco" in records_by_algo and records_by_algo["diloco"]:
        savings = communication_report(records_by_algo["diloco"], config, num_params)
    if family.simulates_network:
        extra["simulated"] = {
            algo: {"seconds": records[-1]["sim_cumulative_seconds"],
                   "compute_utilization": sum(r["sim_utilization"] * r["sim_seconds"] for r in records)
                   / records[-1]["sim_cumulative_seconds"],
                   "step_time": records[0].get("sim_step_time")}
            for algo, records in records_by_algo.items() if records and "sim_seconds" in records[-1]}
    return extra, savings


def print_family(extra: dict) -> None:
    """One line per algorithm with its simulated time, when a network was simulated."""
    for algo, sim in extra.get("simulated", {}).items():
        print(f"{algo}: simulated {sim['seconds']:.3g} s on the network, compute utilization "
              f"{100 * sim['compute_utilization']:.1f}% (step time {sim['step_time']:.3g} s)")
