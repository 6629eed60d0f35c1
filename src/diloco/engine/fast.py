"""The fast executor (``--engine fast``): the K workers in flat, preallocated buffers, stepped with batched matmul.

The same ``Executor`` methods as ``diloco.core.executors.ReferenceExecutor``, so the one
driver (``diloco.core.driver``) runs every algorithm and mechanism on it. Only storage
and stepping differ:

* the K workers' parameters and optimizer states are ``(K, P)`` buffers
  (``diloco.engine.flat``); in the *stacked* layout the K workers take each step
  together (``WorkerStack`` with S = K models, one AdamW pass over the buffer); in the
  *per-worker* layout one ``(1, P)`` model steps each worker in turn
  (``choose_layout``);
* the baseline is one model seeing the K batches as K groups (S = 1, G = K);
* the lr schedule, clipping (per worker, by its global norm) and an input encoder run
  here too. A one-hot encoder (the character-level task's ``OneHot``) turns each shard's
  windows into their one-hot columns once, checked once (and, for a shard the runs of one
  command share, once for all of them: ``diloco.core.shard_reuse.derived``); a batch draws its columns, and
  the first layer gathers and scatters rows by them (``WorkerStack``, ``context``).
  Any other encoder is called on each batch, into the input buffer;
* a transformer (``config.model``) takes the MLP kernel's place: ``ModelStack`` calls its
  ``loss_and_grads`` on views of the flat buffers, one worker at a time, and the flat
  optimizer kernels step it as they step the MLP;
* the inner optimizer (``diloco.core.inner.Optimizer``) keeps its state in one ``(K, P)``
  buffer per slot (``to_slots`` / ``from_slots``: AdamW's ``m`` and ``v``) and its flat
  form steps them (``diloco.engine.optim.flat_updater``: the engine's AdamW kernel; Muon,
  one batched Newton-Schulz over the K workers' ``(K, m, n)`` matrices; any other
  entry's per-array rule lifted to the rows).

The random draws are the milestones': worker k draws each batch from its child
generator with ``sample_worker_batch``'s rule, so for a seed the fast executor sees
the reference executor's batches and ends within rounding of it (the tests allow 1e-10
relative in float64).
"""

from __future__ import annotations

import numpy as np

from diloco.core import progress
from diloco.core.inner import inner_optimizer
from diloco.core.mechanisms import clip_scale, scheduled_lr
from diloco.core.model_seam import model_for, model_kind
from diloco.core.shard_reuse import derived
from diloco.engine.flat import flat_layout, layer_views, pack, unpack
from diloco.engine.layout import choose_layout
from diloco.engine.model_stack import ModelStack
from diloco.engine.optim import adamw_scratch, flat_updater
from diloco.engine.stack import WorkerStack
from diloco.sharding import sample_worker_batch

__all__ = ["FastExecutor", "draw_batch"]


def draw_batch(shard, batch_size: int, rng, x_out: np.ndarray, y_out: np.ndarray, encode=None) -> None:
    """Fill ``x_out`` (b, d) and ``y_out`` (b,) with the mini-batch milestone 18 (``sample_worker_batch``) draws."""
    x_batch, y_batch = sample_worker_batch(*shard, batch_size, rng)
    x_out[...] = x_batch if encode is None else encode(x_batch, x_out.dtype)
    y_out[...] = y_batch


class FastExecutor:
    """K workers as rows of ``(K, P)`` buffers (see the module doc)."""

    name = "fast"

    def __init__(self, shards, config, encode=None, layout: str = "auto") -> None:
        self.config = config
        self.workers = tuple(range(config.num_workers))
        self.dtype = np.dtype(config.dtype)
        # A one-hot encoder (``OneHot``: ``columns`` and ``first_layer``): each shard's windows become their
        # one-hot columns once, checked once, and the stack gathers its first layer from a batch's columns.
        self.context = getattr(encode, "context", None) if hasattr(encode, "first_layer") else None
        if model_kind(config).sequence_model:  # the transformer reads the index windows themselves
            self.context = encode = None
        self.encode = None if self.context is not None else encode  # any other encoder: called per batch
        self.shards = [(self._inputs(x_k, encode), np.ascontiguousarray(y_k, dtype=np.intp)) for x_k, y_k in shards]
        self.layout_name = layout
        self.flat = None

    def _inputs(self, x_k, encode) -> np.ndarray:
        if self.context is not None:  # read-only; a shard another run of the command split: its columns again
            return derived(x_k, ("one-hot columns", type(encode), encode),
                           lambda windows: np.ascontiguousarray(encode.columns(windows), dtype=np.int32))
        return np.ascontiguousarray(x_k, dtype=self.dtype if encode is None else x_k.dtype)

    def load(self, worker_params: dict, worker_states: dict) -> None:
        first = next(iter(worker_params.values()))
        self.flat = flat_layout(first)
        K, P, b = self.config.num_workers, self.flat.size, self.config.batch_size
        self.sync_model = len(worker_params) == 1 and 0 in worker_params and len(worker_states) == 1
        rows = 1 if self.sync_model else K
        self.params = np.empty((rows, P), dtype=self.dtype)
        self.optimizer = inner_optimizer(self.config)  # its state: one (rows, P) buffer per slot
        self.slots = tuple(np.empty((rows, P), dtype=self.dtype) for _ in self.optimizer.slots)
        stored = {k: self.optimizer.to_slots(worker_states[k], worker_params[k]) for k in range(rows)}
        for k in range(rows):
            pack(worker_params[k], self.params[k], self.flat)
            for buffer, values in zip(self.slots, stored[k][1], strict=True):
                pack(values, buffer[k], self.flat)
        self.steps = [int(stored[k][0]) for k in range(rows)]  # per worker: asynchronous ones differ
        self.step = self.steps[0]
        if not model_kind(self.config).milestone_model:  # no batched kernel: one worker at a time (model_stack.py)
            self.stacked = self.sync_model
            self.stack = ModelStack(model_for(self.config, first), self.flat, 1, K if self.sync_model else 1, b,
                                    self.dtype)
        elif self.sync_model:
            self.stack = WorkerStack(self.flat, 1, K, b, self.dtype, self.context)
            self.stacked = True
        else:
            # asynchronous groups are subsets of the workers at their own step counts: one at a time
            self.stacked = (not self.config.asynchrony.asynchronous
                            and choose_layout(K, P, self.layout_name, itemsize=self.dtype.itemsize) == "stacked")
            self.stack = WorkerStack(self.flat, K if self.stacked else 1, 1, b, self.dtype, self.context)
        self.inputs = self.stack.x if self.context is None else self.stack.columns  # what a draw fills
        scratch = adamw_scratch(self.stack.params.size, self.dtype)
        self.flat_update = flat_updater(self.config, self.flat, first, scratch)

    def _lr_at(self, step: int):
        """``lr_at(peak)``: step ``step``'s learning rate on the run's schedule for a peak."""
        config = self.config
        return lambda peak: scheduled_lr(peak, config, step)

    def _clip(self, grads: np.ndarray) -> None:
        """Clip each row of ``grads`` to ``clip_norm`` (``clip_by_global_norm``'s rule, per worker)."""
        clip = self.config.clip_norm
        if clip is None:
            return
        norms = np.sqrt(np.einsum("ij,ij->i", grads, grads))
        grads *= clip_scale(norms, clip).astype(grads.dtype)[:, None]

    def _update(self, rows: slice) -> None:
        self._clip(self.stack.grads)
        step = self.step + 1
        self.flat_update(self.stack.params, tuple(buffer[rows] for buffer in self.slots), self.stack.grads, step,
                         self._lr_at(step))

    def run(self, rngs, steps: int, workers=None) -> dict:
        K, b, stack = self.config.num_workers, self.config.batch_size, self.stack
        chosen = range(K) if workers is None else [k for k in range(K) if k in workers]
        losses = np.empty((K, steps))
        if self.stacked:  # every worker (the asynchronous schedule uses the per-worker layout)
            self.step = self.steps[0]
            stack.params[...] = self.params
            for h in range(steps):
                for k in range(K):
                    draw_batch(self.shards[k], b, rngs[k], self.inputs[k], stack.labels[k], self.encode)
                losses[:, h] = stack.loss_and_grads()[:, 0]
                self._update(slice(0, K))
                self.step += 1
                progress.steps_done(K)
            self.params[...] = stack.params
            self.steps = [self.step] * K
        else:
            for k in chosen:
                self.step = self.steps[k]
                stack.params[0] = self.params[k]
                for h in range(steps):
                    draw_batch(self.shards[k], b, rngs[k], self.inputs[0], stack.labels[0], self.encode)
                    losses[k, h] = stack.loss_and_grads()[0, 0]
                    self._update(slice(k, k + 1))
                    self.step += 1
                    progress.steps_done(1)
                self.params[k] = stack.params[0]
                self.steps[k] = self.step
        return {k: losses[k] for k in chosen}

    def run_sync(self, rngs, steps: int) -> dict:
        K, b, stack = self.config.num_workers, self.config.batch_size, self.stack
        losses = np.empty((K, steps))
        stack.params[...] = self.params
        for h in range(steps):
            for k in range(K):
                rows = slice(k * b, (k + 1) * b)
                draw_batch(self.shards[k], b, rngs[k], self.inputs[0, rows], stack.labels[0, rows], self.encode)
            losses[:, h] = stack.loss_and_grads()[0]
            self._update(slice(0, 1))
            self.step += 1
            progress.steps_done(K)
        self.params[...] = stack.params
        self.steps = [self.step]
        return {k: losses[k] for k in range(K)}

    def shared(self) -> dict:
        return unpack(self.params[0], self.flat)

    def read(self, keys) -> dict:
        views = layer_views(self.params, self.flat)
        return {k: {key: views[key][k] for key in keys} for k in self.workers}

    def write(self, k: int, params: dict) -> None:
        views = layer_views(self.params, self.flat)
        for key, value in params.items():
            views[key][k] = value

    def gather(self, items: dict) -> dict:
        return items

    def round_fields(self) -> dict:
        """The executor's own measurements for a round's record (none in one process)."""
        return {}

    def round_ended(self, record: dict, get_state) -> None:
        """Nothing to do between rounds in one process."""

    def snapshot(self) -> tuple[dict, dict]:
        rows = range(self.params.shape[0])
        params = {k: unpack(self.params[k], self.flat) for k in rows}
        states = {k: self.optimizer.from_slots(self.steps[k], tuple(unpack(b[k], self.flat) for b in self.slots),
                                               self.config) for k in rows}
        return params, states
