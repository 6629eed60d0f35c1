"""Which MPI ranks are still alive: a dead worker becomes a dropped worker (ULFM).

The MPI executor's collectives run through ``Membership.survive(op)``. Without fault
tolerance that is just ``op()``: a rank that dies ends the job (``mpiexec`` sees it, or
``--round-timeout`` fires). With it (``diloco.tools.cli.mpi --survive-failures``), an MPI
that implements ULFM, the User-Level Failure Mitigation interface (Bland et al., 2013),
reports the dead peer as an error of class ``MPI_ERR_PROC_FAILED`` (or ``MPI_ERR_REVOKED``)
instead of ending the job, and ``survive``:

1. revokes the communicator (``MPIX_Comm_revoke``), so every rank leaves the collective;
2. agrees with the survivors whether every one of them finished ``op``
   (``MPIX_Comm_iagree`` of a flag, after ``MPIX_Comm_ack_failed``; it is fault tolerant);
3. if not, shrinks the communicator to the survivors (``MPIX_Comm_shrink``, which keeps
   their order), records the workers that are gone in ``lost``, and runs ``op`` again on
   the new communicator, where the lost workers contribute nothing: dropped workers.

A worker keeps its index (its rank in ``MPI_COMM_WORLD``) in the shrunk communicators;
``members[r]`` is the worker of rank ``r``. Of the MPIs this project ships or tests, only
Open MPI 5 started with ``mpiexec --with-ft ulfm`` does this; MPICH 5.0.2's wheel has the
calls but fails in ``MPI_Init`` when ``MPIR_CVAR_ENABLE_FT=1`` (docs/failure-and-recovery.md).
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["Membership", "ulfm_problem"]


def ulfm_problem() -> str | None:
    """Why this process cannot survive a rank's death (None when it can): the MPI and its launch."""
    from mpi4py import MPI

    library = MPI.Get_library_version().strip().splitlines()[0]
    if "Open MPI" not in library:
        return (f"--survive-failures needs an MPI with ULFM fault tolerance, Open MPI 5 started as `mpiexec --with-ft "
                f"ulfm`; this is {library} (MPICH's MPIR_CVAR_ENABLE_FT=1 fails in MPI_Init, "
                f"docs/failure-and-recovery.md)")
    if os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() not in ("1", "true", "yes"):
        return "--survive-failures needs Open MPI's fault tolerance on: start the job with `mpiexec --with-ft ulfm`"
    return None


class Membership:
    """The executor's communicator and the workers it holds (module doc)."""

    def __init__(self, comm, fault_tolerant: bool = False, wait=None) -> None:
        self.comm, self.fault_tolerant = comm, fault_tolerant
        self.wait = wait if wait is not None else _wait_all  # the executor's: polls, with its time limit
        self.members = tuple(range(comm.size))
        self.lost: set = set()

    def survive(self, op):
        """``op()`` (collectives on ``self.comm``), run again on the survivors until all of them finish it."""
        if not self.fault_tolerant:
            return op()
        while True:
            try:
                result, finished = op(), True
            except Exception as error:  # noqa: BLE001 - MPI.Exception; anything else is re-raised below
                if not _is_failure(error):
                    raise
                result, finished = None, False
                self.comm.Revoke()
            if self._agree(finished):
                return result
            self._shrink()

    def _agree(self, finished: bool) -> bool:
        try:
            self.comm.Ack_failed()
            flag = np.array([int(finished)], dtype=np.intc)
            self.wait([self.comm.Iagree(flag)])  # non-blocking: a blocking agreement spins on a busy machine
            return bool(flag[0])
        except Exception as error:  # noqa: BLE001 - a failure during the agreement: shrink and run again
            if not _is_failure(error):
                raise
            return False

    def _shrink(self) -> None:
        from mpi4py import MPI

        survivors = self.comm.Shrink()
        ranks = MPI.Group.Translate_ranks(survivors.Get_group(), list(range(survivors.size)), self.comm.Get_group())
        members = tuple(self.members[r] for r in ranks)
        self.lost |= set(self.members) - set(members)
        self.comm, self.members = survivors, members


def _wait_all(requests) -> None:
    from mpi4py import MPI

    MPI.Request.Waitall(requests)


def _is_failure(error) -> bool:
    from mpi4py import MPI

    classes = {getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
               if hasattr(MPI, name)}
    return isinstance(error, MPI.Exception) and error.Get_error_class() in classes
