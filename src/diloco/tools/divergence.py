"""The divergence guard: ``Diverged`` and the checks that raise it.

After every DiLoCo round (``_check_diloco_round``: worker losses, AdamW moments,
pseudo-gradient norm, global parameters) and after every baseline step, the losses,
optimizer states, pseudo-gradient and parameters must be finite, and, with
``max_loss``, no loss may exceed it. ``check_record`` applies the same guard to a
finished round's record alone, for trainers the resumable driver does not run (the fast
engine, the studies, ``diloco.tools.mpi``). A failure raises ``Diverged``, which names the
round (and step), the worker and the quantity. Used by ``diloco.tools.training``, which
re-exports ``Diverged`` and ``check_record``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Diverged", "check_record"]


class Diverged(ArithmeticError):
    """Training produced a non-finite (or, with ``max_loss``, too large) value.

    Attributes
    ----------
    algo : str
    round : int
        1-based round in which it happened.
    worker : int or None
        0-based worker, or None when the quantity belongs to no single worker.
    quantity : str
        What went wrong, e.g. ``"training loss nan"``.
    step : int or None
        Inner step (1-based, within the round) when known.
    context : str or None
        Which run, when there are several (a study's variant and seed).
    """

    def __init__(self, algo: str, round_index: int, worker, quantity: str, step: int | None = None,
                 context: str | None = None):
        self.algo, self.round, self.worker, self.quantity, self.step = algo, round_index, worker, quantity, step
        self.context = context
        where = f"round {round_index}" + (f", step {step}" if step is not None else "")
        who = f"worker {worker}" if worker is not None else "all workers"
        name = {"diloco": "DiLoCo", "sync": "the synchronous baseline"}.get(algo, algo)
        super().__init__(f"{context + ': ' if context else ''}{name} diverged in {where}, {who}: {quantity}")

    def as_dict(self) -> dict:
        return {"algo": self.algo, "round": self.round, "step": self.step, "worker": self.worker,
                "quantity": self.quantity, "context": self.context, "message": str(self)}


def _finite(params) -> str | None:
    """The first key of ``params`` holding a NaN or Inf, or None."""
    for key, value in params.items():
        if not np.isfinite(value.sum()) and not np.isfinite(value).all():
            return key
    return None


def _check_loss(algo, round_index, worker, loss, max_loss, step=None, what="training loss"):
    if not math.isfinite(loss):
        raise Diverged(algo, round_index, worker, f"{what} is {loss}", step)
    if max_loss is not None and loss > max_loss:
        raise Diverged(algo, round_index, worker, f"{what} {loss:.6g} exceeds max_loss {max_loss:g}", step)


def check_record(record: dict, algo: str, max_loss: float | None = None, *, context: str | None = None) -> None:
    """The guard on a finished round's record alone (for trainers this driver does not run).

    Raises ``Diverged`` if a worker's loss, the pseudo-gradient norm or the held-out loss is
    not finite, or a loss exceeds ``max_loss``; ``context`` names the run in the message.
    """
    try:
        _check_record(record, algo, max_loss)
    except Diverged as exc:
        if context is None:
            raise
        raise Diverged(exc.algo, exc.round, exc.worker, exc.quantity, exc.step, context) from None


def _check_record(record: dict, algo: str, max_loss: float | None) -> None:
    round_index = record.get("round")
    for worker, loss in enumerate(record.get("worker_losses") or []):
        _check_loss(algo, round_index, worker, float(loss if loss is not None else math.nan), max_loss)
    norm = record.get("pseudo_grad_norm")
    if algo == "diloco" and (norm is None or not math.isfinite(norm)):
        raise Diverged(algo, round_index, None, f"pseudo-gradient norm is {norm}")
    _check_eval(algo, record, max_loss)


def _check_eval(algo, record, max_loss) -> None:
    """The held-out loss, when there is held-out data (``finish_record`` wrote None otherwise)."""
    if record.get("eval_loss") is not None or record.get("eval_accuracy") is not None:
        loss = record.get("eval_loss")
        _check_loss(algo, record["round"], None, float(loss if loss is not None else math.nan), max_loss,
                    what="held-out loss")


def _check_diloco_round(round_index, params, worker_states, record, max_loss) -> None:
    for worker, loss in enumerate(record["worker_losses"]):
        _check_loss("diloco", round_index, worker, loss, max_loss, what="mean training loss")
    for worker, state in enumerate(worker_states):
        for name, moments in (("first moment m", state.m), ("second moment v", state.v)):
            key = _finite(moments)
            if key is not None:
                raise Diverged("diloco", round_index, worker, f"AdamW {name}[{key!r}] is not finite")
    if not math.isfinite(record["pseudo_grad_norm"]):
        raise Diverged("diloco", round_index, None, f"pseudo-gradient norm is {record['pseudo_grad_norm']}")
    key = _finite(params)
    if key is not None:
        raise Diverged("diloco", round_index, None, f"global parameter {key!r} is not finite after the outer step")
