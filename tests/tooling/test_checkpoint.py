"""Checkpoints (diloco.tools.runs.checkpoint): exact round trip, generator state, atomic writes,
and refusal of every damaged or foreign checkpoint, with nothing changed on disk."""

from __future__ import annotations

import hashlib
import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from diloco import DiLoCoConfig
from diloco.adamw import AdamWState
from diloco.outer import OuterState
from diloco.tools.runs import checkpoint as ckpt
from diloco.tools.runs.checkpoint import (
    CheckpointError,
    data_fingerprint,
    generator_state,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    restore_generator,
    save_checkpoint,
)

CONFIG = DiLoCoConfig(num_workers=2, inner_steps=2, rounds=5, hidden_sizes=(3,), batch_size=4)
FINGERPRINT = data_fingerprint(np.arange(6.0).reshape(3, 2), np.array([0, 1, 0]))


def random_params(rng, dtype=np.float64) -> dict:
    shapes = {"W1": (2, 3), "b1": (3,), "W2": (3, 2), "b2": (2,)}
    return {key: rng.standard_normal(shape).astype(dtype) for key, shape in shapes.items()}


def write(directory, round_index=1, *, algo="diloco", config=CONFIG, seed=0, history=None):
    """A checkpoint of random states; returns (manifest path, what was saved)."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(config.dtype)
    params = random_params(rng, dtype)
    outer = OuterState(random_params(rng, dtype)) if algo == "diloco" else None
    states = [AdamWState(7 + k, random_params(rng, dtype), {key: v**2 for key, v in random_params(rng, dtype).items()})
              for k in range(config.num_workers if algo == "diloco" else 1)]
    run_rng = np.random.default_rng(1234)
    run_rng.standard_normal(3)
    run_rng.spawn(2 * round_index)
    history = history if history is not None else [{"round": r, "inner_loss": 0.1 * r} for r in
                                                   range(1, round_index + 1)]
    path = save_checkpoint(directory, algo, round_index, config, params, outer, states, run_rng, history,
                           FINGERPRINT)
    return path, dict(params=params, outer=outer, states=states, rng=run_rng, history=history)


def snapshot(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# --- generators ----------------------------------------------------------------------------

def test_restored_generator_spawns_the_same_children_and_draws_the_same_numbers():
    rng = np.random.default_rng(7)
    rng.standard_normal(5)
    rng.spawn(3)
    record = json.loads(json.dumps(generator_state(rng)))  # it survives JSON
    again = restore_generator(record)
    for a, b in zip(rng.spawn(4), again.spawn(4), strict=True):
        assert np.array_equal(a.standard_normal(8), b.standard_normal(8))
    assert np.array_equal(rng.integers(0, 2**62, 6), again.integers(0, 2**62, 6))


def test_the_spawn_count_is_what_bit_generator_state_misses():
    """Why the seed sequence is saved: spawning does not change ``bit_generator.state``,
    yet the next round's worker streams depend on how many children were spawned."""
    rng = np.random.default_rng(7)
    before = rng.bit_generator.state
    rng.spawn(3)
    assert rng.bit_generator.state == before
    naive = np.random.default_rng(7)
    naive.bit_generator.state = rng.bit_generator.state  # the stream position alone
    restored = restore_generator(generator_state(rng))
    assert not np.array_equal(naive.spawn(1)[0].random(4), restored.spawn(1)[0].random(4))


@pytest.mark.parametrize("name", ["MT19937", "Philox", "SFC64", "PCG64DXSM"])
def test_other_bit_generators_round_trip(name):
    rng = np.random.Generator(getattr(np.random, name)(5))
    rng.random(3)
    rng.spawn(2)
    again = restore_generator(json.loads(json.dumps(generator_state(rng))))
    assert np.array_equal(rng.random(5), again.random(5))
    assert np.array_equal(rng.spawn(1)[0].random(3), again.spawn(1)[0].random(3))


# --- round trip ----------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ["diloco", "sync"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_round_trip_is_exact(tmp_path, algo, dtype):
    config = CONFIG.replace(dtype=dtype)
    path, saved = write(tmp_path, 3, algo=algo, config=config)
    loaded = load_checkpoint(path, algo=algo, config=config, fingerprint=FINGERPRINT)
    assert (loaded.algo, loaded.round, loaded.config, loaded.history) == (algo, 3, config, saved["history"])
    for key, value in saved["params"].items():
        assert loaded.params[key].dtype == value.dtype and np.array_equal(loaded.params[key], value)
    assert [s.step for s in loaded.worker_states] == [s.step for s in saved["states"]]
    for got, want in zip(loaded.worker_states, saved["states"], strict=True):
        assert all(np.array_equal(got.m[k], want.m[k]) and np.array_equal(got.v[k], want.v[k]) for k in want.m)
    if algo == "diloco":
        assert all(np.array_equal(loaded.outer_state.momentum[k], saved["outer"].momentum[k]) for k in want.m)
    else:
        assert loaded.outer_state is None
    assert np.array_equal(loaded.rng.spawn(2)[1].random(3), saved["rng"].spawn(2)[1].random(3))
    assert load_checkpoint(tmp_path, algo=algo).round == 3  # a folder: its newest checkpoint


def test_only_the_newest_two_are_kept_and_leftovers_are_cleaned(tmp_path):
    (tmp_path / ".diloco-round000009.npz.x1y2.tmp").write_bytes(b"half")  # a kill mid-write
    (tmp_path / "diloco-round000004.npz").write_bytes(b"arrays without a manifest")
    for round_index in (1, 2, 3):
        write(tmp_path, round_index)
    write(tmp_path, 1, algo="sync")
    assert [p.name for p in list_checkpoints(tmp_path, "diloco")] == ["diloco-round000002.json",
                                                                      "diloco-round000003.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "diloco-round000002.json", "diloco-round000002.npz", "diloco-round000003.json", "diloco-round000003.npz",
        "sync-round000001.json", "sync-round000001.npz"]
    assert latest_checkpoint(tmp_path, "diloco").name == "diloco-round000003.json"


def test_a_failed_write_keeps_the_previous_checkpoint_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    write(tmp_path, 1)
    before = snapshot(tmp_path)
    real_fsync = os.fsync

    def full_disk(fd):
        if ".json." in os.readlink(f"/proc/self/fd/{fd}"):  # the manifest: its arrays are already in place
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write(tmp_path, 2)
    monkeypatch.undo()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert latest_checkpoint(tmp_path, "diloco").name == "diloco-round000001.json"
    assert load_checkpoint(tmp_path, algo="diloco").round == 1
    for name, data in before.items():
        assert (tmp_path / name).read_bytes() == data


# --- refusals ------------------------------------------------------------------------------

def _rewrite_npz(manifest_path: Path, arrays: dict, declared=None) -> None:
    """Replace the .npz by ``arrays`` and make the manifest's size and checksum match it."""
    manifest = json.loads(manifest_path.read_text())
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    blob = buffer.getvalue()
    (manifest_path.parent / manifest["npz"]).write_bytes(blob)
    manifest.update(npz_bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    if declared is not None:
        manifest["arrays"] = declared
    _write_forged(manifest_path, manifest)


def _write_forged(path: Path, manifest: dict) -> None:
    """A manifest whose own checksum is recomputed: what a hostile file, not a damaged one, looks like.
    The deeper checks must refuse it anyway."""
    manifest["manifest_sha256"] = ckpt.manifest_digest(manifest)
    path.write_text(json.dumps(manifest))


def _edit_manifest(path: Path, **changes) -> None:
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    _write_forged(path, manifest)


def _damage_manifest(path: Path) -> None:
    """One digit of the history changed, the manifest otherwise valid JSON: a bit flip on disk."""
    text = path.read_text()
    position = text.index('"inner_loss": 0.') + len('"inner_loss": 0.')
    path.write_text(text[:position] + ("7" if text[position] != "7" else "8") + text[position + 1:])


def _npz_arrays(path: Path) -> dict:
    with np.load(path.with_suffix(".npz")) as archive:
        return {name: archive[name] for name in archive.files}


def _huge_header(path: Path) -> None:
    """An entry whose header declares 10**12 values (8 TB) while holding 48 bytes."""
    npz = path.with_suffix(".npz")
    arrays = _npz_arrays(path)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, value in arrays.items():
            member = io.BytesIO()
            if name == "params.W1":
                header = {"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**6)}
                np.lib.format.write_array_header_1_0(member, header)
                member.write(value.tobytes())
            else:
                np.lib.format.write_array(member, value)
            archive.writestr(f"{name}.npy", member.getvalue())
    blob = buffer.getvalue()
    npz.write_bytes(blob)
    manifest = json.loads(path.read_text())
    manifest["arrays"]["params.W1"]["shape"] = [10**6, 10**6]
    manifest.update(npz_bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    _write_forged(path, manifest)


def _rewrite_declared(manifest_path: Path, arrays: dict) -> None:
    """Replace the .npz by ``arrays`` and declare them in the manifest, so only the deeper checks see it."""
    declared = {name: {"shape": list(value.shape), "dtype": str(value.dtype)} for name, value in arrays.items()}
    _rewrite_npz(manifest_path, arrays, declared)


DAMAGE = {
    "truncated npz": (lambda p: p.with_suffix(".npz").write_bytes(p.with_suffix(".npz").read_bytes()[:-100]),
                      "truncated: diloco-round000002.npz holds"),
    "missing npz": (lambda p: p.with_suffix(".npz").unlink(), "truncated: its data file diloco-round000002.npz is "
                                                              "missing"),
    "flipped byte": (lambda p: p.with_suffix(".npz").write_bytes(
        (lambda b: b[:200] + bytes([b[200] ^ 1]) + b[201:])(p.with_suffix(".npz").read_bytes())),
        "corrupted: the SHA-256 of diloco-round000002.npz does not match"),
    "truncated manifest": (lambda p: p.write_text(p.read_text()[:50]), "corrupted or truncated manifest"),
    "a changed digit in the manifest": (_damage_manifest, "its SHA-256 (manifest_sha256) does not match its content"),
    "not a manifest": (lambda p: p.write_text("[1, 2]"), "not a diloco checkpoint manifest"),
    "wrong version": (lambda p: _edit_manifest(p, version=99), "wrong format version 99; this diloco reads version 1"),
    "no version": (lambda p: _edit_manifest(p, version=None), "wrong format version None"),
    "bad round": (lambda p: _edit_manifest(p, round="2"), "field 'round' missing or not a int"),
    "round past the end": (lambda p: _edit_manifest(p, round=99), "round 99 outside 1..5"),
    "bad steps": (lambda p: _edit_manifest(p, worker_steps=[1]), "worker_steps must be 2 non-negative ints"),
    "short history": (lambda p: _edit_manifest(p, history=[]), "the history must hold 2 records"),
    "history of numbers": (lambda p: _edit_manifest(p, history=[1, 2]), "the history must hold 2 records"),
    "negative step": (lambda p: _edit_manifest(p, worker_steps=[1, -1]), "worker_steps must be 2 non-negative ints"),
    "a step that is a bool": (lambda p: _edit_manifest(p, worker_steps=[True, 1]),
                              "worker_steps must be 2 non-negative ints"),
    "negative outer step": (lambda p: _edit_manifest(p, outer_step=-1), "outer_step must be a non-negative int"),
    "bad family state": (lambda p: _edit_manifest(p, extra={"pending": [{"step": 1}]}),
                         "the family's state cannot be read"),
    "params of another layout": (lambda p: _rewrite_declared(
        p, {k: v for k, v in _npz_arrays(p).items() if not k.endswith(".b2")}), "the params must be"),
    "a state of another shape": (lambda p: _rewrite_declared(p, {**_npz_arrays(p), "worker1.m.W1": np.zeros((2, 2))}),
                                 "an optimizer state's keys or shapes do not match the params'"),
    "an outer state without a key": (lambda p: _rewrite_declared(
        p, {k: v for k, v in _npz_arrays(p).items() if k != "outer.momentum.b1"}),
        "an optimizer state's keys or shapes do not match the params'"),
    "bad config": (lambda p: _edit_manifest(p, config={"rounds": -1}), "invalid config"),
    "escaping path": (lambda p: _edit_manifest(p, npz="../elsewhere.npz"), "data file name '../elsewhere.npz'"),
    "bad generator": (lambda p: _edit_manifest(p, rng={"bit_generator": "os.system"}),
                      "the generator state cannot be restored"),
    "object array": (lambda p: _rewrite_npz(p, {**_npz_arrays(p), "params.W1": np.array([{"a": 1}], dtype=object)}),
                     "array 'params.W1' has dtype object, the config says float64"),
    "wrong keys": (lambda p: _rewrite_npz(p, {"evil": np.zeros(2)}), "wrong arrays in diloco-round000002.npz"),
    "wrong dtype": (lambda p: _rewrite_npz(p, {k: v.astype(np.float32) for k, v in _npz_arrays(p).items()}),
                    "has dtype float32, the config says float64"),
    "wrong shape": (lambda p: _rewrite_npz(p, {**_npz_arrays(p), "params.W1": np.zeros((3, 3))}),
                    "array 'params.W1' has shape (3, 3), the manifest says [2, 3]"),
    "huge declared shape": (_huge_header, "declares shape (1000000, 1000000), more than its"),
    "NaN in a state": (lambda p: _rewrite_npz(p, {**_npz_arrays(p), "worker1.v.b2": np.array([np.nan, 1.0])}),
                       "array 'worker1.v.b2' holds NaN or Inf"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_checkpoint_is_refused_saying_which_and_why(tmp_path, damage):
    write(tmp_path, 1)
    path, _ = write(tmp_path, 2)
    apply, message = DAMAGE[damage]
    apply(path)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path, algo="diloco", config=CONFIG, fingerprint=FINGERPRINT)
    text = str(caught.value)
    assert str(path) in text and "refused" in text and message in text, text
    assert snapshot(tmp_path) == before  # nothing changed, not even the damaged files


@pytest.mark.parametrize("kwargs, message", [
    ({"config": CONFIG.replace(rounds=6)}, "made with another config (checkpoint -> this run): rounds 5 -> 6"),
    ({"config": CONFIG.replace(inner={"lr": 0.5})}, "inner.lr 0.001 -> 0.5"),
    ({"fingerprint": data_fingerprint(np.zeros((3, 2)), np.array([0, 1, 0]))}, "made on other data"),
    ({"algo": "sync"}, "it is a 'diloco' checkpoint, not 'sync'"),
])
def test_a_checkpoint_of_another_run_is_refused(tmp_path, kwargs, message):
    path, _ = write(tmp_path, 2)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match="refused") as caught:
        load_checkpoint(path, **kwargs)
    assert message in str(caught.value)
    assert snapshot(tmp_path) == before


def test_an_empty_folder_has_no_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="no sync checkpoint in"):
        load_checkpoint(tmp_path, algo="sync")
    with pytest.raises(ValueError, match="algo is required"):
        load_checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path / "missing", "diloco") is None


def test_fingerprint_sees_dtype_shape_and_values():
    x = np.arange(6.0).reshape(3, 2)
    variants = [x.astype(np.float32), x.reshape(2, 3), x + 1e-12, None]
    prints = {data_fingerprint(x)} | {data_fingerprint(v) for v in variants}
    assert len(prints) == 5
    assert ckpt.data_fingerprint(x, None) != ckpt.data_fingerprint(x)


@pytest.mark.parametrize("array", [np.arange(6.0).reshape(3, 2), np.arange(6.0).reshape(3, 2)[:, ::-1],
                                   np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.zeros((0, 3)), np.array(2.5),
                                   np.arange(4, dtype=">f8"), np.arange(5, dtype=np.float16), np.array([True, False])])
def test_fingerprint_is_the_sha256_of_dtype_shape_and_c_order_bytes(array):
    """What checkpoints store: a checkpoint made before the digest stopped copying the bytes
    (``tobytes``) still matches its data."""
    import hashlib

    contiguous = np.ascontiguousarray(array)
    expected = hashlib.sha256(f"{contiguous.dtype.str}{contiguous.shape};".encode() + contiguous.tobytes()
                              + b"none;").hexdigest()
    assert data_fingerprint(array, None) == expected
