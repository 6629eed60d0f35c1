"""The family on real MPI ranks: encoded outer gradients, fragments and eager updates.

    mpiexec -n 4 python -m diloco.tools.mpi -K 4 --comm-dtype fp4 --fragments 2 --overlap 3

Rank k is worker k, as in ``diloco.tools.mpi``. Every exchange (``diloco.family.comm``)
is done with messages, and the bytes each rank hands MPI for other ranks are counted:

1. The exchanged tensors are cut into *units* (``quantize.unit_bounds``: one scale block,
   or one tensor), and unit u is *owned* by rank ``floor(c_u K / N)`` (``c_u`` values
   before it): contiguous, balanced shares.
2. Reduce-scatter (``Alltoallv``): each rank encodes each unit of its outer gradient
   (``encode_delta``, the unit's slice of the tensor: the same codes and scale as the
   whole tensor's encoding) and sends it to the unit's owner.
3. Each owner decodes its units' K payloads into the params' dtype and reduces them
   (``reduce_decoded``: ``average_params``, milestone 15, or the TIES merge), encodes the
   result again and all-gathers it (``Allgatherv``); every rank decodes every unit.

Nothing encoded (the params' dtype): the units carry the workers' raw parameters, the
owners average them and every rank subtracts the average from the global parameters,
which is ``compute_outer_gradient`` (milestone 24) element for element. So in every
case the result is the simulation's (``train_streaming``, ``train_eager``) bit for bit
(``tests/tooling/test_family_mpi.py``). A rank sends ``sum_{j != k} |P_k[j]|`` in step 2
and ``(K-1) |R_k|`` in step 3; averaged over ranks that is the model's
``(K-1)/K (|P| + |R|)`` exactly when every rank's payload has the same size (all dense
formats), within a few bytes with sign pruning.
"""

from __future__ import annotations

import time

import numpy as np

from diloco.adamw import init_adamw_state
from diloco.config import DiLoCoConfig
from diloco.family.comm import Exchange, is_native, reduce_decoded
from diloco.family.config import FamilyConfig
from diloco.family.eager import eager_outer_gradient
from diloco.family.quantize import decode, encode, sign_prune_mask, unit_bounds
from diloco.family.streaming import _merge, fragment_keys, sync_offsets
from diloco.family.wire import from_bytes, to_bytes
from diloco.loop import TrainResult, finish_record, prepare_training, round_record
from diloco.mechanisms import normalised_weights, pseudo_grad_weights
from diloco.model import Params
from diloco.outer import OuterState, init_outer_optimizer, nesterov_param_update, update_outer_momentum
from diloco.params import average_params, subtract_params
from diloco.sharding import local_train_step, sample_worker_batch

__all__ = ["units_of", "mpi_exchange", "train_family_mpi"]

_NATIVE_UNIT = 256  # values per unit of a raw (unencoded) exchange: any cut gives the same numbers


def units_of(tensors: Params, unit_size: int, num_ranks: int) -> list:
    """``[(key, start, stop, owner), ...]``: every unit of ``tensors`` (flat offsets) and its owner rank."""
    total = sum(value.size for value in tensors.values())
    units, before = [], 0
    for key, value in tensors.items():
        bounds = unit_bounds(value.size, unit_size or max(value.size, 1))
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            units.append((key, int(start), int(stop), min(num_ranks - 1, before * num_ranks // max(total, 1))))
            before += int(stop - start)
    return units


def _alltoallv(comm, pieces: list) -> list:
    """Send ``pieces[j]`` (bytes) to rank j; return what every rank sent here, by rank."""
    sizes = np.array([len(p) for p in pieces], dtype=np.int64)
    incoming = np.empty(comm.size, dtype=np.int64)
    comm.Alltoall(sizes, incoming)
    send = np.frombuffer(b"".join(pieces), dtype=np.uint8) if sizes.sum() else np.zeros(0, np.uint8)
    receive = np.empty(int(incoming.sum()), dtype=np.uint8)
    comm.Alltoallv([send, (sizes, np.concatenate([[0], np.cumsum(sizes)[:-1]])), _byte(comm)],
                   [receive, (incoming, np.concatenate([[0], np.cumsum(incoming)[:-1]])), _byte(comm)])
    offsets = np.concatenate([[0], np.cumsum(incoming)])
    return [receive[offsets[j]:offsets[j + 1]].tobytes() for j in range(comm.size)]


def _allgatherv(comm, piece: bytes) -> list:
    sizes = np.array(comm.allgather(len(piece)), dtype=np.int64)
    receive = np.empty(int(sizes.sum()), dtype=np.uint8)
    comm.Allgatherv([np.frombuffer(piece, dtype=np.uint8), _byte(comm)],
                    [receive, (sizes, np.concatenate([[0], np.cumsum(sizes)[:-1]])), _byte(comm)])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [receive[offsets[j]:offsets[j + 1]].tobytes() for j in range(comm.size)]


def _byte(comm):
    from mpi4py import MPI

    return MPI.BYTE


def mpi_exchange(comm, local: Params, spec, *, weights=None, residual: dict | None = None,
                 global_params: Params | None = None) -> tuple[Exchange, int]:
    """This rank's side of one exchange; returns ``(Exchange, bytes this rank sent)``.

    ``global_params`` given: ``local`` are the worker's parameters (DiLoCo and Streaming
    DiLoCo); otherwise ``local`` are its outer gradients (eager updates).
    """
    rank, size = comm.rank, comm.size
    reference = global_params if global_params is not None else local
    dtype = next(iter(reference.values())).dtype
    native = is_native(spec, dtype)
    residual = dict(residual or {})
    if native:
        payload = {key: value.ravel() for key, value in local.items()}
    else:
        deltas = local if global_params is None else subtract_params(global_params, local)
        payload = {}
        for key, value in deltas.items():
            if spec.error_feedback and key in residual:
                value = value + residual[key]
            payload[key] = value
    # raw values can be cut anywhere; encoded ones at their scale blocks (or whole tensors)
    units = units_of(reference, _NATIVE_UNIT if native else spec.block_size, size)
    keeps = {}
    if not native and spec.sign_prune > 0:  # the trim is per tensor, before cutting into units
        keeps = {key: sign_prune_mask(value, spec.sign_prune) for key, value in payload.items()}
    pieces, sent = [[] for _ in range(size)], 0
    decoded_own = {key: np.empty(value.size, dtype=dtype) for key, value in payload.items()}
    for key, start, stop, owner in units:
        flat = payload[key].ravel()[start:stop]
        if native:
            piece = np.ascontiguousarray(flat).tobytes()
        else:
            keep = keeps[key].ravel()[start:stop] if key in keeps else None
            encoded = encode(flat, spec.fmt or dtype.name, block_size=0, keep=keep)
            piece = to_bytes(encoded)
            decoded_own[key][start:stop] = decode(encoded, dtype)
        pieces[owner].append(piece)
        sent += 0 if owner == rank else len(piece)
    received = _alltoallv(comm, [b"".join(p) for p in pieces])
    mine = [u for u in units if u[3] == rank]
    offsets, reduced_pieces = [0] * size, []
    for _key, start, stop, _ in mine:
        values = []
        for k in range(size):
            if native:
                count = (stop - start) * dtype.itemsize
                values.append(np.frombuffer(received[k], dtype=dtype, count=stop - start, offset=offsets[k]).copy())
                offsets[k] += count
            else:
                encoded, offsets[k] = from_bytes(received[k], spec.fmt or dtype.name, (stop - start,), stop - start,
                                                 sparse=spec.sign_prune > 0, offset=offsets[k])
                values.append(decode(encoded, dtype))
        reduced = reduce_decoded(values, not native and spec.sign_prune > 0, weights)
        if native:
            reduced_pieces.append(np.ascontiguousarray(reduced).tobytes())
        else:
            keep = reduced != 0 if spec.sign_prune > 0 else None
            reduced_pieces.append(to_bytes(encode(reduced, spec.fmt or dtype.name, block_size=0, keep=keep)))
    mine_bytes = b"".join(reduced_pieces)
    sent += (size - 1) * len(mine_bytes)
    gathered = _allgatherv(comm, mine_bytes)
    result = {key: np.empty(value.size, dtype=dtype) for key, value in reference.items()}
    offsets = [0] * size
    for key, start, stop, owner in units:
        if native:
            result[key][start:stop] = np.frombuffer(gathered[owner], dtype=dtype, count=stop - start,
                                                    offset=offsets[owner])
            offsets[owner] += (stop - start) * dtype.itemsize
        else:
            keep_flag = spec.sign_prune > 0
            encoded, offsets[owner] = from_bytes(gathered[owner], spec.fmt or dtype.name, (stop - start,),
                                                 stop - start, sparse=keep_flag, offset=offsets[owner])
            result[key][start:stop] = decode(encoded, dtype)
    result = {key: value.reshape(reference[key].shape) for key, value in result.items()}
    if native and global_params is not None:
        result = subtract_params(global_params, result)  # compute_outer_gradient's old minus new
    if not native and spec.error_feedback:
        residual = {key: payload[key] - decoded_own[key].reshape(payload[key].shape) for key in payload}
    payload_sizes = comm.allgather(sum(len(b"".join(p)) for p in pieces))
    reduced_size = sum(len(g) for g in gathered)
    model = (size - 1) / size * (np.mean(payload_sizes) + reduced_size)
    return Exchange(result, float(model), int(round(np.mean(payload_sizes))), [residual]), sent


def train_family_mpi(x, y, config: DiLoCoConfig, comm, family: FamilyConfig, *, x_eval=None, y_eval=None,
                     on_round=None) -> TrainResult:
    """``train_streaming`` / ``train_eager`` with this process as worker ``comm.rank``.

    Returns the same ``TrainResult`` on every rank; each record also holds
    ``allreduce_seconds`` (wall time in this rank's exchanges) and ``mpi_bytes_sent``
    (bytes this rank handed MPI for other ranks in the round).
    """
    if comm.size != config.num_workers:
        raise ValueError(f"config.num_workers ({config.num_workers}) must equal the number of MPI processes "
                         f"({comm.size})")
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, None)
    family.check_against(config)
    rank, inner_steps, spec = comm.rank, config.inner_steps, family.comm
    weights, shares = pseudo_grad_weights(shards, config), normalised_weights(shards, config)
    x_k, y_k = shards[rank]
    eager = family.eager and family.tau(inner_steps) > 0
    tau = 0 if family.eager else family.tau(inner_steps)
    fragments = fragment_keys(params, family.fragments, family.pattern)
    offsets = sync_offsets(family.fragments, inner_steps)
    local, theta, state = dict(params), dict(params), init_adamw_state(params)
    momentum = dict(init_outer_optimizer(params).momentum)
    outer_state = init_outer_optimizer(params)
    residual, pending, history = {}, [], []
    previous_local = previous_global = None
    for round_index in range(1, config.rounds + 1):
        rng_k = rng.spawn(config.num_workers)[rank]
        losses = np.empty(inner_steps)
        syncs, round_delta, seconds, sent_total = [], {}, 0.0, 0
        for h in range(1, inner_steps + 1):
            step = (round_index - 1) * inner_steps + h
            x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, rng_k)
            local, state, losses[h - 1] = local_train_step(local, state, x_batch, y_batch, config.inner)
            due = [keys for keys, offset in zip(fragments, offsets, strict=True) if (step - offset) % inner_steps == 0]
            for keys in due if not family.eager else ([tuple(params)] if h == inner_steps else []):
                start = time.perf_counter()
                if eager:
                    own = subtract_params(theta, local)
                    result, sent = mpi_exchange(comm, own, spec, weights=weights, residual=residual)
                else:
                    base = theta if family.eager else params
                    result, sent = mpi_exchange(comm, {key: local[key] for key in keys}, spec, weights=weights,
                                                residual=residual, global_params={key: base[key] for key in keys})
                seconds += time.perf_counter() - start
                sent_total += sent
                residual = {**residual, **result.residuals[0]}
                round_delta.update(result.delta)
                syncs.append([h, result.bytes_sent, inner_steps if eager else tau])
                if family.eager:
                    applied = result.delta if not eager else eager_outer_gradient(
                        own, previous_local, previous_global, shares[rank])
                    outer_state = update_outer_momentum(outer_state, applied, config.outer_momentum)
                    theta = nesterov_param_update(theta, applied, outer_state, config.outer_lr,
                                                  config.outer_momentum, nesterov=config.nesterov)
                    if eager:
                        previous_local, previous_global = own, result.delta
                    local = dict(theta)
                    continue
                sub = {key: params[key] for key in keys}
                outer = update_outer_momentum(OuterState({key: momentum[key] for key in keys}), result.delta,
                                              config.outer_momentum)
                received = nesterov_param_update(sub, result.delta, outer, config.outer_lr,
                                                 config.outer_momentum, nesterov=config.nesterov)
                params = {**params, **received}
                momentum.update(outer.momentum)
                pending.append((step + tau, received))
            for item in [p for p in pending if p[0] == step]:
                pending.remove(item)
                local = {**local, **{key: _merge(local[key], value, family.mix) for key, value in item[1].items()}}
        if family.eager:
            params = theta if not eager else _consensus(comm, theta, weights)
        delta = {key: round_delta[key] for key in params if key in round_delta}
        record = round_record(comm.allgather(float(losses.mean())), params, config, pseudo_grad=delta)
        record.update(all_reduces=len(syncs), bytes_sent=float(sum(s[1] for s in syncs)),
                      peak_sync_bytes=float(max(s[1] for s in syncs)), syncs=syncs, allreduce_seconds=seconds,
                      mpi_bytes_sent=sent_total)
        record["bytes_per_step"] = record["bytes_sent"] / inner_steps
        finish_record(record, round_index, config, params, x_eval, y_eval, history)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)


def _consensus(comm, theta: Params, weights) -> Params:
    """The workers' average of their outer copies, as ``train_eager`` reports it (evaluation only)."""
    everyone = comm.allgather(theta)
    return average_params(everyone, weights)
