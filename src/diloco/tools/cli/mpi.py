"""DiLoCo as real processes: one MPI rank per worker (needs the ``mpi`` extra, mpi4py).

    mpiexec -n 8 python -m diloco.tools.cli.mpi --rounds 10          # K = 8 workers, 8 processes

The single-process simulation runs the K workers one after another. Here the one driver
(``diloco.core.driver``) runs on every rank with the MPI executor
(``diloco.core.executors.MPIExecutor``): rank k holds worker k and steps it with the same
milestone functions; only the synchronisations cross process boundaries:

1. Every rank builds the same shards and initial model from the seed (exactly as
   ``train_diloco`` does, so nothing needs broadcasting) and keeps its own shard.
2. Each round every rank draws ``rng.spawn(K)`` like ``run_diloco_round`` and keeps child
   ``k``, so worker k sees the same mini-batches as simulated worker k.
3. At each sync the kept workers' parameters are reduce-scattered and all-gathered as
   flat buffers (encoded outer gradients are all-gathered as their payload bytes), and
   every value is reduced in worker order, so the global parameters stay equal
   everywhere and equal the single-process run's bit for bit: every flag of
   ``diloco train`` (the family's compression, fragments and eager updates, drops,
   outer Adam, the lr schedule, clipping, the character-level task) runs here too.

Faults never hang the job. Every collective is non-blocking and waited on for at most
``round_timeout`` seconds: a rank that stops answering (killed, stopped, stuck) makes the
others print that a collective timed out and call ``MPI_Abort``, which ends every
process. An exception on any rank is printed as one line naming the rank, then
``MPI_Abort`` ends the job. A divergence (``diloco.tools.runs.training.Diverged``) is seen by
every rank at once, since they hold the same global model and losses, so they all stop
with the same message and exit status 3, without an abort. The MPI executor writes no
checkpoints: ``--checkpoint-every`` and ``--resume`` belong to ``diloco train``. ``--run-dir DIR``
keeps the run's record, ``DIR/config.json`` (written atomically by rank 0 before the first round,
as ``diloco train`` writes it), from which ``diloco train --config`` or this tool's ``--config`` runs
it again.

A part registered from outside the package (``diloco.core.registry``) reaches the ranks as it
reaches any process, by being registered in it: ``--plugin MODULE`` imports the module that
registers it in every rank, before the flags are read, and in a replacement too (it gets the same
flags).

Under an MPI with ULFM (Open MPI 5, ``mpiexec --with-ft ulfm``), ``--survive-failures`` makes a
rank that dies a dropped worker, and ``--replace-failed`` starts a process in its place at the
end of that round (``diloco.core.membership``; docs/failure-and-recovery.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from diloco._validation import milestone
from diloco.config import DiLoCoConfig
from diloco.core.deadline import exit_after
from diloco.core.driver import train
from diloco.core.executors import RoundTimeout, replacement_start
from diloco.core.hooks import Guard, NetworkTimer, callbacks
from diloco.core.membership import within
from diloco.loop import TrainResult

__all__ = ["RoundTimeout", "train_diloco_mpi", "main"]


@milestone  # a trainer's depth, as train_diloco: checked once by prepare_training, then the guard watches
def train_diloco_mpi(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, comm, *, x_eval=None, y_eval=None,
                     on_round=None, round_timeout: float | None = None, max_loss: float | None = None,
                     algo: str = "diloco", encode=None, sync_fields: bool | None = None,
                     survive_failures: bool = False, replace=None, start=None) -> TrainResult:
    """Train with DiLoCo (every mechanism of ``config``, its family included), this process being
    worker ``comm.rank`` of ``comm.size``: the one driver on the MPI executor.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, on_round, encode
        As for ``diloco.loop.train_diloco``; every rank passes the same values.
    comm : mpi4py.MPI.Comm
        ``comm.size`` must equal ``config.num_workers``.
    round_timeout : float > 0, optional
        Seconds a rank waits in a collective before raising ``RoundTimeout``; None waits forever.
    max_loss : float > 0, optional
        The divergence guard's loss threshold (``diloco.core.hooks.Guard``).
    algo : "diloco" or "sync", keyword-only
        The synchronous baseline all-gathers the gradients every step.
    survive_failures, replace, start : keyword-only
        Under an MPI with ULFM: a rank that dies becomes a dropped worker (``lost_workers`` and
        ``dropped_workers`` in its records); ``replace``, the argv that starts a process in its
        place at the round's end; ``start``, a replacement's ``RunState``
        (``diloco.core.membership``, ``diloco.core.driver.train``).

    Returns
    -------
    TrainResult(params, history)
        The same on every rank, bit-identical to the single-process run of the same config
        (every value is reduced in worker order). DiLoCo's records also hold
        ``allreduce_seconds`` (this rank's wall time in the round's collectives),
        ``mpi_bytes_sent`` and ``mpi_allreduce_bytes``.

    Raises
    ------
    ValueError
        ``comm.size != config.num_workers``, or the errors of ``train_diloco``.
    RoundTimeout
        A collective outlasted ``round_timeout``.
    diloco.tools.runs.training.Diverged
        A non-finite loss, pseudo-gradient or held-out loss (on every rank alike).
    """
    _check_processes(config, comm)
    guard, hooks = _hooks(config, algo, max_loss, on_round)
    with guard.watch():
        return train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, encode=encode, executor="mpi", hooks=hooks,
                     comm=comm, timeout=round_timeout, sync_fields=sync_fields, survive_failures=survive_failures,
                     replace=replace, start=start)


def _check_processes(config: DiLoCoConfig, comm) -> None:
    """``ValueError`` unless there is one process per worker."""
    if comm.size != config.num_workers:
        raise ValueError(
            f"config.num_workers ({config.num_workers}) must equal the number of MPI processes ({comm.size}); "
            f"run with mpiexec -n {config.num_workers}"
        )


def _hooks(config: DiLoCoConfig, algo: str, max_loss: float | None, on_round) -> tuple[Guard, list]:
    """The divergence guard and the driver's hooks: the network timer (when the family simulates one),
    the guard, then the caller's ``on_round``."""
    guard = Guard(algo, max_loss)
    hooks = [NetworkTimer(config)] if config.family.simulates_network else []
    return guard, [*hooks, guard, *callbacks(on_round)]


def _positive(text: str) -> float:
    value = float(text)
    if not np.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _first_alive(record: dict, size: int) -> int:
    """The lowest worker not lost (worker 0 unless it died and was not replaced): its process prints and writes."""
    return min(set(range(size)) - set(record.get("lost_workers", ())))


def _fail(comm, rank: int, message: str, code: int) -> int:
    """Print one line for this rank and end the whole job (every rank) with ``MPI_Abort``."""
    print(f"diloco.tools.cli.mpi: error: {message}", file=sys.stderr, flush=True)
    time.sleep(0.3)  # let mpiexec forward the line before the abort tears the job down
    comm.Abort(code)
    return code  # not reached: Abort ends this process too


def _parser():
    from diloco.tools.cli.errors import Parser
    from diloco.tools.cli.flags import add_config_flags, add_data_flags, add_recovery_flags

    parser = Parser(prog="python -m diloco.tools.cli.mpi", description=__doc__.splitlines()[0])
    add_config_flags(parser)
    add_data_flags(parser)
    parser.add_argument("--algo", choices=("diloco", "sync"),
                        help="diloco (default, or a --config run file's) or sync (the gradients all-gathered every "
                             "step)")
    parser.add_argument("--json", metavar="FILE", help="rank 0 writes the history and final metrics here")
    parser.add_argument("--save-params", metavar="FILE.npz", help="rank 0 saves the final global params here")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="rank 0 writes the run's config.json here before the first round (the record "
                             "`diloco train --config DIR/config.json` and this tool's --config rerun)")
    parser.add_argument("--round-timeout", type=_positive, default=600.0, metavar="SECONDS",
                        help="a rank waiting longer than this in a round's all-reduce aborts the job (600)")
    parser.add_argument("--survive-failures", action="store_true",
                        help="a rank that dies becomes a dropped worker and the others go on (needs an MPI with ULFM: "
                             "Open MPI 5 started with `mpiexec --with-ft ulfm`)")
    parser.add_argument("--replace-failed", action="store_true",
                        help="with --survive-failures: a new process replaces a dead worker at the end of the round it "
                             "died in, from the global parameters and outer state (MPI_Comm_spawn)")
    add_recovery_flags(parser, resume=False)  # --max-loss
    parser.add_argument("--joining", action="store_true", help=argparse.SUPPRESS)  # a replacement (_replacement_argv)
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="import MODULE in every rank (a replacement too) before the other flags are read, so "
                             "that the parts it registers in diloco.core.registry (an inner optimizer, a codec) are "
                             "choices of --inner-optimizer and --compress; repeatable")
    return parser


def _load_plugins(argv: list) -> str | None:
    """Import every ``--plugin MODULE`` of ``argv``, in order, before the flags are read (their choices
    are the registry's then); why one could not be imported, or None."""
    import importlib

    plugins = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    plugins.add_argument("--plugin", action="append", default=[])
    for module in plugins.parse_known_args(argv)[0].plugin:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - any failure of the plugin's import is one line
            return f"cannot load --plugin {module}: {type(exc).__name__}: {exc}"
    return None


def _fault_refusal(args, config) -> str | None:
    """Why ``--survive-failures`` / ``--replace-failed`` cannot run here (None when they can)."""
    from diloco.core.membership import ulfm_problem
    from diloco.core.synchronisers import is_eager

    if args.replace_failed and not args.survive_failures:
        return "--replace-failed needs --survive-failures (a dead worker is first dropped, then replaced)"
    if not args.survive_failures:
        return None
    if args.algo == "sync":
        return ("--survive-failures does not run the synchronous baseline: it has no outer gradient to drop, so a "
                "dead worker cannot become a dropped one (as --drop-prob is refused there)")
    if is_eager(config):
        return ("--survive-failures does not run eager updates: the eager rule needs every worker's fresh outer "
                "gradient (as --drop-prob is refused there)")
    if config.asynchrony.asynchronous:
        return ("--survive-failures does not run asynchronous DiLoCo: its arrivals follow a simulated clock of all K "
                "workers, which a real death does not stop")
    return ulfm_problem()


def _replacement_argv(argv: list, num_workers: int) -> list:
    """The argv of a process that replaces a dead worker: this module with the run's flags, K made explicit."""
    return [sys.executable, "-m", "diloco.tools.cli.mpi", *argv, "-K", str(num_workers), "--joining"]


def _setup(args, comm):
    """``(config, data, record)`` of the run, or raise ``CliError`` / ``ValueError`` (one line, before any
    work). ``args.algo`` and
    ``args.max_loss`` are settled here: a flag, else the ``--config`` run file's, else ``diloco`` and
    ``DEFAULT_MAX_LOSS``. ``record`` is the run's ``config.json``."""
    from diloco.core.driver import check_algorithm
    from diloco.tools.cli.config_file import run_file_settings
    from diloco.tools.cli.errors import CliError
    from diloco.tools.cli.flags import build_config, load_dataset

    config = build_config(args, defaults={"num_workers": comm.size})
    saved = run_file_settings(args, "train")  # --config run/config.json: its algorithm and guard too
    args.algo = args.algo or saved.get("algo") or "diloco"
    args.max_loss = _max_loss(args.max_loss, saved)
    check_algorithm(args.algo, config)  # the family's flags live in config.family
    problem = _fault_refusal(args, config)
    if problem:
        raise CliError(problem)
    data, data_info = load_dataset(args, config.dtype)
    if config.num_workers != comm.size:
        raise CliError(f"-K {config.num_workers} does not match the {comm.size} MPI processes")
    record = {"command": "train", "algorithms": [args.algo], "max_loss": args.max_loss, "config": config.to_dict(),
              "data": data_info}
    return config, data, record


def _max_loss(flag: float | None, saved: dict) -> float | None:
    """The guard's threshold: ``--max-loss``, else the run file's, else ``DEFAULT_MAX_LOSS``; None for off."""
    from diloco.tools.cli.flags import DEFAULT_MAX_LOSS

    value = saved.get("max_loss", DEFAULT_MAX_LOSS) if flag is None else flag
    return None if value is None or np.isinf(value) else value


def _check_run_dir(run_dir: str | None) -> None:
    """Refuse a ``--run-dir`` that is a file or already holds a run's record (never overwritten)."""
    from diloco.tools.cli.errors import CliError

    if run_dir is None:
        return
    folder = Path(run_dir)
    if folder.exists() and not folder.is_dir():
        raise CliError(f"--run-dir {run_dir} is a file, not a folder")
    if (folder / "config.json").exists():
        raise CliError(f"--run-dir {run_dir} already holds a config.json (another run's record); choose a new folder")


def _write_record(run_dir: str, record: dict) -> str | None:
    """``run_dir/config.json``, written atomically (``diloco.tools.runs.atomic_files``): the run as
    ``diloco train`` records it, so ``diloco train --config`` and this tool's ``--config`` rerun it.
    Returns why it was not written (a folder holding a record already, a failed write), else None."""
    from diloco.tools.cli.errors import CliError
    from diloco.tools.runs.folders import write_json

    try:
        _check_run_dir(run_dir)
        folder = Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        write_json(folder / "config.json", record)
    except CliError as exc:
        return str(exc)
    except OSError as exc:
        return f"cannot write {exc.filename or run_dir}: {exc.strerror or exc}"
    return None


def _write_outputs(args, config, result, seconds: float) -> int:
    """Print the summary and write ``--json`` / ``--save-params``; 0, or 2 when a file cannot be written."""
    from diloco.tools.runs.folders import atomic_write_bytes, npz_bytes, write_json

    last, size = result.history[-1], config.num_workers
    name = "DiLoCo" if args.algo == "diloco" else "the synchronous baseline"
    print(f"{name} on {size} MPI processes: held-out loss {last['eval_loss']:.4f}, "
          f"accuracy {last['eval_accuracy']:.4f}, {len(result.history)} all-reduces, {seconds:.1f} s")
    try:
        if args.json:
            write_json(args.json, {"config": config.to_dict(), "processes": size, "seconds": seconds,
                                   "history": result.history})
        if args.save_params:
            atomic_write_bytes(args.save_params, npz_bytes(result.params))
    except OSError as exc:
        print(f"diloco.tools.cli.mpi: error: cannot write {exc.filename or 'output'}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    return 0


def _reporter(worker: int, size: int):
    """``on_round``: the first worker alive prints one line per round."""
    def report(record):
        if worker == _first_alive(record, size):
            print(f"round {record['round']:3d}  inner loss {record['inner_loss']:.4f}  "
                  f"held-out loss {record['eval_loss']:.4f}  accuracy {record['eval_accuracy']:.4f}  "
                  f"all-reduce {record.get('allreduce_seconds', 0.0) * 1e3:.1f} ms", flush=True)
    return report


def _train_or_fail(args, argv: list, comm, config, data, start):
    """Train this rank's worker: ``(result, 0)``, or ``(None, exit status)`` once the failure is reported.

    A divergence is seen by every rank alike (exit 3, no abort); a time-out (4) or any other
    exception (1) on one rank ends every rank with ``MPI_Abort``."""
    import warnings

    from diloco.tools.runs.training import Diverged

    worker = comm.rank
    replace = _replacement_argv(argv, config.num_workers) if args.replace_failed else None
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):  # the guard's message replaces NumPy's
            warnings.simplefilter("ignore", RuntimeWarning)
            return train_diloco_mpi(data.x_train, data.y_train, config, comm, x_eval=data.x_test,
                                    y_eval=data.y_test, on_round=_reporter(worker, config.num_workers),
                                    round_timeout=args.round_timeout, max_loss=args.max_loss, algo=args.algo,
                                    encode=data.encode, survive_failures=args.survive_failures, replace=replace,
                                    start=start), 0
    except Diverged as exc:  # every rank sees the same record: all stop here, no abort needed
        if worker == 0:
            print(f"diloco.tools.cli.mpi: error: {exc}", file=sys.stderr)
        return None, 3
    except RoundTimeout as exc:
        return None, _fail(comm, worker, f"{exc}; aborting the job", 4)
    except BaseException as exc:  # noqa: BLE001 - any fault on one rank must end every rank, never hang them
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return None, _fail(comm, worker, f"rank {worker} failed: {reason}; aborting the job", 1)


def _start(args, comm, start):
    """``(config, data, start)`` once the run is set up and recorded, or ``(None, None, exit status)``.

    A setup error is one line from worker 0 and status 2 on every rank (nothing has started). A
    replacement's start gets fresh AdamW moments (the dead worker's died with it); otherwise worker 0
    checks and writes ``--run-dir``'s ``config.json`` before any round and tells every rank how that
    went (a broadcast: no rank may decide alone, or the others would wait for it in the first round),
    so a refused folder or a failed write ends every rank with status 2."""
    from diloco.tools.cli.errors import CliError

    try:
        config, data, record = _setup(args, comm)
    except (CliError, ValueError) as exc:
        if comm.rank == 0:
            print(f"diloco.tools.cli.mpi: error: {exc}", file=sys.stderr)
        return None, None, 2
    if start is not None:
        return config, data, replacement_start(start, [comm.rank], config)
    if args.run_dir:
        problem = comm.bcast(_write_record(args.run_dir, record) if comm.rank == 0 else None, root=0)
        if problem:
            if comm.rank == 0:
                print(f"diloco.tools.cli.mpi: error: {problem}", file=sys.stderr)
            return None, None, 2
    return config, data, None


def main(argv=None) -> int:
    """``mpiexec -n K python -m diloco.tools.cli.mpi [train flags]``: K defaults to the number of ranks.

    A process started by ``--replace-failed`` (it has a parent job) first joins the survivors
    (``diloco.core.membership.join``) and goes on as the worker it replaces.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    problem = _load_plugins(argv)
    if problem:
        print(f"diloco.tools.cli.mpi: error: {problem}", file=sys.stderr)
        return 2
    args = _parser().parse_args(argv)
    # a replacement's MPI_Init and join wait for the survivors: if one dies meanwhile, end after --round-timeout
    with within(args.round_timeout if args.joining else None, "a replacement process: joining the survivors"):
        try:
            from mpi4py import MPI
        except ImportError:
            print("diloco.tools.cli.mpi: error: mpi4py is not installed; pip install 'diloco[mpi]'", file=sys.stderr)
            return 2
        from diloco.core.membership import is_replacement, join

        comm, start = MPI.COMM_WORLD, None
        if is_replacement():  # the survivors wait in the admission: join before anything can fail
            comm, _, start = join()  # a replacement's rank in the joined communicator is its worker index
    config, data, start = _start(args, comm, start)
    if config is None:
        return start  # the exit status
    worker = comm.rank  # read now: after a death the driver frees the communicators it was given
    begun = time.perf_counter()
    result, code = _train_or_fail(args, argv, comm, config, data, start)
    if result is None:
        return code
    if worker == _first_alive(result.history[-1], config.num_workers):  # worker 0, or the first one alive
        code = _write_outputs(args, config, result, time.perf_counter() - begun)
    if args.survive_failures:
        _finalize_within(FINALIZE_SECONDS, code)
    return code


# After a rank's death, Open MPI 5's MPI_Finalize (ULFM) now and then never returns: the first rank
# alive sleeps in ompi_mpi_finalize's wait loop after everything is written (seen in 2 of 25 runs of
# tests/tooling/test_mpi_ulfm.py's second death beside three CPU hogs, and in CI).
FINALIZE_SECONDS = 20.0


def _finalize_within(seconds: float, code: int) -> None:
    """``MPI_Finalize``; if it has not returned after ``seconds``, the process exits with ``code``
    (its outputs are written and flushed by then; ``diloco.core.deadline.exit_after``), so that a
    finished job never hangs.

    mpi4py's ``MPI.Finalize`` keeps the GIL, so the timer thread could not run: the call goes through
    ctypes, which lets it go (mpi4py's own finalize at exit then sees MPI finalized and skips).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    with exit_after(seconds, code):
        _finalize_without_the_gil()


def _finalize_without_the_gil() -> None:
    """``MPI_Finalize`` of the library this process loaded (found in /proc/self/maps), through
    ctypes; mpi4py's, which keeps the GIL, where that library cannot be found."""
    import ctypes

    from mpi4py import MPI

    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi.so" in line}
    except OSError:
        paths = set()
    if len(paths) != 1:
        MPI.Finalize()
        return
    ctypes.CDLL(paths.pop()).MPI_Finalize()


if __name__ == "__main__":
    raise SystemExit(main())
