"""Plain forward passes of the transformer's pieces, for the tests of exercises x04-x07.

Written from the lessons' equations, in float64, one position (or one row) at a time:
no mask (row t simply stops at column t), no block split, no in-place tricks. Backward
passes are never written here: the tests check them against central finite differences
of these forwards. Nothing here imports the package.
"""

from __future__ import annotations

import math

import numpy as np

LN_EPS = 1e-5  # the lessons' epsilon, written out
GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


def heads_of(qkv_flat: np.ndarray, batch: int, n_heads: int) -> np.ndarray:
    """``(3, B, h, T, d_h)``: q, k, v of head j of position t of sequence b, read entry by entry.

    Row ``b T + t`` of ``qkv_flat`` is ``[q | k | v]``; head j owns columns ``j d_h .. (j+1) d_h - 1``
    of each third.
    """
    rows, width = qkv_flat.shape
    d_model, length = width // 3, rows // batch
    head_dim = d_model // n_heads
    out = np.empty((3, batch, n_heads, length, head_dim), dtype=np.float64)
    for part in range(3):
        for b in range(batch):
            for j in range(n_heads):
                for t in range(length):
                    start = part * d_model + j * head_dim
                    out[part, b, j, t] = qkv_flat[b * length + t, start:start + head_dim]
    return out


def attention(qkv_flat: np.ndarray, batch: int, n_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """Causal attention by positions: ``(out (B T, d), P (B, h, T, T))``, float64.

    Row t of head j: ``S_s = q_t . k_s / sqrt(d_h)`` for ``s <= t`` only, ``P = exp(S - max S) / sum``,
    ``out_t = sum_s P_s v_s``, written to head j's columns of row ``b T + t``.
    """
    q, k, v = heads_of(np.asarray(qkv_flat, dtype=np.float64), batch, n_heads)
    _, _, length, head_dim = q.shape
    out = np.zeros((batch * length, n_heads * head_dim))
    probs = np.zeros((batch, n_heads, length, length))
    for b in range(batch):
        for j in range(n_heads):
            for t in range(length):
                scores = np.array([q[b, j, t] @ k[b, j, s] for s in range(t + 1)]) / math.sqrt(head_dim)
                weights = np.exp(scores - scores.max())
                probs[b, j, t, :t + 1] = weights / weights.sum()
                out[b * length + t, j * head_dim:(j + 1) * head_dim] = probs[b, j, t, :t + 1] @ v[b, j, :t + 1]
    return out, probs


def in_blocks(probs: np.ndarray, blocks) -> tuple[np.ndarray, ...]:
    """``P`` (B, h, T, T) cut into the row blocks ``[(start, stop), ...]``: rows start..stop-1, columns < stop."""
    return tuple(np.ascontiguousarray(probs[:, :, start:stop, :stop]) for start, stop in blocks)


def layer_norm(x: np.ndarray, gain: np.ndarray, bias: np.ndarray):
    """``(y, x_hat, inv_std (N, 1))`` row by row: biased variance, eps inside the root."""
    x = np.asarray(x, dtype=np.float64)
    x_hat, inv_std = np.empty_like(x), np.empty((x.shape[0], 1))
    for i, row in enumerate(x):
        mean = sum(row) / len(row)
        variance = sum((value - mean) ** 2 for value in row) / len(row)
        inv_std[i, 0] = 1.0 / math.sqrt(variance + LN_EPS)
        x_hat[i] = (row - mean) * inv_std[i, 0]
    return x_hat * gain + bias, x_hat, inv_std


def gelu(u: np.ndarray):
    """``(GELU(u), s)`` with ``s = (1 + tanh z) / 2``, ``z = c (u + a u^3)``, element by element."""
    u = np.asarray(u, dtype=np.float64)
    z = GELU_C * (u + GELU_A * u ** 3)
    s = (1.0 + np.tanh(z)) / 2.0
    return u * s, s


def numeric_grad(f, x: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """Central differences ``(f(x + h e_i) - f(x - h e_i)) / 2h`` of a scalar ``f``, every entry of x (float64)."""
    x = np.array(x, dtype=np.float64)
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        saved = x[index]
        x[index] = saved + step
        up = f(x)
        x[index] = saved - step
        down = f(x)
        x[index] = saved
        grad[index] = (up - down) / (2.0 * step)
    return grad
