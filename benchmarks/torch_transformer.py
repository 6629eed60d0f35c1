"""The NumPy transformer (``diloco.models.transformer``) in PyTorch eager, on the same parameters.

Two uses, neither a dependency of the project (the ``bench`` extra brings torch):

* ``benchmarks/transformer_step.py`` times it against the NumPy model (``make bench``);
* ``tests/tooling/test_torch_transformer.py`` takes its autograd gradients as an oracle for
  the hand-written backward, in float64.

The forward is written from the equations of ``diloco.models.transformer``'s docstring with
PyTorch's own kernels (``F.layer_norm``, ``F.scaled_dot_product_attention(is_causal=True)``,
``F.gelu(approximate="tanh")``, ``F.cross_entropy``); nothing of the NumPy model is called.
Parameter names, shapes and layouts (weights ``(fan_in, fan_out)``) are the NumPy model's,
so a params dict moves across with ``torch.from_numpy``.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from diloco.models.layers import LN_EPS
from diloco.models.transformer import TransformerConfig


def to_torch(params: dict, *, requires_grad: bool = True) -> dict:
    """Copies of the NumPy params as leaf tensors of the same dtype, the same keys in the same order."""
    return {key: torch.from_numpy(np.array(value, copy=True)).requires_grad_(requires_grad)
            for key, value in params.items()}


def torch_loss(params: dict, tokens: torch.Tensor, targets: torch.Tensor, cfg: TransformerConfig) -> torch.Tensor:
    """Mean next-token cross-entropy of ``tokens`` (B, T) against ``targets`` (B, T), as a 0-d tensor."""
    batch, length = tokens.shape
    d, heads = cfg.d_model, cfg.n_heads
    x = params["wte"][tokens] + params["wpe"][:length]  # (B, T, d)
    for layer in range(cfg.n_layers):
        p = lambda name, layer=layer: params[f"h{layer}.{name}"]  # noqa: E731
        a = F.layer_norm(x, (d,), p("ln1.gain"), p("ln1.bias"), eps=LN_EPS).reshape(-1, d)
        q, k, v = torch.addmm(p("attn.qkv_bias"), a, p("attn.qkv")).view(
            batch, length, 3, heads, d // heads).permute(2, 0, 3, 1, 4)  # each (B, h, T, d_h)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(-1, d)
        x = x + torch.addmm(p("attn.proj_bias"), y, p("attn.proj")).view(batch, length, d)
        a = F.layer_norm(x, (d,), p("ln2.gain"), p("ln2.bias"), eps=LN_EPS).reshape(-1, d)
        u = F.gelu(torch.addmm(p("mlp.fc_bias"), a, p("mlp.fc")), approximate="tanh")
        x = x + torch.addmm(p("mlp.proj_bias"), u, p("mlp.proj")).view(batch, length, d)
    x = F.layer_norm(x, (d,), params["ln_f.gain"], params["ln_f.bias"], eps=LN_EPS).reshape(-1, d)
    head = params["wte"].T if cfg.tied else params["head"]
    return F.cross_entropy(x @ head, targets.reshape(-1))


def torch_loss_and_grads(params: dict, tokens: np.ndarray, targets: np.ndarray,
                         cfg: TransformerConfig) -> tuple[float, dict]:
    """``(loss, grads)`` by PyTorch's autograd, as NumPy: the shape of ``transformer_loss_and_grads``'s answer."""
    leaves = to_torch(params)
    loss = torch_loss(leaves, torch.from_numpy(np.asarray(tokens)), torch.from_numpy(np.asarray(targets)), cfg)
    loss.backward()
    return float(loss.detach()), {key: leaf.grad.numpy() for key, leaf in leaves.items()}
