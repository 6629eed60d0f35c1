"""Checking a checkpoint's files: the format, the manifest's checksum and fields, the arrays.

``diloco.tools.runs.checkpoint.load_checkpoint`` reads a checkpoint through these helpers:
``read_manifest`` refuses a manifest that is not valid JSON, of another format or
version, whose own SHA-256 (``manifest_sha256``, see ``manifest_digest``) does not
match, or whose fields are missing or of the wrong type; ``read_arrays`` checks the
``.npz`` entries' names, dtypes, shapes and sizes against the manifest before loading
them, and refuses NaN or Inf. ``config_changes`` names what differs between two configs.
Every refusal is a ``CheckpointError`` naming the file. ``FORMAT``, ``FORMAT_VERSION``,
``CheckpointError`` and ``config_changes`` are re-exported by ``diloco.tools.runs.checkpoint``.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.data import npy_header

__all__ = ["FORMAT", "FORMAT_VERSION", "CheckpointError", "config_changes"]

FORMAT = "diloco-checkpoint"
FORMAT_VERSION = 1


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the reason."""


def manifest_digest(manifest: dict) -> str:
    """SHA-256 of the manifest's content without its own checksum (canonical JSON)."""
    content = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True, allow_nan=False).encode()).hexdigest()


def config_changes(old: DiLoCoConfig, new: DiLoCoConfig) -> list[str]:
    """``"field old -> new"`` for every field that differs (``inner.lr`` style for AdamW's)."""
    before, after = old.to_dict(), new.to_dict()
    inner_before, inner_after = before.pop("inner"), after.pop("inner")
    changes = [f"{key} {before.get(key)!r} -> {after[key]!r}" for key in after if before.get(key) != after[key]]
    changes += [f"inner.{key} {inner_before.get(key)!r} -> {inner_after[key]!r}" for key in inner_after
                if inner_before.get(key) != inner_after[key]]
    return changes


def read_manifest(path: Path) -> dict:
    def refuse(why: str):
        return CheckpointError(f"checkpoint {path} refused: {why}")

    if not path.is_file():
        raise refuse("the manifest is missing")
    try:
        manifest = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise refuse(f"corrupted or truncated manifest, not valid JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise refuse(f"not a diloco checkpoint manifest (no \"format\": \"{FORMAT}\")")
    if manifest.get("version") != FORMAT_VERSION:
        raise refuse(f"wrong format version {manifest.get('version')!r}; this diloco reads version "
                     f"{FORMAT_VERSION}")
    try:
        intact = manifest.get("manifest_sha256") == manifest_digest(manifest)
    except (TypeError, ValueError):  # a value JSON cannot hold again (NaN): not what save_checkpoint wrote
        intact = False
    if not intact:
        raise refuse("corrupted manifest: its SHA-256 (manifest_sha256) does not match its content")
    expected_types = {"algo": str, "round": int, "config": dict, "data_fingerprint": str, "worker_steps": list,
                      "has_outer_state": bool, "outer_step": int, "has_second_moment": bool,
                      "has_worker_starts": bool, "rng": dict, "arrays": dict, "npz": str, "npz_bytes": int,
                      "sha256": str, "history": list}
    for key, kind in expected_types.items():
        if not isinstance(manifest.get(key), kind) or (kind is int and isinstance(manifest.get(key), bool)):
            raise refuse(f"corrupted manifest: field {key!r} missing or not a {kind.__name__}")
    if "/" in manifest["npz"] or "\\" in manifest["npz"] or manifest["npz"].startswith("."):
        raise refuse(f"corrupted manifest: data file name {manifest['npz']!r}")
    return manifest


def read_arrays(npz_path: Path, manifest: dict, dtype: str, refuse) -> dict:
    """The arrays of the ``.npz``, after checking names, headers and sizes against the manifest."""
    declared = manifest["arrays"]
    try:
        with zipfile.ZipFile(npz_path) as archive:
            members = {info.filename: info for info in archive.infolist()}
            expected = {f"{name}.npy" for name in declared}
            if set(members) != expected:
                extra, missing = sorted(set(members) - expected), sorted(expected - set(members))
                raise refuse(f"wrong arrays in {npz_path.name}: unexpected {extra}, missing {missing}")
            for name, spec in declared.items():
                with archive.open(f"{name}.npy") as handle:
                    shape, array_dtype = npy_header(handle)
                if array_dtype.hasobject or str(array_dtype) != dtype:
                    raise refuse(f"array {name!r} has dtype {array_dtype}, the config says {dtype}")
                if list(shape) != spec.get("shape"):
                    raise refuse(f"array {name!r} has shape {shape}, the manifest says {spec.get('shape')}")
                if int(np.prod(shape, dtype=np.float64)) * array_dtype.itemsize > members[f"{name}.npy"].file_size:
                    raise refuse(f"array {name!r} declares shape {shape}, more than its {npz_path.name} entry holds")
        with np.load(npz_path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in declared}
    except CheckpointError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise refuse(f"corrupted {npz_path.name} ({exc})") from None
    for name, value in arrays.items():
        if not np.isfinite(value).all():
            raise refuse(f"array {name!r} holds NaN or Inf; a checkpoint is only written after a finite round")
    return arrays
