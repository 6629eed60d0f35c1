"""One measurement, run in a fresh process by ``bench.py``; prints one JSON line.

    python benchmarks/_case.py '{"impl": "fast", "model": "a", "dtype": "float64", ...}'

``impl`` is ``reference`` (the milestone path of whichever ``diloco`` is first on
``sys.path``: ``bench.py`` puts commit e7f3c6c's ``src`` there for the "before" column),
``fast`` / ``fast-numpy`` (``diloco.engine``; ``bench.py`` sets ``DILOCO_ADAMW_KERNEL`` to
``numba`` / ``numpy`` for them), ``torch-foreach`` or ``torch-fused`` (``torch_mlp.py``),
``matmul`` (the single-thread matrix-product peak) or ``adamw`` (one optimizer update). A training case
runs one round more than it times (the first, as warm-up: BLAS kernels, page faults, set-up),
with the BLAS threads given.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(1, str(HERE))  # torch_mlp, workloads; after the diloco chosen by PYTHONPATH

import charlm  # noqa: E402
from workloads import MODELS, make_data  # noqa: E402


def current_rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def limit_threads(threads: int):
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")


def matmul_peak(dtype: str, shapes, repeats: int = 5, clock=time.perf_counter) -> dict:
    """Best GFLOP/s of ``a @ b`` (into a preallocated ``out``) for each of ``shapes`` (m, k, n).

    ``clock`` is ``time.process_time`` for one thread (robust to other processes on the
    machine) and ``time.perf_counter`` (wall) to compare thread counts.
    """
    rng = np.random.default_rng(0)
    best = {}
    for m, k, n in shapes:
        a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
        out = np.empty((m, n), dtype=dtype)
        np.matmul(a, b, out=out)
        reps = max(1, int(2e8 / (2 * m * k * n)))
        times = []
        for _ in range(repeats):
            start = clock()
            for _ in range(reps):
                np.matmul(a, b, out=out)
            times.append((clock() - start) / reps)
        best[f"{m}x{k}x{n}"] = 2 * m * k * n / min(times) / 1e9
    return best


def adamw_milliseconds(dtype: str, size: int, with_torch: bool, repeats: int = 7) -> dict:
    """CPU milliseconds of one AdamW update of ``size`` values: the engine's, and PyTorch's."""
    import importlib.util

    from diloco import AdamWConfig
    from diloco.engine import optim

    rng = np.random.default_rng(0)
    params, grads = (rng.standard_normal((1, size)).astype(dtype) for _ in range(2))
    m, v, config = np.zeros_like(params), np.zeros_like(params), AdamWConfig()
    scratch = optim.adamw_scratch(size, dtype)
    updates = {"engine, NumPy passes": lambda: optim.adamw_update_numpy(params, m, v, grads, 5, config, scratch)}
    if importlib.util.find_spec("numba") is not None:
        updates["engine, numba loop"] = lambda: optim.adamw_update_numba(params, m, v, grads, 5, config)
    if with_torch:
        import torch

        torch.set_num_threads(1)
        for name, options in (("torch foreach", {"foreach": True}), ("torch fused", {"fused": True})):
            weight = torch.from_numpy(params[0].copy()).requires_grad_(True)
            weight.grad = torch.from_numpy(grads[0].copy())
            updates[name] = torch.optim.AdamW([weight], **options).step
    out = {}
    for name, update in updates.items():
        update()
        times = []
        for _ in range(repeats):
            start = time.process_time()
            for _ in range(10):
                update()
            times.append((time.process_time() - start) / 10)
        out[name] = 1e3 * float(np.median(times))
    return out


def run_training(spec: dict) -> dict:
    """Train ``rounds + 1`` rounds and time the last ``rounds``: the first one is the warm-up.

    The clock reads at the end of every round (``on_round``), so set-up (sharding, the
    initial model, the first touch of every buffer) stays out of the rate.
    """
    model = MODELS[spec["model"]]
    dtype = spec["dtype"]
    x, y = make_data(spec["model"], dtype)
    fields = dict(num_workers=spec.get("workers", model["workers"]), inner_steps=spec.get("inner_steps", model["H"]),
                  batch_size=model["batch"], hidden_sizes=tuple(spec.get("hidden", model["hidden"])), dtype=dtype)
    rounds = spec.get("rounds", model["rounds"])
    impl = spec["impl"]
    marks = []

    def on_round(_record=None):
        marks.append((time.perf_counter(), time.process_time()))

    if impl.startswith("torch"):
        import torch_mlp

        def train():
            return torch_mlp.train_diloco_torch(x, y, {**fields, "rounds": rounds + 1}, fused=impl == "torch-fused",
                                                on_round=on_round)
    else:
        from diloco import DiLoCoConfig

        if impl == "reference":
            from diloco import train_diloco as trainer
        elif impl not in ("fast", "fast-numpy"):
            raise SystemExit(f"unknown impl {impl!r}")
        else:
            from diloco.core.trainers import train_diloco_fast as trainer

        options = {"layout": spec["layout"]} if "layout" in spec else {}  # the fast engine's, to compare them

        def train():
            return trainer(x, y, DiLoCoConfig(**fields, rounds=rounds + 1), on_round=on_round, **options).params
    base_rss = current_rss_mb()  # after the imports and the data
    params = train()
    (wall_0, cpu_0), (wall_1, cpu_1) = marks[0], marks[-1]
    out = {"wall": wall_1 - wall_0, "cpu": cpu_1 - cpu_0,
           "worker_steps": fields["num_workers"] * fields["inner_steps"] * rounds,
           "peak_rss_mb": peak_rss_mb(), "base_rss_mb": base_rss}
    if spec.get("save"):
        np.savez(spec["save"], **{k: np.asarray(v) for k, v in params.items()})
        out["params_sha256"] = hashlib.sha256(b"".join(np.ascontiguousarray(v).tobytes()
                                                       for v in params.values())).hexdigest()
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    load_before = os.getloadavg()[0]
    import diloco

    with limit_threads(spec.get("threads", 1)):
        if spec["impl"] == "adamw":
            result = {"ms": adamw_milliseconds(spec["dtype"], spec["size"], spec.get("torch", False))}
        elif spec["impl"] == "matmul":
            clock = time.process_time if spec.get("clock") == "cpu" else time.perf_counter
            result = {"gflops": matmul_peak(spec["dtype"], [tuple(s) for s in spec["shapes"]], clock=clock)}
        elif spec["impl"] == "charlm-eval":
            result = charlm.run_eval(spec)
        elif spec["impl"] == "charlm-first-layer":
            result = charlm.run_first_layer(spec)
        elif spec["impl"].startswith("charlm-"):
            result = charlm.run_charlm(spec)
        else:
            result = run_training(spec)
    result["diloco_path"] = str(Path(diloco.__file__).parent)
    result["load"] = [load_before, os.getloadavg()[0]]  # one-minute load average at start and end
    if spec["impl"].startswith("fast"):
        from diloco.engine import optim

        result["adamw_kernel"] = optim.KERNEL
    print(json.dumps(result))


if __name__ == "__main__":
    main()
