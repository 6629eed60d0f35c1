"""The transformer's pieces, each a forward and its backward by hand, on 2-D rows ``(N, width)``.

Pure NumPy, no state: ``diloco.models.transformer`` composes them into the model. Every
forward returns what its backward needs; every docstring gives the equations. Element-wise
chains are written in place on one scratch array where that saves a temporary: a step of
the default model allocates tens of megabytes of them, and each new one costs page faults.
"""

from __future__ import annotations

import functools
import math

import numpy as np

__all__ = ["LN_EPS", "GELU_C", "GELU_A", "SAFE_ROW_SUM", "BLOCK_ROWS", "row_sum", "row_dot", "col_sum", "row_mean",
           "affine", "affine_backward", "layer_norm", "layer_norm_backward", "gelu", "gelu_backward", "softmax",
           "causal_softmax", "causal_mask", "masked_scores", "row_blocks", "causal_attention", "attention_backward",
           "cross_entropy", "embedding_grad"]

LN_EPS = 1e-5  # LayerNorm's epsilon, PyTorch's default
GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715
SAFE_ROW_SUM = 2.0**32  # causal_softmax's headroom below the dtype's largest number
BLOCK_ROWS = 16  # attention splits its rows in two from this length on (row_blocks)


def row_sum(x):
    """``sum_j x[..., j]`` with a trailing axis of 1, as a product with a vector of ones.

    BLAS's matrix-vector product sums rows of 64 four to six times faster than
    ``x.sum(axis=-1)``, whose reduction along a short last axis runs row by row
    (measured on (2048, 64) and (32, 4, 64, 64) float32: 12 against 80 us, 61 against 279 us).
    """
    return (x @ np.ones(x.shape[-1], dtype=x.dtype))[..., None]


def col_sum(x):
    """``sum_i x[i, :]`` of a 2-D ``x`` as ``ones @ x`` (a bias's or a gain's gradient).

    BLAS's vector-matrix product is three to five times faster than ``x.sum(axis=0)`` on the
    model's (2048, 64) and (2048, 256) float32 arrays (11 against 51 us, 38 against 87 us).
    """
    return np.ones(x.shape[0], dtype=x.dtype) @ x


def row_dot(a, b):
    """``sum_j a[..., j] b[..., j]`` with a trailing axis of 1, by ``einsum``: no temporary the size of ``a``.

    Faster than ``row_sum(a * b)`` too: 0.12 against 0.16 ms on (32, 4, 64, 64) float32, 0.03
    against 0.05 ms on (2048, 64).
    """
    return np.einsum("...j,...j->...", a, b)[..., None]


def row_mean(x):
    """``mean_j x[..., j]`` with a trailing axis of 1 (``row_sum`` divided by the width)."""
    return row_sum(x) * (1.0 / x.shape[-1])


def causal_attention(qkv_flat, batch, n_heads):
    """Causal multi-head attention: ``P v`` of every head, concatenated.

    ``S = q k^T / sqrt(d_h) + M`` per head, ``M_ts = -inf`` for ``s > t`` (else 0),
    ``P = softmax(S)`` row by row (``causal_softmax``), so ``P_ts = 0`` exactly for ``s > t``.
    P is made in the row blocks of ``row_blocks``: rows ``start .. stop - 1`` against columns
    ``0 .. stop - 1`` only.

    Parameters
    ----------
    qkv_flat : ndarray of shape (B T, 3 d)
        Row ``b T + t`` holds ``[q | k | v]`` of position t of sequence b; within each of the
        three, columns ``j d_h .. (j + 1) d_h - 1`` belong to head j.
    batch : int
        B.
    n_heads : int
        h; ``d = qkv_flat.shape[1] / 3`` must be a multiple of it.

    Returns
    -------
    out : ndarray of shape (B T, d)
        ``P v``, head j in columns ``j d_h .. (j + 1) d_h - 1``.
    qkv : ndarray of shape (3, B, h, T, d_h)
        q, k, v split by head (views of ``qkv_flat``), for the backward.
    probs : tuple of ndarray
        P's row blocks, one per ``row_blocks(T)`` entry, each (B, h, stop - start, stop).
    """
    # BEGIN EXERCISE x04
    length, d_model = qkv_flat.shape[0] // batch, qkv_flat.shape[1] // 3
    head_dim = d_model // n_heads
    qkv = qkv_flat.reshape(batch, length, 3, n_heads, head_dim).transpose(2, 0, 3, 1, 4)  # (3, B, h, T, d_h)
    out = np.empty((batch, length, n_heads, head_dim), dtype=qkv.dtype)
    heads = out.transpose(0, 2, 1, 3)  # (B, h, T, d_h), written in the concatenated layout
    probs = []
    for start, stop in row_blocks(length):
        block = causal_softmax(masked_scores(qkv, start, stop))
        if block is None:  # a score far above its row's diagonal overflowed: the row-wise softmax instead
            block = softmax(masked_scores(qkv, start, stop), in_place=True)
        np.matmul(block, qkv[2][:, :, :stop], out=heads[:, :, start:stop])
        probs.append(block)
    return out.reshape(batch * length, d_model), qkv, tuple(probs)
    # END EXERCISE x04


def row_blocks(length):
    """The rows of P made together, as ``(start, stop)``: rows ``start .. stop - 1`` see columns ``< stop``.

    From ``T = BLOCK_ROWS`` on, two halves: the first half's rows never see the second half's
    columns, so that quarter of S, P, dP and dS (all of it masked) is neither multiplied nor
    passed over. At the default size that saves about 2% of a step; below, one block.
    """
    if length < BLOCK_ROWS:
        return ((0, length),)
    return ((0, length // 2), (length // 2, length))


def masked_scores(qkv, start, stop):
    """Rows ``start .. stop - 1`` of ``S = q k^T / sqrt(d_h) + M`` over columns ``< stop``, a new array.

    ``qkv`` is (3, B, h, T, d_h) as ``causal_attention`` splits it; the result is (B, h, stop - start, stop),
    ``-inf`` where ``causal_mask(stop - start, stop)`` is True.
    """
    # BEGIN EXERCISE x04
    q, k, _ = qkv
    scores = q[:, :, start:stop] @ k[:, :, :stop].transpose(0, 1, 3, 2)
    scores *= 1.0 / math.sqrt(q.shape[-1])
    np.copyto(scores, -np.inf, where=causal_mask(stop - start, stop))  # M, broadcast over (B, h)
    return scores
    # END EXERCISE x04


def causal_softmax(scores):
    """``softmax`` over the last axis of causal ``scores``, in place; None where it would overflow.

    ``scores`` is (B, h, R, C): rows of positions ``C - R .. C - 1`` against positions ``< C``.
    Each row is shifted by its own diagonal score ``S_tt`` rather than by its maximum:
    ``P_ts = exp(S_ts - S_tt) / sum_s exp(S_ts - S_tt)``. The diagonal is visible to its row
    (causal attention always sees itself) and needs no reduction, where the row maxima are
    short reductions: 0.45 ms of a 1.7 ms softmax of (32, 4, 64, 64). Every row holds
    ``exp(0) = 1``, so no row's sum underflows, and row t still depends on positions
    ``<= t`` only, to the bit. Only a score far above its row's diagonal can overflow: where a
    row's sum exceeds the dtype's largest number over ``SAFE_ROW_SUM`` (a score about 66 nats
    above the diagonal in float32, 687 in float64) it returns None, and the caller takes the
    row-wise softmax.
    """
    # BEGIN EXERCISE x04
    rows, cols = scores.shape[-2:]
    diagonal = np.diagonal(scores, offset=cols - rows, axis1=-2, axis2=-1)[..., None].copy()  # S_tt, (B, h, R, 1)
    scores -= diagonal
    with np.errstate(over="ignore"):
        exp = np.exp(scores, out=scores)
    totals = row_sum(exp)
    if not totals.max() <= np.finfo(exp.dtype).max / SAFE_ROW_SUM:  # inf and NaN fail too
        return None
    exp /= totals
    return exp
    # END EXERCISE x04


def attention_backward(dout, qkv, probs):
    """``d[q k v]`` (N, 3d) from ``d(P v)`` (N, d), P in the row blocks ``causal_attention`` made.

    ``dP = dO v^T``, ``dv = P^T dO``, ``dS = P * (dP - rowsum(dP * P))``,
    ``dq = dS k / sqrt(d_h)``, ``dk = dS^T q / sqrt(d_h)`` (masked entries have P = 0, so dS = 0),
    block by block: a block's rows give their own dq, and add to dk and dv of the columns they see.
    """
    # BEGIN EXERCISE x05
    q, k, v = qkv
    batch, n_heads, length, head_dim = q.shape
    dout = dout.reshape(batch, length, n_heads, head_dim).transpose(0, 2, 1, 3)  # (B, h, T, d_h)
    dqkv = np.empty((batch, length, 3, n_heads, head_dim), dtype=q.dtype)  # the forward's qkv layout
    dq, dk, dv = (dqkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))  # (B, h, T, d_h) views
    for (start, stop), block in reversed(tuple(zip(row_blocks(length), probs, strict=True))):
        grad = dout[:, :, start:stop]
        dscores = grad @ v[:, :, :stop].transpose(0, 1, 3, 2)  # dP, made into dS in place
        dscores -= row_dot(dscores, block)
        dscores *= block
        dscores *= 1.0 / math.sqrt(head_dim)
        np.matmul(dscores, k[:, :, :stop], out=dq[:, :, start:stop])
        if stop == length:  # the last block sees every column: it writes all of dk and dv
            np.matmul(dscores.transpose(0, 1, 3, 2), q[:, :, start:stop], out=dk)
            np.matmul(block.transpose(0, 1, 3, 2), grad, out=dv)
        else:
            dk[:, :, :stop] += dscores.transpose(0, 1, 3, 2) @ q[:, :, start:stop]
            dv[:, :, :stop] += block.transpose(0, 1, 3, 2) @ grad
    return dqkv.reshape(batch * length, 3 * n_heads * head_dim)
    # END EXERCISE x05


def affine(inputs, weight, bias, residual=None):
    """``inputs @ weight + bias (+ residual)``, with the sums made in place in the product's new array."""
    out = inputs @ weight
    out += bias
    if residual is not None:
        out += residual
    return out


def affine_backward(dout, inputs, weight):
    """Of ``out = inputs @ weight + bias``: ``d inputs = dout W^T``, ``dW = inputs^T dout``, ``db = sum_i dout``."""
    return dout @ weight.T, inputs.T @ dout, col_sum(dout)


def layer_norm(x, gain, bias):
    """``y = g * x_hat + b``, ``x_hat = (x - mean) / sqrt(var + eps)`` over the last axis; returns y and its cache.

    No (N, d) temporary besides ``x_hat`` (cached) and y: every temporary a step frees is memory
    glibc may hand back to the kernel and fault in again on the next step (see
    ``benchmarks/transformer_step.py``).
    """
    # BEGIN EXERCISE x06
    x_hat = x - row_mean(x)
    inv_std = 1.0 / np.sqrt(row_dot(x_hat, x_hat) * (1.0 / x.shape[-1]) + LN_EPS)  # (N, 1)
    x_hat *= inv_std
    out = x_hat * gain
    out += bias
    return out, (x_hat, inv_std)
    # END EXERCISE x06


def layer_norm_backward(dy, gain, cache):
    """``dx = inv_std (dx_hat - mean(dx_hat) - x_hat mean(dx_hat x_hat))`` with ``dx_hat = dy g``;
    ``dg = sum_i dy x_hat``, ``db = sum_i dy``."""
    # BEGIN EXERCISE x06
    x_hat, inv_std = cache
    dx_hat = dy * gain
    dx = x_hat * (row_dot(dx_hat, x_hat) * (1.0 / x_hat.shape[-1]))
    np.subtract(dx_hat, dx, out=dx)
    dx -= row_mean(dx_hat)
    dx *= inv_std
    return dx, col_sum(dy * x_hat), col_sum(dy)
    # END EXERCISE x06


def gelu(u):
    """``GELU(u) = u/2 (1 + tanh(z))``, ``z = c (u + a u^3)`` (the tanh approximation, GPT-2's); returns it and
    ``s = (1 + tanh(z)) / 2``.

    Computed as ``u s`` with ``s = sigmoid(2 z) = 1 / (1 + exp(-2 z))``, the same function: NumPy's
    float32 ``exp`` takes half the time of its ``tanh`` (0.7 against 1.4 ms on (2048, 256)), and
    this was the forward's costliest step. In place over one scratch array. For ``u`` far below
    zero ``exp(-2 z)`` overflows to inf and ``s`` to 0: GELU's limit, so that overflow is silenced.
    """
    # BEGIN EXERCISE x06
    s = u * u
    s *= -2.0 * GELU_C * GELU_A
    s -= 2.0 * GELU_C
    s *= u  # -2 z
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    np.divide(1.0, s, out=s)  # s = sigmoid(2 z) = (1 + tanh z) / 2
    return u * s, s
    # END EXERCISE x06


def gelu_backward(dy, u, s):
    """``dy * [ s + u s (1 - s) 2 c (1 + 3 a u^2) ]`` with the forward's ``s = (1 + tanh z) / 2``.

    (``d s / d u = 2 s (1 - s) dz/du`` and ``dz/du = c (1 + 3 a u^2)``; with ``t = tanh z`` it is
    ``(1 + t)/2 + u/2 (1 - t^2) c (1 + 3 a u^2)``.)
    """
    # BEGIN EXERCISE x06
    slope = u * u
    slope *= 6.0 * GELU_C * GELU_A
    slope += 2.0 * GELU_C
    slope *= u
    slope *= s
    slope -= slope * s  # u s (1 - s) 2 c (1 + 3 a u^2)
    slope += s
    slope *= dy
    return slope
    # END EXERCISE x06


def softmax(scores, *, in_place=False):
    """Row-wise softmax over the last axis, stable and ``-inf``-tolerant (a masked entry gives 0).

    ``in_place`` overwrites ``scores`` (the attention's own scratch array). Not
    ``diloco.model.softmax``: that milestone rejects the ``-inf`` of the causal mask (and is
    a stub in a learner's workspace until milestone 04 is done).
    """
    # BEGIN EXERCISE x04
    exp = scores if in_place else scores.copy()
    exp -= scores.max(axis=-1, keepdims=True)
    np.exp(exp, out=exp)
    exp /= row_sum(exp)
    return exp
    # END EXERCISE x04


@functools.lru_cache(maxsize=16)
def causal_mask(rows, cols):
    """Where ``M`` is ``-inf`` for rows of positions ``cols - rows .. cols - 1`` against positions ``< cols``:
    True where the column lies after the row's position (t never sees s > t). (rows, cols), read-only, cached.

    ``masked_scores`` writes ``-inf`` there (``np.copyto(..., where=)``) rather than adding a float
    mask of 0 and ``-inf``: the addition reads the 16 kB mask again for every (b, h) in step with
    the writes to the scores, and where the two addresses agree modulo 4 kB (as fresh arrays from
    ``malloc`` often do) the processor stalls each read behind the write it seems to alias: 0.6-0.8
    against 0.25 ms a layer at the default size.
    """
    # BEGIN EXERCISE x04
    upper = np.triu(np.ones((rows, cols), dtype=bool), k=cols - rows + 1)
    upper.setflags(write=False)
    return upper
    # END EXERCISE x04


def cross_entropy(logits, targets, *, grad=True):
    """Mean CE of ``targets`` (N,) under ``logits`` (N, V) and ``d loss / d logits = (softmax - Y) / N``."""
    # BEGIN EXERCISE x07
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    picked = shifted[np.arange(n), targets]
    exp = np.exp(shifted, out=shifted)  # the shifted logits are not needed again
    totals = row_sum(exp)  # (N, 1)
    loss = float(np.mean(np.log(totals[:, 0]) - picked))
    if not grad:
        return loss, None
    exp /= totals  # softmax
    exp[np.arange(n), targets] -= 1.0
    exp *= 1.0 / n
    return loss, exp
    # END EXERCISE x07


def embedding_grad(tokens, dx, vocab_size):
    """``d wte[v] = sum of dx over the positions holding token v``; dx is (B, T, d).

    As the product ``onehot(tokens)^T dx`` (V, N) x (N, d): for V = 65 it costs a fifth of
    ``np.add.at``'s scatter.
    """
    # BEGIN EXERCISE x07
    flat = tokens.reshape(-1)
    onehot = (flat[None, :] == np.arange(vocab_size)[:, None]).astype(dx.dtype)  # (V, N)
    return onehot @ dx.reshape(flat.size, dx.shape[-1])
    # END EXERCISE x07
