"""Streaming DiLoCo (Douillard et al., 2025, arXiv 2501.18512), on the milestone functions.

The model's L layers are split into P fragments. Fragment p synchronises every H inner
steps, offset by ``t_p = floor(p H / P)`` steps, i.e. at the steps ``t`` with
``(t - t_p) mod H == 0`` (so one fragment syncs every H/P steps and a round of H steps
holds one sync of each). At its sync step t, fragment p's outer gradient

    Delta_p = theta_p - mean_k theta_{k,p}^{(t)}              (theta_p: its global copy)

is all-reduced (possibly encoded, ``diloco.family.comm``) and the outer Nesterov step
updates ``theta_p``. The workers keep training meanwhile; ``tau`` steps later the result
arrives and each worker merges it into its local copy:

    theta_{k,p}^{(t + tau)} <- mix * theta_p + (1 - mix) * theta_{k,p}^{(t + tau)}

With P = 1, tau = 0 and mix = 1 this is DiLoCo: ``train_streaming`` then computes
exactly what ``train_diloco`` computes, in the same order (one ``rng.spawn(K)`` per
round, ``sample_worker_batch`` + ``local_train_step`` per step, ``compute_outer_gradient``,
``update_outer_momentum``, ``nesterov_param_update``), and the result is bit-identical
(``tests/tooling/test_streaming.py``). Each worker's AdamW state is carried throughout.

Fragments follow the paper's two patterns over layers ``l = 1..L`` (``W_l``, ``b_l``
together): *strided* (fragment p holds layers p+1, p+1+P, ...; the paper's choice) or
*sequential* (contiguous blocks of layers).
"""

from __future__ import annotations

import numpy as np

from diloco.adamw import init_adamw_state
from diloco.config import DiLoCoConfig
from diloco.family.comm import exchange
from diloco.family.config import PATTERNS, FamilyConfig
from diloco.loop import TrainResult, finish_record, prepare_training, round_record
from diloco.mechanisms import pseudo_grad_weights
from diloco.model import Params
from diloco.outer import OuterState, init_outer_optimizer, nesterov_param_update, update_outer_momentum
from diloco.sharding import local_train_step, sample_worker_batch

__all__ = ["fragment_layers", "fragment_keys", "sync_offsets", "sync_steps", "train_streaming"]


def fragment_layers(num_layers: int, fragments: int, pattern: str = "strided") -> list[list[int]]:
    """The 1-based layers of each fragment.

    >>> fragment_layers(4, 2)
    [[1, 3], [2, 4]]
    >>> fragment_layers(4, 2, "sequential")
    [[1, 2], [3, 4]]
    """
    if pattern not in PATTERNS:
        raise ValueError(f"pattern must be one of {PATTERNS}, got {pattern!r}")
    if not 1 <= fragments <= num_layers:
        raise ValueError(f"fragments must be between 1 and the number of layers ({num_layers}), got {fragments}")
    layers = list(range(1, num_layers + 1))
    if pattern == "strided":
        return [layers[p::fragments] for p in range(fragments)]
    return [list(chunk) for chunk in np.array_split(layers, fragments)]


def fragment_keys(params: Params, fragments: int, pattern: str = "strided") -> list[tuple[str, ...]]:
    """The parameter keys (``W_l``, ``b_l``) of each fragment of an MLP's params."""
    num_layers = len(params) // 2
    return [tuple(key for layer in group for key in (f"W{layer}", f"b{layer}"))
            for group in fragment_layers(num_layers, fragments, pattern)]


def sync_offsets(fragments: int, inner_steps: int) -> list[int]:
    """``t_p = floor(p H / P)`` for p = 0..P-1 (needs P <= H, so the offsets differ)."""
    if fragments > inner_steps:
        raise ValueError(f"fragments ({fragments}) must not exceed inner_steps ({inner_steps})")
    return [(p * inner_steps) // fragments for p in range(fragments)]


def sync_steps(fragment: int, fragments: int, inner_steps: int, total_steps: int) -> list[int]:
    """The 1-based inner steps ``t <= total_steps`` at which ``fragment`` synchronises."""
    offset = sync_offsets(fragments, inner_steps)[fragment]
    return [t for t in range(1, total_steps + 1) if (t - offset) % inner_steps == 0]


def _merge(local: np.ndarray, received: np.ndarray, mix: float) -> np.ndarray:
    if mix == 1.0:
        return received.copy()  # an exact overwrite, as DiLoCo's next round starts from the global params
    return mix * received + (1.0 - mix) * local


def train_streaming(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, family: FamilyConfig | None = None, *,
                    x_eval=None, y_eval=None, rng=None, on_round=None) -> TrainResult:
    """Train with Streaming DiLoCo (and any wire format of ``family``).

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round
        As for ``diloco.loop.train_diloco``.
    family : FamilyConfig, optional
        ``fragments`` (P), ``pattern``, ``overlap`` (tau < H), ``mix`` and the wire format.

    Returns
    -------
    TrainResult(params, history)
        ``params`` are the global (outer) parameters. A record per H inner steps; besides
        the DiLoCo fields, ``all_reduces`` (fragment syncs in the round), ``bytes_sent``,
        ``peak_sync_bytes`` (largest single sync), ``bytes_per_step`` and ``syncs``
        (``[step in round, bytes, tau]`` per sync, read by ``diloco.family.netsim``).

    Raises
    ------
    TypeError, ValueError
        The errors of ``train_diloco``; P above the number of layers or above H;
        ``tau >= H``; eager updates (use ``train_eager``).
    """
    family = FamilyConfig() if family is None else family
    if not isinstance(family, FamilyConfig):
        raise TypeError(f"family must be a FamilyConfig, got {type(family).__name__}")
    if family.eager:
        raise ValueError("train_streaming does not do eager updates: use diloco.family.train_eager")
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng)
    inner_steps, num_workers = config.inner_steps, config.num_workers
    family.check_against(config)
    tau = family.tau(inner_steps)
    weights = pseudo_grad_weights(shards, config)  # None (uniform), or shard sizes as train_diloco uses
    fragments = fragment_keys(params, family.fragments, family.pattern)
    offsets = sync_offsets(family.fragments, inner_steps)
    locals_ = [dict(params) for _ in range(num_workers)]  # arrays are never mutated in place
    worker_states = [init_adamw_state(params) for _ in range(num_workers)]
    momentum = dict(init_outer_optimizer(params).momentum)
    residuals = [{} for _ in range(num_workers)]
    pending: list = []  # (merge step, received fragment params)
    history: list = []
    for round_index in range(1, config.rounds + 1):
        worker_rngs = rng.spawn(num_workers)
        losses = np.empty((num_workers, inner_steps))
        syncs, round_delta = [], {}
        for h in range(1, inner_steps + 1):
            step = (round_index - 1) * inner_steps + h
            for k, ((x_k, y_k), rng_k) in enumerate(zip(shards, worker_rngs, strict=True)):
                x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, rng_k)
                locals_[k], worker_states[k], losses[k, h - 1] = local_train_step(
                    locals_[k], worker_states[k], x_batch, y_batch, config.inner)
            for keys, offset in zip(fragments, offsets, strict=True):
                if (step - offset) % inner_steps:
                    continue
                sub_global = {key: params[key] for key in keys}
                result = exchange(sub_global, [{key: theta[key] for key in keys} for theta in locals_],
                                  family.comm, residuals, weights)
                residuals = result.residuals
                outer = update_outer_momentum(OuterState({key: momentum[key] for key in keys}), result.delta,
                                              config.outer_momentum)
                received = nesterov_param_update(sub_global, result.delta, outer, config.outer_lr,
                                                 config.outer_momentum, nesterov=config.nesterov)
                params = {**params, **received}
                momentum.update(outer.momentum)
                round_delta.update(result.delta)
                syncs.append([h, result.bytes_sent, tau])
                pending.append((step + tau, received))
            for due in [item for item in pending if item[0] == step]:
                pending.remove(due)
                for k in range(num_workers):
                    locals_[k] = {**locals_[k], **{key: _merge(locals_[k][key], value, family.mix)
                                                   for key, value in due[1].items()}}
        ordered_delta = {key: round_delta[key] for key in params if key in round_delta}
        record = round_record(losses.mean(axis=1), params, config, pseudo_grad=ordered_delta)
        record["all_reduces"] = len(syncs)
        record["bytes_sent"] = float(sum(s[1] for s in syncs))
        record["peak_sync_bytes"] = float(max(s[1] for s in syncs))
        record["bytes_per_step"] = record["bytes_sent"] / inner_steps
        record["syncs"] = syncs
        finish_record(record, round_index, config, params, x_eval, y_eval, history)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)
