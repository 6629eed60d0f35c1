"""A causal pre-LayerNorm transformer language model in NumPy, forward and backward by hand.

The model (GPT-2's layout, Radford et al. 2019) maps ``B`` sequences of ``T <= context``
token ids to next-token logits. With ``N = B T`` rows, ``d = d_model``, ``h = n_heads``
heads of width ``d_h = d / h`` and ``m = mlp_ratio d`` hidden units::

    x_0     = wte[tokens] + wpe[:T]                                   (N, d)
    for layer l = 0 .. n_layers - 1:
        x  <- x + Attn(LN_1(x)) W_o + b_o                             (N, d)
        x  <- x + GELU(LN_2(x) W_fc + b_fc) W_proj + b_proj           (N, d)
    logits  = LN_f(x) W_head         (W_head = wte^T when tied)       (N, V)
    loss    = mean_i [ logsumexp(logits_i) - logits_{i, target_i} ]

``LN(x) = g * (x - mu) / sqrt(var + eps) + b`` over the last axis. Attention, head by
head, with ``[q k v] = a W_qkv + b_qkv``, causal mask ``M_ts = 0`` for ``s <= t`` and
``-inf`` for ``s > t``::

    P = softmax(q k^T / sqrt(d_h) + M),   Attn(a) = P v   (heads concatenated)

and ``GELU(u) = u/2 (1 + tanh(c (u + 0.044715 u^3)))``, ``c = sqrt(2 / pi)``.

Parameters are a flat ``dict[str, ndarray]`` like the MLP's (``diloco.model.Params``), in
the order ``transformer_param_shapes`` gives: ``wte (V, d)``, ``wpe (context, d)``; per
layer ``h{l}.ln1.gain``, ``h{l}.ln1.bias``, ``h{l}.attn.qkv (d, 3d)``,
``h{l}.attn.qkv_bias``, ``h{l}.attn.proj (d, d)``, ``h{l}.attn.proj_bias``,
``h{l}.ln2.gain``, ``h{l}.ln2.bias``, ``h{l}.mlp.fc (d, m)``, ``h{l}.mlp.fc_bias``,
``h{l}.mlp.proj (m, d)``, ``h{l}.mlp.proj_bias``; then ``ln_f.gain``, ``ln_f.bias`` and,
untied only, ``head (d, V)``. Weights are stored ``(fan_in, fan_out)`` as the MLP's are.

The backward pass (``transformer_backward``) follows the same steps in reverse; each
helper's docstring gives its equations. It is checked against central finite differences
in float64 on every parameter (``tests/tooling/test_transformer.py``).

Default size: 2 layers, ``d = 64``, 4 heads of 16, context 64, MLP ratio 4, tied output,
over the 65 Tiny Shakespeare characters: 108,352 parameters (embeddings 8,256, each block
49,984, final LayerNorm 128). Why this size: it is the smallest that keeps what the
papers' models have and the char-LM MLP lacks -- more than one head, more than one block
(Streaming DiLoCo has blocks to stagger, attention composes across layers), hidden
matrices of ``64 x 64`` and up for Muon, and a context of 64 characters (about ten words:
enough for a speaker's line to carry a "topic"; the MLP sees 6). A smaller model is
cheaper but gives one of those up. CPU milliseconds per forward+backward of 2,048 tokens
(median of 5, one thread, float32, 2 shared cores at a load average of about 11, glibc's
``M_TOP_PAD`` at 64 MiB, see ``benchmarks/transformer_step.py``)::

    1 layer,  d = 32,  2 heads, context 32      15,872 params     8.5 ms
    2 layers, d = 64,  4 heads, context 64     108,352 params    38.9 ms   <- default
    2 layers, d = 64,  4 heads, context 128    112,448 params    46.4 ms
    2 layers, d = 128, 4 heads, context 64     413,312 params   116.4 ms
    4 layers, d = 128, 4 heads, context 128    818,048 params   271.7 ms

At the default size on 32 sequences of 64, a forward+backward takes about 40 ms, of which
22 are its matrix products, and a worker-step with AdamW is at parity with PyTorch eager on
the same model, one thread, float32 (``make bench-transformer``). Where the rest goes and
what made it faster (GELU through ``exp``, the softmax shifted by each row's diagonal, the
causal mask written rather than added, column sums as products): docs/transformer.md,
"Where the time goes", and ``benchmarks/transformer_profile.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from diloco._validation import check_bool, check_generator, check_positive_int
from diloco.config import _dtype_name, _field_error
from diloco.model import Params
from diloco.models.layers import (
    affine,
    affine_backward,
    attention_backward,
    causal_attention,
    col_sum,
    cross_entropy,
    embedding_grad,
    gelu,
    gelu_backward,
    layer_norm,
    layer_norm_backward,
)

__all__ = [
    "TransformerConfig",
    "TransformerCache",
    "transformer_param_shapes",
    "init_transformer_params",
    "transformer_forward",
    "transformer_backward",
    "transformer_loss",
    "transformer_loss_and_grads",
    "transformer_hidden_matrices",
    "transformer_blocks",
    "sequence_targets",
    "block_backward",
    "embedding_backward",
]

INIT_STD = 0.02  # GPT-2's initialisation: N(0, 0.02^2), residual projections scaled by 1/sqrt(2 n_layers)


@dataclass(frozen=True)
class TransformerConfig:
    """Shape and dtype of a causal transformer language model.

    Attributes
    ----------
    vocab_size : int >= 1
        V, number of token ids (65 characters for Tiny Shakespeare).
    context : int >= 1
        Longest sequence the position embedding covers.
    d_model : int >= 1
        d, the residual stream's width; a multiple of ``n_heads``.
    n_heads : int >= 1
        h, attention heads per layer, each of width ``d / h``.
    n_layers : int >= 1
        Transformer blocks.
    mlp_ratio : int >= 1
        The MLP's hidden width is ``mlp_ratio * d_model``.
    tied : bool
        Output head ``wte^T`` (tied to the token embedding) or its own ``head (d, V)``.
    dtype : "float32" or "float64"
        Dtype of the parameters and the arithmetic (float32 for speed, float64 for checks).

    Raises
    ------
    TypeError, ValueError
        A one-line message naming the field, e.g. ``TransformerConfig.n_heads ...``.
    """

    vocab_size: int = 65
    context: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 4
    tied: bool = True
    dtype: str = "float32"

    def __post_init__(self) -> None:
        try:
            sizes = {name: check_positive_int(getattr(self, name), name)
                     for name in ("vocab_size", "context", "d_model", "n_heads", "n_layers", "mlp_ratio")}
            if sizes["d_model"] % sizes["n_heads"]:
                raise ValueError(f"n_heads must divide d_model ({sizes['d_model']}), got {sizes['n_heads']}")
            tied = check_bool(self.tied, "tied")
            dtype = _dtype_name(self.dtype)
        except (TypeError, ValueError) as exc:
            raise _field_error("TransformerConfig", exc) from None
        for name, value in {**sizes, "tied": tied, "dtype": dtype}.items():
            object.__setattr__(self, name, value)  # NumPy ints and dtypes become plain ints and names

    @property
    def head_dim(self) -> int:
        """``d_h = d_model / n_heads``."""
        return self.d_model // self.n_heads


class LayerCache(NamedTuple):
    """What one block's backward needs; ``N = B T`` rows, shapes in the comments."""

    ln1: tuple  # (x_hat (N, d), inv_std (N, 1)) of LN_1
    attn_in: np.ndarray  # a = LN_1(x), (N, d)
    qkv: np.ndarray  # q, k, v stacked, (3, B, h, T, d_h)
    probs: tuple  # P in row blocks, each (B, h, stop - start, stop) (layers.row_blocks)
    attn_out: np.ndarray  # P v with the heads concatenated, (N, d)
    ln2: tuple  # (x_hat, inv_std) of LN_2
    mlp_in: np.ndarray  # LN_2(x), (N, d)
    fc_out: np.ndarray  # u = LN_2(x) W_fc + b_fc, (N, m)
    gelu_sigmoid: np.ndarray  # s = (1 + tanh(c (u + a u^3))) / 2, (N, m)
    gelu_out: np.ndarray  # GELU(u), (N, m)


class TransformerCache(NamedTuple):
    """What ``transformer_backward`` needs from ``transformer_forward``.

    Attributes
    ----------
    tokens : ndarray of shape (B, T), int
    layers : tuple of n_layers LayerCache
    ln_f : tuple
        ``(x_hat (N, d), inv_std (N, 1))`` of the final LayerNorm.
    final : ndarray of shape (N, d)
        ``LN_f(x)``, the head's input.
    logits : ndarray of shape (N, V)
    """

    tokens: np.ndarray
    layers: tuple
    ln_f: tuple
    final: np.ndarray
    logits: np.ndarray


def transformer_param_shapes(cfg: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's key and shape, in the params' order (the one place that owns the layout).

    Returns
    -------
    dict of str -> tuple of int
        ``wte (V, d)``, ``wpe (context, d)``, per layer the twelve arrays of the module
        docstring, ``ln_f.gain (d,)``, ``ln_f.bias (d,)`` and, untied, ``head (d, V)``.
    """
    d, m = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    shapes = {"wte": (cfg.vocab_size, d), "wpe": (cfg.context, d)}
    for layer in range(cfg.n_layers):
        p = f"h{layer}."
        shapes.update({
            p + "ln1.gain": (d,), p + "ln1.bias": (d,),
            p + "attn.qkv": (d, 3 * d), p + "attn.qkv_bias": (3 * d,),
            p + "attn.proj": (d, d), p + "attn.proj_bias": (d,),
            p + "ln2.gain": (d,), p + "ln2.bias": (d,),
            p + "mlp.fc": (d, m), p + "mlp.fc_bias": (m,),
            p + "mlp.proj": (m, d), p + "mlp.proj_bias": (d,),
        })
    shapes.update({"ln_f.gain": (d,), "ln_f.bias": (d,)})
    if not cfg.tied:
        shapes["head"] = (d, cfg.vocab_size)
    return shapes


def init_transformer_params(rng: np.random.Generator, cfg: TransformerConfig) -> Params:
    """GPT-2's initialisation, drawn key by key in ``transformer_param_shapes`` order.

    Weight matrices and embeddings ``~ N(0, 0.02^2)``; the two residual projections
    (``attn.proj``, ``mlp.proj``) ``~ N(0, (0.02 / sqrt(2 n_layers))^2)`` so the residual
    stream's variance does not grow with depth; biases 0; LayerNorm gains 1.

    Parameters
    ----------
    rng : numpy.random.Generator
        Advanced by this call; the same state gives identical parameters.
    cfg : TransformerConfig

    Returns
    -------
    params : dict of str -> ndarray, ``cfg.dtype``

    Raises
    ------
    TypeError
        ``rng`` is not a Generator or ``cfg`` not a TransformerConfig.
    """
    check_generator(rng)
    _check_config(cfg)
    residual_std = INIT_STD / math.sqrt(2 * cfg.n_layers)
    params: Params = {}
    for key, shape in transformer_param_shapes(cfg).items():
        if key.endswith(".gain"):
            value = np.ones(shape)
        elif key.endswith("bias"):
            value = np.zeros(shape)
        else:
            std = residual_std if key.endswith("proj") else INIT_STD
            value = rng.standard_normal(shape) * std
        params[key] = value.astype(cfg.dtype)
    return params


def transformer_forward(params: Params, tokens: np.ndarray,
                        cfg: TransformerConfig) -> tuple[np.ndarray, TransformerCache]:
    """Next-token logits of every position (the equations of the module docstring).

    Parameters
    ----------
    params : dict of str -> ndarray
        Keys and shapes of ``transformer_param_shapes(cfg)``, dtype ``cfg.dtype``.
    tokens : ndarray of shape (B, T), integer, values in [0, V), ``1 <= T <= context``
    cfg : TransformerConfig

    Returns
    -------
    logits : ndarray of shape (B, T, V), ``cfg.dtype``
        Row ``(b, t)`` depends on ``tokens[b, :t + 1]`` only (causality).
    cache : TransformerCache

    Raises
    ------
    TypeError, ValueError
        Params that do not match ``cfg``, or tokens of the wrong shape, dtype or range.
    """
    _check_config(cfg)
    _check_params(params, cfg)
    batch, length = _check_tokens(tokens, cfg, "tokens")
    x = (params["wte"][tokens] + params["wpe"][:length]).reshape(batch * length, cfg.d_model)  # (N, d)
    layers = []
    for layer in range(cfg.n_layers):
        x, layer_cache = _block_forward(params, f"h{layer}.", x, batch, cfg)
        layers.append(layer_cache)
    final, ln_f = layer_norm(x, params["ln_f.gain"], params["ln_f.bias"])  # (N, d)
    logits = final @ _head(params, cfg)  # (N, V)
    cache = TransformerCache(tokens, tuple(layers), ln_f, final, logits)
    return logits.reshape(batch, length, cfg.vocab_size), cache


def transformer_backward(params: Params, cache: TransformerCache, targets: np.ndarray,
                         cfg: TransformerConfig) -> tuple[float, Params]:
    """Mean next-token cross-entropy and its gradient with respect to every parameter.

    With ``p = softmax(logits)`` and one-hot ``Y``: ``d logits = (p - Y) / N``;
    ``dW_head = LN_f(x)^T d logits`` (added to ``d wte`` transposed when tied), then back
    through ``LN_f``, the blocks in reverse and the embeddings:
    ``d wte[v] = sum_{i: token_i = v} dx_0,i``, ``d wpe[t] = sum_b dx_0,(b, t)``.

    Parameters
    ----------
    params : dict of str -> ndarray
        The parameters the forward pass used.
    cache : TransformerCache
        From ``transformer_forward(params, tokens, cfg)``.
    targets : ndarray of shape (B, T), integer, values in [0, V)
        The next token of every position.
    cfg : TransformerConfig

    Returns
    -------
    loss : float
        ``mean_i [ logsumexp(logits_i) - logits_{i, target_i} ]`` over the ``N = B T`` rows.
    grads : dict of str -> ndarray
        Same keys, order, shapes and dtype as ``params``.
    """
    if not isinstance(cache, TransformerCache):
        raise TypeError(f"cache must be the TransformerCache of transformer_forward, got {type(cache).__name__}")
    _check_targets(targets, cache.tokens.shape, cfg)
    loss, dlogits = cross_entropy(cache.logits, targets.reshape(-1))  # (N, V)
    grads: Params = {}
    head = _head(params, cfg)
    head_grad = cache.final.T @ dlogits  # (d, V)
    dx, grads["ln_f.gain"], grads["ln_f.bias"] = layer_norm_backward(dlogits @ head.T, params["ln_f.gain"],
                                                                     cache.ln_f)
    for layer in reversed(range(cfg.n_layers)):
        dx = block_backward(params, f"h{layer}.", dx, cache.layers[layer], grads, cfg)
    grads.update(embedding_backward(cache.tokens, dx, head_grad, cfg))
    return loss, {key: grads[key] for key in params}


def transformer_loss_and_grads(params: Params, tokens: np.ndarray, targets: np.ndarray,
                               cfg: TransformerConfig) -> tuple[float, Params]:
    """``transformer_backward(params, transformer_forward(params, tokens, cfg)[1], targets, cfg)``.

    Parameters
    ----------
    params : dict of str -> ndarray
    tokens, targets : ndarray of shape (B, T), integer, values in [0, V)
    cfg : TransformerConfig

    Returns
    -------
    loss : float
    grads : dict of str -> ndarray, shaped like ``params``
    """
    _check_config(cfg)
    _check_targets(targets, np.shape(tokens), cfg)  # before the forward's work
    _, cache = transformer_forward(params, tokens, cfg)
    return transformer_backward(params, cache, targets, cfg)


def transformer_loss(params: Params, tokens: np.ndarray, targets: np.ndarray, cfg: TransformerConfig) -> float:
    """The mean next-token cross-entropy alone (evaluation: no gradient is formed).

    Parameters and return as ``transformer_loss_and_grads``'s first output.
    """
    _check_config(cfg)
    _check_targets(targets, np.shape(tokens), cfg)
    logits, _ = transformer_forward(params, tokens, cfg)
    loss, _ = cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1), grad=False)
    return loss


def transformer_hidden_matrices(cfg: TransformerConfig) -> tuple[str, ...]:
    """The keys Muon orthogonalises: every block's ``attn.qkv``, ``attn.proj``, ``mlp.fc``, ``mlp.proj``.

    The embeddings and the output head are 2-D too but are not hidden matrices: Muon
    (Jordan et al., 2024) and MuLoCo leave them, the gains and the biases to AdamW. Pass
    the result as ``MuonConfig(keys=...)``. ``attn.qkv`` is one ``(d, 3d)`` matrix here and
    is orthogonalised as a whole, not as three ``(d, d)`` ones.
    """
    _check_config(cfg)
    return tuple(f"h{layer}.{name}" for layer in range(cfg.n_layers)
                 for name in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj"))


def transformer_blocks(cfg: TransformerConfig) -> list[tuple[str, ...]]:
    """The parameter keys in blocks, input to output: embeddings, each layer, head.

    ``[("wte", "wpe"), (h0's 12 keys), ..., ("ln_f.gain", "ln_f.bias"[, "head"])]``:
    ``n_layers + 2`` blocks that together hold every key once. Streaming DiLoCo's
    fragments are unions of these blocks (when tied, ``wte`` is in the embeddings block
    and also feeds the head). Every key of ``transformer_param_shapes(cfg)`` is in exactly
    one block.
    """
    keys = list(transformer_param_shapes(cfg))
    blocks = [("wte", "wpe")]
    blocks += [tuple(k for k in keys if k.startswith(f"h{layer}.")) for layer in range(cfg.n_layers)]
    blocks.append(tuple(k for k in keys if k.startswith("ln_f.") or k == "head"))
    return blocks


def sequence_targets(windows: np.ndarray, next_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and next-token targets from ``diloco.text``'s windows and their next characters.

    ``tokens = windows``, ``targets[:, t] = windows[:, t + 1]`` for ``t < T - 1`` and
    ``targets[:, T - 1] = next_tokens``: the same ``(x, y)`` rows the MLP trains on, so
    sharding and batch sampling (milestones 16-18) work on them unchanged, and every
    position of a window is a prediction.

    Parameters
    ----------
    windows : ndarray of shape (B, T), integer-valued (``diloco.text`` stores float32)
    next_tokens : ndarray of shape (B,), integer

    Returns
    -------
    tokens, targets : ndarray of shape (B, T), intp

    Raises
    ------
    ValueError
        Mismatched shapes or a window value that is not a whole number.
    """
    windows, next_tokens = np.asarray(windows), np.asarray(next_tokens)
    if windows.ndim != 2 or next_tokens.shape != (windows.shape[0],):
        raise ValueError(f"windows (B, T) and next_tokens (B,) must agree, got {windows.shape} and {next_tokens.shape}")
    tokens = windows.astype(np.intp)
    if not np.array_equal(tokens, windows):
        raise ValueError("windows must hold whole-number token ids")
    targets = np.empty_like(tokens)
    targets[:, :-1] = tokens[:, 1:]
    targets[:, -1] = next_tokens
    return tokens, targets


# --------------------------------------------------------------------------- the pieces


def _block_forward(params, p, x, batch, cfg):
    """``x + Attn(LN_1(x)) W_o + b_o``, then ``+ GELU(LN_2(.) W_fc + b_fc) W_proj + b_proj``; x is (N, d)."""
    attn_in, ln1 = layer_norm(x, params[p + "ln1.gain"], params[p + "ln1.bias"])
    qkv_flat = affine(attn_in, params[p + "attn.qkv"], params[p + "attn.qkv_bias"])  # (N, 3d)
    attn_out, qkv, probs = causal_attention(qkv_flat, batch, cfg.n_heads)  # (N, d)
    x = affine(attn_out, params[p + "attn.proj"], params[p + "attn.proj_bias"], residual=x)
    mlp_in, ln2 = layer_norm(x, params[p + "ln2.gain"], params[p + "ln2.bias"])
    fc_out = affine(mlp_in, params[p + "mlp.fc"], params[p + "mlp.fc_bias"])  # (N, m)
    gelu_out, gelu_sigmoid = gelu(fc_out)
    x = affine(gelu_out, params[p + "mlp.proj"], params[p + "mlp.proj_bias"], residual=x)
    return x, LayerCache(ln1, attn_in, qkv, probs, attn_out, ln2, mlp_in, fc_out, gelu_sigmoid, gelu_out)


def block_backward(params: Params, p: str, dx: np.ndarray, cache: LayerCache, grads: Params,
                   cfg: TransformerConfig) -> np.ndarray:
    """Gradient through one block (``_block_forward``'s steps in reverse); writes its 12 parameter
    gradients into ``grads`` and returns ``dx_in`` (N, d).

    Each residual branch ``x_out = x_in + f(x_in)`` gives ``dx_in = dx_out + J_f^T dx_out``: the
    gradient reaching the branch's output also passes the branch by, unchanged. Backwards, the
    MLP branch first (``mlp.proj``, GELU, ``mlp.fc``, LN_2), plus ``dx`` gives ``dx_mid``; then
    the attention branch (``attn.proj``, attention, ``attn.qkv``, LN_1), plus ``dx_mid``.

    Parameters
    ----------
    params : dict of str -> ndarray
        The model's parameters; this block's keys start with ``p`` (``"h0."``).
    p : str
        The block's key prefix.
    dx : ndarray of shape (N, d)
        ``d loss / d x_out``, the gradient at the block's output.
    cache : LayerCache
        The block's ``_block_forward`` cache.
    grads : dict of str -> ndarray
        Receives ``p + "ln1.gain"`` ... ``p + "mlp.proj_bias"`` (the 12 keys of the block).
    cfg : TransformerConfig

    Returns
    -------
    dx_in : ndarray of shape (N, d)
        ``d loss / d x_in``.
    """
    # BEGIN EXERCISE x07
    dgelu, grads[p + "mlp.proj"], grads[p + "mlp.proj_bias"] = affine_backward(dx, cache.gelu_out,
                                                                               params[p + "mlp.proj"])
    dfc = gelu_backward(dgelu, cache.fc_out, cache.gelu_sigmoid)  # (N, m)
    dmlp_in, grads[p + "mlp.fc"], grads[p + "mlp.fc_bias"] = affine_backward(dfc, cache.mlp_in, params[p + "mlp.fc"])
    dln2, grads[p + "ln2.gain"], grads[p + "ln2.bias"] = layer_norm_backward(dmlp_in, params[p + "ln2.gain"],
                                                                             cache.ln2)
    dln2 += dx  # the residual branch: dx_mid = dx_out + d(MLP branch)
    dx = dln2
    dattn, grads[p + "attn.proj"], grads[p + "attn.proj_bias"] = affine_backward(dx, cache.attn_out,
                                                                                 params[p + "attn.proj"])
    dqkv = attention_backward(dattn, cache.qkv, cache.probs)  # (N, 3d)
    dattn_in, grads[p + "attn.qkv"], grads[p + "attn.qkv_bias"] = affine_backward(dqkv, cache.attn_in,
                                                                                  params[p + "attn.qkv"])
    dln1, grads[p + "ln1.gain"], grads[p + "ln1.bias"] = layer_norm_backward(dattn_in, params[p + "ln1.gain"],
                                                                             cache.ln1)
    dln1 += dx
    return dln1
    # END EXERCISE x07


def embedding_backward(tokens: np.ndarray, dx: np.ndarray, head_grad: np.ndarray,
                       cfg: TransformerConfig) -> Params:
    """The gradients of the embeddings (and of an untied head) from ``dx_0`` and the head's ``dW_head``.

    ``x_0 = wte[tokens] + wpe[:T]``, so ``d wte[v] = sum_{i: token_i = v} dx_0,i``
    (``embedding_grad``: a token seen twice gets both rows) and ``d wpe[t] = sum_b dx_0,(b, t)``
    for ``t < T`` (0 for ``T <= t < context``). Tied, ``W_head = wte^T`` is the same matrix
    used a second time, so its gradient is added: ``d wte += dW_head^T``; untied it is
    ``d head = dW_head``.

    Parameters
    ----------
    tokens : ndarray of shape (B, T), integer
    dx : ndarray of shape (B T, d)
        ``d loss / d x_0``, row ``b T + t`` for position t of sequence b.
    head_grad : ndarray of shape (d, V)
        ``dW_head = LN_f(x)^T d logits``.
    cfg : TransformerConfig

    Returns
    -------
    grads : dict of str -> ndarray
        ``wte (V, d)``, ``wpe (context, d)`` and, untied only, ``head (d, V)``, in that order.
    """
    # BEGIN EXERCISE x07
    batch, length = tokens.shape
    dx = dx.reshape(batch, length, cfg.d_model)
    grads = {"wte": embedding_grad(tokens, dx, cfg.vocab_size)}
    grads["wpe"] = np.zeros((cfg.context, cfg.d_model), dtype=dx.dtype)
    grads["wpe"][:length] = col_sum(dx.reshape(batch, length * cfg.d_model)).reshape(length, cfg.d_model)
    if cfg.tied:
        grads["wte"] += head_grad.T
    else:
        grads["head"] = head_grad
    return grads
    # END EXERCISE x07


def _head(params, cfg):
    """The output matrix (d, V): ``wte^T`` when tied, else ``head``."""
    return params["wte"].T if cfg.tied else params["head"]


# --------------------------------------------------------------------------- checks


def _check_config(cfg) -> None:
    if not isinstance(cfg, TransformerConfig):
        raise TypeError(f"cfg must be a TransformerConfig, got {type(cfg).__name__}")


def _check_params(params, cfg) -> None:
    """Keys, shapes and dtype exactly as ``transformer_param_shapes(cfg)`` and ``cfg.dtype``."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of str -> numpy.ndarray, got {type(params).__name__}")
    shapes = transformer_param_shapes(cfg)
    if list(params) != list(shapes):
        missing, extra = sorted(set(shapes) - set(params)), sorted(set(params) - set(shapes))
        raise ValueError(f"params must have the keys of transformer_param_shapes(cfg) in order; "
                         f"missing {missing}, unexpected {extra}")
    for key, shape in shapes.items():
        value = params[key]
        if not isinstance(value, np.ndarray) or value.shape != shape or value.dtype != cfg.dtype:
            got = f"{value.shape} {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
            raise ValueError(f"params[{key!r}] must be an ndarray of shape {shape} and dtype {cfg.dtype}, got {got}")


def _check_targets(targets, shape, cfg) -> None:
    """``targets`` of the tokens' ``shape``, ids in [0, V)."""
    if not isinstance(targets, np.ndarray) or targets.shape != tuple(shape):
        raise ValueError(f"targets must be an ndarray of shape {tuple(shape)} like the tokens, "
                         f"got {getattr(targets, 'shape', type(targets).__name__)}")
    _check_tokens(targets, cfg, "targets")


def _check_tokens(tokens, cfg, name) -> tuple[int, int]:
    """``tokens`` (B, T) integer in [0, V) with 1 <= T <= context; returns (B, T)."""
    if not isinstance(tokens, np.ndarray) or not np.issubdtype(tokens.dtype, np.integer):
        raise TypeError(f"{name} must be an integer ndarray of shape (B, T), got "
                        f"{getattr(tokens, 'dtype', type(tokens).__name__)}")
    if tokens.ndim != 2 or tokens.shape[0] < 1 or not 1 <= tokens.shape[1] <= cfg.context:
        raise ValueError(f"{name} must have shape (B, T) with B >= 1 and 1 <= T <= context ({cfg.context}), "
                         f"got {tokens.shape}")
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ValueError(f"{name} must hold ids in [0, {cfg.vocab_size}), got min {tokens.min()} max {tokens.max()}")
    return tokens.shape
