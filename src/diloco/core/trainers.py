"""The core's entry points: one function per algorithm and executor, each the one driver.

Every function here is ``diloco.core.driver.train`` with a config section and hooks filled
in; none owns a loop. They keep ``train_diloco``'s signature, so the tools, notebooks and
tests can swap them:

* ``train_streaming`` (Streaming DiLoCo: ``family.fragments``, ``overlap``, ``mix``) and
  ``train_eager`` (eager updates), with any wire format of ``family``;
* ``train_family`` and ``family_trainer(algo, family)``: DiLoCo or the baseline under a
  ``FamilyConfig``, with the divergence guard and, on a simulated network, the network
  clock; ``train_family_mpi``: the same on real MPI ranks;
* ``train_diloco_fast`` and ``train_synchronous_fast`` (``FAST_TRAINERS``): the fast
  engine, the driver on the fast executor (``diloco.engine.fast``);
* ``communication_report``: ``communication_savings`` (milestone 30) at the real encoded
  size, from a run's records.
"""

from __future__ import annotations

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.config.sections import FamilyConfig
from diloco.core.driver import baseline_config, train
from diloco.core.hooks import Guard, NetworkTimer, callbacks
from diloco.evaluation import communication_savings
from diloco.loop import TrainResult

__all__ = ["train_streaming", "train_eager", "train_family", "family_trainer", "train_family_mpi",
           "train_diloco_fast", "train_synchronous_fast", "FAST_TRAINERS", "communication_report"]


def _family(config, family, default=None) -> FamilyConfig:
    """``family``, or ``default``, or the config's own section."""
    if family is None:
        family = default or (config.family if isinstance(config, DiLoCoConfig) else FamilyConfig())
    if not isinstance(family, FamilyConfig):
        raise TypeError(f"family must be a FamilyConfig, got {type(family).__name__}")
    return family


def train_streaming(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, family: FamilyConfig | None = None, *,
                    x_eval=None, y_eval=None, rng=None, on_round=None, executor: str = "reference",
                    encode=None) -> TrainResult:
    """Train with Streaming DiLoCo (and any wire format of ``family``).

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round, encode
        As for ``diloco.loop.train_diloco``.
    family : FamilyConfig, optional
        ``fragments`` (P), ``pattern``, ``overlap`` (tau < H), ``mix`` and the wire format;
        default ``config.family``.
    executor : "reference", "fast" or "mpi", keyword-only

    Returns
    -------
    TrainResult(params, history)
        ``params`` are the global (outer) parameters. A record per H inner steps; besides
        the DiLoCo fields, ``all_reduces`` (fragment syncs in the round), ``bytes_sent``,
        ``peak_sync_bytes`` (largest single sync), ``bytes_per_step`` and ``syncs``
        (``[step in round, bytes, tau]`` per sync, read by ``diloco.core.netsim``).

    Raises
    ------
    TypeError, ValueError
        The errors of ``train_diloco``; P above the number of layers or above H;
        ``tau >= H``; eager updates (use ``train_eager``).
    """
    family = _family(config, family)
    if family.eager:
        raise ValueError("train_streaming does not do eager updates: use diloco.core.trainers.train_eager")
    return train("diloco", x, y, config.replace(family=family), x_eval=x_eval, y_eval=y_eval, rng=rng,
                 encode=encode, executor=executor, hooks=callbacks(on_round), sync_fields=True)


def train_eager(x, y, config: DiLoCoConfig, family: FamilyConfig | None = None, *, x_eval=None, y_eval=None,
                rng=None, on_round=None, executor: str = "reference", encode=None) -> TrainResult:
    """Train DiLoCo with eager updates (``family.tau(H)`` must be 0 or H; default ``FamilyConfig(eager=True)``).

    Parameters and returns as ``train_streaming``; ``params`` is the workers' average.
    Records carry ``syncs = [[H, bytes, tau]]``: the all-reduce issued at the end of a
    round may take the next round's H inner steps (tau = H).
    """
    family = _family(config, family, FamilyConfig(eager=True))
    return train("diloco", x, y, config.replace(family=family), x_eval=x_eval, y_eval=y_eval, rng=rng,
                 encode=encode, executor=executor, hooks=callbacks(on_round), sync_fields=True)


def train_family(x, y, config: DiLoCoConfig, family: FamilyConfig | None = None, *, on_round=None,
                 max_loss: float | None = None, executor: str = "reference", **kwargs):
    """DiLoCo under ``family`` (default ``config.family``): streaming, eager, compression, network clock."""
    return family_trainer("diloco", _family(config, family))(x, y, config, on_round=on_round, max_loss=max_loss,
                                                             executor=executor, **kwargs)


def family_trainer(algo: str, family: FamilyConfig):
    """The training function of ``algo`` under ``family``: ``run(x, y, config, *, x_eval, y_eval, rng,
    on_round, max_loss, executor, encode) -> TrainResult`` (the baseline keeps only the
    simulated network of ``family``)."""
    family = _family(None, family)

    def run(x, y, config, *, x_eval=None, y_eval=None, rng=None, on_round=None, max_loss=None,
            executor="reference", encode=None):
        config = config.replace(family=family)
        if algo == "sync":
            config = baseline_config(config)
        hooks = [NetworkTimer(config)] if family.simulates_network else []
        guard = Guard(algo, max_loss)
        hooks += [guard, *callbacks(on_round)]
        with guard.watch():
            return train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, rng=rng, encode=encode,
                         executor=executor, hooks=hooks, sync_fields=algo == "diloco")

    return run


def train_family_mpi(x, y, config: DiLoCoConfig, comm, family: FamilyConfig, *, x_eval=None, y_eval=None,
                     on_round=None, round_timeout: float | None = None, max_loss: float | None = None
                     ) -> TrainResult:
    """``train_family`` with this process as worker ``comm.rank`` (the MPI executor).

    Returns the same ``TrainResult`` on every rank, bit-identical to the single-process
    run; each record also holds ``allreduce_seconds`` (wall time in this rank's
    collectives), ``mpi_bytes_sent`` (bytes this rank handed MPI for the other ranks) and
    ``mpi_allreduce_bytes`` (the outer gradients' payload among them).
    """
    guard = Guard("diloco", max_loss)
    with guard.watch():
        return train("diloco", x, y, config.replace(family=family), x_eval=x_eval, y_eval=y_eval, executor="mpi",
                     hooks=[guard, *callbacks(on_round)], comm=comm, timeout=round_timeout, sync_fields=True)


def train_diloco_fast(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None, rng=None,
                      on_round=None, layout: str = "auto", encode=None):
    """DiLoCo (milestone 26's algorithm, with every mechanism of ``config``) on the fast engine.

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round, encode
        As for ``diloco.loop.train_diloco``; ``config.engine`` is not consulted.
    layout : "auto", "stacked" or "per-worker", keyword-only
        Stacked: the K workers take each inner step together (batched matmul, one AdamW
        pass over a ``(K, P)`` buffer). Per-worker: worker after worker, each with one
        ``(1, P)`` model, as the loop does. ``"auto"``: ``diloco.engine.layout.choose_layout``.

    Returns
    -------
    TrainResult(params, history)
        Equal to ``train_diloco``'s within rounding (the tests allow 1e-10 relative in
        float64, 1e-5 in float32).
    """
    return train("diloco", x, y, config, x_eval=x_eval, y_eval=y_eval, rng=rng, encode=encode, executor="fast",
                 hooks=callbacks(on_round), layout=layout)


def train_synchronous_fast(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, *, x_eval=None, y_eval=None,
                           rng=None, on_round=None, encode=None):
    """The synchronous baseline (milestone 27's algorithm) on the fast engine, the K batches as one.

    One shared model sees the K workers' mini-batches as ``K`` groups of one forward and
    backward pass (``K * b`` rows, one BLAS call per layer); the gradient is the mean of
    the groups' gradients, as the all-reduce would give, then one inner step.

    Returns
    -------
    TrainResult(params, history)
        Equal to ``train_synchronous_baseline``'s up to rounding (the K groups' gradients
        are summed inside one matrix product instead of one by one).
    """
    return train("sync", x, y, config, x_eval=x_eval, y_eval=y_eval, rng=rng, encode=encode, executor="fast",
                 hooks=callbacks(on_round))


FAST_TRAINERS = {"diloco": train_diloco_fast, "sync": train_synchronous_fast}


def communication_report(history: list, config: DiLoCoConfig, num_params: int) -> dict:
    """``communication_savings``' fields for a finished family run, at the encoded size.

    The baseline's bytes (one all-reduce per step, params' precision) come from milestone
    30; DiLoCo's are the records' ``bytes_sent`` summed, and ``outer_bytes_per_value`` is
    the real average (``bytes / (2 (K-1)/K N)`` per all-reduce of the whole model).
    """
    itemsize = np.dtype(config.dtype).itemsize
    report = communication_savings(num_params, config.num_workers, config.inner_steps, config.rounds,
                                   bytes_per_value=itemsize)._asdict()
    diloco_bytes = float(sum(record["bytes_sent"] for record in history))
    report["diloco_bytes_per_worker"] = diloco_bytes
    report["diloco_all_reduces"] = int(sum(record["all_reduces"] for record in history))
    report["peak_sync_bytes"] = float(max(record.get("peak_sync_bytes", record["bytes_sent"]) for record in history))
    per_value = 2.0 * (config.num_workers - 1) / config.num_workers * num_params * len(history)
    report["outer_bytes_per_value"] = diloco_bytes / per_value if per_value else float(itemsize)
    report["savings_factor"] = (report["sync_bytes_per_worker"] / diloco_bytes if diloco_bytes
                                else report["savings_factor"] * itemsize / report["outer_bytes_per_value"])
    return report
