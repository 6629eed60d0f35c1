"""Part 6 - the DiLoCo round, the training loop, and the synchronous baseline.

Milestones 25-27: the course's Algorithm 1, with no mechanism plumbing. All K workers are
simulated in one process, one after another.

Random streams: at the start of every round the run's generator spawns one child per
worker (``rng.spawn(K)``); worker k draws all its mini-batches of that round from child
k. The baseline does the same, so for a given seed both algorithms see exactly the same
mini-batches and differ only in how they combine the workers' work.

The paper's mechanisms (inner lr schedule, clipping, shard-size weights, outer Adam,
dropped outer gradients, the similarity record, an input encoder for the character-level
task) and the family beyond it are run by the one training core, ``diloco.core.driver``,
which calls these milestones' building blocks; on the reference executor with default
settings it equals ``train_diloco`` and ``train_synchronous_baseline`` bit for bit. The
records and the trainers' shared start live in ``diloco.core.run_records`` (re-exported here).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import check_args, milestone
from diloco.adamw import AdamWState, adamw_step, init_adamw_state
from diloco.config import DiLoCoConfig
from diloco.core.mechanisms import global_norm
from diloco.core.run_records import (
    EVAL_CHUNK,
    RoundCallback,
    RoundRecord,
    TrainResult,
    finish_record,
    held_out_metrics,
    num_values,
    prepare_training,
    refuse_mechanisms,
    round_record,
)
from diloco.model import Params, cross_entropy_loss, model_backward, model_forward
from diloco.outer import (
    OuterState,
    compute_outer_gradient,
    init_outer_optimizer,
    nesterov_param_update,
    update_outer_momentum,
)
from diloco.params import average_params
from diloco.sharding import inner_train_worker, sample_worker_batch

__all__ = [
    "RoundRecord", "RoundResult", "TrainResult", "run_diloco_round", "train_diloco", "train_synchronous_baseline",
    "num_values", "global_norm", "round_record", "prepare_training", "finish_record", "held_out_metrics",
    "EVAL_CHUNK",
]


class RoundResult(NamedTuple):
    """What one DiLoCo round returns (milestone 25).

    Attributes
    ----------
    global_params : dict of str -> ndarray
        The global model after the outer step.
    outer_state : OuterState
        The outer momentum after the round.
    worker_states : list of K AdamWState
        Each worker's AdamW state at the end of its H inner steps, carried to the next round.
    record : RoundRecord
        The round's training fields (``round_record``): ``inner_loss``, ``worker_losses``,
        ``pseudo_grad_norm``, ``all_reduces``, ``bytes_sent``.
    """

    global_params: Params
    outer_state: OuterState
    worker_states: list
    record: dict


@milestone
def run_diloco_round(global_params: Params, outer_state: OuterState, worker_states, shards, config: DiLoCoConfig,
                     rng) -> RoundResult:
    """Milestone 25: one DiLoCo round (one synchronisation).

    1. Spawn one random stream per worker: ``worker_rngs = rng.spawn(K)``.
    2. Every worker k starts from ``global_params`` and runs ``inner_train_worker`` for
       ``config.inner_steps`` steps on its shard with its own carried AdamW state.
    3. ``delta = compute_outer_gradient(global_params, worker_params)`` (old minus new).
    4. ``m = update_outer_momentum(outer_state, delta, mu)`` then
       ``theta = nesterov_param_update(theta, delta, m, outer_lr, mu, nesterov=...)``.

    Parameters
    ----------
    global_params : dict of str -> ndarray (MLP)
    outer_state : OuterState
    worker_states : list of K AdamWState
        Each worker's optimizer state from its previous round.
    shards : list of K (x_k, y_k)
    config : DiLoCoConfig
    rng : numpy.random.Generator

    Returns
    -------
    RoundResult(global_params, outer_state, worker_states, record)
        ``record`` holds ``inner_loss`` (mean over workers and steps),
        ``worker_losses`` (list of K means), ``pseudo_grad_norm`` (global L2 norm of
        delta), ``all_reduces`` (1) and ``bytes_sent`` (per worker, ring all-reduce at
        the params' precision).

    Raises
    ------
    TypeError, ValueError
        Wrong config type, ``worker_states`` or ``shards`` not of length K, bad rng.
    """
    config = check_args.run_diloco_round(global_params, outer_state, worker_states, shards, config, rng)
    # BEGIN SOLUTION
    worker_rngs = rng.spawn(config.num_workers)
    worker_params, new_states, worker_losses = [], [], []
    for (x_k, y_k), state_k, rng_k in zip(shards, worker_states, worker_rngs, strict=True):
        params_k, state_k, losses_k = inner_train_worker(global_params, state_k, x_k, y_k, config.inner_steps,
                                                         config.batch_size, config.inner, rng_k)
        worker_params.append(params_k)
        new_states.append(state_k)
        worker_losses.append(float(losses_k.mean()))
    pseudo_grad = compute_outer_gradient(global_params, worker_params)
    outer_state = update_outer_momentum(outer_state, pseudo_grad, config.outer_momentum)
    new_global = nesterov_param_update(global_params, pseudo_grad, outer_state, config.outer_lr,
                                       config.outer_momentum, nesterov=config.nesterov)
    record = round_record(worker_losses, global_params, config, pseudo_grad=pseudo_grad)
    return RoundResult(new_global, outer_state, new_states, record)
    # END SOLUTION


@milestone
def train_diloco(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None, rng=None,
                 on_round: RoundCallback | None = None) -> TrainResult:
    """Milestone 26: train with DiLoCo for ``config.rounds`` rounds.

    With ``rng = default_rng(config.seed)`` unless given: shard the data (IID, or
    non-IID with ``config.alpha``), He-initialise the MLP ``(d_in, *hidden_sizes, C)``
    (``C = max label + 1``), give every worker a fresh AdamW state and the outer
    optimizer a zero momentum (``prepare_training`` does the first two), then run
    ``run_diloco_round`` ``rounds`` times, evaluating the global model on
    ``(x_eval, y_eval)`` after each round (``finish_record``).

    Parameters
    ----------
    x : ndarray of shape (n, d_in), floating
    y : ndarray of shape (n,), integer labels
    config : DiLoCoConfig
    x_eval, y_eval : held-out data, keyword-only, optional (both or neither)
    rng : numpy.random.Generator, keyword-only, optional
    on_round : callable(record) -> None, keyword-only, optional
        Called after every round with its finished record (for progress bars and
        writing history files as the run goes).

    Returns
    -------
    TrainResult(params, history)
        The same seed gives bit-identical params and history.

    Raises
    ------
    TypeError, ValueError
        Bad data, config or rng; a mechanism this loop does not run (``clip_norm``, an lr
        schedule, an outer optimizer but SGD: ``refuse_mechanisms``).
    """
    refuse_mechanisms(config, "diloco")
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng, on_round=on_round)
    # BEGIN SOLUTION
    worker_states = [init_adamw_state(params) for _ in range(config.num_workers)]
    outer_state = init_outer_optimizer(params)
    history: list[dict] = []
    for round_index in range(1, config.rounds + 1):
        params, outer_state, worker_states, record = run_diloco_round(params, outer_state, worker_states, shards,
                                                                      config, rng)
        finish_record(record, round_index, config, params, x_eval, y_eval, history)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)
    # END SOLUTION


@milestone
def train_synchronous_baseline(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None,
                               rng=None, on_round: RoundCallback | None = None) -> TrainResult:
    """Milestone 27: the synchronous data-parallel baseline at equal compute.

    Same shards, same initial model and the same mini-batches as ``train_diloco`` for
    the same seed. Every step each of the K workers computes a gradient on its own
    batch; the gradients are averaged (one all-reduce per step) and one AdamW step is
    taken on the single shared model. ``rounds * inner_steps`` steps in all; a history
    record every ``inner_steps`` steps, aligned with DiLoCo's rounds.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round
        As for ``train_diloco``; the outer-optimizer fields of ``config`` are unused.

    Returns
    -------
    TrainResult(params, history)
        ``history[r]["all_reduces"] == inner_steps``.

    Raises
    ------
    TypeError, ValueError
        Bad data, config or rng; a mechanism this loop does not run (``clip_norm``, an lr
        schedule, an outer optimizer but SGD: ``refuse_mechanisms``).
    """
    refuse_mechanisms(config, "sync")
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng, on_round=on_round)
    # BEGIN SOLUTION
    state: AdamWState = init_adamw_state(params)
    history: list[dict] = []
    for round_index in range(1, config.rounds + 1):
        worker_rngs = rng.spawn(config.num_workers)  # the same streams DiLoCo's workers get
        losses = np.empty((config.num_workers, config.inner_steps))
        for step in range(config.inner_steps):
            grads = []
            for worker, ((x_k, y_k), rng_k) in enumerate(zip(shards, worker_rngs, strict=True)):
                x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, rng_k)
                logits, cache = model_forward(params, x_batch)
                losses[worker, step] = cross_entropy_loss(logits, y_batch)
                grads.append(model_backward(params, cache, y_batch))
            params, state = adamw_step(params, state, average_params(grads), config.inner)
        record = round_record(losses.mean(axis=1), params, config)
        finish_record(record, round_index, config, params, x_eval, y_eval, history)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)
    # END SOLUTION
