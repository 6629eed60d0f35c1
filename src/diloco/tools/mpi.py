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

Faults never hang the job. The all-reduce is non-blocking (``Iallreduce``) and waited on
for at most ``round_timeout`` seconds: a rank that stops answering (killed, stopped,
stuck) makes the others print which round timed out and call ``MPI_Abort``, which ends
every process. An exception on any rank is printed as one line naming the rank, then
``MPI_Abort`` ends the job. A divergence (``diloco.tools.training.Diverged``) is seen
by every rank at once, since they hold the same global model and losses, so they all
stop with the same message and exit status 3, without an abort.
"""

from __future__ import annotations

import argparse
import io
import sys
import time

import numpy as np

from diloco._validation import milestone
from diloco.adamw import init_adamw_state
from diloco.config import DiLoCoConfig
from diloco.loop import TrainResult, finish_record, prepare_training, round_record
from diloco.mechanisms import check_fast_engine, pseudo_grad_weights
from diloco.model import Params
from diloco.outer import init_outer_optimizer, nesterov_param_update, update_outer_momentum
from diloco.params import subtract_params
from diloco.sharding import inner_train_worker

__all__ = ["RoundTimeout", "train_diloco_mpi", "main"]


def _flatten(params: Params) -> np.ndarray:
    return np.concatenate([value.ravel() for value in params.values()])


def _unflatten(buffer: np.ndarray, like: Params) -> Params:
    out, start = {}, 0
    for key, value in like.items():
        out[key] = buffer[start:start + value.size].reshape(value.shape).copy()
        start += value.size
    return out


class RoundTimeout(RuntimeError):
    """The round's all-reduce did not complete in time: some rank stopped answering."""


def _wait(requests, timeout: float | None, round_index: int, rank: int) -> None:
    """Wait for MPI ``requests``, at most ``timeout`` seconds (None: forever)."""
    from mpi4py import MPI

    if timeout is None:
        MPI.Request.Waitall(requests)
        return
    deadline = time.monotonic() + timeout
    pause = 1e-5
    while not MPI.Request.Testall(requests):  # each Test also drives MPI's progress
        if time.monotonic() > deadline:
            raise RoundTimeout(f"rank {rank}: the all-reduce of round {round_index} did not complete within "
                               f"{timeout:g} s (--round-timeout): another rank stopped answering")
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


@milestone  # a trainer's depth, as train_diloco: checked once by prepare_training, then the guard watches
def train_diloco_mpi(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, comm, *, x_eval=None, y_eval=None,
                     on_round=None, round_timeout: float | None = None, max_loss: float | None = None
                     ) -> TrainResult:
    """Train with DiLoCo, this process being worker ``comm.rank`` of ``comm.size``.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, on_round
        As for ``diloco.loop.train_diloco``; every rank passes the same values.
    comm : mpi4py.MPI.Comm
        ``comm.size`` must equal ``config.num_workers``.
    round_timeout : float > 0, optional
        Seconds a rank waits in a round's all-reduce before raising ``RoundTimeout``;
        None waits forever.
    max_loss : float > 0, optional
        The divergence guard's loss threshold (``diloco.tools.training.check_record``).

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
    RoundTimeout
        A round's all-reduce outlasted ``round_timeout``.
    diloco.tools.training.Diverged
        A non-finite loss, pseudo-gradient or held-out loss (on every rank alike).
    """
    if comm.size != config.num_workers:
        raise ValueError(
            f"config.num_workers ({config.num_workers}) must equal the number of MPI processes ({comm.size}); "
            f"run with mpiexec -n {config.num_workers}"
        )
    from mpi4py import MPI

    from diloco.tools.training import check_record

    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, None)
    check_fast_engine(config, "diloco", "the MPI backend")  # the course's round and shard-size weights only
    weights = pseudo_grad_weights(shards, config)  # None: the plain average, as before
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
        if weights is not None:  # the weighted average: each rank sends w_k theta_k, w_k = n_k / n
            local = local * (weights[rank] / sum(weights))
        total = np.empty_like(local)
        local_losses = np.zeros(config.num_workers)  # worker k's mean loss in slot k: the sum gathers them
        local_losses[rank] = losses.mean()
        worker_losses = np.empty_like(local_losses)
        start = time.perf_counter()
        requests = [comm.Iallreduce(local, total, op=MPI.SUM),
                    comm.Iallreduce(local_losses, worker_losses, op=MPI.SUM)]
        _wait(requests, round_timeout, round_index, rank)
        allreduce_seconds = time.perf_counter() - start
        average = _unflatten(total / config.num_workers if weights is None else total, params)
        pseudo_grad = subtract_params(params, average)
        outer_state = update_outer_momentum(outer_state, pseudo_grad, config.outer_momentum)
        params = nesterov_param_update(
            params, pseudo_grad, outer_state, config.outer_lr, config.outer_momentum, nesterov=config.nesterov
        )
        record = round_record(worker_losses.tolist(), params, config, pseudo_grad=pseudo_grad)
        record["allreduce_seconds"] = allreduce_seconds
        record["round"] = round_index
        check_record(record, "diloco", max_loss)  # losses and pseudo-gradient, before evaluating NaN params
        finish_record(record, round_index, config, params, x_eval, y_eval, history)
        check_record(record, "diloco", max_loss)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)


def _positive(text: str) -> float:
    value = float(text)
    if not np.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _fail(comm, rank: int, message: str, code: int) -> int:
    """Print one line for this rank and end the whole job (every rank) with ``MPI_Abort``."""
    print(f"diloco.tools.mpi: error: {message}", file=sys.stderr, flush=True)
    time.sleep(0.3)  # let mpiexec forward the line before the abort tears the job down
    comm.Abort(code)
    return code  # not reached: Abort ends this process too


def main(argv=None) -> int:
    """``mpiexec -n K python -m diloco.tools.mpi [train flags]``: K defaults to the number of ranks."""
    try:
        from mpi4py import MPI
    except ImportError:
        print("diloco.tools.mpi: error: mpi4py is not installed; pip install 'diloco[mpi]'", file=sys.stderr)
        return 2
    import warnings

    from diloco.family import FamilyConfig
    from diloco.family.mpi_family import train_family_mpi
    from diloco.tools.errors import CliError, Parser
    from diloco.tools.family_flags import build_family
    from diloco.tools.flags import (
        DEFAULT_MAX_LOSS,
        add_config_flags,
        add_data_flags,
        add_recovery_flags,
        build_config,
        load_dataset,
    )
    from diloco.tools.runs import atomic_write_bytes, write_json
    from diloco.tools.training import Diverged

    parser = Parser(prog="python -m diloco.tools.mpi", description=__doc__.splitlines()[0])
    add_config_flags(parser)
    add_data_flags(parser)
    parser.add_argument("--json", metavar="FILE", help="rank 0 writes the history and final metrics here")
    parser.add_argument("--save-params", metavar="FILE.npz", help="rank 0 saves the final global params here")
    parser.add_argument("--round-timeout", type=_positive, default=600.0, metavar="SECONDS",
                        help="a rank waiting longer than this in a round's all-reduce aborts the job (600)")
    add_recovery_flags(parser, resume=False)  # --max-loss
    args = parser.parse_args(argv)
    max_loss = DEFAULT_MAX_LOSS if args.max_loss is None else args.max_loss
    max_loss = None if np.isinf(max_loss) else max_loss
    comm = MPI.COMM_WORLD
    try:
        config = build_config(args, defaults={"num_workers": comm.size})
        data, _ = load_dataset(args, config.dtype)
        if data.encode is not None:
            raise CliError("--data shakespeare needs the reference loop (one-hot batches per step): use diloco train")
        family = build_family(args)  # --comm-dtype, --fragments, --eager, ...: diloco.family.mpi_family
        if family != FamilyConfig():
            family.check_against(config)
        if config.num_workers != comm.size:
            raise CliError(f"-K {config.num_workers} does not match the {comm.size} MPI processes")
    except (CliError, ValueError) as exc:
        if comm.rank == 0:
            print(f"diloco.tools.mpi: error: {exc}", file=sys.stderr)
        return 2

    def report(record):
        if comm.rank == 0:
            print(f"round {record['round']:3d}  inner loss {record['inner_loss']:.4f}  "
                  f"held-out loss {record['eval_loss']:.4f}  accuracy {record['eval_accuracy']:.4f}  "
                  f"all-reduce {record['allreduce_seconds'] * 1e3:.1f} ms", flush=True)

    start = time.perf_counter()
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):  # the guard's message replaces NumPy's
            warnings.simplefilter("ignore", RuntimeWarning)
            if family != FamilyConfig():  # no round timeout or divergence guard on this path
                result = train_family_mpi(data.x_train, data.y_train, config, comm, family, x_eval=data.x_test,
                                          y_eval=data.y_test, on_round=report)
            else:
                result = train_diloco_mpi(data.x_train, data.y_train, config, comm, x_eval=data.x_test,
                                          y_eval=data.y_test, on_round=report, round_timeout=args.round_timeout,
                                          max_loss=max_loss)
    except Diverged as exc:  # every rank sees the same record: all stop here, no abort needed
        if comm.rank == 0:
            print(f"diloco.tools.mpi: error: {exc}", file=sys.stderr)
        return 3
    except RoundTimeout as exc:
        return _fail(comm, comm.rank, f"{exc}; aborting the job", 4)
    except BaseException as exc:  # noqa: BLE001 - any fault on one rank must end every rank, never hang them
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return _fail(comm, comm.rank, f"rank {comm.rank} failed: {reason}; aborting the job", 1)
    if comm.rank == 0:
        seconds = time.perf_counter() - start
        last = result.history[-1]
        print(f"DiLoCo on {comm.size} MPI processes: held-out loss {last['eval_loss']:.4f}, "
              f"accuracy {last['eval_accuracy']:.4f}, {len(result.history)} all-reduces, {seconds:.1f} s")
        try:
            if args.json:
                write_json(args.json, {"config": config.to_dict(), "processes": comm.size, "seconds": seconds,
                                       "history": result.history})
            if args.save_params:
                buffer = io.BytesIO()
                np.savez(buffer, **result.params)
                atomic_write_bytes(args.save_params, buffer.getvalue())
        except OSError as exc:
            print(f"diloco.tools.mpi: error: cannot write {exc.filename or 'output'}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
