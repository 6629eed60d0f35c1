"""Checks that run before a command makes its run folder, so a doomed run leaves nothing behind.

``check_run(config, data)`` refuses, with a ``CliError`` (one line, exit status 2):

* data with fewer than two classes in the training labels (accuracy would be a
  meaningless 1.0);
* more workers than training examples (every worker needs a non-empty shard);
* a run whose estimated memory exceeds what the machine has available, with the
  estimate in the message (``estimate_memory``; its history in memory included, so
  ``--rounds 10**12`` is refused at once);
* workers' speeds the simulation cannot serve (``diloco.core.schedule.check_speeds``):
  step times that overflow the simulated clock, or an asynchronous schedule whose speed
  ratio needs more than ``MAX_ARRIVALS`` arrivals (``--async --step-times 1,1e9``);
* anything ``diloco.loop.prepare_training`` rejects (the sharding included: a non-IID
  split that leaves a worker empty), by running it once on the real data.
"""

from __future__ import annotations

import numpy as np

from diloco._validation import available_memory
from diloco.config import DiLoCoConfig
from diloco.core.schedule import check_speeds
from diloco.data import Dataset
from diloco.loop import prepare_training
from diloco.tools.cli.errors import CliError
from diloco.tools.studies.ablations import format_bytes

__all__ = ["estimate_memory", "available_memory", "check_run", "check_run_count", "RECORD_BYTES"]

# Bytes a history record (a dict of about 20 fields) and a study's row take in memory, roughly.
RECORD_BYTES = 2048


def check_run_count(runs: int, rounds: int = 1, *, flag: str = "--seeds") -> None:
    """Refuse (``CliError``) a study of ``runs`` runs whose records alone cannot fit in memory
    (``runs * (rounds + 1) * RECORD_BYTES``), before any list of them is made."""
    needed = runs * (rounds + 1) * RECORD_BYTES
    available = available_memory()
    if available is not None and needed > available:
        raise CliError(f"{flag}: {runs:,} runs of {rounds:,} rounds need about {format_bytes(needed)} for their "
                       f"records alone, but only {format_bytes(available)} is available; use fewer")


def _num_params(layer_sizes) -> int:
    return sum(fan_in * fan_out + fan_out for fan_in, fan_out in zip(layer_sizes[:-1], layer_sizes[1:], strict=True))


def estimate_memory(config: DiLoCoConfig, num_features: int, num_classes: int, num_eval: int,
                    *, checkpointing: bool = True) -> tuple[int, str]:
    """Peak bytes a run needs beyond its data, roughly, and how the figure is made.

    With ``P`` parameters of ``b`` bytes and ``K`` workers, the reference path holds about
    ``3K + 8`` parameter-sized arrays at once: K workers' AdamW moments (2K) and models (K),
    the global model, the outer momentum, the pseudo-gradient and AdamW's temporaries. A
    checkpoint adds its serialised copy (``2K + 2``). Activations: a batch through the widest
    layers (4 arrays of ``batch * sum(widths)``; K batches at once on the fast engine, which
    steps the workers stacked) and the held-out set through the model at once (3 arrays of
    ``n_eval * max(width)``). A round keeps every worker's per-step loss (``K H`` float64s), and
    the history a record per round (with one loss per worker). Python ints, so absurd sizes
    do not overflow.
    """
    widths = (num_features, *config.hidden_sizes, num_classes)
    itemsize = np.dtype(config.dtype).itemsize
    params = _num_params(widths)
    workers = config.num_workers
    copies = 3 * workers + 8 + (2 * workers + 2 if checkpointing else 0)
    batches = workers if config.engine == "fast" else 1
    activations = 4 * batches * config.batch_size * sum(widths) + 3 * num_eval * max(widths)
    step_losses = 8 * workers * config.inner_steps
    history = config.rounds * (RECORD_BYTES + 32 * workers)
    total = itemsize * (copies * params + activations) + step_losses + history
    how = (f"{params:,} parameters x {copies} copies (K={workers}) + activations + a round's "
           f"{workers * config.inner_steps:,} step losses (K x H), {config.dtype}")
    return total, how


def check_run(config: DiLoCoConfig, data: Dataset, *, checkpointing: bool = True, label: str = "") -> None:
    """Refuse (``CliError``) a run that cannot work, before anything is written.

    ``label`` prefixes the message (a study's variant).
    """
    prefix = f"{label}: " if label else ""
    classes = np.unique(data.y_train)
    if classes.size < 2:
        raise CliError(f"{prefix}the training labels hold a single class ({int(classes[0])}); classification needs "
                       f"at least two, or every accuracy would be a meaningless 1.0")
    num_train = len(data.y_train)
    if config.num_workers > num_train:
        raise CliError(f"{prefix}K={config.num_workers} workers but only {num_train} training examples: "
                       f"every worker needs at least one (use -K {num_train} or fewer)")
    try:
        check_speeds(config)  # bounded before any schedule is built
    except ValueError as exc:
        raise CliError(f"{prefix}workers' speeds (--step-times, --speed-spread, --straggler-factor): {exc}") from None
    needed, how = estimate_memory(config, data.x_train.shape[1], data.num_classes, len(data.y_test),
                                  checkpointing=checkpointing)
    available = available_memory()
    if available is not None and needed > available:
        raise CliError(f"{prefix}this run needs about {format_bytes(needed)} of memory ({how}) but only "
                       f"{format_bytes(available)} is available; use smaller --hidden-sizes, fewer workers, fewer "
                       f"inner steps (-H) or a smaller --batch-size")
    try:
        prepare_training(data.x_train, data.y_train, config, data.x_test, data.y_test, encode=data.encode)
    except (TypeError, ValueError) as exc:
        raise CliError(f"{prefix}cannot train: {exc}") from None
    except MemoryError:
        raise CliError(f"{prefix}out of memory while initialising the model (estimated {format_bytes(needed)}: "
                       f"{how})") from None
