"""DiLoCo as real processes: one MPI rank per worker (needs the ``mpi`` extra, mpi4py).

    mpiexec -n 8 python -m diloco.tools.mpi --rounds 10          # K = 8 workers, 8 processes

The single-process simulation (``diloco.loop``) runs the K workers one after another.
Here each of the K ranks of an MPI communicator is worker ``k = rank`` and runs the same
milestone functions; only the averaging of the workers' models crosses process
boundaries, as one ``MPI_Allreduce`` per round:

1. Every rank builds the same shards and initial model from the seed (exactly as
   ``train_diloco`` does, so nothing needs broadcasting) and keeps its own shard.
2. Each round every rank draws ``rng.spawn(K)`` like ``run_diloco_round`` and keeps child
   ``k``, so worker k sees the same mini-batches as simulated worker k.
3. ``inner_train_worker`` (milestone 20) runs H AdamW steps on the rank's shard with the
   rank's carried AdamW state.
4. The worker parameters are flattened into one buffer, summed over ranks with
   ``Allreduce`` and divided by K: the workers' average. ``subtract_params`` (14) gives
   the pseudo-gradient ``global - average``, which is ``compute_outer_gradient``.
5. ``update_outer_momentum`` and ``nesterov_param_update`` (22, 23) run identically on
   every rank, so the global parameters stay equal everywhere without more messages.

The result equals ``train_diloco`` with the same config up to the rounding of the
all-reduce's summation order (the test suite checks ~1e-12 agreement).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from diloco.adamw import init_adamw_state
from diloco.config import DiLoCoConfig
from diloco.loop import TrainResult, finish_record, prepare_training, round_record
from diloco.model import Params
from diloco.outer import init_outer_optimizer, nesterov_param_update, update_outer_momentum
from diloco.params import subtract_params
from diloco.sharding import inner_train_worker

__all__ = ["train_diloco_mpi", "main"]


def _flatten(params: Params) -> np.ndarray:
    return np.concatenate([value.ravel() for value in params.values()])


def _unflatten(buffer: np.ndarray, like: Params) -> Params:
    out, start = {}, 0
    for key, value in like.items():
        out[key] = buffer[start:start + value.size].reshape(value.shape).copy()
        start += value.size
    return out


def train_diloco_mpi(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, comm, *, x_eval=None, y_eval=None,
                     on_round=None) -> TrainResult:
    """Train with DiLoCo, this process being worker ``comm.rank`` of ``comm.size``.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, on_round
        As for ``diloco.loop.train_diloco``; every rank passes the same values.
    comm : mpi4py.MPI.Comm
        ``comm.size`` must equal ``config.num_workers``.

    Returns
    -------
    TrainResult(params, history)
        The same on every rank. Each record also holds ``allreduce_seconds``, the wall
        time this rank spent in the round's all-reduce (waiting for the slowest worker
        included).

    Raises
    ------
    ValueError
        ``comm.size != config.num_workers``, or the errors of ``train_diloco``.
    """
    if comm.size != config.num_workers:
        raise ValueError(
            f"config.num_workers ({config.num_workers}) must equal the number of MPI processes ({comm.size}); "
            f"run with mpiexec -n {config.num_workers}"
        )
    from mpi4py import MPI

    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, None)
    rank = comm.rank
    x_k, y_k = shards[rank]
    state = init_adamw_state(params)
    outer_state = init_outer_optimizer(params)
    history: list[dict] = []
    for round_index in range(1, config.rounds + 1):
        rng_k = rng.spawn(config.num_workers)[rank]
        worker_params, state, losses = inner_train_worker(
            params, state, x_k, y_k, config.inner_steps, config.batch_size, config.inner, rng_k
        )
        local = _flatten(worker_params)
        total = np.empty_like(local)
        start = time.perf_counter()
        comm.Allreduce(local, total, op=MPI.SUM)
        allreduce_seconds = time.perf_counter() - start
        average = _unflatten(total / config.num_workers, params)
        pseudo_grad = subtract_params(params, average)
        outer_state = update_outer_momentum(outer_state, pseudo_grad, config.outer_momentum)
        params = nesterov_param_update(
            params, pseudo_grad, outer_state, config.outer_lr, config.outer_momentum, nesterov=config.nesterov
        )
        record = round_record(comm.allgather(float(losses.mean())), params, config, pseudo_grad=pseudo_grad)
        record["allreduce_seconds"] = allreduce_seconds
        finish_record(record, round_index, config, params, x_eval, y_eval, history)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)


def main(argv=None) -> int:
    """``mpiexec -n K python -m diloco.tools.mpi [train flags]``: K defaults to the number of ranks."""
    try:
        from mpi4py import MPI
    except ImportError:
        print("diloco.tools.mpi: error: mpi4py is not installed; pip install 'diloco[mpi]'", file=sys.stderr)
        return 2
    from diloco.tools.errors import CliError, Parser
    from diloco.tools.flags import add_config_flags, add_data_flags, build_config, load_dataset

    parser = Parser(prog="python -m diloco.tools.mpi", description=__doc__.splitlines()[0])
    add_config_flags(parser)
    add_data_flags(parser)
    parser.add_argument("--json", metavar="FILE", help="rank 0 writes the history and final metrics here")
    parser.add_argument("--save-params", metavar="FILE.npz", help="rank 0 saves the final global params here")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    try:
        config = build_config(args, defaults={"num_workers": comm.size})
        data, _ = load_dataset(args, config.dtype)
        if config.num_workers != comm.size:
            raise CliError(f"-K {config.num_workers} does not match the {comm.size} MPI processes")
    except CliError as exc:
        if comm.rank == 0:
            print(f"diloco.tools.mpi: error: {exc}", file=sys.stderr)
        return 2

    def report(record):
        if comm.rank == 0:
            print(f"round {record['round']:3d}  inner loss {record['inner_loss']:.4f}  "
                  f"held-out loss {record['eval_loss']:.4f}  accuracy {record['eval_accuracy']:.4f}  "
                  f"all-reduce {record['allreduce_seconds'] * 1e3:.1f} ms", flush=True)

    start = time.perf_counter()
    result = train_diloco_mpi(data.x_train, data.y_train, config, comm,
                              x_eval=data.x_test, y_eval=data.y_test, on_round=report)
    if comm.rank == 0:
        seconds = time.perf_counter() - start
        last = result.history[-1]
        print(f"DiLoCo on {comm.size} MPI processes: held-out loss {last['eval_loss']:.4f}, "
              f"accuracy {last['eval_accuracy']:.4f}, {len(result.history)} all-reduces, {seconds:.1f} s")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as handle:
                json.dump({"config": config.to_dict(), "processes": comm.size, "seconds": seconds,
                           "history": result.history}, handle, indent=2)
        if args.save_params:
            np.savez(args.save_params, **result.params)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
