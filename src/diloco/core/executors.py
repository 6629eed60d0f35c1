"""Executors: how the K workers are stored and stepped, and how they all-reduce. Nothing else.

Every executor offers the same few methods to ``diloco.core.driver``:

* ``load(worker_params, worker_states)``: the workers' parameters and AdamW (or Muon) states
  (dicts keyed by worker index; the baseline has one shared model, key 0);
* ``run(rngs, steps, workers=None)``: ``steps`` inner steps of every local worker (or
  of the local ones among ``workers``: an asynchronous group), each from its own
  carried params and AdamW state, worker k drawing its batches from ``rngs[k]``;
  returns ``{k: losses (steps,)}``;
* ``run_sync(rngs, steps)``: the synchronous baseline's steps: every worker's gradient,
  averaged (one all-reduce per step), one inner step (``inner_step``: AdamW or Muon) on the shared model;
* ``read(keys)`` / ``write(k, params)``: the local workers' parameters of a fragment;
* ``gather(items)``: the collective, merging a dict keyed by worker index across
  processes (identity in one process);
* ``snapshot()``: ``(worker_params, worker_states)`` for checkpoints.

``ReferenceExecutor`` runs the learner's milestone functions (20, or 16-19 with the
paper's lr schedule, clipping and an input encoder), so the milestones gate what
``--engine reference`` trains; a transformer (``config.model``) takes the place of the
MLP's forward and backward (``diloco.core.model_seam``). ``MPIExecutor`` is the same with one worker per rank and
mpi4py collectives. The fast executor (flat buffers, batched matmul) is
``diloco.engine.fast``, outside learner workspaces.
"""

from __future__ import annotations

import pickle
import time

import numpy as np

from diloco.core import progress
from diloco.core.model_seam import model_of
from diloco.mechanisms import inner_step, loss_and_grads, train_worker, uses_plain_worker
from diloco.params import average_params
from diloco.sharding import inner_train_worker, sample_worker_batch

__all__ = ["ReferenceExecutor", "MPIExecutor", "RoundTimeout"]


class RoundTimeout(RuntimeError):
    """A collective did not complete in time: some rank stopped answering."""


class ReferenceExecutor:
    """The K workers as parameter dicts, stepped by the milestone functions, one after another."""

    name = "reference"

    def __init__(self, shards, config, encode=None, workers=None) -> None:
        self.shards, self.config, self.encode = shards, config, encode
        self.workers = tuple(range(config.num_workers)) if workers is None else tuple(workers)
        self.plain = uses_plain_worker(config, encode)
        self.params: dict = {}
        self.states: dict = {}

    def load(self, worker_params: dict, worker_states: dict) -> None:
        self.params = {k: dict(v) for k, v in worker_params.items()}
        self.states = dict(worker_states)
        self.model = model_of(self.config, next(iter(worker_params.values())))  # None: the MLP

    def run(self, rngs, steps: int, workers=None) -> dict:
        config, losses = self.config, {}
        for k in self.workers if workers is None else [k for k in self.workers if k in workers]:
            x_k, y_k = self.shards[k]
            parts = []
            for piece in progress.chunks(steps):  # [steps] unless a progress bar listens (same bits either way)
                if self.plain:
                    self.params[k], self.states[k], part = inner_train_worker(
                        self.params[k], self.states[k], x_k, y_k, piece, config.batch_size, config.inner, rngs[k])
                else:
                    self.params[k], self.states[k], part = train_worker(
                        self.params[k], self.states[k], x_k, y_k, config, rngs[k], encode=self.encode, steps=piece,
                        model=self.model)
                parts.append(part)
                progress.steps_done(piece)
            losses[k] = parts[0] if len(parts) == 1 else np.concatenate(parts)
        return losses

    def _gradient(self, params, k, rng):
        x_k, y_k = self.shards[k]
        x_batch, y_batch = sample_worker_batch(x_k, y_k, self.config.batch_size, rng)
        return loss_and_grads(params, x_batch, y_batch, next(iter(params.values())).dtype, self.encode, self.model)

    def run_sync(self, rngs, steps: int) -> dict:
        params, state = self.params[0], self.states[0]
        losses = {k: np.empty(steps) for k in self.workers}
        for step in range(steps):
            grads = {}
            for k in self.workers:
                losses[k][step], grads[k] = self._gradient(params, k, rngs[k])
            everyone = self.gather(grads)
            params, state = inner_step(params, state, average_params([everyone[k] for k in sorted(everyone)]),
                                       self.config)
            progress.steps_done(len(self.workers))
        self.params[0], self.states[0] = params, state
        return losses

    def shared(self) -> dict:
        """The baseline's one shared model."""
        return self.params[0]

    def read(self, keys) -> dict:
        return {k: {key: self.params[k][key] for key in keys} for k in self.workers}

    def write(self, k: int, params: dict) -> None:
        if k in self.params:
            self.params[k] = {**self.params[k], **params}

    def gather(self, items: dict) -> dict:
        return items

    def round_fields(self) -> dict:
        """The executor's own measurements for a round's record (none in one process)."""
        return {}

    def snapshot(self) -> tuple[dict, dict]:
        return dict(self.params), dict(self.states)


class MPIExecutor(ReferenceExecutor):
    """One worker per MPI rank (worker ``comm.rank``); the collectives are all-gathers in worker order.

    Every rank gathers the kept workers' parameters (or encoded payloads) and combines
    them in worker order, exactly as one process does, so an MPI run is bit-identical
    to the single-process run of the same config. A collective waits at most
    ``timeout`` seconds (``RoundTimeout``), so a rank that stops never hangs the others.
    """

    name = "mpi"

    def __init__(self, shards, config, comm, encode=None, timeout: float | None = None) -> None:
        if comm.size != config.num_workers:
            raise ValueError(f"config.num_workers ({config.num_workers}) must equal the number of MPI processes "
                             f"({comm.size}); run with mpiexec -n {config.num_workers}")
        super().__init__(shards, config, encode, workers=(comm.rank,))
        self.comm, self.timeout = comm, timeout
        self.collective_seconds = 0.0
        self.sent_bytes = 0

    def load(self, worker_params: dict, worker_states: dict) -> None:
        """This rank's worker, or the baseline's one shared model (key 0, on every rank)."""
        shared = len(worker_params) == 1
        keep = {0} if shared else set(self.workers)
        super().load({k: v for k, v in worker_params.items() if k in keep},
                     {k: v for k, v in worker_states.items() if k in keep})

    def _wait(self, requests) -> None:
        from mpi4py import MPI

        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        pause = 1e-5
        while not MPI.Request.Testall(requests):  # each Test also drives MPI's progress
            if deadline is not None and time.monotonic() > deadline:
                raise RoundTimeout(f"rank {self.comm.rank}: the all-gather of round {getattr(self, 'round_index', 0)} "
                                   f"did not complete within {self.timeout:g} s (--round-timeout): another rank "
                                   f"stopped answering")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def gather(self, items: dict) -> dict:
        """All-gather ``items`` (pickled), or ``{rank: bytes}`` as exactly those bytes (a sparse message).

        A length word (one int64 per rank, negative ``-(n + 1)`` for raw bytes) goes first;
        ``sent_bytes`` counts the messages only, ``(size - 1)`` times each.
        """
        start = time.perf_counter()
        raw = list(items) == [self.comm.rank] and isinstance(items[self.comm.rank], bytes)
        payload = items[self.comm.rank] if raw else pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
        blob = np.frombuffer(payload, dtype=np.uint8)
        words = np.zeros(self.comm.size, dtype=np.int64)
        self._wait([self.comm.Iallgather(np.array([-blob.size - 1 if raw else blob.size], dtype=np.int64), words)])
        sizes = np.where(words < 0, -words - 1, words)
        received = np.empty(int(sizes.sum()), dtype=np.uint8)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        self._wait([self.comm.Iallgatherv(blob, [received, sizes, offsets, _byte_type()])])
        self.sent_bytes += int(blob.size) * (self.comm.size - 1)
        merged: dict = {}
        for rank, (start_at, size) in enumerate(zip(offsets, sizes, strict=True)):
            part = received[start_at:start_at + size].tobytes()
            merged.update({rank: part} if words[rank] < 0 else pickle.loads(part))
        self.collective_seconds += time.perf_counter() - start
        return merged

    def round_fields(self) -> dict:
        """The round's seconds in collectives and bytes this rank sent, then zero for the next round."""
        fields = {"allreduce_seconds": self.collective_seconds, "mpi_bytes_sent": int(self.sent_bytes)}
        self.collective_seconds, self.sent_bytes = 0.0, 0
        return fields


    def snapshot(self) -> tuple[dict, dict]:
        raise ValueError("the MPI executor writes no checkpoints (run without --checkpoint-every / --resume)")


def _byte_type():
    from mpi4py import MPI

    return MPI.BYTE
