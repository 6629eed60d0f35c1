"""The hand-written transformer backward against PyTorch's autograd, in float64.

``benchmarks/torch_transformer.py`` writes the model with PyTorch's own kernels (layer norm,
scaled-dot-product attention, tanh GELU, cross-entropy) and differentiates it by autograd:
an oracle that shares no code with ``diloco.models`` but the parameter layout. Loss and every
gradient must agree to float64 rounding on small configs that stress the shapes: odd head
counts and widths, one head, context 1 and longer, tied and untied output, several layers.
Skipped where torch is not installed (the ``bench`` extra) or ``benchmarks/`` is not shipped.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from diloco.models.transformer import TransformerConfig, transformer_loss_and_grads, transformer_param_shapes
from helpers import assert_close

pytest.importorskip("torch", reason="torch is not installed (the bench extra: pip install -e '.[bench]')")
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if not (BENCHMARKS / "torch_transformer.py").exists():
    pytest.skip("benchmarks/ is not shipped with the package", allow_module_level=True)
sys.path.insert(0, str(BENCHMARKS))

from torch_transformer import torch_loss_and_grads  # noqa: E402

# (config fields, batch, length): odd head counts and head widths, one head, T = 1 and T = context,
# tied and untied, one to three layers; T = 17 and 64 make attention's rows in two blocks (layers.row_blocks).
CASES = [
    (dict(vocab_size=7, context=5, d_model=9, n_heads=3, n_layers=1, mlp_ratio=2, tied=False), 3, 5),
    (dict(vocab_size=11, context=4, d_model=10, n_heads=5, n_layers=2, mlp_ratio=3, tied=True), 2, 1),
    (dict(vocab_size=5, context=9, d_model=7, n_heads=1, n_layers=3, mlp_ratio=1, tied=True), 2, 9),
    (dict(vocab_size=13, context=8, d_model=15, n_heads=3, n_layers=2, mlp_ratio=4, tied=False), 1, 6),
    (dict(vocab_size=9, context=17, d_model=6, n_heads=2, n_layers=2, mlp_ratio=2, tied=False), 2, 17),
    (dict(vocab_size=65, context=64, d_model=64, n_heads=4, n_layers=2, mlp_ratio=4, tied=True), 2, 64),
]


def random_model(fields, batch, length, seed, dtype="float64"):
    """Parameters of order one (attention far from uniform, LayerNorm gains and biases away from 1 and 0)."""
    cfg = TransformerConfig(**fields, dtype=dtype)
    rng = np.random.default_rng(seed)
    params = {key: rng.normal(1.0 if key.endswith("gain") else 0.0, 0.5, shape).astype(dtype)
              for key, shape in transformer_param_shapes(cfg).items()}
    tokens, targets = rng.integers(0, cfg.vocab_size, (2, batch, length))
    return cfg, params, tokens, targets


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(("fields", "batch", "length"), CASES)
def test_loss_and_every_gradient_equal_pytorch_autograd_in_float64(fields, batch, length, seed):
    cfg, params, tokens, targets = random_model(fields, batch, length, seed)
    loss, grads = transformer_loss_and_grads(params, tokens, targets, cfg)
    want_loss, want_grads = torch_loss_and_grads(params, tokens, targets, cfg)
    assert_close(loss, want_loss, rtol=1e-12, what="loss")
    assert list(grads) == list(want_grads)
    for key, want in want_grads.items():
        scale = float(np.abs(want).max())
        assert scale > 0, f"{key}: a zero gradient cannot tell a wrong backward from a right one"
        assert_close(grads[key], want, rtol=1e-10, atol=1e-10 * scale, what=f"grads[{key!r}]")


def test_float32_step_agrees_with_pytorch_to_float32_rounding():
    """The benchmark's dtype: same model in float32 (loss to 1e-5 relative, gradients to 1e-3 of their scale)."""
    cfg, params, tokens, targets = random_model(CASES[-1][0], 4, 64, 2, dtype="float32")
    loss, grads = transformer_loss_and_grads(params, tokens, targets, cfg)
    want_loss, want_grads = torch_loss_and_grads(params, tokens, targets, cfg)
    assert_close(loss, want_loss, rtol=1e-5, what="loss")
    for key, want in want_grads.items():
        assert grads[key].dtype == np.float32
        assert_close(grads[key], want, rtol=0, atol=1e-3 * float(np.abs(want).max()), what=f"grads[{key!r}]")
