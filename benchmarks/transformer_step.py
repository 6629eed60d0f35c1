"""CPU time per worker-step of the NumPy transformer against PyTorch eager on the same model.

    .venv/bin/python benchmarks/transformer_step.py [--batch 32] [--steps 10] [--repeats 7] [--json OUT]

One thread (threadpoolctl's BLAS limit, ``torch.set_num_threads(1)``; under ``make bench``
also OMP/OPENBLAS/MKL_NUM_THREADS=1 and OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset, see
``bench_env``), float32, the default ``TransformerConfig`` (2 layers, d = 64, 4 heads,
context 64, tied) on batches of ``--batch`` sequences of 64 Tiny-Shakespeare-sized token
ids (V = 65). Cases, timed interleaved (case A, B, C, A, B, C, ... so a change in the
machine's load hits each alike), each repeat ``--steps`` steps after one warm-up step, CPU
seconds (``time.process_time``):

* ``numpy fwd+bwd``: ``transformer_loss_and_grads``;
* ``numpy step``: that plus one AdamW update as the fast engine makes it: the parameters are
  views of one flat buffer, the gradients are copied into another, and
  ``diloco.engine.optim.adamw_update_numpy`` (NumPy passes, not the ``fast`` extra's numba
  loop) updates them all in place: one worker-step;
* ``numpy step, milestone AdamW``: the same with ``diloco.adamw.adamw_step`` (the milestones'
  AdamW, which returns new arrays: the reference executor's step);
* ``numpy matmul floor``: only the step's matrix products (the same shapes and count,
  forward and backward), into preallocated outputs: what no NumPy rewrite of the
  element-wise work can go below;
* ``torch fwd+bwd`` and ``torch step`` (``torch.optim.AdamW(fused=True)``, PyTorch's fastest
  AdamW on CPU: 0.35 ms an update here against 1.0 with ``foreach=True``): the same model in
  PyTorch eager (``torch_transformer.py``: ``F.layer_norm``,
  ``F.scaled_dot_product_attention(is_causal=True)``, ``F.gelu(approximate="tanh")``), from
  the same initial parameters, when ``torch`` is importable (the ``bench`` extra); its loss
  is checked against NumPy's first.

Prints the median and the spread (min .. max) of the per-step milliseconds over the repeats,
and the ratio NumPy step / PyTorch step repeat by repeat (each pair measured back to back).

For ``make bench``: ``measure(repeats, log)`` runs this script in a fresh process and returns
its figures, ``section(result)`` renders them as report lines and the target row, in the shape
``bench.EXTRA_WORKLOADS`` and ``report.EXTRA_SECTIONS`` take; ``make bench-transformer``
(``bench.py --only transformer``) measures this section alone and puts it into
``benchmarks/results.md`` in place.

``--top-pad MB`` (default 64; 0 leaves glibc's default) asks glibc's ``malloc`` to keep that
much freed memory at the top of the heap (``mallopt(M_TOP_PAD)``) instead of handing it back
to the kernel. A step allocates and frees about 40 MB of 0.5-2 MB temporaries; by default
glibc trims the heap after the frees, and every new temporary pays a page fault per 4 kB on
first touch (kernel time, counted in the CPU time). Measured on the 2-core machine, one
thread: 83 and 86 ms per forward+backward without, 50 and 52 ms with 64 MB, before the model
made fewer temporaries; since then 43.3 ms without and 41.7 with (NumPy / PyTorch step 0.95
either way, on a loaded machine). PyTorch's CPU tensors come from the same ``malloc``, so its
figures move too; the setting is per process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from diloco.adamw import adamw_step, init_adamw_state
from diloco.config import AdamWConfig
from diloco.engine.optim import adamw_scratch, adamw_update_numpy
from diloco.models.layers import row_blocks
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

    def milestone_step():
        _, grads = transformer_loss_and_grads(state["params"], tokens, targets, cfg)
        state["params"], state["opt"] = adamw_step(state["params"], state["opt"], grads, adam)

    return {"numpy fwd+bwd": fwd_bwd, "numpy step": flat_adamw_step(cfg, tokens, targets, adam),
            "numpy step, milestone AdamW": milestone_step, "numpy matmul floor": matmul_floor(cfg, *tokens.shape)}


def flat_adamw_step(cfg: TransformerConfig, tokens, targets, adam: AdamWConfig):
    """A worker-step as the fast engine takes it: the params are views of one flat buffer, the gradients are
    copied into another, and ``diloco.engine.optim.adamw_update_numpy`` updates all of them at once in place."""
    start = init_transformer_params(np.random.default_rng(0), cfg)
    flat = np.concatenate([value.reshape(-1) for value in start.values()])
    params, offset = {}, 0
    for key, value in start.items():
        params[key] = flat[offset:offset + value.size].reshape(value.shape)
        offset += value.size
    m, v, grads_flat = np.zeros_like(flat), np.zeros_like(flat), np.empty_like(flat)
    scratch = adamw_scratch(flat.size, flat.dtype)
    steps = [0]

    def step():
        _, grads = transformer_loss_and_grads(params, tokens, targets, cfg)
        np.concatenate([g.reshape(-1) for g in grads.values()], out=grads_flat)
        steps[0] += 1
        adamw_update_numpy(flat, m, v, grads_flat, steps[0], adam, scratch)

    return step


def matmul_floor(cfg: TransformerConfig, batch: int, length: int):
    """The step's matrix products alone: per layer 4 dense ones and 2 batched attention ones (per row block of
    ``layers.row_blocks``) forward, twice that backward (dA = dY W^T and dW = A^T dY), and the head's three."""
    rng = np.random.default_rng(0)
    n, d, m, v = batch * length, cfg.d_model, cfg.mlp_ratio * cfg.d_model, cfg.vocab_size
    heads, width = cfg.n_heads, cfg.head_dim
    dense = [(d, 3 * d), (d, d), (d, m), (m, d)]
    buffers = []
    for fan_in, fan_out in dense:
        x, w, y = (rng.standard_normal(s).astype(cfg.dtype) for s in ((n, fan_in), (fan_in, fan_out), (n, fan_out)))
        buffers.append((x, w, y, np.empty_like(y), np.empty_like(x), np.empty_like(w)))
    q, k = (rng.standard_normal((batch, heads, length, width)).astype(cfg.dtype) for _ in range(2))
    blocks = [(q[:, :, start:stop], k[:, :, :stop], *(np.empty((batch, heads, rows, cols), dtype=cfg.dtype)
                                                     for rows, cols in ((stop - start, stop), (stop - start, width),
                                                                        (stop, width))))
              for start, stop in row_blocks(length)]
    final, head, logits = (rng.standard_normal(s).astype(cfg.dtype) for s in ((n, d), (d, v), (n, v)))
    head_out = (np.empty_like(logits), np.empty_like(final), np.empty_like(head))

    def products():
        for _ in range(cfg.n_layers):
            for x, w, y, fwd, dx, dw in buffers:
                np.matmul(x, w, out=fwd)
                np.matmul(y, w.T, out=dx)
                np.matmul(x.T, y, out=dw)
            for rows, keys, scores, out, key_out in blocks:  # attention's row blocks (layers.row_blocks)
                for _ in range(2):  # S = q k^T forward, dP = dO v^T backward
                    np.matmul(rows, keys.transpose(0, 1, 3, 2), out=scores)
                for _ in range(2):  # P v forward; dq = dS k backward
                    np.matmul(scores, keys, out=out)
                for _ in range(2):  # dk = dS^T q, dv = P^T dO backward
                    np.matmul(scores.transpose(0, 1, 3, 2), out, out=key_out)
        np.matmul(final, head, out=head_out[0])
        np.matmul(logits, head.T, out=head_out[1])
        np.matmul(final.T, logits, out=head_out[2])

    return products


def torch_cases(cfg: TransformerConfig, tokens, targets) -> dict:
    """The same model in PyTorch eager (``torch_transformer.py``), from the same initial parameters; {} if no torch."""
    if importlib.util.find_spec("torch") is None:
        return {}
    import torch
    from torch_transformer import to_torch, torch_loss

    torch.set_num_threads(1)
    start = init_transformer_params(np.random.default_rng(0), cfg)
    params = to_torch(start)
    tok, tgt = torch.from_numpy(tokens), torch.from_numpy(targets)
    opt = torch.optim.AdamW(list(params.values()), lr=1e-3, weight_decay=0.01, fused=True)
    want, _ = transformer_loss_and_grads(start, tokens, targets, cfg)
    got = float(torch_loss(params, tok, tgt, cfg).detach())
    if abs(got - want) > 1e-4 * abs(want):
        raise AssertionError(f"torch loss {got} != numpy loss {want}: not the same model")

    def fwd_bwd():
        opt.zero_grad(set_to_none=False)
        torch_loss(params, tok, tgt, cfg).backward()

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
    return {name: spread(t) for name, t in times.items()}


def spread(values: list) -> dict:
    """Median, min, max and the values themselves."""
    return {"median_ms": float(np.median(values)), "min_ms": min(values), "max_ms": max(values), "repeats": values}


def step_ratio(results: dict) -> dict | None:
    """NumPy's worker-step over PyTorch's, repeat by repeat (each pair measured back to back); None without torch."""
    if "torch step" not in results:
        return None
    ratios = [a / b for a, b in zip(results["numpy step"]["repeats"], results["torch step"]["repeats"], strict=True)]
    return {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios), "repeats": ratios}


def bench_env() -> dict:
    """The environment of the measuring process: one thread for every BLAS and OpenMP pool, and OpenBLAS left
    to pick its own kernel (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset: some machines set them for
    older OpenBLAS builds; the kernel it then runs is read back by threadpoolctl and reported)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    return {**env, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def measure(repeats: int, log, python: str = sys.executable) -> dict:
    """This script in a fresh process (``bench_env``), ``--repeats repeats``; its JSON figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "transformer_step.json"
        subprocess.run([python, str(Path(__file__).resolve()), "--repeats", str(repeats), "--json", str(out)],
                       check=True, capture_output=True, text=True, env=bench_env())
        result = json.loads(out.read_text())
    ratio = result.get("ratio")
    log(f"  transformer step: numpy {result['results']['numpy step']['median_ms']:.1f} ms"
        + (f", torch {result['results']['torch step']['median_ms']:.1f} ms, ratio {ratio['median']:.2f}"
           if ratio else ", torch not importable"))
    return result


TARGET = "transformer worker-step (fwd+bwd+AdamW) NumPy / PyTorch eager, float32, one thread: at most 1"


def section(result: dict) -> tuple[list, list]:
    """The report's transformer section and its target row (NumPy's worker-step at or below PyTorch's)."""
    machine = result["machine"]
    lines = ["", "## The transformer, one BLAS thread", "",
             f"`benchmarks/transformer_step.py` (`make bench-transformer` reruns this section alone), measured "
             f"{machine['date']}: {result['config']}, batch {result['batch']} x {result['length']} tokens, float32; "
             f"NumPy {machine['numpy']} on {machine['blas']}, PyTorch {machine['torch']}; one thread "
             "(`threadpoolctl`, `torch.set_num_threads(1)`, OMP/OPENBLAS/MKL_NUM_THREADS=1), OPENBLAS_CORETYPE "
             f"and OPENBLAS_L2_SIZE unset, glibc M_TOP_PAD {result['top_pad_mb']} MiB; load average "
             f"{machine['load'][0]:.2f} before, {machine['load'][1]:.2f} after. CPU milliseconds per step, median "
             f"(min-max) of {result['repeats']} interleaved repeats of {result['steps']} steps. A worker-step is "
             "forward, backward and one AdamW update (NumPy: the fast engine's `adamw_update_numpy` on one flat "
             "buffer, and the milestones' `adamw_step`; PyTorch: `torch.optim.AdamW(fused=True)`). The matmul "
             "floor is the step's matrix products alone.", "",
             "| case | ms per step |", "|---|---|"]
    for name, r in result["results"].items():
        lines.append(f"| {name} | {r['median_ms']:.2f} ({r['min_ms']:.2f}-{r['max_ms']:.2f}) |")
    ratio = result.get("ratio")
    if ratio:
        lines += ["", f"NumPy / PyTorch worker-step, repeat by repeat: median {ratio['median']:.2f} "
                      f"(min {ratio['min']:.2f}, max {ratio['max']:.2f}); below 1, NumPy is faster."]
        row = (TARGET, f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})",
               "met" if ratio["median"] <= 1.0 else "**missed**")
    else:
        row = (TARGET, "-", "not measured: torch not importable (the bench extra)")
    return lines, [row]


def machine_info() -> dict:
    """What the figures depend on: versions, the BLAS kernel OpenBLAS picked, the load."""
    from threadpoolctl import threadpool_info

    blas = next((i for i in threadpool_info() if i["user_api"] == "blas"), {})
    torch_version = "not importable"
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch_version = torch.__version__
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "numpy": np.__version__, "torch": torch_version,
            "blas": " ".join(str(blas.get(k, "?")) for k in ("internal_api", "version")) + " kernel "
                    + str(blas.get("architecture", "?")),
            "coretype": os.environ.get("OPENBLAS_CORETYPE", "unset"), "load": [os.getloadavg()[0]]}


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
    for flag in ("batch", "steps", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    padded = keep_heap_top(args.top_pad)
    from threadpoolctl import threadpool_limits

    cfg = TransformerConfig(dtype=args.dtype)
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, cfg.vocab_size, (2, args.batch, cfg.context))
    machine = machine_info()
    with threadpool_limits(limits=1, user_api="blas"):
        cases = {**numpy_cases(cfg, tokens, targets), **torch_cases(cfg, tokens, targets)}
        results = time_cases(cases, args.steps, args.repeats)
    machine["load"].append(os.getloadavg()[0])  # the 1-minute load average before and after
    size = sum(int(np.prod(s)) for s in transformer_param_shapes(cfg).values())
    print(f"transformer {cfg}, {size:,} parameters, batch {args.batch} x {cfg.context} tokens, one thread, "
          f"malloc top pad {f'{args.top_pad} MiB' if padded else 'glibc default'}, {machine['blas']}, "
          f"OPENBLAS_CORETYPE {machine['coretype']}")
    for name, r in results.items():
        print(f"  {name:28s} {r['median_ms']:8.2f} ms/step  (min {r['min_ms']:.2f}, max {r['max_ms']:.2f}, "
              f"{args.repeats} repeats of {args.steps})")
    ratio = step_ratio(results)
    if ratio is None:
        print("  torch: not importable, skipped (the bench extra: pip install -e '.[bench]')")
    else:
        print(f"  numpy step / torch step, repeat by repeat: median {ratio['median']:.2f} "
              f"(min {ratio['min']:.2f}, max {ratio['max']:.2f}; below 1: NumPy faster)")
    if args.json:
        figures = {"config": str(cfg), "batch": args.batch, "length": cfg.context, "steps": args.steps,
                   "repeats": args.repeats, "top_pad_mb": args.top_pad if padded else 0, "machine": machine,
                   "results": results, "ratio": ratio}
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(figures, indent=1), encoding="utf-8")
        tmp.replace(args.json)
    return results


if __name__ == "__main__":
    main()
