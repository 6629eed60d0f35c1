"""How far ``diloco.engine.optim.adamw_update`` drifts from the milestones' ``adamw_step``.

    .venv/bin/python benchmarks/adamw_agreement.py [--steps 1000]

Runs both from one start over ``--steps`` steps (float64, weight decay 0.1, gradients of
random scale) on the buffers of model (a) stacked, (8, 9,610), and of (1, 40,000), and
prints the largest ``max|d| / max|ref|`` over the steps, the largest value-by-value
relative difference (values above 1e-8 of the largest), whether the moments are equal to
the last bit, and whether the NumPy and numba kernels agree to the last bit. The figures
in ``optim``'s docstring come from this command.
"""

from __future__ import annotations

import argparse
import importlib.util

import numpy as np

from diloco.adamw import adamw_step, init_adamw_state
from diloco.config import AdamWConfig
from diloco.engine import optim


def drift(shape, steps: int, config: AdamWConfig) -> dict:
    rng = np.random.default_rng(1)
    start = rng.standard_normal(shape)
    want, state = {"w": start.copy()}, init_adamw_state({"w": start})
    kernels = ["numpy"] + (["numba"] if importlib.util.find_spec("numba") else [])
    runs = {kernel: [start.copy(), np.zeros(shape), np.zeros(shape)] for kernel in kernels}
    scratch = optim.adamw_scratch(start.size, start.dtype)
    worst = worst_value = 0.0
    for step in range(1, steps + 1):
        grads = rng.standard_normal(shape) * rng.uniform(0.01, 10.0)
        want, state = adamw_step(want, state, {"w": grads}, config)
        for kernel, (params, m, v) in runs.items():
            if kernel == "numba":
                optim.adamw_update_numba(params, m, v, grads, step, config)
            else:
                optim.adamw_update_numpy(params, m, v, grads, step, config, scratch)
        gap, ref = np.abs(runs["numpy"][0] - want["w"]), np.abs(want["w"])
        worst = max(worst, float(gap.max() / ref.max()))
        seen = ref > 1e-8 * ref.max()
        worst_value = max(worst_value, float(np.max(gap[seen] / ref[seen])))
    params, m, v = runs["numpy"]
    return {"max|d|/max|ref|": worst, "value by value": worst_value,
            "moments bit-equal": bool(np.array_equal(m, state.m["w"]) and np.array_equal(v, state.v["w"])),
            "numba == numpy": (all(np.array_equal(a, b) for a, b in zip(runs["numba"], runs["numpy"], strict=True))
                               if "numba" in runs else "numba missing")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    config = AdamWConfig(weight_decay=0.1)
    for shape in ((8, 9610), (1, 40_000)):
        result = drift(shape, args.steps, config)
        print(f"{shape}: " + ", ".join(f"{k} {v:.2g}" if isinstance(v, float) else f"{k} {v}"
                                       for k, v in result.items()))


if __name__ == "__main__":
    main()
