"""CPU time per worker-step of the NumPy transformer against PyTorch eager on the same model.

    .venv/bin/python benchmarks/transformer_step.py [--batch 32] [--steps 10] [--repeats 7] [--json OUT]

One thread (threadpoolctl's BLAS limit, ``torch.set_num_threads(1)``; under ``make bench``
also OMP/OPENBLAS/MKL_NUM_THREADS=1 and OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE unset, see
``bench_env``), float32, the default ``TransformerConfig`` (2 layers, d = 64, 4 heads,
context 64, tied) on batches of ``--batch`` sequences of 64 Tiny-Shakespeare-sized token
ids (V = 65). Cases, timed interleaved (case A, B, C, A, B, C, ... so a change in the
machine's load hits each alike), each repeat ``--steps`` steps after one warm-up step, CPU
seconds (``time.process_time``):

* ``engine fwd+bwd``: the fast engine's ``ModelStack.loss_and_grads`` (``diloco.engine``), as
  ``--engine fast`` and the studies run it: with the ``fast`` extra, ``TransformerStep``
  (reused buffers, fused numba loops, the gradient written into the flat row);
* ``engine step``: that plus the engine's AdamW (``diloco.engine.optim.adamw_update``) on the flat
  buffers: one worker-step, the figure the target compares;
* ``reference fwd+bwd``: ``transformer_loss_and_grads`` (``diloco.models``, the NumPy passes the
  reference executor runs; it allocates new arrays every step);
* ``reference step, milestone AdamW``: that plus ``diloco.adamw.adamw_step`` (the reference
  executor's step);
* ``numpy matmul floor``: only the reference step's matrix products (the same shapes and count,
  forward and backward), into preallocated outputs;
* ``torch fwd+bwd`` and ``torch step`` (``torch.optim.AdamW(fused=True)``, PyTorch's fastest
  AdamW on CPU): the same model in PyTorch eager (``torch_transformer.py``: ``F.layer_norm``,
  ``F.scaled_dot_product_attention(is_causal=True)``, ``F.gelu(approximate="tanh")``), from
  the same initial parameters, when ``torch`` is importable (the ``bench`` extra); its loss
  is checked against NumPy's first, and the engine's against the reference's.

Nothing here changes the process: no allocator setting, no environment variable beyond the
one-thread limits, so the figures are what ``diloco train`` gets. (Until this change the
script set glibc's ``M_TOP_PAD`` to 64 MiB: the reference path allocates and frees tens of
megabytes a step, and by default glibc hands them back to the kernel and faults them in again.
The engine's step allocates no array after its first, so it needs no such setting.)

Prints the median and the spread (min .. max) of the per-step milliseconds over the repeats,
and PyTorch's worker-step over the engine's, repeat by repeat (each pair measured back to
back): above 1, NumPy is faster.

For ``make bench``: ``measure(repeats, log)`` runs this script in a fresh process per batch
size (``BATCHES``) and returns its figures, ``section(result)`` renders them as report lines and
the target rows, in the shape ``bench.EXTRA_WORKLOADS`` and ``report.EXTRA_SECTIONS`` take;
``make bench-transformer`` (``bench.py --only transformer``) measures this section alone and puts
it into ``benchmarks/results.md`` in place.
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
from diloco.engine.flat import flat_layout, pack
from diloco.engine.model_stack import ModelStack
from diloco.engine.optim import adamw_scratch, adamw_update, current_kernel
from diloco.models.layers import row_blocks
from diloco.models.seam import TransformerModel
from diloco.models.transformer import (
    TransformerConfig,
    init_transformer_params,
    transformer_loss_and_grads,
    transformer_param_shapes,
)

BATCHES = (16, 32)  # the sequences of 64 per step measure() times: the range, ends included
TARGET_SPEEDUP = 1.3  # PyTorch's worker-step over the engine's


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

    engine_fwd_bwd, engine_step = engine_cases(cfg, tokens, targets, adam)
    return {"engine fwd+bwd": engine_fwd_bwd, "engine step": engine_step, "reference fwd+bwd": fwd_bwd,
            "reference step, milestone AdamW": milestone_step, "numpy matmul floor": matmul_floor(cfg, *tokens.shape)}


def engine_cases(cfg: TransformerConfig, tokens, targets, adam: AdamWConfig):
    """The fast engine's forward+backward and worker-step (``ModelStack`` and ``adamw_update`` on its flat
    buffers), from the same initial parameters; its loss is checked against the reference's first."""
    start = init_transformer_params(np.random.default_rng(0), cfg)
    layout = flat_layout(start)
    stack = ModelStack(TransformerModel(cfg), layout, 1, 1, tokens.shape[0], np.dtype(cfg.dtype))
    pack(start, stack.params[0], layout)
    stack.x[0] = tokens  # the windows; the label is each window's next token
    stack.labels[0] = targets[:, -1]
    if not np.array_equal(targets[:, :-1], tokens[:, 1:]):
        raise ValueError("targets must be the tokens shifted by one (sequence_targets)")
    want, _ = transformer_loss_and_grads(start, tokens, targets, cfg)
    got = float(stack.loss_and_grads()[0, 0])
    if abs(got - want) > 1e-5 * abs(want):
        raise AssertionError(f"engine loss {got} != reference loss {want}")
    m, v = np.zeros_like(stack.params), np.zeros_like(stack.params)
    scratch, steps = adamw_scratch(stack.params.size, stack.params.dtype), [0]

    def step():
        stack.loss_and_grads()
        steps[0] += 1
        adamw_update(stack.params, m, v, stack.grads, steps[0], adam, scratch)

    return stack.loss_and_grads, step


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


def step_speedup(results: dict) -> dict | None:
    """PyTorch's worker-step over the engine's, repeat by repeat (each pair measured back to back): above 1,
    NumPy is faster; None without torch."""
    if "torch step" not in results:
        return None
    ratios = [b / a for a, b in zip(results["engine step"]["repeats"], results["torch step"]["repeats"], strict=True)]
    return {"median": float(np.median(ratios)), "min": min(ratios), "max": max(ratios), "repeats": ratios}


def bench_env() -> dict:
    """The environment of the measuring process: one thread for every BLAS and OpenMP pool, and OpenBLAS left
    to pick its own kernel (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset: some machines set them for
    older OpenBLAS builds; the kernel it then runs is read back by threadpoolctl and reported)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    return {**env, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def measure(repeats: int, log, python: str = sys.executable) -> dict:
    """This script in a fresh process (``bench_env``) per batch of ``BATCHES``, ``--repeats repeats``; the JSON
    figures of each, by batch."""
    runs = {}
    for batch in BATCHES:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "transformer_step.json"
            subprocess.run([python, str(Path(__file__).resolve()), "--batch", str(batch), "--repeats", str(repeats),
                            "--json", str(out)], check=True, capture_output=True, text=True, env=bench_env())
            result = json.loads(out.read_text())
        speedup = result.get("speedup")
        log(f"  transformer step, batch {batch}: engine {result['results']['engine step']['median_ms']:.1f} ms"
            + (f", torch {result['results']['torch step']['median_ms']:.1f} ms, torch / engine {speedup['median']:.2f}"
               if speedup else ", torch not importable"))
        runs[str(batch)] = result
    return {"batches": runs}


TARGET = (f"transformer worker-step (fwd+bwd+AdamW, float32, one thread, no allocator setting): PyTorch eager / "
          f"fast engine, at least {TARGET_SPEEDUP}")


def section(result: dict) -> tuple[list, list]:
    """The report's transformer section and its target row (PyTorch's worker-step over the engine's, per batch)."""
    runs = result["batches"]
    first = next(iter(runs.values()))
    machine = first["machine"]
    lines = ["", "## The transformer, one BLAS thread", "",
             f"`benchmarks/transformer_step.py` (`make bench-transformer` reruns this section alone), measured "
             f"{machine['date']}: {first['config']}, batches of {' and '.join(runs)} x {first['length']} tokens, "
             f"float32; NumPy {machine['numpy']} on {machine['blas']}, PyTorch {machine['torch']}; one thread "
             "(`threadpoolctl`, `torch.set_num_threads(1)`, OMP/OPENBLAS/MKL_NUM_THREADS=1), OPENBLAS_CORETYPE "
             "and OPENBLAS_L2_SIZE unset, no allocator setting (glibc's defaults, as `diloco train` runs). CPU "
             f"milliseconds per step, median (min-max) of {first['repeats']} interleaved repeats of {first['steps']} "
             "steps, one process per batch size. A worker-step is forward, backward and one AdamW update (the fast "
             "engine: `ModelStack` with `TransformerStep`, `adamw_update` on its flat buffers; the reference: "
             "`transformer_loss_and_grads` and the milestones' `adamw_step`; PyTorch: "
             "`torch.optim.AdamW(fused=True)`). The matmul floor is the reference step's matrix products alone.",
             "", "| case | " + " | ".join(f"batch {b}: ms per step" for b in runs) + " |",
             "|---|" + "---|" * len(runs)]
    for name in first["results"]:
        cells = [f"{r['median_ms']:.2f} ({r['min_ms']:.2f}-{r['max_ms']:.2f})"
                 for r in (run["results"][name] for run in runs.values())]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    lines.append("")
    for batch, run in runs.items():
        load = run["machine"]["load"]
        lines.append(f"Batch {batch}: load average {load[0]:.2f} before, {load[1]:.2f} after.")
    speedups = {batch: run.get("speedup") for batch, run in runs.items()}
    if all(speedups.values()):
        lines += ["", "PyTorch / fast engine worker-step, repeat by repeat: "
                  + "; ".join(f"batch {b}: median {s['median']:.2f} (min {s['min']:.2f}, max {s['max']:.2f})"
                              for b, s in speedups.items()) + "; above 1, NumPy is faster."]
        measured = ", ".join(f"batch {b}: {s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
                             for b, s in speedups.items())
        met = all(s["median"] >= TARGET_SPEEDUP for s in speedups.values())
        row = (TARGET, measured, "met" if met else "**missed**")
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
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    for flag in ("batch", "steps", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    from threadpoolctl import threadpool_limits

    cfg = TransformerConfig(dtype=args.dtype)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg.vocab_size, (args.batch, cfg.context + 1))
    tokens, targets = tokens[:, :-1].copy(), tokens[:, 1:].copy()  # windows and their next tokens
    machine = machine_info()
    with threadpool_limits(limits=1, user_api="blas"):
        cases = {**numpy_cases(cfg, tokens, targets), **torch_cases(cfg, tokens, targets)}
        results = time_cases(cases, args.steps, args.repeats)
    machine["load"].append(os.getloadavg()[0])  # the 1-minute load average before and after
    machine["adamw_kernel"] = current_kernel()
    size = sum(int(np.prod(s)) for s in transformer_param_shapes(cfg).values())
    print(f"transformer {cfg}, {size:,} parameters, batch {args.batch} x {cfg.context} tokens, one thread, "
          f"{machine['blas']}, OPENBLAS_CORETYPE {machine['coretype']}, engine AdamW kernel {machine['adamw_kernel']}")
    for name, r in results.items():
        print(f"  {name:32s} {r['median_ms']:8.2f} ms/step  (min {r['min_ms']:.2f}, max {r['max_ms']:.2f}, "
              f"{args.repeats} repeats of {args.steps})")
    speedup = step_speedup(results)
    if speedup is None:
        print("  torch: not importable, skipped (the bench extra: pip install -e '.[bench]')")
    else:
        print(f"  torch step / engine step, repeat by repeat: median {speedup['median']:.2f} "
              f"(min {speedup['min']:.2f}, max {speedup['max']:.2f}; above 1: NumPy faster)")
    if args.json:
        figures = {"config": str(cfg), "batch": args.batch, "length": cfg.context, "steps": args.steps,
                   "repeats": args.repeats, "machine": machine, "results": results, "speedup": speedup}
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(figures, indent=1), encoding="utf-8")
        tmp.replace(args.json)
    return results


if __name__ == "__main__":
    main()
