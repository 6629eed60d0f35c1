"""``diloco train`` and ``compare`` under the family's flags (``diloco.tools.cli.family_flags``).

``diloco.tools.cli.commands`` calls these few hooks, so the commands stay as they are when no
family flag is given:

* ``check_family(args, command, algos, config)`` before the run folder is made: the
  config's family section (``DiLoCoConfig.family``, built from the flags by
  ``diloco.tools.cli.flags.build_config``), or ``CliError``.
* ``run_with_family(algo, family, config, data, on_round, resumable)``: trains ``algo``
  through ``resumable``, the one driver with checkpoints, resume, the divergence guard
  and the network clock, whatever the family settings.
* ``family_summary(family, config, records_by_algo, num_params, savings)``: the encoded
  communication report and the simulated time, for ``summary.json`` and the table.
"""

from __future__ import annotations

from diloco.config.sections import FamilyConfig
from diloco.core.driver import baseline_config, check_algorithm
from diloco.core.trainers import communication_report
from diloco.tools.cli.errors import CliError

__all__ = ["check_family", "run_with_family", "family_summary", "print_family"]


def check_family(args, command: str, algos, config) -> FamilyConfig:
    """The family section of a ``train``/``compare`` run's config, checked against its algorithms.

    ``train --algo sync`` refuses DiLoCo's outer-gradient settings in one line (the
    baseline has none); ``compare`` trains the baseline without them
    (``diloco.core.driver.baseline_config``).
    """
    for algo in algos:
        try:
            check_algorithm(algo, config if command == "train" else (baseline_config(config) if algo == "sync"
                                                                      else config))
        except ValueError as exc:
            raise CliError(str(exc) + (" (use --algo diloco, or compare)" if algo == "sync" else "")) from None
    return config.family


def run_with_family(algo: str, family: FamilyConfig | None, config, data, on_round, resumable):
    """Train ``algo`` through ``resumable(on_round)``: the driver runs the family's settings
    (``config.family``), with checkpoints, resume, the divergence guard and the network clock."""
    return resumable(on_round)


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
        step = "per worker: --step-times" if sim["step_time"] is None else f"{sim['step_time']:.3g} s"
        print(f"{algo}: simulated {sim['seconds']:.3g} s on the network, compute utilization "
              f"{100 * sim['compute_utilization']:.1f}% (step time {step})")
