"""The executor interface is a Protocol (``diloco.core.executors.Executor``), and every executor meets it."""

from __future__ import annotations

import numpy as np
import pytest

from diloco.config import DiLoCoConfig
from diloco.core.executors import Executor, MPIExecutor, ReferenceExecutor
from diloco.engine.fast import FastExecutor

CALLS = ("load", "run", "run_sync", "shared", "read", "write", "gather", "round_fields", "round_ended", "snapshot")


def test_the_protocol_names_the_calls_the_driver_makes():
    assert set(CALLS) <= set(dir(Executor))


@pytest.mark.parametrize("cls", [ReferenceExecutor, MPIExecutor, FastExecutor])
def test_every_executor_class_has_every_call(cls):
    missing = [name for name in CALLS if not callable(getattr(cls, name, None))]
    assert not missing, f"{cls.__name__} lacks {missing}"


@pytest.mark.parametrize("cls", [ReferenceExecutor, FastExecutor])
def test_an_executor_is_an_executor_and_a_stub_is_not(cls):
    config = DiLoCoConfig(num_workers=2, hidden_sizes=(4,))
    shards = [(np.zeros((4, 3)), np.zeros(4, dtype=int))] * 2
    assert isinstance(cls(shards, config), Executor)

    class Partial:
        name, workers = "partial", (0,)

        def run(self, rngs, steps, workers=None):
            return {}

    assert not isinstance(Partial(), Executor)
