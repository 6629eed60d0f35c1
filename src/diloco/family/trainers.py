"""One entry point per algorithm of the family, with the signature of ``train_diloco``.

``family_trainer(algo, family, base)`` gives a function ``train(x, y, config, *, x_eval,
y_eval, rng, on_round) -> TrainResult`` for the tools (``diloco train/compare/study``):

* ``algo="diloco"``: ``train_eager`` with ``family.eager``, else ``train_streaming`` (any
  fragments, overlap, mix and wire format); plain DiLoCo settings return ``base`` itself
  (the milestone ``train_diloco``, or the fast engine's) unchanged.
* ``algo="sync"``: ``base`` (the baseline has no outer gradient to compress).

With a simulated network (``family.bandwidth``) every record also gets ``sim_seconds``,
``sim_cumulative_seconds`` and ``sim_utilization`` (``diloco.family.netsim``); without
``family.step_time`` the compute time per inner step is measured: the round's wall time
divided by K H (the K workers run one after another here; evaluation included).

``communication_report`` is ``communication_savings`` (milestone 30) at the real encoded
size: the wire format's bytes per value, scales and bitmaps included, taken from the
run's records.
"""

from __future__ import annotations

import functools
import time

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.evaluation import communication_savings
from diloco.family.config import FamilyConfig
from diloco.family.eager import train_eager
from diloco.family.netsim import NetworkClock
from diloco.family.streaming import train_streaming

__all__ = ["family_trainer", "train_family", "communication_report", "with_network", "network_callback"]


def train_family(x, y, config: DiLoCoConfig, family: FamilyConfig | None = None, **kwargs):
    """``train_eager`` or ``train_streaming`` as ``family`` says (network annotation included)."""
    family = FamilyConfig() if family is None else family
    train = functools.partial(train_eager if family.eager else train_streaming, family=family)
    return with_network(train, family)(x, y, config, **kwargs)


def network_callback(family: FamilyConfig, config: DiLoCoConfig, on_round=None):
    """A round callback that adds the simulated network's ``sim_*`` fields, then calls ``on_round``.

    Create it right before training starts: without ``family.step_time`` the first
    round's wall time (divided by K H) is the measured compute time per inner step.
    """
    state = {"clock": None, "last": time.perf_counter()}

    def annotate(record):
        if state["clock"] is None:
            step_time = family.step_time
            if step_time is None:  # measured on the first round
                step_time = (time.perf_counter() - state["last"]) / (config.num_workers * config.inner_steps)
            state["clock"] = NetworkClock(config.num_workers, config.inner_steps, family.bandwidth,
                                          family.latency, max(step_time, 1e-9))
            record["sim_step_time"] = state["clock"].step_time
        record.update(state["clock"].advance(record))
        if on_round is not None:
            on_round(record)

    return annotate


def with_network(train, family: FamilyConfig):
    """``train`` whose records also carry the simulated network's ``sim_*`` fields."""
    if not family.simulates_network:
        return train

    @functools.wraps(train)
    def simulated(x, y, config, *, on_round=None, **kwargs):
        return train(x, y, config, on_round=network_callback(family, config, on_round), **kwargs)

    return simulated


def family_trainer(algo: str, family: FamilyConfig, base):
    """The training function of ``algo`` under ``family``; ``base`` is the plain one."""
    if algo == "diloco" and not family.algorithm_is_diloco():
        train = functools.partial(train_eager if family.eager else train_streaming, family=family)
    else:
        train = base
    return with_network(train, family)


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
