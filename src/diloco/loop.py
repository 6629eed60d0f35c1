"""Part 6 - the DiLoCo round, the training loop, and the synchronous baseline.

Milestones 25-27. All K workers are simulated in one process, one after another.

Random streams: at the start of every round the run's generator spawns one child per
worker (``rng.spawn(K)``); worker k draws all its mini-batches of that round from child
k. The baseline does the same, so for a given seed both algorithms see exactly the same
mini-batches and differ only in how they combine the workers' work.

The paper's mechanisms (inner lr schedule, gradient clipping, shard-size weights, outer
Adam, dropped outer gradients, worker similarity) are ``DiLoCoConfig`` fields, composed
here from ``diloco.mechanisms``; at their defaults the round is the course's. ``encode``
(keyword-only, e.g. ``diloco.text.OneHot``) turns stored index windows into model inputs
one mini-batch at a time, for the character-level language model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypedDict

import numpy as np

from diloco._validation import (
    check_args,
    check_fits_in_memory,
    check_float_array,
    check_generator,
    check_labels,
    check_params,
    milestone,
)
from diloco.adamw import AdamWState, init_adamw_state
from diloco.config import DiLoCoConfig
from diloco.evaluation import classification_accuracy, communication_savings, evaluate_loss
from diloco.mechanisms import (
    copy_outer_state,
    draw_dropped,
    global_norm,
    mean_pairwise_cosine,
    outer_step,
    pseudo_grad_weights,
    scheduled_adamw_step,
    train_worker,
    uses_plain_worker,
)
from diloco.model import Params, cross_entropy_loss, init_model_params, model_backward, model_forward
from diloco.outer import OuterState, compute_outer_gradient, init_outer_optimizer
from diloco.params import average_params
from diloco.sharding import iid_shard_dataset, inner_train_worker, noniid_shard_dataset, sample_worker_batch
from diloco.text import bits_per_char, perplexity

__all__ = [
    "RoundRecord", "RoundResult", "RoundResultWithStarts", "TrainResult", "run_diloco_round", "train_diloco",
    "train_synchronous_baseline", "num_values", "global_norm", "round_record", "prepare_training", "finish_record",
    "held_out_metrics",
]

# Held-out windows encoded at a time by ``held_out_metrics`` (one (2048, c V) block).
EVAL_CHUNK = 2048


class _RoundRecordFields(TypedDict):
    """The fields every record has (see ``RoundRecord``)."""

    round: int
    step: int
    inner_loss: float
    worker_losses: list
    all_reduces: int
    bytes_sent: float
    cumulative_bytes: float
    eval_loss: float | None
    eval_accuracy: float | None
    eval_perplexity: float | None
    eval_bits: float | None


class RoundRecord(_RoundRecordFields, total=False):
    """One entry of a run's history: one DiLoCo round, or ``inner_steps`` baseline steps.

    The single schema of the per-round record, used by the loop, the MPI backend, the run
    folder's ``history.jsonl`` and the docs. ``round_record`` fills the training fields,
    ``finish_record`` the position and evaluation fields.

    Attributes
    ----------
    round : int
        1-based round index.
    step : int
        Inner steps per worker so far, ``round * inner_steps``.
    inner_loss : float
        Mean training loss over the workers and the round's steps.
    worker_losses : list of float
        Each worker's mean training loss in the round (K entries).
    pseudo_grad_norm : float
        DiLoCo only: global L2 norm of the averaged pseudo-gradient.
    all_reduces : int
        All-reduces in the round: 1 for DiLoCo, ``inner_steps`` for the baseline.
    bytes_sent : float
        Bytes each worker sent in the round (ring all-reduce, params' precision).
    cumulative_bytes : float
        ``bytes_sent`` summed over the rounds so far.
    eval_loss, eval_accuracy : float or None
        Held-out metrics of the global model after the round; None without held-out data.
    eval_perplexity, eval_bits : float or None
        ``exp(eval_loss)`` and ``eval_loss / ln 2``: perplexity and bits per prediction
        (per character for the character-level language model).
    dropped_workers : list of int
        DiLoCo with ``drop_prob > 0`` only: the workers whose outer gradient was dropped.
    pseudo_grad_cosine : float or None
        DiLoCo with ``record_similarity`` only: mean pairwise cosine similarity of the
        workers' own pseudo-gradients (None for one worker).
    allreduce_seconds : float
        MPI only: wall time this rank spent in the round's all-reduce.
    mpi_bytes_sent : int
        ``diloco.family`` on MPI only: the bytes this rank handed MPI for other ranks in
        the round (its share of the reduce-scatter and all-gather of payloads).
    peak_sync_bytes, bytes_per_step : float
        ``diloco.family`` only: the largest single synchronisation of the round (one
        fragment's, with Streaming DiLoCo) and ``bytes_sent / inner_steps``.
    syncs : list of [int, float, int]
        ``diloco.family`` only: per all-reduce of the round, the inner step (1..H) after
        which it starts, the bytes each worker sends, and the overlap tau (inner steps
        until its result is needed), as ``diloco.core.netsim`` reads them.
    sim_seconds, sim_cumulative_seconds, sim_utilization, sim_step_time : float
        With a simulated network (``--bandwidth``) only: the round's simulated wall time,
        the run's so far, the fraction of it spent computing, and the compute seconds per
        inner step used (``sim_step_time`` on the first record).
    """

    pseudo_grad_norm: float
    dropped_workers: list
    pseudo_grad_cosine: float | None
    allreduce_seconds: float
    peak_sync_bytes: float
    bytes_per_step: float
    syncs: list
    sim_seconds: float
    sim_cumulative_seconds: float
    sim_utilization: float
    sim_step_time: float
    mpi_bytes_sent: int


RoundCallback = Callable[[RoundRecord], None]


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


class RoundResultWithStarts(NamedTuple):
    """What milestone 25 returns when called with ``worker_starts`` (dropped outer gradients).

    Attributes
    ----------
    global_params, outer_state, worker_states, record
        As in ``RoundResult``.
    worker_starts : list of K dicts of str -> ndarray
        Where each worker starts the next round: the new global params, or, for a worker
        whose outer gradient was dropped, its own parameters.
    """

    global_params: Params
    outer_state: OuterState
    worker_states: list
    record: dict
    worker_starts: list


class TrainResult(NamedTuple):
    """What ``train_diloco`` and ``train_synchronous_baseline`` return.

    Attributes
    ----------
    params : dict of str -> ndarray
        The final global parameters.
    history : list of RoundRecord
        One record per round (per ``inner_steps`` steps for the baseline); see
        ``RoundRecord`` for the fields.
    """

    params: Params
    history: list


def num_values(params: Params) -> int:
    """Number of scalars in a parameter dict (what one all-reduce sends per worker)."""
    check_params(params, finite=False)
    return int(sum(value.size for value in params.values()))


def round_record(worker_losses, params: Params, config: DiLoCoConfig, *, pseudo_grad: Params | None = None
                 ) -> RoundRecord:
    """The training fields of one round's record (see ``RoundRecord``).

    With ``pseudo_grad`` (DiLoCo) the round made one all-reduce of the params and the
    record carries ``pseudo_grad_norm``; without it (the baseline) it made
    ``config.inner_steps``. Bytes come from ``communication_savings`` (milestone 30) at
    the params' precision.
    """
    check_args.diloco_config(config)
    check_params(params, finite=False)
    if isinstance(worker_losses, (str, bytes)) or not hasattr(worker_losses, "__iter__"):
        raise TypeError(f"worker_losses must be a sequence of floats, got {type(worker_losses).__name__}")
    try:
        worker_losses = [float(value) for value in worker_losses]
    except (TypeError, ValueError):
        raise TypeError(f"worker_losses must hold real numbers, got {list(worker_losses)[:3]!r}...") from None
    if len(worker_losses) != config.num_workers:
        raise ValueError(f"worker_losses must have one entry per worker ({config.num_workers}), "
                         f"got {len(worker_losses)}")
    itemsize = next(iter(params.values())).dtype.itemsize
    comm = communication_savings(num_values(params), config.num_workers, config.inner_steps, 1,
                                 bytes_per_value=itemsize)
    record: RoundRecord = {"inner_loss": float(np.mean(worker_losses)), "worker_losses": worker_losses}
    if pseudo_grad is not None:
        record["pseudo_grad_norm"] = global_norm(pseudo_grad)
        record["all_reduces"] = comm.diloco_all_reduces
        record["bytes_sent"] = comm.diloco_bytes_per_worker
    else:
        record["all_reduces"] = comm.sync_all_reduces
        record["bytes_sent"] = comm.sync_bytes_per_worker
    return record


@milestone
def run_diloco_round(global_params: Params, outer_state: OuterState, worker_states, shards, config: DiLoCoConfig,
                     rng, *, encode=None, worker_starts=None) -> RoundResult:
    """Milestone 25: one DiLoCo round (one synchronisation).

    1. Spawn one random stream per worker: ``worker_rngs = rng.spawn(K)``.
    2. Every worker k starts from ``global_params`` and runs ``inner_train_worker`` for
       ``config.inner_steps`` steps on its shard with its own carried AdamW state.
    3. ``delta = compute_outer_gradient(global_params, worker_params)`` (old minus new).
    4. ``m = update_outer_momentum(outer_state, delta, mu)`` then
       ``theta = nesterov_param_update(theta, delta, m, outer_lr, mu, nesterov=...)``.

    The paper's mechanisms (``DiLoCoConfig`` fields, helpers in ``diloco.mechanisms``)
    extend these steps; at their defaults the round is exactly the four steps above:

    * step 2 runs ``train_worker`` instead of milestone 20 when the inner lr follows a
      schedule, gradients are clipped or an ``encode``-r is given;
    * step 3 weighs the workers by ``pseudo_grad_weights`` (shard sizes, for non-IID
      shards by default) and leaves out the workers ``draw_dropped`` drops;
    * step 4 is ``outer_step``: milestones 22-23, or Adam for ``outer_optimizer="adam"``.

    Parameters
    ----------
    global_params : dict of str -> ndarray (MLP)
    outer_state : OuterState
    worker_states : list of K AdamWState
        Each worker's optimizer state from its previous round.
    shards : list of K (x_k, y_k)
        Features, or index windows when ``encode`` is given.
    config : DiLoCoConfig
    rng : numpy.random.Generator
    encode : callable, keyword-only, optional
        Turns a mini-batch of stored rows into model inputs (``diloco.text.OneHot``).
    worker_starts : list of K param dicts, keyword-only, optional
        Where each worker starts this round (needed when ``config.drop_prob > 0``: a
        worker whose outer gradient was dropped carries on from its own parameters).
        When given, the result is a ``RoundResultWithStarts`` whose ``worker_starts``
        are the next round's starting points.

    Returns
    -------
    RoundResult(global_params, outer_state, worker_states, record)
        ``record`` holds ``inner_loss`` (mean over workers and steps),
        ``worker_losses`` (list of K means), ``pseudo_grad_norm`` (global L2 norm of
        delta), ``all_reduces`` (1) and ``bytes_sent`` (per worker, ring all-reduce at
        the params' precision); ``dropped_workers`` and ``pseudo_grad_cosine`` when
        those mechanisms are on. With ``worker_starts``: a ``RoundResultWithStarts``.
        If every outer gradient is dropped, no outer step is taken (delta = 0).

    Raises
    ------
    TypeError, ValueError
        Wrong config type, ``worker_states`` or ``shards`` not of length K, bad rng,
        ``drop_prob > 0`` without ``worker_starts``.
    """
    config = check_args.run_diloco_round(global_params, outer_state, worker_states, shards, config, rng, encode,
                                         worker_starts)
    # BEGIN SOLUTION
    num_workers = config.num_workers
    worker_rngs = rng.spawn(num_workers)
    starts = [global_params] * num_workers if worker_starts is None else worker_starts
    plain = uses_plain_worker(config, encode)  # milestone 20 as it is: constant lr, no clipping, no encoder
    worker_params, new_states, worker_losses = [], [], []
    for (x_k, y_k), state_k, rng_k, start_k in zip(shards, worker_states, worker_rngs, starts, strict=True):
        if plain:
            params_k, state_k, losses_k = inner_train_worker(
                start_k, state_k, x_k, y_k, config.inner_steps, config.batch_size, config.inner, rng_k
            )
        else:
            params_k, state_k, losses_k = train_worker(start_k, state_k, x_k, y_k, config, rng_k, encode=encode)
        worker_params.append(params_k)
        new_states.append(state_k)
        worker_losses.append(float(losses_k.mean()))
    dropped = draw_dropped(rng, config)  # [] unless config.drop_prob > 0
    kept = [k for k in range(num_workers) if k not in dropped]
    weights = pseudo_grad_weights(shards, config)  # None (uniform) unless weighting by shard size
    if kept:
        pseudo_grad = compute_outer_gradient(global_params, [worker_params[k] for k in kept],
                                             None if weights is None else [weights[k] for k in kept])
        new_global, outer_state = outer_step(global_params, pseudo_grad, outer_state, config)
    else:  # every outer gradient was dropped: nothing reached the server, no outer step
        pseudo_grad = {key: np.zeros_like(value) for key, value in global_params.items()}
        new_global = {key: value.copy() for key, value in global_params.items()}
        outer_state = copy_outer_state(outer_state)
    record = round_record(worker_losses, global_params, config, pseudo_grad=pseudo_grad)
    if config.drop_prob > 0:
        record["dropped_workers"] = dropped
    if config.record_similarity:
        record["pseudo_grad_cosine"] = mean_pairwise_cosine(global_params, worker_params)
    if worker_starts is None:
        return RoundResult(new_global, outer_state, new_states, record)
    next_starts = [worker_params[k] if k in dropped else new_global for k in range(num_workers)]
    return RoundResultWithStarts(new_global, outer_state, new_states, record, next_starts)
    # END SOLUTION


def prepare_training(x, y, config, x_eval=None, y_eval=None, rng=None, *, encode=None, on_round=None):
    """The shared start of every trainer: validate, shard, initialise, in one rng order.

    Used by ``train_diloco``, ``train_synchronous_baseline`` and the MPI backend, so for
    one seed they all start from the same shards and the same initial model. With
    ``encode``, ``x`` holds index windows of width ``encode.input_width`` and the model's
    input width is ``encode.num_features``. ``on_round``, if given, is only checked to be
    callable (a trainer's callback, refused before any training).

    Returns
    -------
    (config, rng, shards, params)

    Raises
    ------
    TypeError, ValueError
        Bad data, config, rng or callback; fewer than two classes; a model too large for
        the memory available.
    """
    config = check_args.diloco_config(config)
    check_float_array(x, "x", ndim=2)
    check_labels(y, "y", n=x.shape[0])
    if y.size == 0:
        raise ValueError("x must hold at least one example")
    if x.shape[1] == 0:
        raise ValueError("x must have at least one feature (column), got shape (n, 0)")
    check_args.workers_fit(config.num_workers, x.shape[0])  # checked here: the sharding call is nested
    num_features = x.shape[1] if encode is None else check_args.encoder(encode, x.shape[1])
    if (x_eval is None) != (y_eval is None):
        raise ValueError("x_eval and y_eval must be given together")
    if on_round is not None and not callable(on_round):
        raise TypeError(f"on_round must be callable (a function of the round's record), got {type(on_round).__name__}")
    num_classes = int(y.max()) + 1
    if x_eval is not None:
        check_float_array(x_eval, "x_eval", ndim=2)
        if x_eval.shape[0] == 0:
            raise ValueError("x_eval must hold at least one example (or pass no held-out data at all)")
        if x_eval.shape[1] != x.shape[1]:
            raise ValueError(f"x_eval must have {x.shape[1]} columns like x, got shape {x_eval.shape}")
        check_labels(y_eval, "y_eval", n=x_eval.shape[0])
        if y_eval.size:
            num_classes = max(num_classes, int(y_eval.max()) + 1)
    if num_classes < 2:
        raise ValueError("y must hold at least two classes (labels 0 and 1 at least): with one, every accuracy "
                         "would be a meaningless 1.0")
    layer_sizes = (num_features, *config.hidden_sizes, num_classes)
    num_params = sum(a * b + b for a, b in zip(layer_sizes[:-1], layer_sizes[1:], strict=True))
    check_fits_in_memory(num_params * np.dtype(config.dtype).itemsize * (3 * config.num_workers + 4), "the model",
                         f"layer sizes {layer_sizes} (C = largest label in y or y_eval + 1), "
                         f"{num_params:,} parameters, with K = {config.num_workers} workers' copies and states,")
    rng = np.random.default_rng(config.seed) if rng is None else check_generator(rng)
    if config.iid:
        shards = iid_shard_dataset(x, y, config.num_workers, rng)
    else:
        shards = noniid_shard_dataset(x, y, config.num_workers, rng, alpha=config.alpha)
    params = init_model_params(layer_sizes, rng, dtype=np.dtype(config.dtype))
    return config, rng, shards, params


def held_out_metrics(params: Params, x_eval, y_eval, encode=None) -> tuple[float, float]:
    """``(evaluate_loss, classification_accuracy)`` of ``params`` on held-out data.

    Without ``encode`` these are milestones 28 and 29 on the whole array. With it, the
    index windows are encoded ``EVAL_CHUNK`` rows at a time and the chunks' means are
    combined, weighted by their sizes, so no dense ``(n, c V)`` matrix is ever built.
    """
    if encode is None:
        return evaluate_loss(params, x_eval, y_eval), classification_accuracy(params, x_eval, y_eval)
    dtype = next(iter(params.values())).dtype
    loss_sum = correct = 0.0
    for start in range(0, len(y_eval), EVAL_CHUNK):
        x_chunk, y_chunk = encode(x_eval[start:start + EVAL_CHUNK], dtype), y_eval[start:start + EVAL_CHUNK]
        loss_sum += evaluate_loss(params, x_chunk, y_chunk) * len(y_chunk)
        correct += classification_accuracy(params, x_chunk, y_chunk) * len(y_chunk)
    return loss_sum / len(y_eval), correct / len(y_eval)


def finish_record(record: RoundRecord, round_index: int, config, params, x_eval, y_eval, history: list, *,
                  encode=None) -> RoundRecord:
    """Complete ``record`` with its position, cumulative bytes and held-out metrics; append it to ``history``.

    The held-out metrics are ``eval_loss``, ``eval_accuracy`` and, from the loss,
    ``eval_perplexity = exp(eval_loss)`` and ``eval_bits = eval_loss / ln 2``.
    """
    record["round"] = round_index
    record["step"] = round_index * config.inner_steps
    previous = history[-1]["cumulative_bytes"] if history else 0.0
    record["cumulative_bytes"] = previous + record["bytes_sent"]
    if x_eval is None:
        record["eval_loss"] = record["eval_accuracy"] = record["eval_perplexity"] = record["eval_bits"] = None
    else:
        record["eval_loss"], record["eval_accuracy"] = held_out_metrics(params, x_eval, y_eval, encode)
        record["eval_perplexity"] = perplexity(record["eval_loss"])
        record["eval_bits"] = bits_per_char(record["eval_loss"])
    history.append(record)
    return record


@milestone
def train_diloco(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None, rng=None,
                 on_round: RoundCallback | None = None, encode=None) -> TrainResult:
    """Milestone 26: train with DiLoCo for ``config.rounds`` rounds.

    With ``rng = default_rng(config.seed)`` unless given: shard the data (IID, or
    non-IID with ``config.alpha``), He-initialise the MLP ``(d_in, *hidden_sizes, C)``
    (``C = max label + 1``), give every worker a fresh AdamW state and the outer
    optimizer a zero momentum, then run ``run_diloco_round`` ``rounds`` times,
    evaluating the global model on ``(x_eval, y_eval)`` after each round.

    With ``config.drop_prob > 0`` the loop also carries where each worker starts its
    next round (``worker_starts``: every worker starts the first round from the initial
    model; a worker whose outer gradient was dropped carries on from its own parameters).

    Parameters
    ----------
    x : ndarray of shape (n, d_in), floating
        Features, or index windows of width ``encode.input_width`` when ``encode`` is given.
    y : ndarray of shape (n,), integer labels
    config : DiLoCoConfig
    x_eval, y_eval : held-out data, keyword-only, optional (both or neither)
    rng : numpy.random.Generator, keyword-only, optional
    on_round : callable(record) -> None, keyword-only, optional
        Called after every round with its finished record (for progress bars and
        writing history files as the run goes).
    encode : callable, keyword-only, optional
        Turns stored rows into model inputs, one mini-batch (or evaluation chunk) at a
        time: ``diloco.text.OneHot`` for the character-level language model.

    Returns
    -------
    TrainResult(params, history)
        The same seed gives bit-identical params and history.

    Raises
    ------
    TypeError, ValueError
        Bad data, config or rng.
    """
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng, encode=encode, on_round=on_round)
    # BEGIN SOLUTION
    worker_states = [init_adamw_state(params) for _ in range(config.num_workers)]
    outer_state = init_outer_optimizer(params)
    starts = [params] * config.num_workers if config.drop_prob > 0 else None  # only dropped workers diverge
    history: list[dict] = []
    for round_index in range(1, config.rounds + 1):
        result = run_diloco_round(params, outer_state, worker_states, shards, config, rng, encode=encode,
                                  worker_starts=starts)
        params, outer_state, worker_states, record = result[:4]
        if starts is not None:
            starts = result.worker_starts
        finish_record(record, round_index, config, params, x_eval, y_eval, history, encode=encode)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)
    # END SOLUTION


@milestone
def train_synchronous_baseline(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None,
                               rng=None, on_round: RoundCallback | None = None, encode=None) -> TrainResult:
    """Milestone 27: the synchronous data-parallel baseline at equal compute.

    Same shards, same initial model and the same mini-batches as ``train_diloco`` for
    the same seed. Every step each of the K workers computes a gradient on its own
    batch; the gradients are averaged (one all-reduce per step) and one AdamW step is
    taken on the single shared model. ``rounds * inner_steps`` steps in all; a history
    record every ``inner_steps`` steps, aligned with DiLoCo's rounds.

    The step is ``scheduled_adamw_step`` (``diloco.mechanisms``): at the defaults plain
    ``adamw_step(params, state, mean_grad, config.inner)``; with ``clip_norm`` and
    ``lr_schedule`` it clips the averaged gradient and follows the same lr curve as
    DiLoCo's workers, so the comparison stays at equal optimizer settings.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round, encode
        As for ``train_diloco``; the outer-optimizer fields of ``config`` are unused.

    Returns
    -------
    TrainResult(params, history)
        ``history[r]["all_reduces"] == inner_steps``.

    Raises
    ------
    TypeError, ValueError
        Bad data, config or rng.
    """
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng, encode=encode, on_round=on_round)
    # BEGIN SOLUTION
    state: AdamWState = init_adamw_state(params)
    dtype = next(iter(params.values())).dtype
    history: list[dict] = []
    for round_index in range(1, config.rounds + 1):
        worker_rngs = rng.spawn(config.num_workers)  # the same streams DiLoCo's workers get
        losses = np.empty((config.num_workers, config.inner_steps))
        for step in range(config.inner_steps):
            grads = []
            for worker, ((x_k, y_k), rng_k) in enumerate(zip(shards, worker_rngs, strict=True)):
                x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, rng_k)
                if encode is not None:
                    x_batch = encode(x_batch, dtype)
                logits, cache = model_forward(params, x_batch)
                losses[worker, step] = cross_entropy_loss(logits, y_batch)
                grads.append(model_backward(params, cache, y_batch))
            params, state = scheduled_adamw_step(params, state, average_params(grads), config)
        record = round_record(losses.mean(axis=1), params, config)
        finish_record(record, round_index, config, params, x_eval, y_eval, history, encode=encode)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)
    # END SOLUTION
