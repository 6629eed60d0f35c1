"""The fast engine's two layouts over a grid of K, width and dtype: the data ``engine.layout`` is fitted to.

    .venv/bin/python benchmarks/layout_grid.py [--repeats 3] [--out benchmarks/layout_grid.json]

Model ``w-w-10`` (one hidden layer of width w, w input features, batch 32, H = 10) for
w in 64, 128, 256, 512 and K in 1, 2, 4, 8, 16, 32, 64, float64 and float32, with the
AdamW kernel of this install (``diloco.engine.optim.KERNEL``). Each (kernel, dtype, width)
runs in a fresh process, one BLAS thread; inside it the two layouts alternate, repeat
after repeat (interleaved), timed in CPU seconds per worker-step over at least 320
worker-steps after a warm-up round. Writes every measurement as JSON and prints the
stacked / per-worker speed ratio (median) of each cell.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
WORKERS = (1, 2, 4, 8, 16, 32, 64)
WIDTHS = (64, 128, 256, 512)
DTYPES = ("float64", "float32")
BATCH, INNER_STEPS = 32, 10
MIN_STEPS = 320  # worker-steps per timed run, so that K = 1 runs long enough to time


def num_values(width: int) -> int:
    """P of the ``w-w-10`` MLP."""
    return width * width + width + width * 10 + 10


def time_cell(width: int, dtype: str, repeats: int) -> dict:
    """``{K: {layout: [CPU seconds per worker-step, per repeat]}}`` for one width and dtype (in this process)."""
    from threadpoolctl import threadpool_limits

    from diloco import DiLoCoConfig
    from diloco.core.trainers import train_diloco_fast

    rng = np.random.default_rng(0)
    n = max(WORKERS) * 4 * BATCH
    x, y = rng.standard_normal((n, width)).astype(dtype), rng.integers(0, 10, n)
    out: dict = {}
    with threadpool_limits(limits=1, user_api="blas"):
        for _ in range(repeats):
            for workers in WORKERS:
                timed = -(-MIN_STEPS // (workers * INNER_STEPS))  # rounds timed: at least MIN_STEPS worker-steps
                config = DiLoCoConfig(num_workers=workers, inner_steps=INNER_STEPS, rounds=timed + 1,
                                      batch_size=BATCH, hidden_sizes=(width,), dtype=dtype)
                for layout in ("stacked", "per-worker"):
                    marks = []
                    train_diloco_fast(x, y, config, layout=layout,
                                      on_round=lambda _r, marks=marks: marks.append(time.process_time()))
                    seconds = (marks[-1] - marks[0]) / (workers * INNER_STEPS * timed)
                    out.setdefault(str(workers), {}).setdefault(layout, []).append(seconds)
    return out


def run_grid(repeats: int, log=print) -> dict:
    """Every cell, each (dtype, width) in a fresh process: ``{"kernel": ..., "cells": [...]}``."""
    cells = []
    kernel = None
    for dtype in DTYPES:
        for width in WIDTHS:
            done = subprocess.run([sys.executable, str(Path(__file__)), "--cell", f"{width},{dtype},{repeats}"],
                                  capture_output=True, text=True, check=True)
            result = json.loads(done.stdout.strip().splitlines()[-1])
            kernel = result.pop("kernel")
            for workers, by_layout in result["times"].items():
                cells.append({"dtype": dtype, "width": width, "workers": int(workers), "num_values": num_values(width),
                              "stacked": by_layout["stacked"], "per-worker": by_layout["per-worker"],
                              "load": result["load"]})
            log(f"  layouts: {dtype} width {width} done (load {result['load']:.2f})")
    return {"kernel": kernel, "batch": BATCH, "inner_steps": INNER_STEPS, "cells": cells}


def ratio(cell: dict) -> float:
    """Median speed of stacked over per-worker (> 1: stacked is faster)."""
    return statistics.median(cell["per-worker"]) / statistics.median(cell["stacked"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "layout_grid.json"))
    parser.add_argument("--cell", help=argparse.SUPPRESS)  # internal: one (width, dtype, repeats) in this process
    args = parser.parse_args()
    if args.cell:
        width, dtype, repeats = args.cell.split(",")
        from diloco.engine import optim

        times = time_cell(int(width), dtype, int(repeats))
        print(json.dumps({"kernel": optim.KERNEL, "times": times, "load": os.getloadavg()[0]}))
        return
    grid = run_grid(args.repeats)
    Path(args.out).write_text(json.dumps(grid, indent=1) + "\n", encoding="utf-8")
    for cell in grid["cells"]:
        print(f"{cell['dtype']} w={cell['width']:3d} K={cell['workers']:2d} P*K*itemsize="
              f"{cell['num_values'] * cell['workers'] * np.dtype(cell['dtype']).itemsize / 2**20:7.2f} MB "
              f"stacked/per-worker {ratio(cell):.2f}")


if __name__ == "__main__":
    main()
