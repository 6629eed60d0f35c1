"""Checkpoints: everything a run needs to continue bit-identically after a crash.

A checkpoint taken after round ``r`` is two files in a checkpoint folder::

    <algo>-round000004.npz    the arrays (np.savez, no pickles)
    <algo>-round000004.json   the manifest, written last

The ``.npz`` holds the global params (``params.W1``, ...), DiLoCo's outer state
(``outer.momentum.W1``, ..., and for outer Adam ``outer.second_moment.W1``, ...), every
worker's AdamW moments (``worker3.m.W1``, ``worker3.v.W1``, ...; the baseline has one
shared state, ``worker0``; every inner optimizer's state in its stored form, its registry
entry's ``to_moments`` (``diloco.core.inner``): Muon's matrices' momentum and SGD's buffer
under ``m``, zeros under ``v``)
and, when outer gradients can be dropped
(``config.drop_prob > 0``), where each worker starts its next round (``start3.W1``, ...).
The manifest holds the format version, the algorithm, the round, the config, a
fingerprint of the data, every AdamW step count and the outer step count, the run
generator's state, the history so far, each array's shape and dtype, and the SHA-256 and
size of the ``.npz``.

The run generator's state is two things. ``bit_generator.state`` is the stream's
position, but ``Generator.spawn`` (one call per round) does not move it: it counts
children in the ``SeedSequence`` (``n_children_spawned``), and the next spawn's streams
depend on that count. Both are saved and restored, so the workers of round ``r + 1``
draw the batches they would have drawn without the interruption.

Both files are written atomically (``diloco.tools.runs.folders.atomic_write_bytes``), the
manifest only once the arrays are on disk, so a kill at any moment leaves the previous
checkpoint intact and the new one either complete or without a manifest (ignored, and
removed by the next save). An error or a signal (``KeyboardInterrupt``) in the middle of
a write removes what it had written: the temporary file and arrays without a manifest.
The newest ``keep`` checkpoints are kept. ``load_checkpoint`` refuses, with
``CheckpointError`` saying which file and why, a checkpoint that is truncated,
corrupted, of another format version, or made with another config, data or algorithm;
it never changes a file.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import numpy as np

from diloco.adamw import AdamWState
from diloco.config import DiLoCoConfig
from diloco.core.inner import inner_optimizer
from diloco.core.model_seam import parameter_keys, with_model_defaults
from diloco.outer import OuterState
from diloco.tools.runs.checkpoint_extra import pack_extra, unpack_extra
from diloco.tools.runs.checkpoint_records import data_fingerprint, generator_state, restore_generator
from diloco.tools.runs.checkpoint_verify import (
    FORMAT,
    FORMAT_VERSION,
    CheckpointError,
    config_changes,
    manifest_digest,
    read_arrays,
    read_manifest,
)
from diloco.tools.runs.folders import atomic_write_bytes, atomic_write_text, npz_bytes

__all__ = [
    "FORMAT", "FORMAT_VERSION", "CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint",
    "list_checkpoints", "latest_checkpoint", "config_changes", "data_fingerprint", "generator_state",
    "restore_generator",
]

_NAME = re.compile(r"^(?P<algo>[a-z]+)-round(?P<round>\d{6,})\.json$")


class Checkpoint(NamedTuple):
    """A loaded checkpoint: the state of a run after ``round`` rounds.

    Attributes
    ----------
    algo : "diloco" or "sync"
    round : int
        Rounds completed (``inner_steps`` steps each for the baseline).
    config : DiLoCoConfig
    params : dict of str -> ndarray
        The global parameters after ``round`` rounds.
    outer_state : OuterState or None
        DiLoCo's outer optimizer state; None for the baseline.
    worker_states : list of AdamWState
        K states for DiLoCo (carried across rounds), one shared state for the baseline.
    worker_starts : list of K dicts, or None
        DiLoCo with ``config.drop_prob > 0``: the params each worker starts its next round
        from (its own, if its outer gradient was dropped); None otherwise.
    rng : numpy.random.Generator
        The run generator, positioned for round ``round + 1``.
    history : list of dict
        The ``round`` records so far (``RoundRecord`` fields).
    data_fingerprint : str
    path : pathlib.Path
        The manifest.
    extra : dict or None
        The family's state (``diloco.tools.runs.checkpoint_extra``): error-feedback residuals,
        fragments still to merge, eager outer copies; ``{}`` when there is none.
    """

    algo: str
    round: int
    config: DiLoCoConfig
    params: dict
    outer_state: OuterState | None
    worker_states: list
    worker_starts: list | None
    rng: np.random.Generator
    history: list
    data_fingerprint: str
    path: Path
    extra: dict | None = None


# --- writing ---------------------------------------------------------------------------------

def _check_algo(algo) -> str:
    if algo not in ("diloco", "sync"):
        raise ValueError(f"algo must be 'diloco' or 'sync', got {algo!r}")
    return algo


def _stem(algo: str, round_index: int) -> str:
    return f"{algo}-round{round_index:06d}"


def list_checkpoints(directory, algo: str) -> list[Path]:
    """The manifests of ``algo`` in ``directory``, oldest round first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match and match["algo"] == algo:
            found.append((int(match["round"]), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(directory, algo: str) -> Path | None:
    """The newest manifest of ``algo`` in ``directory``, or None."""
    found = list_checkpoints(directory, _check_algo(algo))
    return found[-1] if found else None


def save_checkpoint(directory, algo: str, round_index: int, config: DiLoCoConfig, params, outer_state,
                    worker_states, rng, history, fingerprint: str, *, worker_starts=None, extra=None,
                    keep: int = 2) -> Path:
    """Write the checkpoint after ``round_index`` rounds; return its manifest.

    The ``.npz`` is written (atomically) first, then the manifest, which carries its own
SHA-256 besides the ``.npz``'s; only then are older
    checkpoints beyond the newest ``keep`` removed, and leftover temporary files of an
    earlier crash with them.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _check_algo(algo)
    arrays = _state_arrays(config, params, outer_state, worker_states, worker_starts)
    extra_arrays, extra_meta = pack_extra(extra or {})
    arrays.update(extra_arrays)
    blob = npz_bytes(arrays)
    stem = _stem(algo, round_index)
    manifest = {
        "format": FORMAT, "version": FORMAT_VERSION, "algo": algo, "round": int(round_index),
        "created": datetime.now().isoformat(timespec="seconds"),
        "config": config.to_dict(), "data_fingerprint": fingerprint,
        "worker_steps": [int(state.step) for state in worker_states],
        "has_outer_state": outer_state is not None,
        "outer_step": int(outer_state.step) if outer_state is not None else 0,
        "has_second_moment": outer_state is not None and outer_state.second_moment is not None,
        "has_worker_starts": worker_starts is not None,
        "extra": extra_meta,
        "rng": generator_state(rng),
        "arrays": {name: {"shape": list(value.shape), "dtype": str(value.dtype)} for name, value in arrays.items()},
        "npz": f"{stem}.npz", "npz_bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
        "history": history,
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
    manifest_path = directory / f"{stem}.json"
    text = json.dumps(manifest, indent=1, allow_nan=False) + "\n"
    _write_pair(directory / f"{stem}.npz", blob, manifest_path, text)
    _prune(directory, algo, keep)
    return manifest_path


def _prefixed(prefix: str, group: dict) -> dict:
    return {f"{prefix}{key}": value for key, value in group.items()}


def _state_arrays(config: DiLoCoConfig, params: dict, outer_state, worker_states, worker_starts) -> dict:
    """The ``.npz`` entries: params, outer state, each worker's stored ``(m, v)`` and start."""
    arrays = _prefixed("params.", params)
    if outer_state is not None:
        arrays.update(_prefixed("outer.momentum.", outer_state.momentum))
        if outer_state.second_moment is not None:
            arrays.update(_prefixed("outer.second_moment.", outer_state.second_moment))
    for worker, state in enumerate(worker_states):
        state = inner_optimizer(config).to_moments(state, params)  # the stored form (AdamW's own state)
        arrays.update(_prefixed(f"worker{worker}.m.", state.m))
        arrays.update(_prefixed(f"worker{worker}.v.", state.v))
    for worker, start in enumerate(worker_starts or []):
        arrays.update(_prefixed(f"start{worker}.", start))
    return arrays


def _write_pair(npz_path: Path, blob: bytes, manifest_path: Path, text: str) -> None:
    """The arrays, then the manifest; an error or a signal between them (or during the
    manifest) removes the new arrays again, so no file without its manifest is left."""
    had_arrays = npz_path.exists()  # the same round written again (an interrupt's save): keep the old pair
    atomic_write_bytes(npz_path, blob)
    try:
        atomic_write_text(manifest_path, text)
    except BaseException:
        if not had_arrays:
            npz_path.unlink(missing_ok=True)
        raise


def _prune(directory: Path, algo: str, keep: int) -> None:
    for old in list_checkpoints(directory, algo)[:-keep]:
        old.unlink(missing_ok=True)
        old.with_suffix(".npz").unlink(missing_ok=True)
    manifests = {p.with_suffix(".npz") for p in list_checkpoints(directory, algo)}
    for path in directory.glob(f"{algo}-round*.npz"):
        if path not in manifests:  # arrays whose manifest never got written (a kill in between)
            path.unlink(missing_ok=True)
    for path in directory.glob(f".{algo}-round*.tmp"):  # a kill in the middle of a write
        path.unlink(missing_ok=True)


# --- reading ---------------------------------------------------------------------------------

def _group(arrays: dict, prefix: str) -> dict:
    return {name[len(prefix):]: value for name, value in arrays.items() if name.startswith(prefix)}


def load_checkpoint(path, *, algo: str | None = None, config: DiLoCoConfig | None = None,
                    fingerprint: str | None = None) -> Checkpoint:
    """Read and verify a checkpoint (its manifest ``path``, or a folder: the newest of ``algo``).

    Parameters
    ----------
    path : path of a ``<algo>-roundNNNNNN.json`` manifest, or of a checkpoint folder
    algo, config, fingerprint : optional
        What the checkpoint must have been made by: this algorithm, this exact config and
        this data (``data_fingerprint``). ``algo`` is required with a folder.

    Returns
    -------
    Checkpoint

    Raises
    ------
    CheckpointError (a ValueError)
        No checkpoint, a truncated or corrupted file, another format version, or another
        algorithm, config or data; the message names the file and says why. Nothing is
        changed on disk.
    """
    path = _manifest_path(Path(path), algo)
    refuse = _refuser(path)
    manifest = read_manifest(path)
    saved_config = _check_origin(manifest, refuse, algo, config, fingerprint)
    arrays = _read_data_file(path, manifest, saved_config, refuse)
    _check_counts(manifest, saved_config, refuse)
    params = _group(arrays, "params.")
    worker_states, outer_state, worker_starts = _read_states(arrays, manifest, params, saved_config, refuse)
    rng, extra = _read_run_state(arrays, manifest, refuse)
    return Checkpoint(manifest["algo"], manifest["round"], saved_config, params, outer_state, worker_states,
                      worker_starts, rng, manifest["history"], manifest["data_fingerprint"], path, extra)


def _manifest_path(path: Path, algo: str | None) -> Path:
    """``path`` itself, or the newest manifest of ``algo`` when ``path`` is a folder."""
    if not path.is_dir():
        return path
    if algo is None:
        raise ValueError("algo is required to pick a checkpoint from a folder")
    found = latest_checkpoint(path, algo)
    if found is None:
        raise CheckpointError(f"no {algo} checkpoint in {path}")
    return found


def _refuser(path: Path):
    def refuse(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path} refused: {why}")
    return refuse


def _check_origin(manifest: dict, refuse, algo, config, fingerprint) -> DiLoCoConfig:
    """The saved config, once the algorithm, config and data are the ones the caller asks for."""
    if algo is not None and manifest["algo"] != algo:
        raise refuse(f"it is a {manifest['algo']!r} checkpoint, not {algo!r}")
    _check_algo(manifest["algo"])
    try:
        saved_config = DiLoCoConfig.from_dict(manifest["config"])
    except (TypeError, ValueError) as exc:
        raise refuse(f"corrupted manifest: invalid config ({exc})") from None
    if config is not None:
        changes = config_changes(saved_config, config)
        if changes:
            raise refuse("made with another config (checkpoint -> this run): " + "; ".join(changes))
    if fingerprint is not None and manifest["data_fingerprint"] != fingerprint:
        raise refuse("made on other data (the data fingerprint differs)")
    return saved_config


def _read_data_file(path: Path, manifest: dict, saved_config: DiLoCoConfig, refuse) -> dict:
    """The ``.npz``'s arrays, once the file is there whole: its size and SHA-256 the manifest's."""
    npz_path = path.with_name(manifest["npz"])
    if not npz_path.is_file():
        raise refuse(f"truncated: its data file {npz_path.name} is missing")
    blob = npz_path.read_bytes()
    if len(blob) != manifest["npz_bytes"]:
        raise refuse(f"truncated: {npz_path.name} holds {len(blob)} bytes, the manifest says {manifest['npz_bytes']}")
    if hashlib.sha256(blob).hexdigest() != manifest["sha256"]:
        raise refuse(f"corrupted: the SHA-256 of {npz_path.name} does not match the manifest")
    return read_arrays(npz_path, manifest, saved_config.dtype, refuse)


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_counts(manifest: dict, saved_config: DiLoCoConfig, refuse) -> None:
    """The round, the step counts and the history agree with each other and the config."""
    round_index, steps = manifest["round"], manifest["worker_steps"]
    num_states = saved_config.num_workers if manifest["algo"] == "diloco" else 1
    if not 0 < round_index <= saved_config.rounds:
        raise refuse(f"corrupted manifest: round {round_index} outside 1..{saved_config.rounds}")
    if len(steps) != num_states or not all(_is_count(step) for step in steps):
        raise refuse(f"corrupted manifest: worker_steps must be {num_states} non-negative ints")
    if manifest["outer_step"] < 0:
        raise refuse("corrupted manifest: outer_step must be a non-negative int")
    if len(manifest["history"]) != round_index or not all(isinstance(r, dict) for r in manifest["history"]):
        raise refuse(f"corrupted manifest: the history must hold {round_index} records")


def _read_states(arrays: dict, manifest: dict, params: dict, saved_config: DiLoCoConfig, refuse):
    """The workers' inner states, the outer state and the workers' starts, each laid out as the params."""
    layout = parameter_keys(saved_config)
    if list(params) != layout:
        raise refuse(f"the params must be {layout}, got {list(params)}")
    steps = manifest["worker_steps"]
    worker_states = [AdamWState(step, _group(arrays, f"worker{worker}.m."), _group(arrays, f"worker{worker}.v."))
                     for worker, step in enumerate(steps)]
    groups = [s.m for s in worker_states] + [s.v for s in worker_states]
    outer_state = None
    if manifest["has_outer_state"]:
        second = _group(arrays, "outer.second_moment.") if manifest["has_second_moment"] else None
        outer_state = OuterState(_group(arrays, "outer.momentum."), second, manifest["outer_step"])
        groups += [outer_state.momentum] + ([second] if second is not None else [])
    worker_starts = None
    if manifest["has_worker_starts"]:
        worker_starts = [_group(arrays, f"start{worker}.") for worker in range(len(steps))]
        groups += worker_starts
    _check_layout(groups, params, layout, refuse)
    return _inner_states(saved_config, params, worker_states, refuse), outer_state, worker_starts


def _check_layout(groups: list, params: dict, layout: list, refuse) -> None:
    """Every state group has the params' keys, in their order, and their shapes."""
    for group in groups:
        if list(group) != layout or any(group[key].shape != params[key].shape for key in layout):
            raise refuse("an optimizer state's keys or shapes do not match the params'")


def _inner_states(saved_config: DiLoCoConfig, params: dict, stored: list, refuse) -> list:
    """The stored ``(m, v)`` form back into the inner optimizer's own states."""
    try:
        fixed = with_model_defaults(saved_config, params)  # as prepare_training fixes it (Muon's matrices)
        return [inner_optimizer(fixed).from_moments(state, fixed) for state in stored]
    except ValueError as exc:
        raise refuse(f"the {saved_config.inner_optimizer} states do not fit the params ({exc})") from None


def _read_run_state(arrays: dict, manifest: dict, refuse):
    """The run generator, positioned for the next round, and the family's state."""
    try:
        rng = restore_generator(manifest["rng"])
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise refuse(f"corrupted manifest: the generator state cannot be restored ({exc})") from None
    try:
        extra = unpack_extra(arrays, manifest.get("extra"))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise refuse(f"corrupted manifest: the family's state cannot be read ({exc})") from None
    return rng, extra
