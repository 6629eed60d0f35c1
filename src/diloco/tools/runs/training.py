"""Training that survives crashes: checkpoints, bit-identical resume and a divergence guard.

``train_resumable(algo, x, y, config, ...)`` trains DiLoCo (``algo="diloco"``, with every
mechanism of ``config``, its family section included) or the synchronous baseline
(``"sync"``) through the one driver (``diloco.core.driver.train``), on the executor that
``config.engine`` names (``"reference"``: the milestone functions; ``"fast"``: the
fast executor). ``checkpoint_dir=D, checkpoint_every=N`` writes a checkpoint
(``diloco.tools.runs.checkpoint``) every N rounds and after the last one, and
``resume_from=D`` continues from the newest one. A run killed at any moment and resumed
ends with exactly the params and history of a run that was never interrupted.

The guard, the callback, the checkpoints and the simulated network are the driver's hooks
(``diloco.core.hooks``), so every algorithm and executor has them. The checkpoint hook
(``KeepLastRound``) keeps a copy of the last finished round's state, in one step with the
round's callback (``RoundEnd``: a signal waits for both, so the round kept is always the
last one the history file holds); when a signal
(``KeyboardInterrupt``: SIGINT, SIGTERM, SIGHUP) stops the run mid-round, that round is
written as a checkpoint before the interrupt goes on, so ``resume_from`` continues
after it even without ``checkpoint_every``. The guard checks, after
every round, that the losses, the pseudo-gradient and the parameters are finite (and,
with ``max_loss``, that no loss exceeds it), then the held-out loss. A failure raises
``Diverged``, which names the round, the worker and the quantity; no checkpoint is
written for the bad round, so the last good one stays.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np

from diloco.core.divergence import Diverged, check_record
from diloco.core.driver import RunState, train
from diloco.core.hooks import Callback, Guard, NetworkTimer
from diloco.runtime import stop_signals
from diloco.tools.runs.checkpoint import Checkpoint, data_fingerprint, load_checkpoint, save_checkpoint
from diloco.tools.runs.checkpoint_records import generator_state, restore_generator

__all__ = ["Diverged", "train_resumable", "check_record", "executor_of", "state_of_checkpoint", "KeepLastRound",
           "RoundEnd", "keeps_worker_starts"]


def frozen(state: RunState) -> RunState:
    """``state`` detached from the running driver: the generator, history and family state copied.

    The driver goes on using its generator (``spawn`` moves it), its history list and
    its family state after the round; the params and optimizer states are new arrays
    every round (the executors' ``snapshot``), so they are shared, not copied.
    """
    return state._replace(rng=restore_generator(generator_state(state.rng)), history=list(state.history),
                          extra=copy.deepcopy(state.extra))


class KeepLastRound:
    """The checkpoint hook: ``save(round, state)`` after the rounds ``due(round)`` selects, and a
    copy of every finished round's state, so ``save_last()`` can write it when a signal stops
    the next round (``train_resumable``). ``keep_starts=False``: every worker starts the next
    round from the global params, so the workers' own params are not kept (K fewer arrays)."""

    def __init__(self, due, save, *, keep_starts: bool = True) -> None:
        self.due, self.save, self.keep_starts = due, save, keep_starts
        self.last, self.saved = None, None  # the last finished round's state; the round last on disk

    def finished(self, record, get_state) -> None:
        self.keep(get_state)
        self.save_due(record)

    def keep(self, get_state) -> None:
        """Keep a copy of the round just finished (what ``save_last`` writes)."""
        state = frozen(get_state())
        # one assignment: a signal before it leaves the previous round
        self.last = state if self.keep_starts else state._replace(worker_params=None)

    def save_due(self, record) -> None:
        """Write the round kept if ``due`` selects it."""
        if self.due(record["round"]):
            self.save(record["round"], self.last)
            self.saved = record["round"]

    def save_last(self) -> int | None:
        """Write the last finished round unless it is on disk already; return its round (None: none finished)."""
        if self.last is None:
            return None
        if self.saved != self.last.round:
            self.save(self.last.round, self.last)
            self.saved = self.last.round
        return self.last.round


class RoundEnd:
    """The round's callback (the history line) and ``KeepLastRound``'s copy as one step: a stop
    signal landing in either waits for both (``diloco.runtime.stop_signals.deferred``), so the round an
    interrupt saves is always the last round the history holds. The due checkpoint's write
    comes after, and a signal may stop it (``save_last`` writes the round again, whole)."""

    def __init__(self, callback, checkpoints: KeepLastRound | None) -> None:
        self.callback, self.checkpoints = callback, checkpoints

    def finished(self, record, get_state) -> None:
        with stop_signals.deferred():
            if self.callback is not None:
                self.callback.finished(record, get_state)
            if self.checkpoints is not None:
                self.checkpoints.keep(get_state)
        if self.checkpoints is not None:
            self.checkpoints.save_due(record)


def executor_of(config) -> str:
    """The driver's executor for ``config.engine``: ``"reference"`` or ``"fast"`` (the same word)."""
    return config.engine


def keeps_worker_starts(algo: str, config) -> bool:
    """Whether a checkpoint of ``algo`` (and the round ``KeepLastRound`` keeps) holds the workers' own
    params: not when every worker starts each round from the global params (the baseline, and
    DiLoCo without drops, fragments, eager updates or asynchrony)."""
    family = config.family
    plain = (config.drop_prob == 0 and family.fragments == 1 and family.mix == 1.0 and not family.eager
             and family.tau(config.inner_steps) == 0 and not config.asynchrony.asynchronous)
    return algo == "diloco" and not plain


def state_of_checkpoint(checkpoint: Checkpoint) -> RunState:
    """The driver's ``RunState`` from a loaded checkpoint."""
    starts = None if checkpoint.worker_starts is None else dict(enumerate(checkpoint.worker_starts))
    return RunState(checkpoint.round, checkpoint.params, checkpoint.outer_state, starts,
                    dict(enumerate(checkpoint.worker_states)), checkpoint.rng, list(checkpoint.history),
                    checkpoint.extra or {})


def train_resumable(algo: str, x: np.ndarray, y: np.ndarray, config, *, x_eval=None, y_eval=None,
                    checkpoint_dir=None, checkpoint_every: int | None = None, resume_from=None,
                    max_loss: float | None = None, on_round=None, on_checkpoint=None, encode=None):
    """Train ``algo`` ("diloco" or "sync") with checkpoints, resume and a divergence guard.

    ``x, y, config, x_eval, y_eval, on_round, encode`` are as for ``train_diloco``; the run
    generator is always ``default_rng(config.seed)``.

    - ``checkpoint_dir``: where checkpoints go (None: none). ``checkpoint_every`` (>= 1): a
      checkpoint after every this many rounds; the last round is always checkpointed (default:
      only the last). A ``KeyboardInterrupt`` (a signal) during a round writes the last finished
      round first, then goes on: the work done is kept whatever ``checkpoint_every`` is.
    - ``resume_from``: a checkpoint folder (its newest checkpoint of ``algo``) or a manifest,
      made with this exact ``config`` (family section included) and data; training continues
      after its round, and ``checkpoint_dir`` defaults to its folder.
    - ``max_loss`` (> 0): a training or held-out loss above it is divergence.
    - ``on_checkpoint(path, round)``: called after each checkpoint is on disk.

    Returns ``TrainResult(params, history)``, bit-identical to ``train_diloco`` /
    ``train_synchronous_baseline`` for the same inputs on the reference executor, interrupted
    and resumed or not. Raises ``Diverged`` (a non-finite value or a loss above ``max_loss``,
    naming round, worker and quantity); ``checkpoint.CheckpointError`` (``resume_from``
    missing, truncated, corrupted, of another version, or of another config or data);
    ``TypeError`` / ``ValueError`` for bad data or config, as ``train_diloco`` does.
    """
    _check_options(algo, checkpoint_every, max_loss, on_round=on_round, on_checkpoint=on_checkpoint)
    fingerprint = data_fingerprint(x, y, x_eval, y_eval)
    start, checkpoint_dir = _resumed(resume_from, algo, config, fingerprint, checkpoint_dir)
    checkpoints = None if checkpoint_dir is None else _checkpointer(
        algo, config, Path(checkpoint_dir), checkpoint_every, fingerprint, on_checkpoint)
    guard = Guard(algo, max_loss, start.round if start is not None else 0)
    hooks = [NetworkTimer(config)] if config.family.simulates_network else []
    hooks += [guard, RoundEnd(None if on_round is None else Callback(on_round), checkpoints)]
    try:
        with stop_signals.signal_first(), guard.watch():  # a non-finite pseudo-gradient mid-round is divergence too
            return train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, encode=encode,
                         executor=executor_of(config), hooks=hooks, start=start)
    except KeyboardInterrupt:  # a signal mid-round: the last finished round goes to disk, then the signal goes on
        if checkpoints is not None:
            checkpoints.save_last()
        raise


def _check_options(algo, checkpoint_every, max_loss, **hooks) -> None:
    if algo not in ("diloco", "sync"):
        raise ValueError(f"algo must be 'diloco' or 'sync', got {algo!r}")
    if checkpoint_every is not None and (isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int)
                                         or checkpoint_every < 1):
        raise ValueError(f"checkpoint_every must be a positive int, got {checkpoint_every!r}")
    if max_loss is not None and not (isinstance(max_loss, (int, float)) and math.isfinite(max_loss) and max_loss > 0):
        raise ValueError(f"max_loss must be a positive finite number, got {max_loss!r}")
    for name, hook in hooks.items():
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable, got {type(hook).__name__}")


def _resumed(resume_from, algo: str, config, fingerprint: str, checkpoint_dir):
    """The state to continue from (None: round 0) and the checkpoint folder (the resumed one's by default)."""
    if resume_from is None:
        return None, checkpoint_dir
    if isinstance(resume_from, Checkpoint):  # loaded already: read it again, verified against this run
        resume_from = resume_from.path
    checkpoint = load_checkpoint(resume_from, algo=algo, config=config, fingerprint=fingerprint)
    return state_of_checkpoint(checkpoint), checkpoint.path.parent if checkpoint_dir is None else checkpoint_dir


def _checkpointer(algo: str, config, checkpoint_dir: Path, checkpoint_every, fingerprint: str,
                  on_checkpoint) -> KeepLastRound:
    """The hook that writes a checkpoint every ``checkpoint_every`` rounds and after the last."""

    def due(round_index) -> bool:
        return round_index == config.rounds or (checkpoint_every is not None and round_index % checkpoint_every == 0)

    def save(round_index, state: RunState) -> None:
        starts = None if state.worker_params is None else [state.worker_params[k] for k in range(config.num_workers)]
        path = save_checkpoint(checkpoint_dir, algo, round_index, config, state.global_params,
                               state.outer_state, [state.worker_states[k] for k in sorted(state.worker_states)],
                               state.rng, state.history, fingerprint, worker_starts=starts, extra=state.extra)
        if on_checkpoint is not None:
            on_checkpoint(path, round_index)

    return KeepLastRound(due, save, keep_starts=keeps_worker_starts(algo, config))
