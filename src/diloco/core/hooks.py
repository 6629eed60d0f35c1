"""The driver's hooks: the divergence guard, round callbacks and the network clock.

A hook is any object with ``trained(record, (params, losses))`` (called after a round's
training, before the held-out evaluation, with the new global params and each worker's
per-step training losses) and/or
``finished(record, get_state)`` (after it).
``get_state()`` builds the round's ``diloco.core.driver.RunState``; a hook that needs no
state never pays for it. The tools pass them in this order: the network clock, the guard,
the callbacks (history file, progress bar), then the checkpoint (``KeepLastRound`` of
``diloco.tools.runs.training``, which also keeps the last round for an interrupt), so a
checkpoint never holds a round its history lacks and no bad round is checkpointed. The
callbacks and the kept copy are one step for a stop signal (``RoundEnd`` there), so the
round an interrupt saves is never behind the history either.
"""

from __future__ import annotations

import time

from diloco.core.divergence import Guard
from diloco.core.netsim import NetworkClock

__all__ = ["Guard", "Callback", "NetworkTimer", "callbacks"]


class Callback:
    """Calls ``function(record)`` after every round (history writers, progress bars)."""

    def __init__(self, function) -> None:
        self.function = function

    def finished(self, record, get_state) -> None:
        self.function(record)


class NetworkTimer:
    """The simulated network's ``sim_*`` fields (``diloco.core.netsim``) on every record.

    Create it right before training starts: without ``family.step_time`` the first
    round's wall time divided by K H is the measured compute time per inner step.
    """

    def __init__(self, config) -> None:
        self.config, self.family = config, config.family
        self.clock, self.last = None, time.perf_counter()

    def finished(self, record, get_state) -> None:
        if "sim_cumulative_seconds" in record:  # workers with speeds: the driver's own clock (diloco.core.schedule)
            return
        if self.clock is None:
            step_time = self.family.step_time
            if step_time is None:  # measured on the first round
                step_time = (time.perf_counter() - self.last) / (self.config.num_workers * self.config.inner_steps)
            self.clock = NetworkClock(self.config.num_workers, self.config.inner_steps, self.family.bandwidth,
                                      self.family.latency, max(step_time, 1e-9))
            record["sim_step_time"] = self.clock.step_time
        record.update(self.clock.advance(record))


def callbacks(on_round) -> tuple:
    """The hooks of a trainer's ``on_round`` argument: ``(Callback(on_round),)``, or none."""
    if on_round is not None and not callable(on_round):
        raise TypeError(f"on_round must be callable (a function of the round's record), got {type(on_round).__name__}")
    return () if on_round is None else (Callback(on_round),)
