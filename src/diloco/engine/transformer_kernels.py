"""The transformer step's element-wise work as compiled loops (the ``fast`` extra's numba).

Each function here is one pass over rows that ``diloco.models.layers`` takes in several NumPy
passes, with the same equations (that module's docstrings give them). In float32 ``exp`` is
``exp32`` here (Cephes' polynomial, within 2 ulp of NumPy's), which vectorises inside a loop:
numba's own is a scalar libm call, and NumPy's would need a pass of its own; in float64 it
is ``math.exp``. Reductions along a row (a LayerNorm's mean, a softmax's sum) may be
reassociated and products fused with sums (``fastmath={"reassoc", "contract"}``), so they
vectorise and polynomials take FMAs; every result equals the NumPy path to float rounding,
not to the bit (``tests/tooling/test_engine_transformer.py``).

``kernels()`` compiles them on first call (numba is imported then, not with this module) and
returns them by name; every array argument is C-contiguous, of the model's dtype, and the
loops do no bounds checks (the caller, ``diloco.engine.transformer_step``, owns the shapes).
Scalars come in of the arrays' dtype (``constants(dtype)``, ``1 / d``, ``1 / N``): numba, as NumPy
before NEP 50, would take ``1 - s`` or ``s / d`` of a float32 ``s`` in float64, twice the work.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from diloco.models.layers import GELU_A, GELU_C, LN_EPS

__all__ = ["kernels", "available", "constants"]


def available() -> bool:
    """True where numba can be imported (the ``fast`` extra)."""
    import importlib.util

    return importlib.util.find_spec("numba") is not None


def constants(dtype) -> dict:
    """The kernels' scalar arguments in ``dtype``: ``one``, LayerNorm's ``eps``, GELU's ``c`` and ``a`` terms."""
    cast = np.dtype(dtype).type
    return {"one": cast(1), "eps": cast(LN_EPS), "minus_two_c": cast(-2.0 * GELU_C), "gelu_a": cast(GELU_A),
            "three_a": cast(3.0 * GELU_A)}


def layer_norm(x, y, y_bias, gain, bias, out, x_hat, inv_std, inv_d, one, eps):
    """LayerNorm of every row of x (N, d) into ``out``; ``x_hat`` (N, d) and ``inv_std`` (N,) for the backward.

    With ``y`` not None, the residual add ``x += y + y_bias`` (in place) first, in the same pass.
    """
    n, d = x.shape
    for i in range(n):
        if y is not None:
            for j in range(d):
                x[i, j] += y[i, j] + y_bias[j]
        total = one - one
        for j in range(d):
            total += x[i, j]
        mean = total * inv_d
        square = one - one
        for j in range(d):
            centred = x[i, j] - mean
            x_hat[i, j] = centred
            square += centred * centred
        inv = one / np.sqrt(square * inv_d + eps)
        inv_std[i] = inv
        for j in range(d):
            x_hat[i, j] *= inv
            out[i, j] = x_hat[i, j] * gain[j] + bias[j]


def layer_norm_backward(dy, gain, x_hat, inv_std, dx, dgain, dbias, dx_sum, accumulate, inv_d, one):
    """``dx (+)= inv_std (dx_hat - mean(dx_hat) - x_hat mean(dx_hat x_hat))``, ``dx_hat = dy g``;
    ``dgain = sum_i dy x_hat`` and ``dbias = sum_i dy`` (overwritten). ``accumulate``: add to dx (the residual).
    Unless None, ``dx_sum = sum_i dx`` (overwritten): the bias gradient of the branch that adds into x."""
    n, d = dy.shape
    dgain[:] = 0
    dbias[:] = 0
    if dx_sum is not None:
        dx_sum[:] = 0
    for i in range(n):
        mean_dxh = one - one
        mean_dxh_xh = one - one
        for j in range(d):
            dxh = dy[i, j] * gain[j]
            mean_dxh += dxh
            mean_dxh_xh += dxh * x_hat[i, j]
            dgain[j] += dy[i, j] * x_hat[i, j]
            dbias[j] += dy[i, j]
        mean_dxh *= inv_d
        mean_dxh_xh *= inv_d
        inv = inv_std[i]
        for j in range(d):
            value = inv * (dy[i, j] * gain[j] - mean_dxh - x_hat[i, j] * mean_dxh_xh)
            total = dx[i, j] + value if accumulate else value
            dx[i, j] = total
            if dx_sum is not None:
                dx_sum[j] += total


def gelu_forward(u, bias, out, minus_two_c, gelu_a, three_a, one):
    """``out = GELU(v) = v s`` of ``v = u + bias``, ``s = 1 / (1 + exp(-2 z)) = (1 + tanh z) / 2``,
    ``z = c v (1 + a v^2)``; u is overwritten by the slope ``GELU'(v) = s + v s (1 - s) 2 c (1 + 3 a v^2)``,
    all the backward needs. For v far below 0 s is 0 (``saturating_exp``): GELU's limit."""
    n, m = u.shape
    for i in range(n):
        for j in range(m):
            value = u[i, j] + bias[j]
            square = value * value
            sig = one / (one + saturating_exp(minus_two_c * value * (one + gelu_a * square)))
            out[i, j] = value * sig
            u[i, j] = sig - value * sig * (one - sig) * minus_two_c * (one + three_a * square)


def gelu_backward(dy, slope, du, dbias):
    """``du = dy GELU'`` with the forward's slope, and ``dbias = sum_i du`` (overwritten); du may be dy."""
    n, m = dy.shape
    dbias[:] = 0
    for i in range(n):
        for j in range(m):
            grad = dy[i, j] * slope[i, j]
            du[i, j] = grad
            dbias[j] += grad


def attention_softmax(scores, start, scale, limit, by_max, one):
    """Causal softmax in place of a row block of scores (B, h, R, C): row r is position ``t = start + r``
    against positions ``s < C``; ``P_ts = exp((S_ts - c_t) scale) / sum_s (...)`` over ``s <= t``, 0 above.

    ``c_t`` is the row's diagonal ``S_tt`` (``layers.causal_softmax`` says why: no reduction, and no
    row sum can underflow), or with ``by_max`` its maximum. Returns False, the scores partly overwritten,
    when a row's sum exceeds ``limit`` or is not finite (a score far above its diagonal): the caller makes
    the scores again and calls with ``by_max``.
    """
    batch, heads, rows, cols = scores.shape
    for b in range(batch):
        for h in range(heads):
            for r in range(rows):
                row, t = scores[b, h, r], start + r
                shift = row[t]
                if by_max:
                    for s in range(t):
                        shift = max(shift, row[s])
                total = one - one
                for s in range(t + 1):
                    value = fast_exp((row[s] - shift) * scale)
                    row[s] = value
                    total += value
                if not total <= limit:
                    return False
                inv = one / total
                for s in range(t + 1):
                    row[s] *= inv
                for s in range(t + 1, cols):
                    row[s] = 0
    return True


def attention_score_grad(dprobs, probs, scale, one):
    """``dS = P (dP - rowsum(dP P)) scale`` in place over a row block ``dprobs`` (B, h, R, C) (rows as
    ``attention_softmax``'s). Over whole rows: above the diagonal P is 0, so its terms add nothing and dS
    is 0 there, and a loop of the varying length ``t + 1`` would run short rows in scalar code."""
    batch, heads, rows, cols = probs.shape
    for b in range(batch):
        for h in range(heads):
            for r in range(rows):
                total = one - one
                for s in range(cols):
                    total += dprobs[b, h, r, s] * probs[b, h, r, s]
                for s in range(cols):
                    dprobs[b, h, r, s] = probs[b, h, r, s] * (dprobs[b, h, r, s] - total) * scale


def cross_entropy(logits, targets, grad, inv_n, one):
    """Mean ``logsumexp(logits_i) - logits_i,target_i`` over the N rows (summed in float64), each row
    shifted by its maximum; with ``grad``, ``logits`` becomes ``d loss / d logits = (softmax - onehot) / N``
    in place (else its rows hold ``exp`` of the shifted logits)."""
    n, v = logits.shape
    loss = 0.0
    for i in range(n):
        row = logits[i]
        top = row[0]
        for j in range(1, v):
            top = max(top, row[j])
        picked = row[targets[i]] - top
        total = one - one
        for j in range(v):
            value = fast_exp(row[j] - top)
            row[j] = value
            total += value
        loss += math.log(total) - picked
        if grad:
            scale = inv_n / total
            for j in range(v):
                row[j] *= scale
            row[targets[i]] -= inv_n
    return loss / n


def embed(wte, wpe, tokens, x):
    """``x[b T + t] = wte[tokens[b, t]] + wpe[t]``, (N, d)."""
    batch, length = tokens.shape
    d = wte.shape[1]
    for b in range(batch):
        for t in range(length):
            row = b * length + t
            for j in range(d):
                x[row, j] = wte[tokens[b, t], j] + wpe[t, j]


def embed_backward(dx, tokens, dwte, dwpe):
    """``dwte[v] += sum of dx over the positions holding v`` (dwte holds the head's part already) and
    ``dwpe[t] = sum_b dx`` (overwritten; rows past T stay 0)."""
    batch, length = tokens.shape
    d = dx.shape[1]
    dwpe[:] = 0
    for b in range(batch):
        for t in range(length):
            row = b * length + t
            token = tokens[b, t]
            for j in range(d):
                dwte[token, j] += dx[row, j]
                dwpe[t, j] += dx[row, j]


def fast_exp(x):
    """``exp(x)``; in compiled code ``exp32`` for float32 (it vectorises), ``math.exp`` otherwise."""
    return math.exp(x)


def saturating_exp(x):
    """``exp(x)`` for callers that only need ``1 / (1 + exp(x))`` (GELU's sigmoid): in compiled float32 code
    x is clipped to [-86.5, 80] (no branch for inf and NaN, so the loop is shorter): the sigmoid is then within
    2e-35 of its value, and a NaN x gives a finite exp (GELU's ``u s`` stays NaN through u)."""
    return math.exp(x)


SATURATING_HIGH = 80.0


# Cephes' expf: exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 (in two parts), exp(r) a
# polynomial on |r| <= ln(2) / 2; within 2 ulp of NumPy's float32 exp (tests/tooling/test_engine_transformer.py).
EXP32_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
EXP32_LN2 = (0.693359375, -2.12194440e-4)
EXP32_RANGE = (-86.5, 88.72283)  # below: 0 (e^-86.5 is 2.7e-38; 2^(n - 1) stays normal); above: inf


def _exp32_compiled(numba):
    """``exp32(x)`` for float32 x, compiled: Cephes' polynomial, 2^n from its bits, inf, 0 and NaN kept."""
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def bits_to_float32(typingctx, bits):
        if not isinstance(bits, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            value = args[0] if signature.args[0].bitwidth == 32 else builder.trunc(args[0], ir.IntType(32))
            return builder.bitcast(value, ir.FloatType())

        return types.float32(bits), codegen

    f, (p0, p1, p2, p3, p4, p5), (hi, lo), (low, high) = np.float32, EXP32_POLY, EXP32_LN2, EXP32_RANGE
    c = tuple(f(value) for value in (p0, p1, p2, p3, p4, p5, hi, lo, low, high, 1.0 / math.log(2.0), 0.5, 1.0, 2.0,
                                     np.inf, SATURATING_HIGH))

    @numba.njit(error_model="numpy", inline="always")
    def exp32_in_range(x):
        """exp(x) for x in EXP32_RANGE (not checked)."""
        n = np.floor(x * c[10] + c[11])
        r = x - n * c[6] - n * c[7]
        poly = (((((c[0] * r + c[1]) * r + c[2]) * r + c[3]) * r + c[4]) * r + c[5]) * r * r + r + c[12]
        return poly * c[13] * bits_to_float32((np.int32(n) + 126) << 23)  # 2 poly 2^(n - 1): no overflow at
        # n = 128, no denormal at n = -125

    @numba.njit(error_model="numpy", inline="always")
    def exp32(x):
        result = exp32_in_range(min(max(x, c[8]), c[9]))
        if x > c[9]:
            result = c[14]
        if x < c[8]:
            result = c[12] - c[12]
        return x if x != x else result

    @numba.njit(error_model="numpy", inline="always")
    def exp32_saturating(x):
        return exp32_in_range(min(max(x, c[8]), c[15]))

    return exp32, exp32_saturating


def _register_exp(numba) -> None:
    """``fast_exp`` and ``saturating_exp`` in compiled code: ``exp32`` and ``exp32_saturating`` on float32,
    ``math.exp`` on anything else."""
    from numba import types
    from numba.extending import overload

    exp32, exp32_saturating = _exp32_compiled(numba)

    @overload(fast_exp, inline="always")
    def _fast_exp(x):
        if x == types.float32:
            return lambda x: exp32(x)
        return lambda x: math.exp(x)

    @overload(saturating_exp, inline="always")
    def _saturating_exp(x):
        if x == types.float32:
            return lambda x: exp32_saturating(x)
        return lambda x: math.exp(x)


KERNELS = (embed, embed_backward, gelu_forward, gelu_backward, layer_norm, layer_norm_backward, attention_softmax,
           attention_score_grad, cross_entropy)


@functools.cache
def kernels() -> dict:
    """Every kernel of this module compiled (numba, cached on disk), by name. Imports numba."""
    import numba

    _register_exp(numba)
    jit = numba.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc", "contract"})
    return {f.__name__: jit(f) for f in KERNELS}
