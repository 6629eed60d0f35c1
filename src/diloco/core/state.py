"""What a run carries from one round to the next: ``RunState``, the bottom floor of the core.

The driver (``diloco.core.driver``) hands a hook the ``RunState`` of its round, and a
checkpoint holds nothing else; every synchroniser (``diloco.core.synchronisers``) builds
it from its own state. It imports nothing from the core, so nothing circles through it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco.model import Params
from diloco.outer import OuterState

__all__ = ["RunState"]


class RunState(NamedTuple):
    """Everything a checkpoint holds after ``round`` rounds, nothing else.

    ``outer_state`` is the outer optimizer's state over every key (the fragments' states
    side by side: each fragment syncs once a round, so their step counts agree at a round's
    end); None for the baseline. ``worker_params`` is None while every worker starts the
    next round from ``global_params``. ``extra`` holds the schedule's state: error-feedback
    residuals, fragments still to merge, the eager workers' outer copies, the asynchronous
    clock.
    """

    round: int
    global_params: Params
    outer_state: OuterState | None
    worker_params: dict | None
    worker_states: dict
    rng: np.random.Generator
    history: list
    extra: dict
