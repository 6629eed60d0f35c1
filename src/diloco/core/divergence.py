"""The divergence guard: ``Diverged``, the checks that raise it, and ``Guard``, the driver's hook.

After every round of every algorithm, on every executor (``Guard``, a hook of
``diloco.core.driver``): every worker's per-step training loss and the global
parameters must be finite, the pseudo-gradient norm too (DiLoCo), and, with
``max_loss``, no loss may exceed it; after the held-out evaluation, the held-out loss.
``check_record`` applies the record's part of the guard alone. A failure raises
``Diverged``, which names the round (and step), the worker and the quantity.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from diloco._validation import NonFiniteError

__all__ = ["Diverged", "Guard", "check_record"]


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
        if worker in record.get("lost_workers", ()):  # its process died (MPI, ULFM): no loss to check
            continue
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


class Guard:
    """The divergence guard: every loss finite (and at most ``max_loss``), the pseudo-gradient
    norm and the parameters finite after the round, the held-out loss too.

    ``watch()`` wraps the driver's call: a ``NonFiniteError`` raised mid-round (a pseudo-gradient
    that no wire format can encode, a non-finite delta) becomes ``Diverged`` naming the round in
    progress (``first_round``, a resumed run's checkpoint round, plus the rounds finished since)."""

    def __init__(self, algo: str, max_loss: float | None = None, first_round: int = 0) -> None:
        self.algo, self.max_loss, self.round = algo, max_loss, first_round

    @contextlib.contextmanager
    def watch(self):
        try:
            yield
        except NonFiniteError as exc:
            raise Diverged(self.algo, self.round + 1, None, f"a non-finite value mid-round: {exc}") from None

    def trained(self, record, trained) -> None:
        params, losses = trained
        round_index = record["round"]
        bad = [(int(np.flatnonzero(~np.isfinite(values))[0]), k) for k, values in sorted(losses.items())
               if not np.isfinite(values).all()]
        if bad:
            step, worker = min(bad)
            raise Diverged(self.algo, round_index, worker, f"training loss is {losses[worker][step]}", step + 1)
        for worker, loss in enumerate(record["worker_losses"]):
            if self.max_loss is not None and loss is not None and loss > self.max_loss:  # None: a lost worker
                raise Diverged(self.algo, round_index, worker,
                               f"mean training loss {loss:.6g} exceeds max_loss {self.max_loss:g}")
        norm = record.get("pseudo_grad_norm")
        if self.algo == "diloco" and (norm is None or not math.isfinite(norm)):
            raise Diverged(self.algo, round_index, None, f"pseudo-gradient norm is {norm}")
        key = _finite(params)
        if key is not None:
            where = "after the outer step" if self.algo == "diloco" else "after the AdamW step"
            raise Diverged(self.algo, round_index, None, f"global parameter {key!r} is not finite {where}")

    def finished(self, record, get_state) -> None:
        check_record(record, self.algo, self.max_loss)
        self.round = record["round"]


