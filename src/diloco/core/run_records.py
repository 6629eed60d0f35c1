"""The records and the shared start of every trainer: what milestones 25-27 and the core share.

``RoundRecord`` is the one schema of a round's record; ``round_record`` fills its training
fields and ``finish_record`` its position and held-out fields. ``prepare_training`` is
the start of every trainer (validate, shard, initialise, in one rng order), so for one
seed the learner's loops (``diloco.loop``) and the core's driver (``diloco.core.driver``)
start from the same shards and the same initial model. None of this is a milestone.
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
)
from diloco.config import DiLoCoConfig
from diloco.core import shard_reuse
from diloco.core.mechanisms import global_norm
from diloco.core.model_seam import data_model, model_for, parameter_count, with_model_defaults
from diloco.evaluation import communication_savings
from diloco.model import Params
from diloco.models.mlp import EVAL_CHUNK, MLPModel
from diloco.sharding import iid_shard_dataset, noniid_shard_dataset
from diloco.text import bits_per_char, perplexity

__all__ = ["RoundRecord", "RoundCallback", "TrainResult", "num_values", "round_record", "prepare_training",
           "refuse_mechanisms", "shard_dataset", "seeded_shards", "finish_record", "held_out_metrics", "EVAL_CHUNK"]


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
        DiLoCo with ``drop_prob > 0`` (or a lost worker) only: the workers whose outer
        gradient was dropped.
    lost_workers : list of int
        MPI with ``--survive-failures`` only, once a rank has died: the workers whose process
        is gone (``diloco.core.membership``); their ``worker_losses`` entries are None and
        ``inner_loss`` is the mean over the others.
    pseudo_grad_cosine : float or None
        DiLoCo with ``record_similarity`` only: mean pairwise cosine similarity of the
        workers' own pseudo-gradients (None for one worker).
    allreduce_seconds : float
        MPI only: wall time this rank spent in the round's all-reduce.
    mpi_bytes_sent : int
        MPI only: every byte this rank handed MPI for other ranks in the round (every
        collective's, their length words included).
    mpi_allreduce_bytes : int
        MPI only: the outer gradients' payload bytes among them, beside the modelled
        ``bytes_sent`` (``docs/cli.md``, "Real processes", says where they differ).
    peak_sync_bytes, bytes_per_step : float
        ``DiLoCoConfig.family`` only: the largest single synchronisation of the round (one
        fragment's, with Streaming DiLoCo) and ``bytes_sent / inner_steps``.
    syncs : list of [int, float, int]
        ``DiLoCoConfig.family`` only: per all-reduce of the round, the inner step (1..H) after
        which it starts, the bytes each worker sends, and the overlap tau (inner steps
        until its result is needed), as ``diloco.core.netsim`` reads them.
    sim_seconds, sim_cumulative_seconds, sim_utilization, sim_step_time : float
        With a simulated network (``--bandwidth``) only: the round's simulated wall time,
        the run's so far, the fraction of it spent computing, and the compute seconds per
        inner step used (``sim_step_time`` on the first record).
    """

    pseudo_grad_norm: float
    dropped_workers: list
    lost_workers: list
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
    mpi_allreduce_bytes: int


RoundCallback = Callable[[RoundRecord], None]


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


# The paper's mechanisms that milestones 26 and 27 (the course's Algorithm 1) do not run:
# (field, its default). Accepted and ignored, they once changed nothing without a word.
_MECHANISMS = {"diloco": (("clip_norm", None), ("lr_schedule", "constant"), ("warmup_steps", 0),
                          ("outer_optimizer", "sgd")),
               "sync": (("clip_norm", None), ("lr_schedule", "constant"), ("warmup_steps", 0))}


def refuse_mechanisms(config, algo: str) -> None:
    """Raise ``ValueError`` naming every field of ``config`` that ``train_diloco`` (``algo``
    "diloco") or ``train_synchronous_baseline`` ("sync") would ignore: the one driver runs them."""
    names = [f"{name}={getattr(config, name)!r}" for name, plain in _MECHANISMS[algo]
             if getattr(config, name, plain) != plain]
    if names:
        trainer = "train_diloco" if algo == "diloco" else "train_synchronous_baseline"
        raise ValueError(f"{trainer} trains the course's Algorithm 1 and does not apply {', '.join(names)}: "
                         f"train with diloco.core.driver.train({algo!r}, ...), as `diloco train` does")


def _check_train_data(x, y, config) -> None:
    """``x`` a non-empty 2-D float array with columns, ``y`` its labels, enough rows for the workers."""
    check_float_array(x, "x", ndim=2)
    check_labels(y, "y", n=x.shape[0])
    if y.size == 0:
        raise ValueError("x must hold at least one example")
    if x.shape[1] == 0:
        raise ValueError("x must have at least one feature (column), got shape (n, 0)")
    check_args.workers_fit(config.num_workers, x.shape[0])  # checked here: the sharding call is nested


def _num_classes(x, y, x_eval, y_eval) -> int:
    """The number of classes, the largest label in ``y`` or ``y_eval`` plus one, at least two;
    the held-out data, if any, checked against ``x``."""
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
    return num_classes


def _check_model_fits(config, model) -> None:
    """Refuse a model whose K workers' copies and states would not fit in memory."""
    num_params = parameter_count(model)
    check_fits_in_memory(num_params * np.dtype(config.dtype).itemsize * (3 * config.num_workers + 4), "the model",
                         f"{model.describe()}, {num_params:,} parameters, with K = {config.num_workers} workers' "
                         f"copies and states,")


def prepare_training(x, y, config, x_eval=None, y_eval=None, rng=None, *, encode=None, on_round=None):
    """The shared start of every trainer: validate, shard, initialise, in one rng order.

    Used by ``train_diloco``, ``train_synchronous_baseline`` and the MPI backend, so for
    one seed they all start from the same shards and the same initial model. With
    ``encode``, ``x`` holds index windows of width ``encode.input_width`` and the model's
    input width is ``encode.num_features``. The model is ``diloco.core.model_seam.data_model``'s
    (the MLP's output width the number of classes), initialised from the same point of
    the rng stream (after the shards), and the returned config carries what the model
    fixes (``with_model_defaults``: Muon's matrices). ``on_round``, if given, is only checked to be
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
    _check_train_data(x, y, config)
    if encode is not None:
        check_args.encoder(encode, x.shape[1])
    if (x_eval is None) != (y_eval is None):
        raise ValueError("x_eval and y_eval must be given together")
    if on_round is not None and not callable(on_round):
        raise TypeError(f"on_round must be callable (a function of the round's record), got {type(on_round).__name__}")
    num_classes = _num_classes(x, y, x_eval, y_eval)
    model = data_model(config, x, encode, num_classes)
    _check_model_fits(config, model)
    if rng is None:  # default_rng(config.seed): shards a study's runs share (diloco.core.shard_reuse)
        shards, rng = seeded_shards(x, y, config)
    else:
        rng = check_generator(rng)
        shards = shard_dataset(x, y, config, rng)
    params = model.init_params(rng)  # the MLP's: milestone 01, after the shards as always
    return with_model_defaults(config, params), rng, shards, params


def shard_dataset(x, y, config: DiLoCoConfig, rng) -> list:
    """The K shards ``config`` asks for: IID (milestone 16), or non-IID by ``noniid_split``:
    label skew (milestone 17), topic segments (``diloco.text.topic_shard_dataset``) or
    speakers (``diloco.corpus.speakers.speaker_shard_dataset``, which ignores ``alpha``)."""
    split, options = _splitter(config)
    return split(x, y, config.num_workers, rng, **options)


def seeded_shards(x, y, config: DiLoCoConfig) -> tuple[list, np.random.Generator]:
    """``shard_dataset`` with ``default_rng(config.seed)``, and that generator after the split: what
    ``prepare_training`` starts from without a caller's ``rng``. Inside ``diloco.core.shard_reuse.reusing()``
    (one command of the command line) the same data, split, K and seed give the same read-only arrays again,
    not a new split (``shard_reuse.seeded_shards``); bit for bit what a new split would give."""
    split, options = _splitter(config)
    return shard_reuse.seeded_shards(x, y, config.num_workers, config.seed, split, options)


def _splitter(config: DiLoCoConfig) -> tuple:
    """The splitting function ``config`` names and its keyword options (``shard_dataset``)."""
    if config.iid:
        return iid_shard_dataset, {}
    if config.noniid_split == "topic":
        from diloco.text import topic_shard_dataset

        return topic_shard_dataset, {"alpha": config.alpha}
    if config.noniid_split == "speaker":
        from diloco.corpus.speakers import speaker_shard_dataset

        return speaker_shard_dataset, {}
    return noniid_shard_dataset, {"alpha": config.alpha}


def held_out_metrics(params: Params, x_eval, y_eval, encode=None) -> tuple[float, float]:
    """The MLP's ``(evaluate_loss, classification_accuracy)`` of ``params`` on held-out data, reading
    its inputs through ``encode``: ``diloco.models.mlp.MLPModel.metrics`` (milestones 28 and 29, the
    windows ``EVAL_CHUNK`` rows at a time, no dense one-hot matrix). A run's records ask its model
    (``model_for``), whichever it is."""
    return MLPModel.of(params, encode).metrics(params, x_eval, y_eval)


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
        record["eval_loss"], record["eval_accuracy"] = model_for(config, params, encode).metrics(params, x_eval,
                                                                                                 y_eval)
        record["eval_perplexity"] = perplexity(record["eval_loss"])
        record["eval_bits"] = bits_per_char(record["eval_loss"])
    history.append(record)
    return record
