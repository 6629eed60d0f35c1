"""Where a forward+backward of the NumPy transformer spends its CPU time, piece by piece.

    .venv/bin/python benchmarks/transformer_profile.py [--batch 32] [--steps 40] [--dtype float32]

The default ``TransformerConfig`` on ``--batch`` sequences of 64, one BLAS thread, glibc's
allocator as it comes (as ``transformer_step.py``). This is the reference path
(``diloco.models``); the fast engine's step is ``diloco.engine.transformer_step``. Each piece of ``diloco.models`` is
wrapped in a timer of the thread's CPU time (``time.thread_time``) for ``--steps`` steps after
three warm-up steps; the figures are milliseconds per step. Attention's forward is split into
its scores (``q k^T``, the scale and the mask), its softmax and the rest (``P v`` into the
concatenated layout). "Outside the pieces" is the step's total less the pieces: the head's
three products, the embedding gather, the residual adds and Python. The script also checks
that no array of the step is of another dtype than the model's (an accidental float64
upcast would double the time of every pass it touches), and times the step's matrix
products alone (``transformer_step.matmul_floor``).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np
from transformer_step import matmul_floor

import diloco.models.layers as layers
import diloco.models.transformer as transformer

# (module, function name, label); a label shared by two functions adds them.
PIECES = [
    (transformer, "affine", "dense products forward, with bias and residual adds"),
    (transformer, "affine_backward", "dense products backward (dX, dW, bias sums)"),
    (layers, "masked_scores", "attention scores: q k^T, scale, mask"),
    (layers, "causal_softmax", "attention softmax"),
    (transformer, "causal_attention", "attention forward, whole"),
    (transformer, "attention_backward", "attention backward"),
    (transformer, "gelu", "GELU forward"),
    (transformer, "gelu_backward", "GELU backward"),
    (transformer, "layer_norm", "LayerNorm forward (5)"),
    (transformer, "layer_norm_backward", "LayerNorm backward (5)"),
    (transformer, "cross_entropy", "cross-entropy and its gradient"),
    (transformer, "embedding_grad", "embedding gradient"),
]
NESTED = {"attention scores: q k^T, scale, mask", "attention softmax"}  # inside "attention forward, whole"


def wrap(pieces, totals):
    """Replace each function by a timed one; returns the originals, to put back."""
    originals = []
    for module, name, label in pieces:
        function = getattr(module, name)
        originals.append((module, name, function))

        def timed(*args, _function=function, _label=label, **kwargs):
            start = time.thread_time()
            try:
                return _function(*args, **kwargs)
            finally:
                totals[_label] += time.thread_time() - start

        setattr(module, name, timed)
    return originals


def dtypes_in(value) -> set:
    """Every ndarray dtype in a nest of tuples, lists, dicts and NamedTuples."""
    if isinstance(value, np.ndarray):
        return {value.dtype.name} if value.dtype.kind == "f" else set()
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return set().union(*(dtypes_in(v) for v in value)) if value else set()
    return set()


def profile(batch: int, steps: int, dtype: str) -> tuple[float, dict, set]:
    """(ms per step, {label: ms per step}, dtypes seen) for ``steps`` timed steps."""
    cfg = transformer.TransformerConfig(dtype=dtype)
    params = transformer.init_transformer_params(np.random.default_rng(0), cfg)
    tokens, targets = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, batch, cfg.context))
    _, cache = transformer.transformer_forward(params, tokens, cfg)
    seen = dtypes_in(cache) | dtypes_in(transformer.transformer_backward(params, cache, targets, cfg)[1])
    totals: dict = defaultdict(float)
    originals = wrap(PIECES, totals)
    try:
        for _ in range(3):
            transformer.transformer_loss_and_grads(params, tokens, targets, cfg)
        totals.clear()
        start = time.thread_time()
        for _ in range(steps):
            transformer.transformer_loss_and_grads(params, tokens, targets, cfg)
        total = time.thread_time() - start
    finally:
        for module, name, function in originals:
            setattr(module, name, function)
    return 1000 * total / steps, {label: 1000 * t / steps for label, t in totals.items()}, seen


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="sequences of 64 per step (32)")
    parser.add_argument("--steps", type=int, default=40, help="timed steps (40)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    args = parser.parse_args(argv)
    for flag in ("batch", "steps"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        total, pieces, seen = profile(args.batch, args.steps, args.dtype)
        floor = matmul_floor(transformer.TransformerConfig(dtype=args.dtype), args.batch, 64)
        floor()
        start = time.thread_time()
        for _ in range(args.steps):
            floor()
        floor_ms = 1000 * (time.thread_time() - start) / args.steps
    print(f"forward+backward, batch {args.batch} x 64, {args.dtype}, one thread: {total:.2f} ms per step "
          f"(mean of {args.steps}); its matrix products alone: {floor_ms:.2f} ms")
    for label in dict.fromkeys(label for _, _, label in PIECES):  # PIECES' order, attention's parts after it
        if label == "attention forward, whole" or label not in NESTED:
            print(f"  {label:65s} {pieces.get(label, 0.0):6.2f}")
        if label == "attention forward, whole":
            for part in sorted(NESTED):
                print(f"    of which {part:56s} {pieces.get(part, 0.0):6.2f}")
    outside = total - sum(ms for label, ms in pieces.items() if label not in NESTED)
    print(f"  {'outside the pieces (head products, gather, residual adds, Python)':65s} {outside:6.2f}")
    print(f"  array dtypes in the cache and the gradients: {sorted(seen)}")


if __name__ == "__main__":
    main()
