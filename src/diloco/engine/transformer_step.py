"""The fast engine's transformer step: ``transformer_loss_and_grads`` into preallocated buffers.

``diloco.models.transformer`` is the reference: pure functions that return new arrays, in NumPy
passes a learner can read. This is the same forward and backward for the fast engine
(``diloco.engine.model_stack``), with three differences that make it cheaper and change no
equation:

* **No allocation per step.** Every activation, cache and gradient buffer is made once per
  batch shape and reused; the gradients are written straight into the flat gradient row
  (``np.matmul(..., out=view)``). A step of the reference path allocates and frees tens of
  megabytes, and glibc hands freed memory back to the kernel, so every new temporary is
  faulted in again page by page (``benchmarks/transformer_step.py``); here nothing is.
* **Fused element-wise work** (``diloco.engine.transformer_kernels``, numba): the residual add
  with the next LayerNorm, GELU's polynomial and its finish around one ``np.exp``, the
  softmax's shift and normalisation, LayerNorm's and GELU's backward with their gain and bias
  sums, the cross-entropy, the embedding and its gradient: each one pass over its rows.
* The matrix products are NumPy's (BLAS), on views of the same layouts as the reference.

Results equal ``transformer_loss_and_grads``'s to float rounding (sums in another order; the
softmax's fallback where a score lies far above its row's diagonal is the same rule);
``tests/tooling/test_engine_transformer.py`` checks float64 to 1e-10 and float32 to rounding.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from diloco.engine import transformer_kernels as tk
from diloco.engine.optim import numba_loaded
from diloco.models.layers import row_blocks

__all__ = ["TransformerStep", "fast_transformer_available", "step_metrics", "EVAL_CHUNK"]

EVAL_CHUNK = 32  # windows per forward pass in ``step_metrics`` (its buffers stay in cache)


def fast_transformer_available() -> bool:
    """True where the compiled kernels can run: numba installed and not ``DILOCO_ADAMW_KERNEL=numpy``."""
    from diloco.engine import optim

    return optim.KERNEL != "numpy" and tk.available()


class TransformerStep:
    """Forward and backward of one ``TransformerConfig`` on batches of one shape, in reused buffers."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.dtype = np.dtype(cfg.dtype)
        self.k = tk.kernels()
        numba_loaded()  # the flat AdamW may take its compiled loop from the first step (engine.optim)
        self.c = tk.constants(self.dtype)
        self.scale = self.dtype.type(1.0 / math.sqrt(cfg.head_dim))
        self.limit = self.dtype.type(np.finfo(self.dtype).max / 2.0**32)  # layers.SAFE_ROW_SUM's headroom
        self.shape = None

    def _buffers(self, batch: int, length: int) -> None:
        """Every buffer of a (batch, length) step, made once per shape."""
        if self.shape == (batch, length):
            return
        cfg, dt = self.cfg, self.dtype
        n, d, m, heads = batch * length, cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.n_heads
        self.blocks = row_blocks(length)  # P's row blocks: rows start .. stop - 1 against columns < stop
        empty = lambda *shape: np.empty(shape, dtype=dt)  # noqa: E731
        self.layers = [{"xh1": empty(n, d), "inv1": empty(n), "a1": empty(n, d), "qkv": empty(n, 3 * d),
                        "probs": [empty(batch, heads, stop - start, stop) for start, stop in self.blocks],
                        "attn": empty(n, d), "xh2": empty(n, d), "inv2": empty(n), "mlp_in": empty(n, d),
                        "slope": empty(n, m), "g": empty(n, m)} for _ in range(cfg.n_layers)]
        self.x, self.y, self.final, self.xhf, self.invf = empty(n, d), empty(n, d), empty(n, d), empty(n, d), empty(n)
        self.logits = empty(n, cfg.vocab_size)
        self.dx, self.dd, self.dm = empty(n, d), empty(n, d), empty(n, m)  # dm: d GELU, then d u in place
        self.dqkv, self.ones = empty(n, 3 * d), np.ones(n, dt)
        self.dprobs = [empty(batch, heads, stop - start, stop) for start, stop in self.blocks]
        self.partial = empty(batch, heads, self.blocks[0][1], cfg.head_dim)  # an earlier block's part of dk, dv
        self.shape = (batch, length)
        self.inv_d, self.inv_n = dt.type(1.0 / d), dt.type(1.0 / n)

    def loss(self, params: dict, tokens: np.ndarray, targets: np.ndarray) -> float:
        """Mean next-token cross-entropy (the forward only)."""
        self._forward(params, tokens)
        return self._cross_entropy(targets, grad=False)

    def loss_and_correct(self, params: dict, tokens: np.ndarray, targets: np.ndarray) -> tuple[float, int]:
        """The forward only: the mean cross-entropy and how many positions' largest logit is the target."""
        self._forward(params, tokens)
        correct = int(np.count_nonzero(self.logits.argmax(axis=1) == targets.reshape(-1)))
        return self._cross_entropy(targets, grad=False), correct

    def loss_and_grads(self, params: dict, tokens: np.ndarray, targets: np.ndarray, grads: dict) -> float:
        """The loss; every parameter's gradient written into ``grads`` (views, e.g. of a flat row).

        ``params`` and ``grads``: the keys and shapes of ``transformer_param_shapes(cfg)``, C-contiguous, of
        the config's dtype. ``tokens`` and ``targets``: (B, T) intp ids in [0, V), checked by the caller.
        """
        self._forward(params, tokens)
        loss = self._cross_entropy(targets, grad=True)
        self._backward(params, tokens, self.logits, grads)
        return loss

    def _cross_entropy(self, targets: np.ndarray, grad: bool) -> float:
        """The loss of ``self.logits``; with ``grad``, ``self.logits`` becomes d loss / d logits."""
        return self.k["cross_entropy"](self.logits, targets.reshape(-1), grad, self.inv_n, self.c["one"])

    # ------------------------------------------------------------------ forward

    def _forward(self, params: dict, tokens: np.ndarray) -> None:
        cfg, k, c = self.cfg, self.k, self.c
        self._buffers(*tokens.shape)
        k["embed"](params["wte"], params["wpe"], tokens, self.x)
        first = self.layers[0]
        k["layer_norm"](self.x, None, None, params["h0.ln1.gain"], params["h0.ln1.bias"], first["a1"], first["xh1"],
                        first["inv1"], self.inv_d, c["one"], c["eps"])
        for layer, cache in enumerate(self.layers):
            p = f"h{layer}."
            self._attention(params, p, cache)
            np.matmul(cache["attn"], params[p + "attn.proj"], out=self.y)
            k["layer_norm"](self.x, self.y, params[p + "attn.proj_bias"], params[p + "ln2.gain"],
                            params[p + "ln2.bias"], cache["mlp_in"], cache["xh2"], cache["inv2"], self.inv_d, c["one"],
                            c["eps"])
            self._mlp(params, p, cache)
            if layer + 1 < cfg.n_layers:
                q, nxt = f"h{layer + 1}.", self.layers[layer + 1]
                out, gain, bias = (nxt["a1"], nxt["xh1"], nxt["inv1"]), params[q + "ln1.gain"], params[q + "ln1.bias"]
            else:
                out, gain, bias = (self.final, self.xhf, self.invf), params["ln_f.gain"], params["ln_f.bias"]
            k["layer_norm"](self.x, self.y, params[p + "mlp.proj_bias"], gain, bias, *out, self.inv_d, c["one"],
                            c["eps"])
        np.matmul(self.final, self._head(params), out=self.logits)

    def _attention(self, params: dict, p: str, cache: dict) -> None:
        """``[q k v] = a W_qkv + b``, ``P = causal softmax(q k^T / sqrt(d_h))``, ``attn = P v`` (heads concatenated)."""
        batch, length = self.shape
        heads, width = self.cfg.n_heads, self.cfg.head_dim
        qkv, probs = cache["qkv"], cache["probs"]
        np.matmul(cache["a1"], params[p + "attn.qkv"], out=qkv)
        qkv += params[p + "attn.qkv_bias"]
        q, key, v = qkv.reshape(batch, length, 3, heads, width).transpose(2, 0, 3, 1, 4)
        out = cache["attn"].reshape(batch, length, heads, width).transpose(0, 2, 1, 3)
        for (start, stop), block in zip(self.blocks, probs, strict=True):
            for by_max in (False, True):  # by the diagonal; by the row maximum where a row's sum would overflow
                np.matmul(q[:, :, start:stop], key[:, :, :stop].transpose(0, 1, 3, 2), out=block)
                if self.k["attention_softmax"](block, start, self.scale, self.limit, by_max, self.c["one"]):
                    break
            np.matmul(block, v[:, :, :stop], out=out[:, :, start:stop])

    def _mlp(self, params: dict, p: str, cache: dict) -> None:
        """``g = GELU(mlp_in W_fc + b_fc)``, with GELU's slope cached; ``y = g W_proj`` (its bias added later)."""
        c = self.c
        np.matmul(cache["mlp_in"], params[p + "mlp.fc"], out=cache["slope"])  # the pre-activation, then its slope
        self.k["gelu_forward"](cache["slope"], params[p + "mlp.fc_bias"], cache["g"], c["minus_two_c"], c["gelu_a"],
                               c["three_a"], c["one"])
        np.matmul(cache["g"], params[p + "mlp.proj"], out=self.y)

    def _head(self, params: dict) -> np.ndarray:
        return params["wte"].T if self.cfg.tied else params["head"]

    # ------------------------------------------------------------------ backward

    def _backward(self, params: dict, tokens: np.ndarray, dlogits: np.ndarray, grads: dict) -> None:
        """Every gradient into ``grads``: the head, ``LN_f``, the blocks in reverse, the embeddings. Each
        LayerNorm's backward also sums the residual stream's new gradient: the bias gradient of the projection
        that added into it (``mlp.proj_bias`` of the block below, ``attn.proj_bias`` of its own)."""
        if self.cfg.tied:
            np.matmul(dlogits.T, self.final, out=grads["wte"])  # the head's part of d wte, (V, d)
        else:
            np.matmul(self.final.T, dlogits, out=grads["head"])
            grads["wte"][...] = 0
        np.matmul(dlogits, self._head(params).T, out=self.dd)
        last = self.cfg.n_layers - 1
        self._layer_norm_backward(params, grads, "ln_f.", (self.xhf, self.invf), f"h{last}.mlp.proj_bias", False)
        for layer in reversed(range(self.cfg.n_layers)):
            self._block_backward(params, f"h{layer}.", self.layers[layer], grads)
        self.k["embed_backward"](self.dx, tokens, grads["wte"], grads["wpe"])

    def _layer_norm_backward(self, params, grads, p: str, cache: tuple, bias_key, accumulate: bool) -> None:
        """``self.dx (+)=`` the LayerNorm ``p``'s input gradient from ``self.dd``; its gain and bias gradients,
        and ``grads[bias_key]`` (unless None) the column sums of the new ``self.dx``."""
        self.k["layer_norm_backward"](self.dd, params[p + "gain"], *cache, self.dx, grads[p + "gain"],
                                      grads[p + "bias"], None if bias_key is None else grads[bias_key], accumulate,
                                      self.inv_d, self.c["one"])

    def _dense_backward(self, dout, inputs, weight, grad_weight, grad_bias, dinputs) -> None:
        """Of ``out = inputs W + b``: ``dW = inputs^T dout``, ``db = sum_i dout`` (if given), ``dinputs = dout W^T``."""
        np.matmul(inputs.T, dout, out=grad_weight)
        if grad_bias is not None:
            np.matmul(self.ones, dout, out=grad_bias)
        np.matmul(dout, weight.T, out=dinputs)

    def _block_backward(self, params: dict, p: str, cache: dict, grads: dict) -> None:
        """One block in reverse; ``self.dx`` (the residual stream's gradient) is updated in place."""
        k, dx, dd = self.k, self.dx, self.dd
        self._dense_backward(dx, cache["g"], params[p + "mlp.proj"], grads[p + "mlp.proj"], None, self.dm)
        k["gelu_backward"](self.dm, cache["slope"], self.dm, grads[p + "mlp.fc_bias"])
        self._dense_backward(self.dm, cache["mlp_in"], params[p + "mlp.fc"], grads[p + "mlp.fc"], None, dd)
        self._layer_norm_backward(params, grads, p + "ln2.", (cache["xh2"], cache["inv2"]), p + "attn.proj_bias", True)
        self._dense_backward(dx, cache["attn"], params[p + "attn.proj"], grads[p + "attn.proj"], None, dd)
        self._attention_backward(cache)
        self._dense_backward(self.dqkv, cache["a1"], params[p + "attn.qkv"], grads[p + "attn.qkv"],
                             grads[p + "attn.qkv_bias"], dd)
        layer = int(p[1:-1])
        below = f"h{layer - 1}.mlp.proj_bias" if layer > 0 else None
        self._layer_norm_backward(params, grads, p + "ln1.", (cache["xh1"], cache["inv1"]), below, True)

    def _attention_backward(self, cache: dict) -> None:
        """``d[q k v]`` into ``self.dqkv`` from ``d attn`` in ``self.dd`` (``layers.attention_backward``'s
        equations)."""
        batch, length = self.shape
        heads, width = self.cfg.n_heads, self.cfg.head_dim
        q, key, v = cache["qkv"].reshape(batch, length, 3, heads, width).transpose(2, 0, 3, 1, 4)
        dq, dk, dv = self.dqkv.reshape(batch, length, 3, heads, width).transpose(2, 0, 3, 1, 4)
        dout = self.dd.reshape(batch, length, heads, width).transpose(0, 2, 1, 3)
        for (start, stop), block, dblock in reversed(tuple(zip(self.blocks, cache["probs"], self.dprobs, strict=True))):
            grad = dout[:, :, start:stop]
            np.matmul(grad, v[:, :, :stop].transpose(0, 1, 3, 2), out=dblock)
            self.k["attention_score_grad"](dblock, block, self.scale, self.c["one"])
            np.matmul(dblock, key[:, :, :stop], out=dq[:, :, start:stop])
            if stop == length:  # the last block sees every column: it writes all of dk and dv
                np.matmul(dblock.transpose(0, 1, 3, 2), q[:, :, start:stop], out=dk)
                np.matmul(block.transpose(0, 1, 3, 2), grad, out=dv)
            else:  # an earlier block adds to the columns it sees
                partial = self.partial[:, :, :stop]
                np.matmul(dblock.transpose(0, 1, 3, 2), q[:, :, start:stop], out=partial)
                np.add(dk[:, :, :stop], partial, out=dk[:, :, :stop])
                np.matmul(block.transpose(0, 1, 3, 2), grad, out=partial)
                np.add(dv[:, :, :stop], partial, out=dv[:, :, :stop])


@functools.lru_cache(maxsize=4)
def _eval_step(cfg) -> TransformerStep:
    """One evaluation step per model config, kept: its buffers are made once per chunk shape."""
    return TransformerStep(cfg)


def step_metrics(cfg, params: dict, tokens: np.ndarray, targets: np.ndarray,
                 chunk: int = EVAL_CHUNK) -> tuple[float, float]:
    """``TransformerModel.metrics`` on the fast engine: the forward only, ``chunk`` windows at a time.

    ``tokens`` and ``targets``: ``(n, T)`` ids (``sequence_targets``). The chunks' loss sums
    are added, so the result is the mean over all ``n T`` predictions; it equals the reference
    ``metrics`` to float rounding (``tests/tooling/test_engine_transformer.py``).
    """
    step, dtype = _eval_step(cfg), np.dtype(cfg.dtype)
    params = {key: np.ascontiguousarray(value, dtype=dtype) for key, value in params.items()}
    loss_sum = correct = 0.0
    for start in range(0, len(tokens), chunk):
        part, goal = tokens[start:start + chunk], targets[start:start + chunk]
        loss, hits = step.loss_and_correct(params, part, goal)
        loss_sum += float(loss) * goal.size
        correct += hits
    return loss_sum / targets.size, correct / targets.size
