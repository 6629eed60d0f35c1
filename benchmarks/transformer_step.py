"""CPU time per worker-step of the NumPy transformer, against PyTorch eager when importable.

    .venv/bin/python benchmarks/transformer_step.py [--batch 32] [--steps 10] [--repeats 7] [--json OUT]

One thread (threadpoolctl's BLAS limit, ``torch.set_num_threads(1)``), float32, the default
``TransformerConfig`` (2 layers, d = 64, 4 heads, context 64, tied) on batches of
``--batch`` sequences of 64 Tiny-Shakespeare-sized token ids (V = 65). Cases, timed
interleaved (case A, B, C, A, B, C, ... so a change in the machine's load hits each alike),
each repeat ``--steps`` steps after one warm-up step, CPU seconds (``time.process_time``):

* ``numpy fwd+bwd``: ``transformer_loss_and_grads``;
* ``numpy step``: that plus ``diloco.adamw.adamw_step`` (the milestones' AdamW): one worker-step;
* ``numpy matmul floor``: only the step's matrix products (the same shapes and count,
  forward and backward), into preallocated outputs: what no NumPy rewrite of the
  element-wise work can go below;
* ``torch fwd+bwd`` and ``torch step`` (``torch.optim.AdamW``, foreach): the same model in
  PyTorch eager (``F.layer_norm``, ``F.scaled_dot_product_attention(is_causal=True)``,
  ``F.gelu(approximate="tanh")``), from the same initial parameters, only when ``torch`` is
  importable (it is never a dependency); its loss is checked against NumPy's first.

Prints the median and the spread (min .. max) of the per-step milliseconds over the repeats.

For ``make bench``: ``measure(repeats, log)`` runs this script in a fresh process and returns
its figures, ``section(result)`` renders them as report lines and target rows, in the shape
``bench.EXTRA_WORKLOADS`` and ``report.EXTRA_SECTIONS`` take.

``--top-pad MB`` (default 64; 0 leaves glibc's default) asks glibc's ``malloc`` to keep that
much freed memory at the top of the heap (``mallopt(M_TOP_PAD)``) instead of handing it back
to the kernel. A step allocates and frees about 40 MB of 0.5-2 MB temporaries; by default
glibc trims the heap after the frees, and every new temporary pays a page fault per 4 kB on
first touch (kernel time, counted in the CPU time). Measured on the 2-core machine, one
thread: 83 and 86 ms per forward+backward without, 50 and 52 ms with 64 MB. PyTorch's CPU
tensors come from the same ``malloc``, so its figures move too; the setting is per process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from diloco.adamw import adamw_step, init_adamw_state
from diloco.config import AdamWConfig
from diloco.models.transformer import (
    TransformerConfig,
    init_transformer_params,
    transformer_loss_and_grads,
    transformer_param_shapes,
)


def keep_heap_top(pad_mb: int) -> bool:
    """``mallopt(M_TOP_PAD, pad_mb MiB)`` in glibc; False where there is no glibc (nothing changed)."""
    import ctypes
    import ctypes.util

    if pad_mb <= 0 or not ctypes.util.find_library("c"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        return bool(libc.mallopt(-2, pad_mb << 20))  # M_TOP_PAD is -2 in glibc's malloc.h
    except (OSError, AttributeError):
        return False


def numpy_cases(cfg: TransformerConfig, tokens, targets) -> dict:
    """The NumPy step functions, each a closure with its own state."""
    params = init_transformer_params(np.random.default_rng(0), cfg)
    adam = AdamWConfig(lr=1e-3)
    state = {"params": params, "opt": init_adamw_state(params)}

    def fwd_bwd():
        transformer_loss_and_grads(state["params"], tokens, targets, cfg)

    def step():
        _, grads = transformer_loss_and_grads(state["params"], tokens, targets, cfg)
        state["params"], state["opt"] = adamw_step(state["params"], state["opt"], grads, adam)

    return {"numpy fwd+bwd": fwd_bwd, "numpy step": step, "numpy matmul floor": matmul_floor(cfg, *tokens.shape)}


def matmul_floor(cfg: TransformerConfig, batch: int, length: int):
    """The step's matrix products alone: per layer 4 dense ones and 2 batched attention ones forward, twice
    that backward (dA = dY W^T and dW = A^T dY), and the head's three."""
    rng = np.random.default_rng(0)
    n, d, m, v = batch * length, cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.vocab_size
    heads, width = cfg.n_heads, cfg.head_dim
    dense = [(d, 3 * d), (d, d), (d, m), (m, d)]
    buffers = []
    for fan_in, fan_out in dense:
        x, w, y = (rng.standard_normal(s).astype(cfg.dtype) for s in ((n, fan_in), (fan_in, fan_out), (n, fan_out)))
        buffers.append((x, w, y, np.empty_like(y), np.empty_like(x), np.empty_like(w)))
    q, k = (rng.standard_normal((batch, heads, length, width)).astype(cfg.dtype) for _ in range(2))
    scores = np.empty((batch, heads, length, length), dtype=cfg.dtype)
    out = np.empty_like(q)
    final, head, logits = (rng.standard_normal(s).astype(cfg.dtype) for s in ((n, d), (d, v), (n, v)))
    head_out = (np.empty_like(logits), np.empty_like(final), np.empty_like(head))

    def products():
        for _ in range(cfg.n_layers):
            for x, w, y, fwd, dx, dw in buffers:
                np.matmul(x, w, out=fwd)
                np.matmul(y, w.T, out=dx)
                np.matmul(x.T, y, out=dw)
            for _ in range(2):  # S = q k^T forward, dP = dO v^T backward
                np.matmul(q, k.transpose(0, 1, 3, 2), out=scores)
            for _ in range(4):  # P v forward; dq = dS k, dk = dS^T q, dv = P^T dO backward
                np.matmul(scores, k, out=out)
        np.matmul(final, head, out=head_out[0])
        np.matmul(logits, head.T, out=head_out[1])
        np.matmul(final.T, logits, out=head_out[2])

    return products


def torch_cases(cfg: TransformerConfig, tokens, targets) -> dict:
    """The same model in PyTorch eager, from the same initial parameters; {} without torch."""
    if importlib.util.find_spec("torch") is None:
        return {}
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    start = init_transformer_params(np.random.default_rng(0), cfg)
    params = {k: torch.from_numpy(value.copy()).requires_grad_(True) for k, value in start.items()}
    tok, tgt = torch.from_numpy(tokens), torch.from_numpy(targets)
    opt = torch.optim.AdamW(list(params.values()), lr=1e-3, weight_decay=0.01, foreach=True)
    d, h = cfg.d_model, cfg.n_heads

    def loss_fn():
        batch, length = tok.shape
        x = params["wte"][tok] + params["wpe"][:length]
        for layer in range(cfg.n_layers):
            p = lambda name, layer=layer: params[f"h{layer}.{name}"]  # noqa: E731
            a = F.layer_norm(x, (d,), p("ln1.gain"), p("ln1.bias"))
            q, k, v = torch.addmm(p("attn.qkv_bias"), a.reshape(-1, d), p("attn.qkv")).view(
                batch, length, 3, h, d // h).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(-1, d)
            x = x + torch.addmm(p("attn.proj_bias"), y, p("attn.proj")).view(batch, length, d)
            a = F.layer_norm(x, (d,), p("ln2.gain"), p("ln2.bias")).reshape(-1, d)
            u = F.gelu(torch.addmm(p("mlp.fc_bias"), a, p("mlp.fc")), approximate="tanh")
            x = x + torch.addmm(p("mlp.proj_bias"), u, p("mlp.proj")).view(batch, length, d)
        x = F.layer_norm(x, (d,), params["ln_f.gain"], params["ln_f.bias"])
        head = params["wte"].T if cfg.tied else params["head"]
        return F.cross_entropy((x.reshape(-1, d) @ head), tgt.reshape(-1))

    want, _ = transformer_loss_and_grads(start, tokens, targets, cfg)
    got = float(loss_fn())
    if abs(got - want) > 1e-4 * abs(want):
        raise AssertionError(f"torch loss {got} != numpy loss {want}: not the same model")

    def fwd_bwd():
        opt.zero_grad(set_to_none=False)
        loss_fn().backward()

    def step():
        fwd_bwd()
        opt.step()

    return {"torch fwd+bwd": fwd_bwd, "torch step": step}


def time_cases(cases: dict, steps: int, repeats: int) -> dict:
    """Per-step CPU milliseconds of each case, ``repeats`` interleaved rounds of ``steps`` steps."""
    for run in cases.values():
        run()  # warm-up: BLAS kernels, page faults, torch's first-call set-up
    times = {name: [] for name in cases}
    for _ in range(repeats):
        for name, run in cases.items():
            start = time.process_time()
            for _ in range(steps):
                run()
            times[name].append(1000.0 * (time.process_time() - start) / steps)
    return {name: {"median_ms": float(np.median(t)), "min_ms": min(t), "max_ms": max(t), "repeats": t}
            for name, t in times.items()}


def measure(repeats: int, log, python: str = sys.executable) -> dict:
    """This script in a fresh process, ``--repeats repeats``; its JSON figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "transformer_step.json"
        subprocess.run([python, str(Path(__file__).resolve()), "--repeats", str(repeats), "--json", str(out)],
                       check=True, capture_output=True, text=True)
        result = json.loads(out.read_text())
    log(f"  transformer step: numpy {result['results']['numpy step']['median_ms']:.1f} ms"
        + (f", torch {result['results']['torch step']['median_ms']:.1f} ms" if "torch step" in result["results"]
           else ", torch not importable"))
    return result


def section(result: dict) -> tuple[list, list]:
    """The report's transformer section and its target row (NumPy's worker-step at or below PyTorch's)."""
    lines = ["", "## The transformer, one BLAS thread", "",
             f"`benchmarks/transformer_step.py`: {result['config']}, batch {result['batch']} x 64 tokens, float32, "
             f"glibc M_TOP_PAD {result['top_pad_mb']} MiB; CPU milliseconds per step, median (min-max) of "
             "interleaved repeats.", "", "| case | ms per step |", "|---|---|"]
    for name, r in result["results"].items():
        lines.append(f"| {name} | {r['median_ms']:.2f} ({r['min_ms']:.2f}-{r['max_ms']:.2f}) |")
    if "torch step" in result["results"]:
        ratio = result["results"]["numpy step"]["median_ms"] / result["results"]["torch step"]["median_ms"]
        row = ("transformer worker-step at or below PyTorch eager's, float32, one thread", f"{ratio:.2f}x",
               "met" if ratio <= 1.0 else "**missed**")
    else:
        row = ("transformer worker-step at or below PyTorch eager's, float32, one thread", "-",
               "not measured: torch not importable")
    return lines, [row]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="sequences per step (32)")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed repeat (10)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved repeats (7)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--top-pad", type=int, default=64, metavar="MB",
                        help="glibc malloc's M_TOP_PAD in MiB (64; 0: glibc's default)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    padded = keep_heap_top(args.top_pad)
    from threadpoolctl import threadpool_limits

    cfg = TransformerConfig(dtype=args.dtype)
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, cfg.vocab_size, (2, args.batch, cfg.context))
    with threadpool_limits(limits=1, user_api="blas"):
        cases = {**numpy_cases(cfg, tokens, targets), **torch_cases(cfg, tokens, targets)}
        results = time_cases(cases, args.steps, args.repeats)
    size = sum(int(np.prod(s)) for s in transformer_param_shapes(cfg).values())
    print(f"transformer {cfg}, {size:,} parameters, batch {args.batch} x {cfg.context} tokens, one thread, "
          f"malloc top pad {f'{args.top_pad} MiB' if padded else 'glibc default'}")
    for name, r in results.items():
        print(f"  {name:20s} {r['median_ms']:8.2f} ms/step  (min {r['min_ms']:.2f}, max {r['max_ms']:.2f}, "
              f"{args.repeats} repeats of {args.steps})")
    if "torch step" not in results:
        print("  torch: not importable, skipped (never a dependency; pip install torch in another venv to compare)")
    else:
        ratio = results["numpy step"]["median_ms"] / results["torch step"]["median_ms"]
        print(f"  numpy step / torch step = {ratio:.2f} (below 1: NumPy faster)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"config": str(cfg), "batch": args.batch, "top_pad_mb": args.top_pad if padded else 0,
                       "results": results}, handle, indent=1)
    return results


if __name__ == "__main__":
    main()
