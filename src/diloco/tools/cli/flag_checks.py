"""Refuse a flag that would have no effect where it is given, naming what would give it one.

``check_flags(args, config, data)`` runs once per command, after the config and the data
are known and before the run folder is made (``diloco.tools.cli.run_setup.thread_limit``
calls it: every training command passes there). Each refusal is a ``CliError``: one
line, exit status 2. A flag is refused when it is silently ignored or cut down to
something else:

* ``--error-feedback`` when the run's codec says it is not ``lossy`` (``codec_for``: no
  lossy ``--comm-dtype``, ``--sign-prune``, ``--topk`` or ``--compress`` codec): no error
  to carry; a ``--compress`` codec's options are checked here too (it is built once);
* ``--comm-block`` without ``--comm-dtype`` int8 or fp4 (only they have scale blocks), or
  larger than the largest tensor (then it is one scale per tensor: ``--comm-block 0``);
* ``--context``, ``--eval-windows`` without ``--data shakespeare``; ``--eval-windows``
  above the held-out windows the text has (it would be cut to them);
* ``--test-fraction``, ``--split-seed`` with data that brings its own split
  (shakespeare, mnist1d);
* ``--threads`` above the cores this process may use;
* ``--warmup-steps`` above the steps per worker (the decay would never start);
* ``--batch-size`` above a worker's shard (``n // K`` examples: a batch would repeat
  examples of its shard instead of growing);
* ``--alpha`` with ``--noniid-split speaker`` (the speaker split draws no proportions);
* ``--allow-code-change`` without ``--resume``;
* ``--checkpoint-every`` above the run's rounds (no round would reach it).

``check_data_file(spec)`` refuses a ``--data`` path that is not an ``.npz`` archive,
saying what the file must hold (``diloco.tools.cli.flags.load_dataset`` calls it before
reading anything).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from diloco.config.sections import WIRE_FIELDS
from diloco.core.codecs import codec_for
from diloco.core.model_seam import data_model, model_kind, parameter_shapes
from diloco.tools.cli.config_file import run_data_name
from diloco.tools.cli.errors import CliError

__all__ = ["check_flags", "check_data_file", "usable_cores", "NPZ_CONTENTS"]
_BLOCK_FORMATS = ("int8", "fp4")
_OWN_SPLIT = ("shakespeare", "mnist1d")  # data with a held-out part of its own
NPZ_CONTENTS = ("a NumPy .npz archive (np.savez) holding x, float features of shape (n, d), and y, n integer "
                "labels, optionally x_test and y_test")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def check_data_file(spec: str) -> None:
    """A ``--data`` path must be an ``.npz`` archive (a zip file); else a ``CliError`` saying what it must hold."""
    path = Path(spec)
    if path.is_dir():
        raise CliError(f"--data {spec} is a folder; it must be {NPZ_CONTENTS}")
    if path.suffix != ".npz":
        raise CliError(f"--data {spec} is not an .npz file; it must be {NPZ_CONTENTS} "
                       f"(or digits, mnist1d, shakespeare)")
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except OSError:
        return  # missing or unreadable: load_dataset names it
    if magic not in (b"PK\x03\x04", b"PK\x05\x06"):
        raise CliError(f"--data {spec} is not a readable .npz archive (not a zip file); it must be {NPZ_CONTENTS}")


def _given(args, name: str):
    return getattr(args, name, None)


def _largest_tensor(config, data) -> int:
    """The most values one tensor of the run's model holds."""
    model = data_model(config, data.x_train, data.encode, data.num_classes)
    return max(int(np.prod(shape)) for shape in parameter_shapes(model).values())


def _check_family(args, config, data) -> None:
    comm_dtype = _given(args, "comm_dtype")
    given = {name: _given(args, name) for name in WIRE_FIELDS if _given(args, name) is not None}
    try:  # the run's wire, with the flags given (the config holds them already where a command built it)
        codec = codec_for(dataclasses.replace(config.family.comm, **given), config.dtype)  # checks its options
    except (TypeError, ValueError) as exc:
        raise CliError(f"--compress: {exc}") from None
    wire = f"--comm-dtype {comm_dtype}" if comm_dtype else "no --comm-dtype"
    if config.family.compress is not None:
        wire = f"--compress {config.family.compress}"
    if _given(args, "error_feedback") and not getattr(codec, "lossy", True):  # the codec says what it loses
        raise CliError(f"--error-feedback has no effect with {wire}: nothing is lost on the wire; it needs a lossy "
                       f"--comm-dtype (int8, fp4, float16, bfloat16, or float32 with float64 params), --sign-prune, "
                       f"--topk or a lossy --compress codec")
    block = _given(args, "comm_block")
    if block is None:
        return
    if comm_dtype not in _BLOCK_FORMATS:
        raise CliError(f"--comm-block {block} has no effect with {wire}: only int8 and fp4 have scale blocks "
                       f"(add --comm-dtype int8 or fp4)")
    largest = _largest_tensor(config, data)
    if block > largest:
        raise CliError(f"--comm-block {block} is larger than the largest tensor ({largest:,} values), so it is one "
                       f"scale per tensor: use --comm-block 0 for that, or a block of at most {largest:,}")


def _check_data_flags(args, config, data) -> None:
    name = _given(args, "data") or run_data_name(args) or "digits"  # --config run/config.json names its data
    if name != "shakespeare":
        for flag in ("context", "eval_windows"):
            if _given(args, flag) is not None:
                raise CliError(f"--{flag.replace('_', '-')} has no effect with --data {name}: it sets the "
                               f"character-level task's windows (use it with --data shakespeare)")
    else:
        windows = _given(args, "eval_windows")
        if windows is not None and windows > len(data.y_test):
            raise CliError(f"--eval-windows {windows} is more than the {len(data.y_test):,} held-out windows the "
                           f"text has; it would be cut to them (use at most {len(data.y_test):,})")
    if name != "shakespeare" and model_kind(config).sequence_model:
        raise CliError(f"--model {config.model} needs --data shakespeare (it reads character windows), "
                       f"got --data {name}")
    if name != "mnist1d" and _given(args, "num_samples") is not None:
        raise CliError(f"--num-samples has no effect with --data {name}: it sets how many MNIST-1D examples are "
                       f"generated (use it with --data mnist1d)")
    if name in _OWN_SPLIT:
        for flag in ("test_fraction", "split_seed"):
            if _given(args, flag) is not None:
                raise CliError(f"--{flag.replace('_', '-')} has no effect with --data {name}: it brings its own "
                               f"held-out part (the flag splits digits or an .npz without x_test)")


def check_flags(args, config, data) -> None:
    """Refuse (``CliError``) every flag of ``args`` that has no effect with ``config`` and ``data``."""
    if getattr(args, "allow_code_change", False) and not getattr(args, "resume", None):
        raise CliError("--allow-code-change has no effect without --resume (it lets a resume run on changed code)")
    _check_family(args, config, data)
    _check_data_flags(args, config, data)
    if not config.iid and config.noniid_split == "speaker" and _given(args, "alpha") is not None:
        raise CliError(f"--alpha {_given(args, 'alpha')} has no effect with --noniid-split speaker: each worker "
                       f"gets whole speakers, no Dirichlet proportions (drop --alpha, or use --noniid-split topic)")
    threads, cores = _given(args, "threads"), usable_cores()
    if threads is not None and threads > cores:
        raise CliError(f"--threads {threads} is more than the {cores} cores this process may use; the extra threads "
                       f"would only wait for a core (use --threads {cores} or fewer)")
    warmup = _given(args, "warmup_steps")
    if warmup is not None and warmup > config.total_steps:
        raise CliError(f"--warmup-steps {warmup} is more than the run's {config.total_steps:,} steps per worker "
                       f"(rounds x H): the cosine decay would never start (use at most {config.total_steps:,}, "
                       f"or more --rounds)")
    every = _given(args, "checkpoint_every")
    if every is not None and every > config.rounds:
        raise CliError(f"--checkpoint-every {every} is more than the run's {config.rounds:,} rounds, so no round "
                       f"reaches it (use at most {config.rounds:,}; --checkpoint-every {config.rounds:,} keeps only "
                       f"the last round's)")
    batch = _given(args, "batch_size")
    shard = len(data.y_train) // max(config.num_workers, 1)
    if batch is not None and shard and batch > shard:
        raise CliError(f"--batch-size {batch} is larger than a worker's shard ({shard:,} examples: "
                       f"{len(data.y_train):,} training examples / K={config.num_workers}); its batches would "
                       f"repeat examples instead of growing (use --batch-size {shard} or less, or fewer workers)")
