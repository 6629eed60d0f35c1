"""Part 7 - held-out evaluation and the communication model.

Milestones 28-30. Loss and accuracy measure quality; ``communication_savings`` measures
what DiLoCo saves: under a ring all-reduce each worker sends
``2 (K - 1) / K * N * bytes_per_value`` bytes per synchronisation; the synchronous
baseline synchronises every step, DiLoCo once every H steps.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco._validation import check_args, milestone
from diloco.model import Params, cross_entropy_loss, model_forward

__all__ = ["CommunicationReport", "evaluate_loss", "classification_accuracy", "communication_savings"]


class CommunicationReport(NamedTuple):
    """Bytes each worker sends, synchronous baseline against DiLoCo.

    Attributes
    ----------
    sync_all_reduces : int
        ``inner_steps * rounds``, one per step.
    diloco_all_reduces : int
        ``rounds``, one per round.
    sync_bytes_per_worker : float
        ``sync_all_reduces * 2 (K-1)/K * N * bytes_per_value``.
    diloco_bytes_per_worker : float
        ``diloco_all_reduces * 2 (K-1)/K * N * outer_bytes_per_value``.
    savings_factor : float
        ``(sync_all_reduces * bytes_per_value) / (diloco_all_reduces * outer_bytes_per_value)``,
        the byte ratio, defined even for K = 1 where both byte counts are zero;
        ``inner_steps`` at equal precision.
    """

    sync_all_reduces: int
    diloco_all_reduces: int
    sync_bytes_per_worker: float
    diloco_bytes_per_worker: float
    savings_factor: float


@milestone
def evaluate_loss(params: Params, x: np.ndarray, y: np.ndarray) -> float:
    """Milestone 28: mean cross-entropy of the model on (held-out) data.

    ``L = cross_entropy_loss(model_forward(params, x)[0], y)``; the parameters are not
    changed.

    Parameters
    ----------
    params : dict of str -> ndarray (MLP)
    x : ndarray of shape (n, d_in), n >= 1
    y : ndarray of shape (n,), integer in [0, C)

    Returns
    -------
    float
        The loss the model has on this data, however large: a ReLU MLP is positively
        homogeneous once its inputs dwarf its biases, so features of 1e300 give logits,
        and a loss, of order 1e299. That finite value is the answer, not an error (a
        pure teaching function computes what the formula gives); only logits or a loss
        that overflow to Inf are refused. Its precision is ``cross_entropy_loss``'s: a
        loss below the spacing of the logits' size rounds away.

    Raises
    ------
    ValueError, TypeError
        Empty data, mismatched shapes, labels out of range; params and x whose logits
        or loss overflow (naming them).
    """
    check_args.evaluate_loss(params, x, y)
    # BEGIN SOLUTION
    logits, _ = model_forward(params, x)
    return cross_entropy_loss(logits, y)
    # END SOLUTION


@milestone
def classification_accuracy(params: Params, x: np.ndarray, y: np.ndarray) -> float:
    """Milestone 29: fraction of rows whose arg-max logit equals the label.

    ``acc = (1/n) sum_i [argmax_j z_ij == y_i]``; ties go to the lowest index, as
    ``np.argmax`` does.

    Parameters
    ----------
    params : dict of str -> ndarray (MLP)
    x : ndarray of shape (n, d_in), n >= 1
    y : ndarray of shape (n,), integer

    Returns
    -------
    float in [0, 1]

    Raises
    ------
    ValueError
        Empty input, mismatched shapes, labels outside [0, C).
    """
    check_args.classification_accuracy(params, x, y, model_forward)
    # BEGIN SOLUTION
    logits, _ = model_forward(params, x)
    return float(np.mean(np.argmax(logits, axis=1) == y))
    # END SOLUTION


@milestone
def communication_savings(num_params: int, num_workers: int, inner_steps: int, rounds: int, *,
                          bytes_per_value: int = 4, outer_bytes_per_value: int | None = None
                          ) -> CommunicationReport:
    """Milestone 30: bytes sent per worker, synchronous baseline against DiLoCo.

    One ring all-reduce of N values over K workers sends
    ``2 (K - 1) / K * N * b`` bytes from each worker (reduce-scatter, then all-gather).
    The baseline all-reduces every step (``inner_steps * rounds`` times, at
    ``bytes_per_value``); DiLoCo once per round (``rounds`` times, at
    ``outer_bytes_per_value``, e.g. 1 for an int8-quantised pseudo-gradient).

    Parameters
    ----------
    num_params : int >= 1
        N, values in the model.
    num_workers : int >= 1
        K.
    inner_steps : int >= 1
        H.
    rounds : int >= 1
    bytes_per_value : int >= 1, keyword-only
        Precision of the baseline's gradients (4 = float32).
    outer_bytes_per_value : int >= 1 or None, keyword-only
        Precision of DiLoCo's pseudo-gradients; defaults to ``bytes_per_value``.

    Returns
    -------
    CommunicationReport
        ``savings_factor == inner_steps`` at equal precision.

    Raises
    ------
    TypeError, ValueError
        A count that is not a positive int.
    """
    num_params, num_workers, inner_steps, rounds, bytes_per_value, outer_bytes_per_value = (
        check_args.communication_savings(num_params, num_workers, inner_steps, rounds, bytes_per_value,
                                         outer_bytes_per_value))
    # BEGIN SOLUTION
    values_per_all_reduce = 2.0 * (num_workers - 1) / num_workers * num_params
    sync_all_reduces = inner_steps * rounds
    diloco_all_reduces = rounds
    return CommunicationReport(
        sync_all_reduces=sync_all_reduces,
        diloco_all_reduces=diloco_all_reduces,
        sync_bytes_per_worker=sync_all_reduces * values_per_all_reduce * bytes_per_value,
        diloco_bytes_per_worker=diloco_all_reduces * values_per_all_reduce * outer_bytes_per_value,
        savings_factor=(sync_all_reduces * bytes_per_value) / (diloco_all_reduces * outer_bytes_per_value),
    )
    # END SOLUTION
