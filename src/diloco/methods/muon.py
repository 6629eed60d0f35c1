"""Muon as the inner optimizer (MuLoCo, Thérien et al. 2025, arXiv 2505.23725).

MuLoCo is DiLoCo with Muon in place of AdamW on the workers. Muon (Jordan et al., 2024)
updates a 2-D weight matrix with the *orthogonalised* momentum: the momentum matrix
``B = U S V^T`` is replaced by (approximately) ``U V^T``, so every direction of the step
has about the same size. The orthogonalisation is five steps of a quintic Newton-Schulz
iteration, after a normalisation by the Frobenius norm::

    X_0     = G / (||G||_F + eps)
    A       = X_j X_j^T
    X_{j+1} = a X_j + (b A + c A A) X_j,       (a, b, c) = (3.4445, -4.7750, 2.0315)

(transposed first when ``G`` has more rows than columns, so ``A`` is the smaller Gram
matrix). The per-step update of a weight matrix ``W`` with gradient ``G`` (the Muon
reference implementation's order, momentum without dampening)::

    B_t   = mu B_{t-1} + G_t
    U_t   = G_t + mu B_t   (Nesterov)    or    B_t   (heavy ball)
    W_t   = W_{t-1} (1 - lr wd) - lr s NS5(U_t)

with the shape scale ``s = sqrt(max(1, fan_out / fan_in))`` (the reference's
``max(1, rows / cols)`` of a PyTorch ``(out, in)`` weight; our weights are stored
``(fan_in, fan_out)``), or ``s = 0.2 sqrt(max(fan_in, fan_out))`` (Moonlight's, which
matches AdamW's update RMS). Everything that is not a 2-D weight (the biases here) gets
AdamW, as MuLoCo and Muon do: milestones 08-11 through ``diloco.adamw.adamw_step``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from diloco._validation import (
    check_params,
    check_positive_int,
    check_real,
    check_same_structure,
)
from diloco.adamw import AdamWState, adamw_step, init_adamw_state
from diloco.config import MUON_SCALES, AdamWConfig, MuonConfig
from diloco.model import Params

__all__ = ["NS_COEFFICIENTS", "SHAPE_SCALES", "MuonConfig", "MuonState", "newton_schulz", "shape_scale",
           "muon_keys", "init_muon", "muon_step", "muon_matrix_step", "as_moments", "from_moments"]

# The quintic's coefficients in the Muon reference implementation (Jordan et al., 2024).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
SHAPE_SCALES = MUON_SCALES


class MuonState(NamedTuple):
    """Immutable Muon state of one worker.

    Attributes
    ----------
    step : int
        Steps taken so far; 0 before the first.
    momentum : dict of str -> ndarray
        ``B`` of every Muon matrix, shaped and typed like it (fan_in, fan_out).
    adam : AdamWState or None
        The AdamW state of the other arrays; None when every array is a Muon matrix.
    """

    step: int
    momentum: Params
    adam: AdamWState | None


def newton_schulz(matrix: np.ndarray, steps: int = 5, *, eps: float = 1e-7,
                  coefficients: tuple = NS_COEFFICIENTS) -> np.ndarray:
    """The quintic Newton-Schulz orthogonalisation of Muon, ``NS_steps(G) ~ U V^T``.

    ``X_0 = G / (||G||_F + eps)``, then ``steps`` times ``A = X X^T``,
    ``X = a X + (b A + c A A) X``. A matrix with more rows than columns is transposed
    first and back at the end (the same polynomial of the singular values either way).
    The iteration pushes every singular value towards the fixed band the coefficients
    were tuned for (about 0.7 to 1.2), not exactly to 1.

    A stack ``(S, m, n)`` (the fast executor's K workers) is S independent matrices,
    each with its own norm, in one batched ``np.matmul`` per product.

    Parameters
    ----------
    matrix : ndarray of shape (m, n) or (S, m, n), float32 or float64, finite
    steps : int >= 1
    eps : float >= 0, keyword-only
        Added to the norm, so a zero matrix maps to zero.
    coefficients : (a, b, c), keyword-only

    Returns
    -------
    ndarray of the input's shape
        New array of the input's dtype.

    Raises
    ------
    TypeError, ValueError
        ``matrix`` not a finite 2-D (or 3-D) float array, ``steps`` not a positive int, ``eps`` negative.
    """
    if not isinstance(matrix, np.ndarray) or matrix.dtype not in (np.float32, np.float64):
        raise TypeError(f"matrix must be a float32 or float64 ndarray, got "
                        f"{matrix.dtype if isinstance(matrix, np.ndarray) else type(matrix).__name__}")
    if matrix.ndim not in (2, 3):
        raise ValueError(f"matrix must be 2-D (m, n) or a 3-D stack (S, m, n), got shape {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError("matrix must be finite (no NaN or inf)")
    steps = check_positive_int(steps, "steps")
    eps = check_real(eps, "eps", low=0.0)
    a, b, c = (check_real(value, f"coefficients[{i}]") for i, value in enumerate(coefficients))
    tall = matrix.shape[-2] > matrix.shape[-1]
    # C order first, so G and G^T take the same sums and products (bit for bit).
    x = np.ascontiguousarray(np.swapaxes(matrix, -1, -2) if tall else matrix)
    norm = np.sqrt(np.sum(x * x, axis=(-2, -1), keepdims=True))  # Frobenius: every singular value <= 1
    x = x / (norm + eps)
    for _ in range(steps):
        gram = x @ np.swapaxes(x, -1, -2)
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return np.ascontiguousarray(np.swapaxes(x, -1, -2) if tall else x)


def shape_scale(shape: tuple, scale: str = "muon") -> float:
    """The factor of a Muon step of a ``(fan_in, fan_out)`` weight (see the module docstring)."""
    fan_in, fan_out = shape
    if scale == "muon":
        return math.sqrt(max(1.0, fan_out / fan_in))
    if scale == "moonlight":
        return 0.2 * math.sqrt(max(fan_in, fan_out))
    raise ValueError(f"scale must be one of {SHAPE_SCALES}, got {scale!r}")


def muon_keys(params: Params, config: MuonConfig) -> tuple:
    """The keys Muon updates: ``config.keys``, or every 2-D array of ``params`` (in order).

    Raises
    ------
    ValueError
        ``config.keys`` names an array that is missing or not 2-D.
    """
    if config.keys is None:
        return tuple(key for key, value in params.items() if value.ndim == 2)
    for key in config.keys:
        if key not in params or params[key].ndim != 2:
            found = "missing" if key not in params else f"shape {params[key].shape}"
            raise ValueError(f"MuonConfig.keys: params[{key!r}] must be a 2-D weight matrix, got {found}")
    return tuple(key for key in params if key in config.keys)


def init_muon(params: Params, config: MuonConfig | None = None) -> MuonState:
    """The Muon state before the first step: zero momentum for the matrices, fresh AdamW for the rest.

    Parameters
    ----------
    params : dict of str -> ndarray
    config : MuonConfig or None
        Only ``config.keys`` is read; None uses the defaults (every 2-D array).

    Returns
    -------
    MuonState
        ``step = 0``; new zero arrays that share no memory with ``params``.
    """
    check_params(params)
    config = MuonConfig() if config is None else config
    matrices = muon_keys(params, config)
    others = {key: value for key, value in params.items() if key not in matrices}
    return MuonState(step=0, momentum={key: np.zeros_like(params[key]) for key in matrices},
                     adam=init_adamw_state(others) if others else None)


def muon_step(params: Params, state: MuonState, grads: Params, config: MuonConfig,
              adam: AdamWConfig | None = None) -> tuple[Params, MuonState]:
    """One Muon step: orthogonalised momentum for the matrices, AdamW for the rest.

    For every Muon matrix ``W`` (gradient ``G``, momentum ``B``)::

        B' = mu B + G
        U  = G + mu B'   (nesterov)   or   B'
        W' = W (1 - lr wd) - lr s NS5(U)

    and ``adamw_step`` with ``adam`` on the other arrays. Pure: the inputs are not
    modified and the results share no memory with them.

    Parameters
    ----------
    params, grads : dicts with the same keys, shapes and dtype (float32 or float64)
    state : MuonState from ``init_muon`` (or a previous step) for these params
    config : MuonConfig
    adam : AdamWConfig, optional
        The biases' AdamW (a run's ``DiLoCoConfig.inner``); None: ``AdamWConfig()``.

    Returns
    -------
    (new_params, new_state)

    Raises
    ------
    TypeError, ValueError
        Mismatched structures (naming ``grads`` or ``state.momentum``), non-finite values,
        a ``config`` that is not a MuonConfig, an ``adam`` that is not an AdamWConfig.
    """
    adam = _checked_args(params, state, grads, config, adam)
    matrices = muon_keys(params, config)
    _check_state(params, state, matrices)
    new_params, new_momentum = {}, {}
    for key in matrices:
        new_params[key], new_momentum[key] = muon_matrix_step(params[key], grads[key], state.momentum[key], config)
    others = [key for key in params if key not in matrices]
    adam_state = state.adam
    if others:
        updated, adam_state = adamw_step({k: params[k] for k in others}, state.adam,
                                         {k: grads[k] for k in others}, adam)
        new_params.update(updated)
    return {key: new_params[key] for key in params}, MuonState(state.step + 1, new_momentum, adam_state)


def muon_matrix_step(weight: np.ndarray, grad: np.ndarray, momentum: np.ndarray, config: MuonConfig) -> tuple:
    """Muon's rule for one weight matrix (fan_in, fan_out), or a stack of them (S, fan_in, fan_out)::

        B' = mu B + G
        U  = G + mu B'   (nesterov)   or   B'
        W' = W (1 - lr wd) - lr s NS5(U)

    Returns new arrays ``(W', B')``: the one rule of ``muon_step`` and of the fast engine's
    ``diloco.engine.optim.muon_update`` (which passes the K workers' stack at once).
    """
    mu, lr = config.momentum, config.lr
    buffer = mu * momentum + grad
    direction = grad + mu * buffer if config.nesterov else buffer
    update = newton_schulz(direction, config.ns_steps) * shape_scale(weight.shape[-2:], config.scale)
    return weight * (1.0 - lr * config.weight_decay) - lr * update, buffer


def _checked_args(params: Params, state, grads: Params, config, adam) -> AdamWConfig:
    """``muon_step``'s argument checks; returns ``adam`` (``AdamWConfig()`` for None)."""
    if not isinstance(config, MuonConfig):
        raise TypeError(f"config must be a MuonConfig, got {type(config).__name__}")
    adam = AdamWConfig() if adam is None else adam
    if not isinstance(adam, AdamWConfig):
        raise TypeError(f"adam must be an AdamWConfig, got {type(adam).__name__}")
    check_params(params)
    check_params(grads, "grads")
    check_same_structure(params, grads, "params", "grads")
    if not isinstance(state, MuonState):
        raise TypeError(f"state must be a MuonState (from init_muon), got {type(state).__name__}")
    return adam


def _check_state(params: Params, state: MuonState, matrices: tuple) -> None:
    """``state`` holds momentum for exactly the Muon ``matrices`` and AdamW's state for the rest."""
    if list(state.momentum) != list(matrices):
        raise ValueError(f"state.momentum must hold the Muon matrices {list(matrices)}, got {list(state.momentum)}")
    check_same_structure({k: params[k] for k in matrices}, state.momentum, "params", "state.momentum")
    others = [key for key in params if key not in matrices]
    if (state.adam is None) != (not others):
        raise ValueError(f"state.adam must be {'an AdamWState' if others else 'None'} for the arrays {others}")


def as_moments(state: MuonState, params: Params) -> AdamWState:
    """A Muon state in AdamW's shape, over every key of ``params`` (in its order).

    ``m`` holds the momentum ``B`` of the Muon matrices and AdamW's first moment of the
    other arrays; ``v`` holds AdamW's second moment of the other arrays and zeros for the
    matrices. The fast executor's ``(K, P)`` moment buffers and the checkpoints store a
    Muon worker this way; ``from_moments`` inverts it exactly (copies, no arithmetic).
    """
    if not isinstance(state, MuonState):
        raise TypeError(f"state must be a MuonState, got {type(state).__name__}")
    m, v = {}, {}
    for key, value in params.items():
        if key in state.momentum:
            m[key], v[key] = state.momentum[key].copy(), np.zeros_like(value)
        else:
            m[key], v[key] = state.adam.m[key].copy(), state.adam.v[key].copy()
    return AdamWState(state.step, m, v)


def from_moments(moments: AdamWState, config: MuonConfig) -> MuonState:
    """The Muon state ``as_moments`` stored in ``moments`` (AdamW's shape) for ``config``'s matrices."""
    if not isinstance(moments, AdamWState):
        raise TypeError(f"moments must be an AdamWState, got {type(moments).__name__}")
    matrices = muon_keys(moments.m, config)
    others = [key for key in moments.m if key not in matrices]
    adam = AdamWState(moments.step, {k: moments.m[k].copy() for k in others},
                      {k: moments.v[k].copy() for k in others}) if others else None
    return MuonState(moments.step, {k: moments.m[k].copy() for k in matrices}, adam)
