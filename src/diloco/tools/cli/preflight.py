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

``check_text_run(args, config)`` makes the memory check of a ``--data shakespeare`` run
before its windows are made (``4 c`` bytes each, a copy of the text per window): from the
text's length and vocabulary alone, so ``--context 1000000`` (15 GB of windows) or
``--n-layers 1000000000`` is refused in seconds, not after minutes of work.
"""

from __future__ import annotations

import inspect

import numpy as np

from diloco._validation import available_memory
from diloco.config import DiLoCoConfig
from diloco.core.model_seam import data_model, model_kind, parameter_count
from diloco.core.schedule import check_speeds
from diloco.data import Dataset
from diloco.loop import prepare_training
from diloco.tools.cli.errors import CliError
from diloco.tools.runs.training import keeps_worker_starts
from diloco.tools.studies.ablations import format_bytes

__all__ = ["estimate_memory", "available_memory", "check_run", "check_text_run", "check_run_count", "shown_bytes",
           "RECORD_BYTES"]

# Bytes a history record (a dict of about 20 fields) and a study's row take in memory, roughly.
RECORD_BYTES = 2048


def shown_bytes(count: int) -> str:
    """``format_bytes(count)``, or a power of ten for a count no float holds (``--rounds 10**400``)."""
    try:
        return format_bytes(count)
    except OverflowError:
        return f"10^{len(str(int(count))) - 1} bytes"


def check_run_count(runs: int, rounds: int = 1, *, flag: str = "--seeds") -> None:
    """Refuse (``CliError``) a study of ``runs`` runs whose records alone cannot fit in memory
    (``runs * (rounds + 1) * RECORD_BYTES``), before any list of them is made."""
    needed = runs * (rounds + 1) * RECORD_BYTES
    available = available_memory()
    if available is not None and needed > available:
        raise CliError(f"{flag}: {runs:,} runs of {rounds:,} rounds need about {shown_bytes(needed)} for their "
                       f"records alone, but only {shown_bytes(available)} is available; use fewer")


# Parameter-sized arrays a run holds besides the workers' own (``_copies``): the global params, the
# outer momentum and the last round's pseudo-gradient (3), round 0's params and outer momentum,
# which the driver keeps referenced for the whole run (2), and one reference AdamW step's new
# arrays (gradient, m, v, m-hat, v-hat, decayed and new params: 7) with up to three of one key's
# intermediates (lr m-hat, sqrt v-hat + eps, their quotient). Checked against tracemalloc peaks in
# tests/tooling/test_memory_estimate.py.
SHARED_COPIES = 3 + 2 + 7 + 3


def _stacked(config, params: int) -> bool:
    """Whether the fast engine steps the K workers stacked (``diloco.engine.layout.choose_layout``)."""
    from diloco.engine.layout import choose_layout  # only asked for --engine fast, which needs the engine

    return choose_layout(config.num_workers, params, itemsize=np.dtype(config.dtype).itemsize) == "stacked"


def _copies(config, params: int, checkpointing: bool) -> int:
    """Parameter-sized arrays at the run's peak (``estimate_memory``'s docstring derives each term)."""
    workers = config.num_workers
    copies = 3 * workers + 2 * workers + SHARED_COPIES  # live workers, and round 0's moments kept by the driver
    if config.engine == "fast" and _stacked(config, params):
        copies += 2 * (workers - 1)  # the stack's params and gradients: K rows, not one
    if checkpointing:
        kept = (3 if keeps_worker_starts("diloco", config) else 2) * workers  # KeepLastRound: moments (+ starts)
        written = kept + 2  # its serialised copy: those, the global params and the outer momentum
        snapshot = 3 * workers if config.engine == "fast" else 0  # the fast engine's new copy beside the old
        copies += kept + max(written, snapshot)
    return copies


def estimate_memory(config: DiLoCoConfig, model, num_eval: int, *, checkpointing: bool = True) -> tuple[int, str]:
    """Peak bytes a run needs beyond its data, roughly, and how the figure is made.

    With ``P`` parameters of ``b`` bytes and ``K`` workers, a run holds ``5K + 15``
    parameter-sized arrays at its peak: the K workers' params and AdamW moments (3K), round
    0's moments, params and outer momentum, which the driver keeps for the whole run
    (2K + 2), the global params, the outer momentum and the last pseudo-gradient (3), and
    one AdamW step's new arrays and intermediates (10, ``SHARED_COPIES``). The fast engine's
    stacked layout (small models only) steps K models' params and gradients at once
    (2K - 2 more). A run that checkpoints (every CLI run: the last round, and an
    interrupt's save) also keeps the last finished round (``KeepLastRound``: the K workers'
    moments, 2K, and their own params, K more, when a checkpoint needs them,
    ``keeps_worker_starts``) and, while it writes it, the serialised copy (the kept arrays
    and 2); on the fast engine the kept round is a copy made beside the one it replaces
    (3K). Activations: the ``model``'s (``diloco.core.model_seam.data_model``)
    ``activation_values``: the MLP's a batch through the widest layers (4 arrays of
    ``batch * sum(widths)``; K batches on the fast engine) and the held-out set through the
    model at once (3 arrays of ``n_eval * max(width)``); the transformer's one batch and one
    held-out chunk through it. A round keeps every worker's
    per-step loss (``K H`` float64s), and the history a record per round (with one loss per
    worker). Not counted: the state a family mechanism adds (error-feedback residuals,
    eager updates' copies, asynchronous starts). Python ints, so absurd sizes do not
    overflow. It is 1.0-1.3x the peaks tracemalloc measures (tests/tooling/test_memory_estimate.py).
    """
    itemsize = np.dtype(config.dtype).itemsize
    params = parameter_count(model)
    workers = config.num_workers
    copies = _copies(config, params, checkpointing)
    activations = model.activation_values(config.batch_size, workers if config.engine == "fast" else 1, num_eval)
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
    try:
        model = data_model(config, data.x_train, data.encode, data.num_classes)
    except ValueError as exc:
        raise CliError(f"{prefix}cannot train: {exc}") from None
    needed, how = estimate_memory(config, model, len(data.y_test), checkpointing=checkpointing)
    available = available_memory()
    if available is not None and needed > available:
        raise CliError(f"{prefix}this run needs about {shown_bytes(needed)} of memory ({how}) but only "
                       f"{shown_bytes(available)} is available; use a smaller {model_kind(config).size_flags}, "
                       f"fewer workers, fewer inner steps (-H) or a smaller --batch-size")
    try:
        prepare_training(data.x_train, data.y_train, config, data.x_test, data.y_test, encode=data.encode)
    except (TypeError, ValueError) as exc:
        raise CliError(f"{prefix}cannot train: {exc}") from None
    except MemoryError:
        raise CliError(f"{prefix}out of memory while initialising the model (estimated {shown_bytes(needed)}: "
                       f"{how})") from None


def check_text_run(args, config: DiLoCoConfig) -> None:
    """Refuse (``CliError``) a ``--data shakespeare`` run whose windows and run do not fit in memory,
    before the windows are made (see the module doc). Other data: nothing to do."""
    from types import SimpleNamespace

    from diloco.text import load_shakespeare, load_shakespeare_text, vocabulary_of
    from diloco.tools.cli.config_file import with_run_data
    from diloco.tools.cli.paper_flags import text_sizes

    args, _ = with_run_data(args)  # --config run/config.json: its data flags
    if getattr(args, "data", None) != "shakespeare":
        return
    context, eval_windows = text_sizes(args)
    text = load_shakespeare_text()
    held_out = inspect.signature(load_shakespeare).parameters["test_fraction"].default  # the tail it holds out
    vocab, cut = len(vocabulary_of(text)), int(round(len(text) * (1.0 - held_out)))
    train, held = max(cut - context, 0), min(eval_windows, max(len(text) - cut - context, 0))
    windows = 4 * context * (train + held) * (1 + (np.dtype(config.dtype).itemsize != 4))  # float32, then cast
    try:
        model = data_model(config, np.empty((0, context), np.float32),
                           SimpleNamespace(vocab_size=vocab, input_width=context, num_features=context * vocab), vocab)
    except ValueError as exc:
        raise CliError(f"cannot train: {exc}") from None
    needed, how = estimate_memory(config, model, held)
    available = available_memory()
    if available is not None and windows + needed > available:
        raise CliError(f"this run needs about {shown_bytes(windows + needed)} of memory ({train + held:,} windows "
                       f"of {context:,} characters, {shown_bytes(windows)}; the run: {how}) but only "
                       f"{shown_bytes(available)} is available; use a smaller {model_kind(config).text_size_flags}, "
                       f"fewer workers or a smaller --batch-size")
