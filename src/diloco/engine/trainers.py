"""The fast engine's two trainers: DiLoCo and the synchronous baseline.

Same algorithm, same random draws and same record schema as ``diloco.loop.train_diloco``
and ``train_synchronous_baseline``; only the execution differs. The start (validation,
sharding, initial model) is ``diloco.loop.prepare_training`` and the per-round
bookkeeping is ``round_record`` / ``finish_record``, so nothing of that is duplicated.

Random streams, as in the loop: every round the run's generator spawns one child per
worker (``rng.spawn(K)``) and worker k draws each of its mini-batches from child k with
``sample_worker_batch``'s rule (``choice`` without replacement when the shard is large
enough, else ``integers``), so for one seed the engine sees exactly the loop's batches.
"""

from __future__ import annotations

import numpy as np

from diloco.adamw import AdamWState
from diloco.config import DiLoCoConfig
from diloco.engine.flat import flat_layout, layer_views, pack, unpack
from diloco.engine.optim import adamw_scratch, adamw_update, mean_rows_into, outer_update
from diloco.engine.stack import WorkerStack
from diloco.loop import TrainResult, finish_record, prepare_training, round_record
from diloco.mechanisms import check_fast_engine, normalised_weights
from diloco.outer import OuterState

__all__ = ["LAYOUTS", "STACKED_MAX_BYTES", "choose_layout", "train_diloco_fast", "train_synchronous_fast"]

LAYOUTS = ("auto", "stacked", "per-worker")
# Stack the K workers while one (K, P) buffer stays this small (2 MB: the L2 cache of a
# core or two): on the demo's model stacking is ~1.5x faster. Beyond it batched matmul
# gains nothing (each worker's product is one large BLAS call already) while the stacked
# buffers cost K times the memory: on 784-512-512-10 (43 MB per buffer at K = 8) both
# layouts run at the same speed and per-worker peaks 100 MB lower (benchmarks/results.md).
STACKED_MAX_BYTES = 2**21


def choose_layout(num_workers: int, num_values: int, layout: str = "auto", *, itemsize: int = 8) -> str:
    """``"stacked"`` or ``"per-worker"``: the layout for K workers of P values of ``itemsize`` bytes.

    ``"auto"`` stacks when ``K * P * itemsize <= STACKED_MAX_BYTES``; the other two
    layouts are returned as they are.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout != "auto":
        return layout
    return "stacked" if num_workers * num_values * itemsize <= STACKED_MAX_BYTES else "per-worker"


def _cast_shards(shards, dtype) -> list:
    """The shards in the params' dtype (the cast ``model_forward`` makes per batch, made once)."""
    return [(np.ascontiguousarray(x_k, dtype=dtype), np.ascontiguousarray(y_k, dtype=np.intp))
            for x_k, y_k in shards]


def _draw_batch(shard, batch_size: int, rng, x_out: np.ndarray, y_out: np.ndarray) -> None:
    """Fill ``x_out`` (b, d) and ``y_out`` (b,) with a mini-batch drawn as ``sample_worker_batch`` draws it."""
    x_k, y_k = shard
    n = y_k.shape[0]
    if batch_size <= n:
        idx = rng.choice(n, size=batch_size, replace=False)
    else:
        idx = rng.integers(0, n, size=batch_size)
    np.take(x_k, idx, axis=0, out=x_out, mode="clip")  # idx is in range: no buffering
    np.take(y_k, idx, out=y_out, mode="clip")


def _restore(start, flat, params_out, m_out, v_out, momentum_out=None) -> tuple:
    """Fill the buffers from a saved state (``diloco.tools.checkpoint.Checkpoint`` fields).

    Returns ``(first round, AdamW step, rng, history)`` to continue from.
    """
    pack(start["params"], params_out, flat)
    for k, state in enumerate(start["worker_states"]):
        pack(state.m, m_out[k], flat)
        pack(state.v, v_out[k], flat)
    if momentum_out is not None:
        pack(start["outer_state"].momentum, momentum_out, flat)
    return start["round"] + 1, start["worker_states"][0].step, start["rng"], list(start["history"])


def _saved_state(flat, params, m, v, step, rng, history, momentum=None) -> dict:
    """The state after a round as fresh parameter dicts, what ``_restore`` takes back."""
    return {"params": unpack(params, flat),
            "outer_state": None if momentum is None else OuterState(unpack(momentum, flat)),
            "worker_states": [AdamWState(step, unpack(m[k], flat), unpack(v[k], flat)) for k in range(len(m))],
            "rng": rng, "history": history}


def train_diloco_fast(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None, rng=None,
                      on_round=None, layout: str = "auto", start=None, on_state=None) -> TrainResult:
    """DiLoCo (milestone 26's algorithm) with the K workers in flat, preallocated buffers.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round
        As for ``diloco.loop.train_diloco``; ``config.engine`` is not consulted.
    layout : "auto", "stacked" or "per-worker", keyword-only
        Stacked: the K workers take each inner step together (batched matmul, one AdamW
        pass over a ``(K, P)`` buffer). Per-worker: worker after worker, each with one
        ``(1, P)`` model, as the loop does. ``"auto"`` uses ``choose_layout``.
    start, on_state : keyword-only, optional
        For checkpoints (``diloco.tools.training``): ``start``, a mapping with the fields
        of ``diloco.tools.checkpoint.Checkpoint``, is the state to continue from after its
        ``round``; ``on_state(round, get_state)`` is called after every round, and
        ``get_state()`` returns that state (fresh dicts) for saving.

    Returns
    -------
    TrainResult(params, history)
        Equal to ``train_diloco``'s: the same operations in the same order, so in practice to
        the last bit (the tests allow 1e-10 relative in float64, 1e-5 in float32).
    """
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng)
    check_fast_engine(config, "diloco")  # the paper's other mechanisms run on the reference path only
    weights = normalised_weights(shards, config)  # 1/K each, or shard sizes (config.shard_weighting)
    dtype = next(iter(params.values())).dtype
    shards = _cast_shards(shards, dtype)
    flat = flat_layout(params)
    K, H, b = config.num_workers, config.inner_steps, config.batch_size
    stacked = choose_layout(K, flat.size, layout, itemsize=dtype.itemsize) == "stacked"
    stack = WorkerStack(flat, K if stacked else 1, 1, b, dtype)
    global_params = pack(params, np.empty(flat.size, dtype=dtype), flat)  # (P,)
    m = np.zeros((K, flat.size), dtype=dtype)  # each worker's AdamW moments, carried across rounds
    v = np.zeros((K, flat.size), dtype=dtype)
    scratch = adamw_scratch(stack.params.size, dtype)
    outer_momentum = np.zeros(flat.size, dtype=dtype)
    average, pseudo_grad, spare = (np.empty(flat.size, dtype=dtype) for _ in range(3))
    history: list = []
    step = 0  # the workers' common AdamW step count
    first_round = 1
    if start is not None:
        first_round, step, rng, history = _restore(start, flat, global_params, m, v, outer_momentum)
    for round_index in range(first_round, config.rounds + 1):
        worker_rngs = rng.spawn(K)
        losses = np.empty((K, H))
        if stacked:
            stack.params[...] = global_params
            for h in range(H):
                for k in range(K):
                    _draw_batch(shards[k], b, worker_rngs[k], stack.x[k], stack.labels[k])
                losses[:, h] = stack.loss_and_grads()[:, 0]
                adamw_update(stack.params, m, v, stack.grads, step + h + 1, config.inner, scratch)
            for k in range(K):
                mean_rows_into(stack.params[k:k + 1], average, spare, first=k == 0, weight=weights[k])
        else:
            for k in range(K):
                stack.params[0] = global_params
                for h in range(H):
                    _draw_batch(shards[k], b, worker_rngs[k], stack.x[0], stack.labels[0])
                    losses[k, h] = stack.loss_and_grads()[0, 0]
                    adamw_update(stack.params, m[k:k + 1], v[k:k + 1], stack.grads, step + h + 1, config.inner,
                                 scratch)
                mean_rows_into(stack.params, average, spare, first=k == 0, weight=weights[k])
        step += H
        np.subtract(global_params, average, out=pseudo_grad)  # old minus new
        record = round_record(losses.mean(axis=1), layer_views(global_params, flat), config,
                              pseudo_grad=layer_views(pseudo_grad, flat))
        outer_update(global_params, outer_momentum, pseudo_grad, config, spare)
        finish_record(record, round_index, config, layer_views(global_params, flat), x_eval, y_eval, history)
        if on_round is not None:
            on_round(record)
        if on_state is not None:
            on_state(round_index, lambda step=step: _saved_state(flat, global_params, m, v, step, rng, history,
                                                                 outer_momentum))
    return TrainResult(unpack(global_params, flat), history)


def train_synchronous_fast(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None,
                           rng=None, on_round=None, start=None, on_state=None) -> TrainResult:
    """The synchronous baseline (milestone 27's algorithm), the K batches as one.

    One shared model sees the K workers' mini-batches as ``K`` groups of one forward and
    backward pass (``K * b`` rows, one BLAS call per layer); the gradient is the mean of
    the groups' gradients, as the all-reduce would give, then one AdamW step.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round
        As for ``diloco.loop.train_synchronous_baseline``.
    start, on_state : keyword-only, optional
        As for ``train_diloco_fast`` (one shared AdamW state, no outer state).

    Returns
    -------
    TrainResult(params, history)
        Equal to ``train_synchronous_baseline``'s up to rounding: the K groups' gradients
        are summed inside one matrix product instead of one by one (the tests' float64 runs
        end a few 1e-16 apart, relative).
    """
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng)
    check_fast_engine(config, "sync")
    dtype = next(iter(params.values())).dtype
    shards = _cast_shards(shards, dtype)
    flat = flat_layout(params)
    K, H, b = config.num_workers, config.inner_steps, config.batch_size
    stack = WorkerStack(flat, 1, K, b, dtype)
    pack(params, stack.params, flat)
    m, v = np.zeros_like(stack.params), np.zeros_like(stack.params)
    scratch = adamw_scratch(stack.params.size, dtype)
    history: list = []
    step = 0
    first_round = 1
    if start is not None:
        first_round, step, rng, history = _restore(start, flat, stack.params[0], m, v)
    for round_index in range(first_round, config.rounds + 1):
        worker_rngs = rng.spawn(K)  # the same streams DiLoCo's workers get
        losses = np.empty((K, H))
        for h in range(H):
            for k in range(K):
                rows = slice(k * b, (k + 1) * b)
                _draw_batch(shards[k], b, worker_rngs[k], stack.x[0, rows], stack.labels[0, rows])
            losses[:, h] = stack.loss_and_grads()[0]
            step += 1
            adamw_update(stack.params, m, v, stack.grads, step, config.inner, scratch)
        current = layer_views(stack.params[0], flat)
        record = round_record(losses.mean(axis=1), current, config)
        finish_record(record, round_index, config, current, x_eval, y_eval, history)
        if on_round is not None:
            on_round(record)
        if on_state is not None:
            on_state(round_index, lambda step=step: _saved_state(flat, stack.params[0], m, v, step, rng, history))
    return TrainResult(unpack(stack.params[0], flat), history)
