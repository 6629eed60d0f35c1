"""Executors: how the K workers are stored and stepped, and how they all-reduce. Nothing else.

Every executor offers the same few methods to ``diloco.core.driver``, the ``Executor`` protocol:

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
* ``shared()``: the baseline's one shared model;
* ``snapshot()``: ``(worker_params, worker_states)`` for checkpoints;
* ``round_fields()``: the executor's own measurements for a round's record;
* ``round_ended(record, get_state)``: after a round's record (held-out evaluation included),
  before the hooks: the MPI executor admits replacements for dead workers here.

``ReferenceExecutor`` runs the learner's milestone functions (20, or 16-19 with the
paper's lr schedule, clipping and an input encoder), so the milestones gate what
``--engine reference`` trains; a transformer (``config.model``) takes the place of the
MLP's forward and backward (``diloco.core.model_seam``). ``MPIExecutor`` is the same with one worker per rank and
mpi4py collectives. The fast executor (flat buffers, batched matmul) is
``diloco.engine.fast``, outside learner workspaces.
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

import numpy as np

from diloco.core import progress
from diloco.core.comm import reduce_in_order
from diloco.core.flatbuf import chunk_bounds, flatten, pack, unflatten, unpack
from diloco.core.mechanisms import init_inner_state, inner_step, train_worker, uses_plain_worker
from diloco.core.membership import Membership
from diloco.core.model_seam import model_for
from diloco.params import average_params
from diloco.sharding import inner_train_worker, sample_worker_batch

__all__ = ["Executor", "ReferenceExecutor", "MPIExecutor", "RoundTimeout", "shared_state", "replacement_start"]


@runtime_checkable
class Executor(Protocol):
    """What the driver (``diloco.core.driver``), the synchronisers and the records ask of an executor
    (the module doc says what each call does). ``ReferenceExecutor``, ``MPIExecutor`` and the fast
    engine's ``FastExecutor`` implement it; ``isinstance(executor, Executor)`` checks the names.
    An executor with its own collective also offers ``reduce_messages`` (``diloco.core.sync.collective``)."""

    name: str
    workers: tuple

    def load(self, worker_params: dict, worker_states: dict) -> None: ...

    def run(self, rngs, steps: int, workers=None) -> dict: ...

    def run_sync(self, rngs, steps: int) -> dict: ...

    def shared(self) -> dict: ...

    def read(self, keys) -> dict: ...

    def write(self, k: int, params: dict) -> None: ...

    def gather(self, items: dict) -> dict: ...

    def round_fields(self) -> dict: ...

    def round_ended(self, record: dict, get_state) -> None: ...

    def snapshot(self) -> tuple[dict, dict]: ...


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
        self.model = model_for(self.config, next(iter(worker_params.values())), self.encode)

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
        return self.model.loss_and_grads(params, x_batch, y_batch)

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

    def round_ended(self, record: dict, get_state) -> None:
        """Nothing to do between rounds in one process."""


class MPIExecutor(ReferenceExecutor):
    """One worker per MPI rank (worker ``comm.rank``); flat-buffer collectives, reduced in worker order.

    * ``reduce_messages`` (the outer gradients' all-reduce): a summable codec's messages
      (native) are flattened into one buffer in the fixed key order, then reduce-scattered
      (``Ialltoallv``: contributing rank i owns chunk i and receives that chunk of every
      contribution), the owner applies the codec's ``reduce`` to its chunk of the K in
      ascending worker order, and the reduced chunks are all-gathered (``Iallgatherv``).
      Any other codec's messages travel as their payload bytes (``codec.to_wire``,
      ``Iallgatherv``) and every rank decodes and reduces them in worker order.
    * ``gather`` (step losses, the cosine's parameters, the baseline's gradients): the
      arrays as one byte buffer with a JSON head (``diloco.core.flatbuf.pack``), all-gathered.

    The reduce works value by value in the same worker order as one process, so an MPI
    run is bit-identical to the single-process run of the same config. A collective waits
    at most ``timeout`` seconds (``RoundTimeout``), so a rank that stops never hangs the others.

    With ``fault_tolerant`` a dead rank's worker becomes a dropped worker
    (``diloco.core.membership``); with ``replace`` too (the argv that starts a replacement
    process), the survivors replace it at the end of the round it died in (``round_ended``).
    """

    name = "mpi"

    def __init__(self, shards, config, comm, encode=None, timeout: float | None = None,
                 fault_tolerant: bool = False, replace=None) -> None:
        if comm.size != config.num_workers:
            raise ValueError(f"config.num_workers ({config.num_workers}) must equal the number of MPI processes "
                             f"({comm.size}); run with mpiexec -n {config.num_workers}")
        super().__init__(shards, config, encode, workers=(comm.rank,))
        self.worker, self.timeout, self.replace = comm.rank, timeout, replace
        self.group = Membership(comm, fault_tolerant, self._wait)
        self.collective_seconds = 0.0
        self.sent_bytes = self.word_bytes = self.outer_bytes = 0

    @property
    def comm(self):
        """The communicator of the workers alive (``MPI_COMM_WORLD`` until one dies: ``diloco.core.membership``)."""
        return self.group.comm

    @property
    def lost(self) -> set:
        """The workers whose process died (fault tolerance only), dropped from every sync since."""
        return self.group.lost

    def load(self, worker_params: dict, worker_states: dict) -> None:
        """This rank's worker, or the baseline's one shared model (key 0, on every rank)."""
        shared = len(worker_params) == 1
        keep = {0} if shared else set(self.workers)
        super().load({k: v for k, v in worker_params.items() if k in keep},
                     {k: v for k, v in worker_states.items() if k in keep})

    def _wait(self, requests) -> None:

        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        pause = 1e-5
        # each Test drives MPI's progress; one at a time, so a failure raises its own error class (ULFM's
        # MPI_ERR_PROC_FAILED), not Testall's MPI_ERR_IN_STATUS
        while not all(request.Test() for request in requests):
            if deadline is not None and time.monotonic() > deadline:
                raise RoundTimeout(f"rank {self.worker}: a collective of round {getattr(self, 'round_index', 0)} "
                                   f"did not complete within {self.timeout:g} s (--round-timeout): another rank "
                                   f"stopped answering")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def _words(self, *words: int) -> np.ndarray:
        """Every rank's ``words`` (int64), one row per rank."""
        mine = np.array(words, dtype=np.int64)
        table = np.empty((self.comm.size, mine.size), dtype=np.int64)
        self._wait([self.comm.Iallgather(mine, table)])
        self.sent_bytes += mine.nbytes * (self.comm.size - 1)
        self.word_bytes += mine.nbytes * (self.comm.size - 1)
        return table

    def _allgatherv(self, buffer: np.ndarray, counts) -> np.ndarray:
        """Every rank's ``buffer`` (``counts[r]`` values from rank r), end to end in rank order."""
        counts = np.asarray(counts, dtype=np.int64)
        received = np.empty(int(counts.sum()), dtype=buffer.dtype)
        displacements = np.concatenate([[0], np.cumsum(counts)[:-1]])
        self._wait([self.comm.Iallgatherv(buffer, [received, counts, displacements, _mpi_type(buffer.dtype)])])
        self.sent_bytes += buffer.nbytes * (self.comm.size - 1)
        return received

    def _mine(self, messages: dict):
        """This rank's message, or None (a dropped worker, or one outside an asynchronous group)."""
        if set(messages) - {self.worker}:
            raise ValueError(f"rank {self.worker} holds worker {self.worker} only, got {sorted(messages)}")
        return messages.get(self.worker)

    def gather(self, items: dict) -> dict:
        """All-gather ``items`` (worker -> array, or -> dict of arrays) as flat bytes; the union of every rank's."""
        start = time.perf_counter()
        head, data = pack(items)
        message = np.concatenate([np.frombuffer(head, dtype=np.uint8), data])
        merged = self.group.survive(lambda: self._gather_packed(message, len(head)))
        self.collective_seconds += time.perf_counter() - start
        return merged

    def _gather_packed(self, message: np.ndarray, head_size: int) -> dict:
        sizes = self._words(head_size, message.size)
        received = self._allgatherv(message, sizes[:, 1])
        merged, offset = {}, 0
        for head_bytes, size in sizes:
            part = received[offset:offset + size]
            merged.update(unpack(part[:head_bytes].tobytes(), part[head_bytes:]))
            offset += size
        return merged

    def reduce_messages(self, messages: dict, codec, like: dict, weights: dict | None, base: dict | None,
                        overlap: bool = False) -> tuple:
        """``all_reduce``'s collective (``diloco.core.comm``): ``(delta, bytes_sent, payload_bytes)``.

        With ``overlap`` (a summable codec, without fault tolerance) the reduce-scatter is only
        posted: ``delta`` is then a function that waits for it, reduces this rank's chunk and
        all-gathers the chunks (Streaming DiLoCo calls it at the merge, ``tau`` steps later).
        """
        mine = self._mine(messages)
        if codec.summable and overlap and not self.group.fault_tolerant:
            request, finish, bytes_sent, payload_bytes = self._measured(
                lambda: self._post_reduce_scatter(mine, codec, like, weights, base))
            return lambda: self._measured(lambda: self._finish(request, finish)), bytes_sent, payload_bytes
        if codec.summable:
            return self._measured(lambda: self.group.survive(
                lambda: self._reduce_scatter(mine, codec, like, weights, base)))
        everyone = self._measured(lambda: self.group.survive(lambda: self._gather_wire(mine, codec, like)))
        return reduce_in_order(everyone, codec, like, weights, base)

    def _measured(self, op):
        """``op()``, with its seconds and the outer-gradient bytes it sent counted in the round's fields."""
        start, sent, words = time.perf_counter(), self.sent_bytes, self.word_bytes
        out = op()
        self.outer_bytes += (self.sent_bytes - sent) - (self.word_bytes - words)
        self.collective_seconds += time.perf_counter() - start
        return out

    def _finish(self, request, finish):
        """Wait for a posted reduce-scatter, then ``finish()`` it."""
        self._wait([request])
        return finish()

    def _gather_wire(self, mine, codec, like: dict) -> dict:
        """Every contributing rank's message, all-gathered as its payload bytes; keyed by worker."""
        wire = np.frombuffer(codec.to_wire(mine), dtype=np.uint8) if mine is not None else np.empty(0, np.uint8)
        sizes = self._words(-1 if mine is None else wire.size)[:, 0]
        received = self._allgatherv(wire, np.maximum(sizes, 0))
        bounds = np.concatenate([[0], np.cumsum(np.maximum(sizes, 0))])
        return {self.group.members[rank]: codec.from_wire(received[bounds[rank]:bounds[rank + 1]].tobytes(), like)
                for rank in np.flatnonzero(sizes >= 0).tolist()}

    def _reduce_scatter(self, mine, codec, like: dict, weights, base) -> tuple[dict, float, int]:
        """Reduce-scatter then all-gather of the flattened messages; the codec's reduce on each chunk."""
        request, finish, bytes_sent, payload_bytes = self._post_reduce_scatter(mine, codec, like, weights, base)
        return self._finish(request, finish), bytes_sent, payload_bytes

    def _post_reduce_scatter(self, mine, codec, like: dict, weights, base) -> tuple:
        """Post the reduce-scatter (``Ialltoallv``: contributing rank i receives chunk i of every
        contribution): ``(request, finish, bytes_sent, payload_bytes)``, where ``finish()``, once
        the request is complete, reduces this rank's chunk and all-gathers the chunks: the delta."""
        keys, dtype = tuple(like), next(iter(like.values())).dtype
        flat = flatten(mine, keys) if mine is not None else np.empty(0, dtype=dtype)
        senders = np.flatnonzero(self._words(flat.size)[:, 0]).tolist()  # ascending: the worker order
        bounds = chunk_bounds(sum(value.size for value in like.values()), len(senders))
        lengths, size = np.diff(bounds), self.comm.size
        send_counts, send_at, receive_counts = (np.zeros(size, dtype=np.int64) for _ in range(3))
        own = senders.index(self.comm.rank) if mine is not None else None
        if own is not None:
            send_counts[senders], send_at[senders] = lengths, bounds[:-1]
            receive_counts[senders] = lengths[own]
        pieces = np.empty((len(senders) if own is not None else 0, lengths[own] if own is not None else 0), dtype)
        receive_at = np.concatenate([[0], np.cumsum(receive_counts)[:-1]])
        kind = _mpi_type(dtype)
        request = self.comm.Ialltoallv([flat, send_counts, send_at, kind], [pieces, receive_counts, receive_at, kind])
        self.sent_bytes += int(send_counts.sum() - send_counts[self.comm.rank]) * flat.itemsize  # none to itself

        def finish() -> dict:
            chunk = np.empty(0, dtype=dtype)
            if own is not None:
                w = None if weights is None else [weights[self.group.members[r]] for r in senders]
                piece_of_base = None if base is None else {"v": flatten(base, keys, bounds[own], bounds[own + 1])}
                chunk = np.ascontiguousarray(codec.reduce([{"v": row} for row in pieces], w, piece_of_base)[0]["v"],
                                             dtype=dtype)
            counts = np.zeros(size, dtype=np.int64)
            counts[senders] = lengths
            return unflatten(self._allgatherv(chunk, counts), like)

        bytes_sent, payload_bytes = codec.bytes_sent([like] * len(senders), 0)
        return request, finish, float(bytes_sent), payload_bytes

    def round_fields(self) -> dict:
        """The round's seconds in collectives and bytes this rank sent, then zero for the next round.

        ``mpi_bytes_sent``: every byte this rank handed MPI for the other ranks (each
        all-gather's length words included); ``mpi_allreduce_bytes``: the outer gradients'
        payload among them, what the codec's ``bytes_sent`` models.
        """
        fields = {"allreduce_seconds": self.collective_seconds, "mpi_bytes_sent": int(self.sent_bytes),
                  "mpi_allreduce_bytes": int(self.outer_bytes)}
        self.collective_seconds = 0.0
        self.sent_bytes = self.word_bytes = self.outer_bytes = 0
        return fields

    def snapshot(self) -> tuple[dict, dict]:
        """This rank's worker only (the others live in other processes): no checkpoint of the run
        can be written from it, and the MPI executor offers none (``diloco.core.features``)."""
        return super().snapshot()

    def round_ended(self, record: dict, get_state) -> None:
        """With ``replace``: start a process for each worker lost in this round (``Membership.admit``),
        sent ``shared_state``, and note it in ``record``: ``replaced_workers``,
        ``replace_seconds`` (this rank's wall time) and ``replace_bytes`` (the state it sent). After
        the last round there is nothing left to replace a worker for."""
        if not (self.replace and self.lost) or record["round"] == self.config.rounds:
            return
        start, workers = time.perf_counter(), sorted(self.lost)
        record.update(replaced_workers=workers)  # before the state is taken: the history sent holds it
        sent = self.group.admit(self.replace, shared_state(get_state()), self.timeout)
        record.update(replace_seconds=time.perf_counter() - start, replace_bytes=sent)


def shared_state(state):
    """What a survivor sends a replacement (``MPIExecutor.round_ended``): the run's ``RunState``
    without this rank's own worker (params, inner state, error-feedback residual): the global
    parameters, outer state, generator, history and fragments still to merge."""
    return state._replace(worker_params=None, worker_states={}, extra={**state.extra, "residuals": {}})


def replacement_start(state, workers, config):
    """The ``RunState`` a replacement of ``workers`` starts the next round from: ``shared_state``
    with every worker at the global parameters (``worker_params`` None), fresh inner-optimizer
    states (the dead workers' moments died with them) and no error-feedback residual."""
    return state._replace(worker_states={k: init_inner_state(state.global_params, config) for k in workers})


def _mpi_type(dtype):
    """The MPI datatype of a NumPy dtype (mpi4py's own table)."""
    from mpi4py.util.dtlib import from_numpy_dtype

    return from_numpy_dtype(dtype)
