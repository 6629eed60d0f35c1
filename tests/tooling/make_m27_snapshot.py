"""Build ``tests/fixtures/m27_reference.npz``: synchronous-baseline runs of a plain loop.

    .venv/bin/python tests/tooling/make_m27_snapshot.py

``reference_baseline`` below is an independent data-parallel AdamW loop (K gradients
averaged, one step) written out of earlier milestones. It lives here, under
``tests/tooling/``, which is never copied into a learner workspace, so the milestone-27
test (``tests/test_loop.py``) compares against the stored numbers instead of carrying a
second copy of the baseline. ``tests/tooling/test_m27_snapshot.py`` rebuilds the snapshot
and checks it still matches, so it cannot go stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from diloco.adamw import adamw_step, init_adamw_state  # noqa: E402
from diloco.model import init_model_params, model_backward, model_forward  # noqa: E402
from diloco.params import average_params  # noqa: E402
from diloco.sharding import iid_shard_dataset, sample_worker_batch  # noqa: E402
from test_loop import layer_sizes_for, tiny_config, tiny_data  # noqa: E402

SNAPSHOT = TESTS / "fixtures" / "m27_reference.npz"

# (seed, num_workers, inner_steps, rounds, batch_size, num_examples): K from 1 to 4, batches
# smaller and larger than a shard (with and without replacement), and n not divisible by K
# (shards of unequal size, whose gradients still count once each).
CASES = [
    (0, 1, 1, 1, 1, 24),
    (1, 2, 2, 2, 4, 24),
    (2, 3, 3, 2, 9, 24),
    (3, 3, 1, 2, 2, 24),
    (4, 2, 3, 1, 7, 24),
    (5, 1, 2, 2, 5, 24),
    (6, 3, 2, 2, 4, 25),
    (7, 4, 1, 3, 5, 22),
    (8, 2, 2, 2, 12, 23),
]


def reference_baseline(x, y, config):
    """Data-parallel AdamW: K gradients averaged, one step; params and per-record worker losses."""
    rng = np.random.default_rng(config.seed)
    shards = iid_shard_dataset(x, y, config.num_workers, rng)
    params = init_model_params(layer_sizes_for(x, y, config), rng, dtype=np.dtype(config.dtype))
    state = init_adamw_state(params)
    record_losses = []
    for _ in range(config.rounds):
        worker_rngs = rng.spawn(config.num_workers)
        losses = np.zeros((config.num_workers, config.inner_steps))
        for step in range(config.inner_steps):
            grads = []
            for k, ((x_k, y_k), rng_k) in enumerate(zip(shards, worker_rngs, strict=True)):
                x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, rng_k)
                logits, cache = model_forward(params, x_batch)
                shifted = logits - logits.max(axis=1, keepdims=True)
                log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
                losses[k, step] = -log_probs[np.arange(len(y_batch)), y_batch].mean()
                grads.append(model_backward(params, cache, y_batch))
            params, state = adamw_step(params, state, average_params(grads), config.inner)
        record_losses.append(losses.mean(axis=1))
    return params, np.array(record_losses)


def build_snapshot() -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {"cases": np.array(json.dumps(CASES))}
    for i, (seed, num_workers, inner_steps, rounds, batch_size, num_examples) in enumerate(CASES):
        x, y = tiny_data(seed, num_examples=num_examples)
        config = tiny_config(num_workers=num_workers, inner_steps=inner_steps, rounds=rounds,
                             batch_size=batch_size, seed=seed)
        params, losses = reference_baseline(x, y, config)
        arrays.update({f"case{i}/{key}": value for key, value in params.items()})
        arrays[f"case{i}/worker_losses"] = losses
    return arrays


if __name__ == "__main__":
    np.savez_compressed(SNAPSHOT, **build_snapshot())
    print(f"wrote {SNAPSHOT} ({SNAPSHOT.stat().st_size} bytes)")
