"""Training that survives crashes: checkpoints, bit-identical resume and a divergence guard.

``train_resumable(algo, x, y, config, ...)`` trains DiLoCo (``algo="diloco"``) or the
synchronous baseline (``"sync"``) and returns what ``train_diloco`` /
``train_synchronous_baseline`` return, bit for bit. It is the API's resume:
``train_resumable(..., checkpoint_dir=D, checkpoint_every=N)`` writes a checkpoint
(``diloco.tools.checkpoint``) every N rounds and after the last one, and
``train_resumable(..., resume_from=D)`` continues from the newest one. A run killed at
any moment and resumed ends with exactly the params and history of a run that was never
interrupted.

Why a driver here and not ``train_diloco(..., resume_from=...)``: ``train_diloco`` and
``train_synchronous_baseline`` are milestones 26 and 27, written by learners, and their
optimizer states live in local variables a callback cannot reach. Putting file formats
and recovery in them would make every learner write and be graded on I/O code. So this
driver composes the same public pieces in the same order instead: ``prepare_training``,
``init_adamw_state``, ``init_outer_optimizer``, ``run_diloco_round`` (milestone 25) and
``finish_record`` for DiLoCo; per step ``sample_worker_batch``, ``model_forward``,
``cross_entropy_loss``, ``model_backward``, ``average_params`` and
``scheduled_adamw_step`` for the baseline, whose round is not a milestone of its own.
``tests/tooling/test_resume.py`` proves it bit-identical to the two milestone trainers,
with and without the paper's mechanisms, so the two cannot drift apart: a change to
milestone 26 or 27's composition must be mirrored here, and that test says so. With
``config.engine = "fast"`` the engine's trainers run instead, handing out their state
after each round (``on_state``) and taking one back (``start``).

The divergence guard checks, after every DiLoCo round and after every baseline step,
that the losses, the optimizer states, the pseudo-gradient and the parameters are
finite (and, with ``max_loss``, that no loss exceeds it). A failure raises ``Diverged``,
which names the round (and step), the worker and the quantity; no checkpoint is written
for the bad round, so the last good one stays. The guard's checks live in
``diloco.tools.divergence`` (``Diverged`` and ``check_record`` are re-exported here).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from diloco._validation import milestone
from diloco.adamw import init_adamw_state
from diloco.loop import TrainResult, finish_record, prepare_training, round_record, run_diloco_round
from diloco.mechanisms import scheduled_adamw_step, train_worker, uses_plain_worker
from diloco.model import cross_entropy_loss, model_backward, model_forward
from diloco.outer import init_outer_optimizer
from diloco.params import average_params
from diloco.sharding import inner_train_worker, sample_worker_batch
from diloco.tools.checkpoint import (
    Checkpoint,
    data_fingerprint,
    generator_state,
    load_checkpoint,
    restore_generator,
    save_checkpoint,
)
from diloco.tools.divergence import (
    Diverged,
    _check_diloco_round,
    _check_eval,
    _check_loss,
    _finite,
    check_record,
)

__all__ = ["Diverged", "train_resumable", "check_record"]


def _replay_round(round_index, start_rng, starts, worker_states, shards, config, encode, error) -> Diverged:
    """A round raised (a milestone check met a NaN half-way): find the worker, from a copy."""
    worker_rngs = restore_generator(start_rng).spawn(config.num_workers)
    plain = uses_plain_worker(config, encode)
    for worker, ((x_k, y_k), state, rng_k, start_k) in enumerate(
            zip(shards, worker_states, worker_rngs, starts, strict=True)):
        try:
            if plain:
                _, state, losses = inner_train_worker(start_k, state, x_k, y_k, config.inner_steps,
                                                      config.batch_size, config.inner, rng_k)
            else:
                _, state, losses = train_worker(start_k, state, x_k, y_k, config, rng_k, encode=encode)
        except (ValueError, FloatingPointError) as exc:
            return Diverged("diloco", round_index, worker, f"inner training failed: {exc}")
        bad = np.flatnonzero(~np.isfinite(losses))
        if bad.size:
            return Diverged("diloco", round_index, worker, f"training loss is {losses[bad[0]]}", int(bad[0]) + 1)
    return Diverged("diloco", round_index, None, f"the round failed: {error}")


@milestone  # a trainer's depth: the milestones it calls skip their checks, as inside train_diloco
def _diloco_rounds(start: Checkpoint | dict, config, shards, x_eval, y_eval, save, on_round, max_loss, encode=None):
    """``train_diloco``'s loop (milestone 26), from ``start``, with the guard and checkpoints."""
    params, outer_state, worker_states = start["params"], start["outer_state"], start["worker_states"]
    rng, history = start["rng"], start["history"]
    starts = start["worker_starts"]  # where each worker starts: None unless outer gradients can be dropped
    for round_index in range(start["round"] + 1, config.rounds + 1):
        rng_at_start = generator_state(rng)
        try:
            result = run_diloco_round(params, outer_state, worker_states, shards, config, rng, encode=encode,
                                      worker_starts=starts)
            new_params, new_outer, new_states, record = result[:4]
            starts = None if starts is None else result.worker_starts
        except (ValueError, FloatingPointError) as exc:
            if any(_finite(s.m) or _finite(s.v) for s in worker_states) or _finite(params):
                raise  # the inputs were already bad: not a divergence of this round
            raise _replay_round(round_index, rng_at_start, starts or [params] * config.num_workers, worker_states,
                                shards, config, encode, exc) from None
        _check_diloco_round(round_index, new_params, new_states, record, max_loss)
        params, outer_state, worker_states = new_params, new_outer, new_states
        finish_record(record, round_index, config, params, x_eval, y_eval, history, encode=encode)
        _check_eval("diloco", record, max_loss)
        if on_round is not None:  # first the history, then the checkpoint: a resume never skips a record
            on_round(record)
        save(round_index, params, outer_state, worker_states, rng, history, starts)
    return TrainResult(params, history)


@milestone  # as inside train_synchronous_baseline: checked once, by prepare_training and the loader
def _sync_rounds(start, config, shards, x_eval, y_eval, save, on_round, max_loss, encode=None):
    """The baseline, as ``train_synchronous_baseline`` computes it, with a guard after every step."""
    params, (state,), rng, history = start["params"], start["worker_states"], start["rng"], start["history"]
    for round_index in range(start["round"] + 1, config.rounds + 1):
        worker_rngs = rng.spawn(config.num_workers)  # the same streams DiLoCo's workers get
        losses = np.empty((config.num_workers, config.inner_steps))
        for step in range(config.inner_steps):
            grads = []
            for worker, ((x_k, y_k), rng_k) in enumerate(zip(shards, worker_rngs, strict=True)):
                x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, rng_k)
                if encode is not None:  # the character-level task: one-hot windows, batch by batch
                    x_batch = encode(x_batch, next(iter(params.values())).dtype)
                logits, cache = model_forward(params, x_batch)
                if not np.isfinite(logits.sum()):
                    raise Diverged("sync", round_index, worker, "the logits overflowed (not finite)", step + 1)
                losses[worker, step] = cross_entropy_loss(logits, y_batch)
                _check_loss("sync", round_index, worker, losses[worker, step], max_loss, step + 1)
                grads.append(model_backward(params, cache, y_batch))
                key = _finite(grads[-1])
                if key is not None:
                    raise Diverged("sync", round_index, worker, f"gradient[{key!r}] is not finite", step + 1)
            params, state = scheduled_adamw_step(params, state, average_params(grads), config)
            key = _finite(params)
            if key is not None:
                raise Diverged("sync", round_index, None, f"parameter {key!r} is not finite after the AdamW step",
                               step + 1)
        record = round_record(losses.mean(axis=1), params, config)
        finish_record(record, round_index, config, params, x_eval, y_eval, history, encode=encode)
        _check_eval("sync", record, max_loss)
        if on_round is not None:
            on_round(record)
        save(round_index, params, None, [state], rng, history)
    return TrainResult(params, history)


def train_resumable(algo: str, x: np.ndarray, y: np.ndarray, config, *, x_eval=None, y_eval=None,
                    checkpoint_dir=None, checkpoint_every: int | None = None, resume_from=None,
                    max_loss: float | None = None, on_round=None, on_checkpoint=None, encode=None) -> TrainResult:
    """Train ``algo`` ("diloco" or "sync") with checkpoints, resume and a divergence guard.

    Parameters
    ----------
    algo : "diloco" or "sync"
    x, y, config, x_eval, y_eval, on_round
        As for ``train_diloco``. The run generator is always ``default_rng(config.seed)``.
    checkpoint_dir : path, optional
        Where checkpoints go; None writes none.
    checkpoint_every : int >= 1, optional
        With ``checkpoint_dir``: a checkpoint after every this many rounds; the last round
        is always checkpointed (the final params and states). Default: only the last.
    resume_from : path or Checkpoint, optional
        A checkpoint folder (its newest checkpoint of ``algo``) or a manifest. Training
        continues after its round; the checkpoint must have been made with this exact
        ``config`` and data, else ``CheckpointError``. ``checkpoint_dir`` defaults to the
        folder of the checkpoint.
    max_loss : float > 0, optional
        A training or held-out loss above this counts as divergence.
    on_checkpoint : callable(path, round), optional
        Called after each checkpoint is on disk.

    Returns
    -------
    TrainResult(params, history)
        Bit-identical to ``train_diloco`` / ``train_synchronous_baseline`` for the same
        inputs, interrupted and resumed or not.

    Raises
    ------
    Diverged
        A non-finite value (or a loss above ``max_loss``); names round, worker, quantity.
    diloco.tools.checkpoint.CheckpointError
        ``resume_from`` is missing, truncated, corrupted, of another version, or made with
        another config or data.
    TypeError, ValueError
        Bad data or config, as for ``train_diloco``.
    """
    if algo not in ("diloco", "sync"):
        raise ValueError(f"algo must be 'diloco' or 'sync', got {algo!r}")
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 1):
        raise ValueError(f"checkpoint_every must be a positive int, got {checkpoint_every!r}")
    if max_loss is not None and not (isinstance(max_loss, (int, float)) and math.isfinite(max_loss) and max_loss > 0):
        raise ValueError(f"max_loss must be a positive finite number, got {max_loss!r}")
    for name, hook in (("on_round", on_round), ("on_checkpoint", on_checkpoint)):
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable, got {type(hook).__name__}")
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, None, encode=encode)
    if encode is not None and config.engine == "fast":
        raise ValueError("engine 'fast' does not take encode= (the character-level task): use engine 'reference'")
    fingerprint = data_fingerprint(x, y, x_eval, y_eval)
    if resume_from is not None:
        if isinstance(resume_from, Checkpoint):  # loaded already: read it again, verified against this run
            resume_from = resume_from.path
        checkpoint = load_checkpoint(resume_from, algo=algo, config=config, fingerprint=fingerprint)
        start = checkpoint._asdict()
        if checkpoint_dir is None:
            checkpoint_dir = checkpoint.path.parent
    else:
        num_states = config.num_workers if algo == "diloco" else 1
        start = {"round": 0, "params": params, "rng": rng, "history": [],
                 "outer_state": init_outer_optimizer(params) if algo == "diloco" else None,
                 "worker_states": [init_adamw_state(params) for _ in range(num_states)],
                 "worker_starts": [params] * config.num_workers if algo == "diloco" and config.drop_prob > 0
                 else None}

    def due(round_index) -> bool:
        return checkpoint_dir is not None and (
            round_index == config.rounds or (checkpoint_every is not None and round_index % checkpoint_every == 0))

    def save(round_index, params, outer_state, worker_states, rng, history, worker_starts=None):
        if due(round_index):
            path = save_checkpoint(Path(checkpoint_dir), algo, round_index, config, params, outer_state,
                                   worker_states, rng, history, fingerprint, worker_starts=worker_starts)
            if on_checkpoint is not None:
                on_checkpoint(path, round_index)

    if config.engine == "fast":
        return _fast_rounds(algo, x, y, config, x_eval, y_eval, start if resume_from is not None else None, due,
                            save, on_round, max_loss)
    rounds = _diloco_rounds if algo == "diloco" else _sync_rounds
    return rounds(start, config, shards, x_eval, y_eval, save, on_round, max_loss, encode)


def _fast_rounds(algo, x, y, config, x_eval, y_eval, start, due, save, on_round, max_loss) -> TrainResult:
    """``config.engine == "fast"``: ``diloco.engine`` trains; its state comes out per round to be saved.

    The guard sees each round's record (``check_record``): the engine takes no per-step hook.
    """
    try:
        from diloco.engine import TRAINERS as FAST_TRAINERS
    except ImportError:
        raise ValueError("engine 'fast' is not installed here (learner workspaces leave it out); "
                         "use engine 'reference'") from None

    def guarded(record):
        check_record(record, algo, max_loss)
        if on_round is not None:
            on_round(record)

    def on_state(round_index, get_state):
        if not due(round_index):
            return  # no copies out of the engine's buffers unless a checkpoint is due
        state = get_state()
        save(round_index, state["params"], state["outer_state"], state["worker_states"], state["rng"],
             state["history"])

    # At a trainer's depth, the evaluation the engine runs each round skips its checks, so a
    # blow-up reaches the guard (and its message) instead of an overflow error from evaluate_loss.
    return milestone(FAST_TRAINERS[algo])(x, y, config, x_eval=x_eval, y_eval=y_eval, on_round=guarded,
                                          start=start, on_state=on_state)
