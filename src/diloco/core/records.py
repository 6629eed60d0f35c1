"""A round's record, built from what its synchroniser hands back (``RoundOutcome``).

Milestone 26's fields come from ``diloco.loop.round_record``; each mechanism adds its own,
in one small function each, in the order the history has always shown them:

* the per-sync fields (``all_reduces``, ``bytes_sent``, ``peak_sync_bytes``,
  ``bytes_per_step``, ``syncs``), when the run asks for them;
* the simulated clock of workers with speeds (``sim_seconds``, ``sim_cumulative_seconds``,
  ``sim_utilization``);
* asynchronous DiLoCo's arrivals (``arrivals``, ``max_staleness``);
* dropped workers, the pseudo-gradients' similarity, and the executor's own measurements
  (MPI: ``allreduce_seconds``, ``mpi_bytes_sent``, ``mpi_allreduce_bytes``).
"""

from __future__ import annotations

import numpy as np

from diloco.core.schedule import synchronous_round_seconds, worker_local_steps, worker_step_times
from diloco.core.synchronisers import RoundOutcome, trip_seconds
from diloco.loop import round_record

__all__ = ["SimulatedClock", "round_fields"]


class SimulatedClock:
    """The simulated clock of workers with speeds (``config.asynchrony``): the arrivals' time, or
    the wait for the slowest worker of a synchronous round."""

    def __init__(self, config, params) -> None:
        self.config, self.trip = config, trip_seconds(config, params)
        self.work = worker_step_times(config) * worker_local_steps(config)  # H_k c_k

    def fields(self, outcome: RoundOutcome, history: list) -> dict:
        before = history[-1]["sim_cumulative_seconds"] if history else 0.0
        now = outcome.now if outcome.now is not None else before + synchronous_round_seconds(self.config, self.trip)
        busy = self.work[list(outcome.arrived)].sum()  # compute seconds of the round's trips
        return {"sim_seconds": now - before, "sim_cumulative_seconds": now,
                "sim_utilization": float(min(1.0, busy / (self.config.num_workers * (now - before))))}


def _sync_fields(syncs: list, inner_steps: int) -> dict:
    sent = float(sum(s[1] for s in syncs))
    return {"all_reduces": len(syncs), "bytes_sent": sent, "peak_sync_bytes": float(max((s[1] for s in syncs),
                                                                                          default=0.0)),
            "bytes_per_step": sent / inner_steps, "syncs": syncs}


def _mean_cosine(cosines: list):
    if not cosines or any(c is None for c in cosines):
        return None
    return float(np.mean(cosines))


def round_fields(outcome: RoundOutcome, params, step_losses: dict, config, *, sync_fields: bool,
                 clock: SimulatedClock | None, history: list, executor) -> dict:
    """The training fields of a round's record (before the held-out evaluation)."""
    mean_losses = {k: float(v.mean()) for k, v in step_losses.items()}
    lost = sorted(set(getattr(executor, "lost", ())) - set(mean_losses))  # processes that died (MPI, ULFM)
    filled = {**mean_losses, **dict.fromkeys(lost, 0.0)}
    record = round_record([filled[k] for k in sorted(filled)], params, config, pseudo_grad=outcome.delta)
    if lost:  # their losses are unknown: null, and the inner loss is the mean of the workers that trained
        record.update(lost_workers=lost, inner_loss=float(np.mean(list(mean_losses.values()))),
                      worker_losses=[mean_losses.get(k) for k in sorted(filled)])
    if sync_fields:
        record.update(_sync_fields(outcome.syncs, config.inner_steps))
    if clock is not None:
        record.update(clock.fields(outcome, history))
    if outcome.staleness is not None:  # one outer step per group of arrivals
        record.update(all_reduces=len(outcome.syncs), arrivals=list(outcome.arrived), max_staleness=outcome.staleness)
    if config.drop_prob > 0 or lost:
        record["dropped_workers"] = outcome.dropped
    if config.record_similarity:
        record["pseudo_grad_cosine"] = _mean_cosine(outcome.cosines)
    record.update(executor.round_fields())
    return record
