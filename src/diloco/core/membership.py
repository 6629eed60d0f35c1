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

Replacements (``--replace-failed``) join at a round boundary through MPI's dynamic
processes: the survivors start one process per lost worker (``MPI_Comm_spawn``, ``admit``),
merge the intercommunicator with them (``MPI_Intercomm_merge``), rank 0 sends each one its
worker index and the run's state (``MPI_Send`` of the pickled ``RunState``), and every rank
splits the merged communicator with its worker index as the key (``MPI_Comm_split``), so that
rank order is worker order again, as the reduce in worker order needs. The replacement's side
is ``join``. Communicators left behind (the admission's, and those a shrink replaces) are freed:
Open MPI's ``MPI_Finalize`` waits forever on a communicator joining two jobs that holds a dead
process.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from diloco.core.deadline import exit_after

__all__ = ["Membership", "ulfm_problem", "is_replacement", "join"]


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
        _release(self.comm, MPI)
        self.comm, self.members = survivors, members

    def admit(self, command, start, limit: float | None = None) -> int:
        """Replace every lost worker by a new process running ``command`` (argv, the program first),
        sent ``start`` (see ``join``); afterwards no worker is lost. Returns the bytes this rank sent.

        Collective over the survivors, at a round boundary. A death during it is not survived: after
        ``limit`` seconds (``--round-timeout``) this rank says so in one line and exits (``within``).
        """
        from mpi4py import MPI

        workers = sorted(self.lost)
        with within(limit, f"rank {self.comm.rank}: admitting a replacement for worker(s) {workers}"):
            spawned = self.comm.Spawn(command[0], list(command[1:]), maxprocs=len(workers), root=0)
            merged = spawned.Merge(high=False)
            sent = 0
            if merged.rank == 0:  # the new processes hold ranks comm.size.. of ``merged``, in spawn order
                message = pickle.dumps((workers, start), protocol=pickle.HIGHEST_PROTOCOL)
                for rank in range(self.comm.size, merged.size):
                    merged.send(message, dest=rank)
                sent = len(message) * len(workers)
            comm = _ordered(merged, self.members[self.comm.rank], MPI, spawned)
        _release(self.comm, MPI)
        self.comm, self.members, self.lost = comm, tuple(sorted((*self.members, *workers))), set()
        return sent


def is_replacement() -> bool:
    """Whether this process was started by ``Membership.admit`` (it has a parent job)."""
    from mpi4py import MPI

    return MPI.Comm.Get_parent() != MPI.COMM_NULL


def join() -> tuple:
    """A replacement's side of ``Membership.admit``: ``(comm, worker, start)``, the communicator
    of every worker (rank = worker index), the worker it replaces and the state it starts from.
    A replacement runs it (and ``MPI_Init`` before it) ``within`` its ``--round-timeout``."""
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    merged = parent.Merge(high=True)
    workers, start = pickle.loads(merged.recv(source=0))  # from a survivor of the same job
    worker = workers[merged.rank - (merged.size - len(workers))]
    return _ordered(merged, worker, MPI, parent), worker, start


ADMISSION_EXIT = 4  # the exit status of a rank whose admission outlasted its limit (as a collective's time-out)


def within(limit: float | None, what: str):
    """Run the block; if it has not finished after ``limit`` seconds (None: no limit), end this process.

    For the admission, whose spawn, merge and point-to-point messages block and are not fault
    tolerant: a process that dies during it leaves the others waiting forever (the survivors in
    ``MPI_Comm_spawn``, a replacement already in ``MPI_Init``, whose connection to the survivors
    never completes; Open MPI's launcher then waits for it). ``diloco.core.deadline.exit_after``
    prints one line and exits with ``ADMISSION_EXIT`` where the call lets the GIL go; ``MPI_Init``
    (mpi4py's import) keeps it, so its backstop (libc's ``_exit`` on ``SIGALRM``) ends the process
    two seconds later with status 14, silently. What the run saved before the admission (its
    history and outputs written so far) is kept.
    """
    return exit_after(limit, ADMISSION_EXIT, f"diloco.tools.cli.mpi: error: {what} did not finish within "
                      f"{limit:g} s (--round-timeout): a process died during the admission, which cannot be "
                      f"survived; this process ends" if limit is not None else None, backstop=True)


def _ordered(merged, worker: int, MPI, spawned):
    """``merged`` split with the worker index as key (rank order = worker order), errors returned.

    The spawn's intercommunicator and ``merged`` are freed: Open MPI's ``MPI_Finalize``
    disconnects every communicator still joining two jobs, and waits forever on one that holds
    a process dead since (``MPI_Comm_disconnect`` would too: its fence takes in the dead).
    """
    comm = merged.Split(0, worker)
    comm.Set_errhandler(MPI.ERRORS_RETURN)
    merged.Free()
    spawned.Free()
    return comm


def _release(comm, MPI) -> None:
    """Free a communicator left behind (shrunk or replaced), so that ``MPI_Finalize`` skips it;
    never ``MPI_COMM_WORLD``."""
    if comm != MPI.COMM_WORLD:
        comm.Free()


def _wait_all(requests) -> None:
    from mpi4py import MPI

    MPI.Request.Waitall(requests)


def _is_failure(error) -> bool:
    from mpi4py import MPI

    classes = {getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
               if hasattr(MPI, name)}
    return isinstance(error, MPI.Exception) and error.Get_error_class() in classes
