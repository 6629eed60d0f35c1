"""The family's entry points, with the signature of ``train_diloco``, on the one driver.

``family_trainer(algo, family)`` gives a function ``train(x, y, config, *, x_eval, y_eval,
rng, on_round, max_loss, executor) -> TrainResult`` for the tools (``diloco study``'s
family studies): the driver (``diloco.core.driver.train``) with ``config.family = family``
(the baseline keeps only the simulated network of it), the divergence guard and, with a
simulated network (``family.bandwidth``), the network clock's ``sim_seconds``,
``sim_cumulative_seconds`` and ``sim_utilization`` on every record
(``diloco.core.netsim``).

``communication_report`` is ``communication_savings`` (milestone 30) at the real encoded
size: the wire format's bytes per value, scales and bitmaps included, taken from the
run's records.
"""

from __future__ import annotations

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.core.driver import baseline_config, train
from diloco.core.hooks import Guard, NetworkTimer, callbacks
from diloco.evaluation import communication_savings
from diloco.family.config import FamilyConfig

__all__ = ["family_trainer", "train_family", "communication_report"]


def train_family(x, y, config: DiLoCoConfig, family: FamilyConfig | None = None, *, on_round=None,
                 max_loss: float | None = None, executor: str = "reference", **kwargs):
    """DiLoCo under ``family`` (default ``config.family``): streaming, eager, compression, network clock."""
    return family_trainer("diloco", config.family if family is None else family)(
        x, y, config, on_round=on_round, max_loss=max_loss, executor=executor, **kwargs)


def family_trainer(algo: str, family: FamilyConfig, base=None):
    """The training function of ``algo`` under ``family`` (``base`` is accepted for old callers, unused)."""
    if not isinstance(family, FamilyConfig):
        raise TypeError(f"family must be a FamilyConfig, got {type(family).__name__}")

    def run(x, y, config, *, x_eval=None, y_eval=None, rng=None, on_round=None, max_loss=None,
            executor="reference", encode=None):
        config = config.replace(family=family)
        if algo == "sync":
            config = baseline_config(config)
        hooks = [NetworkTimer(config)] if family.simulates_network else []
        guard = Guard(algo, max_loss)
        hooks += [guard, *callbacks(on_round)]
        with guard.watch():
            return train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, rng=rng, encode=encode,
                         executor=executor, hooks=hooks, sync_fields=algo == "diloco")

    return run


def communication_report(history: list, config: DiLoCoConfig, num_params: int) -> dict:
    """``communication_savings``' fields for a finished family run, at the encoded size.

    The baseline's bytes (one all-reduce per step, params' precision) come from milestone
    30; DiLoCo's are the records' ``bytes_sent`` summed, and ``outer_bytes_per_value`` is
    the real average (``bytes / (2 (K-1)/K N)`` per all-reduce of the whole model).
    """
    itemsize = np.dtype(config.dtype).itemsize
    report = communication_savings(num_params, config.num_workers, config.inner_steps, config.rounds,
                                   bytes_per_value=itemsize)._asdict()
    diloco_bytes = float(sum(record["bytes_sent"] for record in history))
    report["diloco_bytes_per_worker"] = diloco_bytes
    report["diloco_all_reduces"] = int(sum(record["all_reduces"] for record in history))
    report["peak_sync_bytes"] = float(max(record.get("peak_sync_bytes", record["bytes_sent"]) for record in history))
    per_value = 2.0 * (config.num_workers - 1) / config.num_workers * num_params * len(history)
    report["outer_bytes_per_value"] = diloco_bytes / per_value if per_value else float(itemsize)
    report["savings_factor"] = (report["sync_bytes_per_worker"] / diloco_bytes if diloco_bytes
                                else report["savings_factor"] * itemsize / report["outer_bytes_per_value"])
    return report
