"""The one study loop: every arm on every seed, in order.

``run_arms`` is the loop of every study: the one runner (``diloco.tools.studies.runner``)
calls it with its cached ``train``, and ``ablations.run_study`` (the notebooks' call) with
the plain one. It imports nothing of the studies, so both can use it.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["run_arms"]


def run_arms(arms, seeds, train: Callable, base, data, *, history=None, on_run: Callable | None = None) -> list:
    """``train(arm, base, seed, data, history=history)`` for each arm, then each seed; the
    outcomes in that order, each also passed to ``on_run`` as it comes."""
    outcomes = []
    for arm in arms:
        for seed in seeds:
            outcome = train(arm, base, seed, data, history=history)
            outcomes.append(outcome)
            if on_run is not None:
                on_run(outcome)
    return outcomes
