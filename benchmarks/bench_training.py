"""Throughput of the simulated trainers, measured side by side in one run.

    .venv/bin/python benchmarks/bench_training.py [--repeats 3]

Prints, for DiLoCo and the synchronous baseline at equal compute on the bundled
digits: seconds per run (best of ``--repeats``), worker-steps per second, and the ratio.
Also times one local AdamW step and the input validation inside it, so the cost of
the library's checks is visible. Speed is reported here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from diloco import (
    AdamWConfig,
    DiLoCoConfig,
    init_adamw_state,
    init_model_params,
    local_train_step,
    train_diloco,
    train_synchronous_baseline,
)
from diloco._validation import check_mlp_params
from diloco.data import load_digits_split


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    data = load_digits_split(0)
    config = DiLoCoConfig(rounds=args.rounds)
    worker_steps = config.num_workers * config.total_steps
    print(f"digits, K={config.num_workers}, H={config.inner_steps}, rounds={config.rounds}, "
          f"hidden={config.hidden_sizes}, {worker_steps} worker-steps per run, best of {args.repeats}")
    results = {}
    for name, trainer in (("diloco", train_diloco), ("sync", train_synchronous_baseline)):
        seconds = best_of(args.repeats, lambda: trainer(data.x_train, data.y_train, config))
        results[name] = seconds
        print(f"  {name:<7} {seconds:7.3f} s   {worker_steps / seconds:9.0f} worker-steps/s")
    print(f"  sync / diloco time ratio: {results['sync'] / results['diloco']:.2f}")

    rng = np.random.default_rng(0)
    params = init_model_params((64, *config.hidden_sizes, 10), rng)
    state = init_adamw_state(params)
    x_batch, y_batch = data.x_train[:32], data.y_train[:32]
    inner = AdamWConfig()
    reps = 500
    step_s = best_of(args.repeats, lambda: [local_train_step(params, state, x_batch, y_batch, inner)
                                            for _ in range(reps)]) / reps
    check_s = best_of(args.repeats, lambda: [check_mlp_params(params) for _ in range(reps)]) / reps
    print(f"  one local_train_step: {step_s * 1e6:8.1f} us; one parameter check: {check_s * 1e6:6.1f} us "
          f"({check_s / step_s:.1%} of a step)")


if __name__ == "__main__":
    main()
