"""The family on real MPI ranks: ``train_family_mpi``, the one driver on the MPI executor.

Kept for its name: ``diloco.tools.cli.mpi.train_diloco_mpi`` runs every setting of
``config.family`` (compression, fragments, eager updates) with the round timeout and the
divergence guard. Each sync all-gathers the workers' encoded payloads
(``diloco.core.comm.all_reduce`` through ``MPIExecutor.gather``), so the result is
bit-identical to the single-process ``diloco.family.train_family``.
"""

from __future__ import annotations

from diloco.config import DiLoCoConfig
from diloco.core.driver import train
from diloco.core.hooks import Guard, callbacks
from diloco.family.config import FamilyConfig
from diloco.loop import TrainResult

__all__ = ["train_family_mpi"]


def train_family_mpi(x, y, config: DiLoCoConfig, comm, family: FamilyConfig, *, x_eval=None, y_eval=None,
                     on_round=None, round_timeout: float | None = None, max_loss: float | None = None
                     ) -> TrainResult:
    """``train_family`` with this process as worker ``comm.rank``.

    Returns the same ``TrainResult`` on every rank; each record also holds
    ``allreduce_seconds`` (wall time in this rank's collectives) and ``mpi_bytes_sent``
    (bytes this rank handed MPI for the other ranks in the round's syncs).
    """
    guard = Guard("diloco", max_loss)
    with guard.watch():
        return train("diloco", x, y, config.replace(family=family), x_eval=x_eval, y_eval=y_eval, executor="mpi",
                     hooks=[guard, *callbacks(on_round)], comm=comm, timeout=round_timeout, sync_fields=True)
