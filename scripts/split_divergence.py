"""Print how non-IID every split of Tiny Shakespeare is, as the Markdown tables of docs/concepts/splits.md.

For each split (IID, label skew and topic segments at alpha 0.1 and 1, speakers), each K
and each context length, the shards every trainer starts from (``diloco.core.run_records.shard_dataset``
with ``default_rng(seed)``) and their mean KL divergence (``diloco.corpus.shard_divergence``):
given the previous character, and of the label (next-character) histogram alone.

    .venv/bin/python scripts/split_divergence.py                  # K = 4, 8; context 6, 64; seed 0
    .venv/bin/python scripts/split_divergence.py --workers 2,16 --contexts 6 --seed 1
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.core.run_records import shard_dataset
from diloco.corpus.shard_divergence import split_divergence
from diloco.text import load_shakespeare

SPLITS = (
    ("IID", {"iid": True}),
    ("label skew a=0.1", {"iid": False, "noniid_split": "label", "alpha": 0.1}),
    ("label skew a=1", {"iid": False, "noniid_split": "label", "alpha": 1.0}),
    ("topic a=0.1", {"iid": False, "noniid_split": "topic", "alpha": 0.1}),
    ("topic a=1", {"iid": False, "noniid_split": "topic", "alpha": 1.0}),
    ("speaker", {"iid": False, "noniid_split": "speaker"}),
)


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        sys.exit(f"{flag} must be positive ints separated by commas, got {text!r}")
    return values


def measure(workers: list[int], contexts: list[int], seed: int) -> dict:
    """``{(split, K, c): (given previous character, label histogram)}`` in nats."""
    table = {}
    for context in contexts:
        data = load_shakespeare(context, eval_windows=64).dataset
        for name, changes in SPLITS:
            for k in workers:
                config = DiLoCoConfig(num_workers=k, seed=seed, **changes)
                shards = shard_dataset(data.x_train, data.y_train, config, np.random.default_rng(seed))
                table[name, k, context] = (split_divergence(shards, text=True), split_divergence(shards, text=False))
    return table


def markdown(table: dict, workers: list[int], contexts: list[int], which: int) -> str:
    columns = [(k, c) for c in contexts for k in workers]
    lines = ["| split | " + " | ".join(f"K = {k}, c = {c}" for k, c in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for name, _ in SPLITS:
        lines.append(f"| {name} | " + " | ".join(f"{table[name, k, c][which]:.4f}" for k, c in columns) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="4,8", help="K values, comma-separated (4,8)")
    parser.add_argument("--contexts", default="6,64", help="context lengths c, comma-separated (6,64)")
    parser.add_argument("--seed", type=int, default=0, help="the seed of the split (0)")
    args = parser.parse_args(argv)
    workers, contexts = _ints(args.workers, "--workers"), _ints(args.contexts, "--contexts")
    if args.seed < 0:
        sys.exit(f"--seed must be a non-negative int, got {args.seed}")
    table = measure(workers, contexts, args.seed)
    print("Mean KL of a shard's next character given the previous one from the whole's (nats):\n")
    print(markdown(table, workers, contexts, 0))
    print("\nMean KL of a shard's next-character histogram from the whole's (nats):\n")
    print(markdown(table, workers, contexts, 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
