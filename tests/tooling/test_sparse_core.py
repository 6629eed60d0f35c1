"""Sparse outer gradients on the one core: the reduction to DiLoCo, the bytes worked by hand
(recorded, and sent by real MPI ranks), checkpoint and resume with the error-feedback
residuals, the guard, the flags, ``--config`` and bad input.

The model of every test here is the digits MLP with hidden layers (8, 8): tensors of
64 x 8, 8, 8 x 8, 8, 8 x 10 and 10 values.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from resume_helpers import assert_resumes_bit_identical, run_keeping_checkpoints

from diloco import DiLoCoConfig
from diloco.config.sections import CommSpec, FamilyConfig
from diloco.core.comm import all_reduce
from diloco.core.divergence import Diverged
from diloco.core.driver import check_algorithm, train
from diloco.core.hooks import Guard
from diloco.data import load_digits_split
from diloco.methods.sparse import SparseConfig, decode_sparse, encode_sparse, params_from_bytes, params_to_bytes
from diloco.params import average_params, subtract_params

BASE = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=3, hidden_sizes=(8, 8), batch_size=8, seed=1)
SHAPES = [(64, 8), (8,), (8, 8), (8,), (8, 10), (10,)]
SPARSE = {"topk": 0.25, "topk_chunk": 64}
# Per tensor, chunks of 64: kept k_L = ceil(L / 4) per chunk, indices of log2(64) = 6 bits.
#   64x8:  8 chunks of 64 -> 8 x 16 = 128 kept; 128 x 6 bits = 96 bytes of indices
#   8:     one chunk of 8 -> 2 kept; 12 bits -> 2 bytes
#   8x8:   one chunk of 64 -> 16 kept; 96 bits -> 12 bytes
#   8:     2 kept, 2 bytes
#   8x10:  chunks of 64 and 16 -> 16 + 4 = 20 kept; 120 bits -> 15 bytes
#   10:    ceil(2.5) = 3 kept; 18 bits -> 3 bytes
# 171 kept values, 130 bytes of indices.
KEPT, INDEX_BYTES = 128 + 2 + 16 + 2 + 20 + 3, 96 + 2 + 12 + 2 + 15 + 3
# float64 values are whole bytes: 130 + 8 x 171 = 1498 bytes.
FULL_WIDTH_MESSAGE = INDEX_BYTES + 8 * KEPT
# 2-bit: one float64 scale per chunk (8 + 1 + 1 + 1 + 2 + 1 = 14 chunks: 112 bytes), the same
# indices, and codes of 2 bits per tensor: 256, 4, 32, 4, 40, 6 bits -> 32 + 1 + 4 + 1 + 5 + 1 = 44 bytes.
TWO_BIT_MESSAGE = 14 * 8 + INDEX_BYTES + 44


def _digits():
    data = load_digits_split(seed=0)
    return data.x_train[:241], data.y_train[:241], data.x_test[:60], data.y_test[:60]


def _flat(params) -> np.ndarray:
    return np.concatenate([v.ravel() for v in params.values()])


def test_the_bytes_worked_by_hand():
    assert FULL_WIDTH_MESSAGE == 1498 and TWO_BIT_MESSAGE == 286
    x, y, x_eval, y_eval = _digits()
    for family, message in ((SPARSE, FULL_WIDTH_MESSAGE), ({**SPARSE, "topk_bits": 2}, TWO_BIT_MESSAGE)):
        result = train("diloco", x, y, BASE.replace(family=family), x_eval=x_eval, y_eval=y_eval)
        assert [v.shape for v in result.params.values()] == SHAPES
        # the ring all-gather: each of K = 2 workers sends its message to the K - 1 = 1 other
        assert [r["bytes_sent"] for r in result.history] == [float(message)] * 3
        assert result.history[-1]["cumulative_bytes"] == 3.0 * message


def test_the_message_round_trips_and_refuses_a_wrong_length():
    rng = np.random.default_rng(0)
    like = {"w": rng.normal(size=(5, 7)), "b": rng.normal(size=3).astype(np.float32)}
    config = SparseConfig(chunk=8, density=0.3, bits=2)
    payloads = {key: encode_sparse(value, config) for key, value in like.items()}
    message = params_to_bytes(payloads)
    back = params_from_bytes(message, like, config)
    for key in like:
        for got, want in zip(back[key], payloads[key], strict=True):
            assert np.array_equal(np.asarray(got), np.asarray(want)) if isinstance(want, np.ndarray) else got == want
    with pytest.raises(ValueError, match="buffer must be"):
        params_from_bytes(message[:-1], like, config)


def test_full_density_without_quantisation_averages_exactly_diloco_s_pseudo_gradients():
    """At k = 100%, no bits, no transform: every worker's decoded outer gradient is its own
    ``global - theta_k`` bit for bit, so the exchange is DiLoCo's mean of pseudo-gradients
    ``1/K sum_k (theta - theta_k)`` bit for bit (with or without error feedback: the
    residual is exactly 0)."""
    rng = np.random.default_rng(1)
    global_params = {"w": rng.normal(size=(9, 5)), "b": rng.normal(size=5)}
    workers = {k: {key: v + 0.01 * rng.normal(size=v.shape) for key, v in global_params.items()} for k in range(3)}
    want = average_params([subtract_params(global_params, workers[k]) for k in range(3)])
    for feedback in (False, True):
        spec = CommSpec(error_feedback=feedback, topk=1.0, topk_chunk=4)
        ex = all_reduce(workers, spec, {}, global_params=global_params)
        assert all(ex.delta[key].tobytes() == want[key].tobytes() for key in want)
        if feedback:
            assert all(not np.any(r[key]) for r in ex.residuals.values() for key in r)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), workers=st.integers(1, 4), chunk=st.integers(1, 12),
       density=st.sampled_from([0.05, 0.3, 1.0]), bits=st.sampled_from([None, 2]),
       transform=st.sampled_from(["none", "dct"]), decay=st.sampled_from([1.0, 0.5]),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_the_core_exchange_is_the_mean_of_what_was_sent_and_keeps_the_rest(seed, workers, chunk, density, bits,
                                                                          transform, decay, dtype):
    """Through the core's message bytes: the exchanged delta is the mean of the decoded payloads, and
    every worker's sent tensor plus its new residual is ``decay * old + delta_k`` (nothing lost)."""
    rng = np.random.default_rng(seed)
    deltas = {k: {"w": rng.normal(size=(3, 5)).astype(dtype), "b": rng.normal(size=4).astype(dtype)}
              for k in range(workers)}
    old = {k: {key: rng.normal(size=v.shape).astype(v.dtype) for key, v in d.items()} for k, d in deltas.items()}
    spec = CommSpec(error_feedback=True, topk=density, topk_chunk=chunk, topk_bits=bits, topk_transform=transform,
                    topk_decay=decay)
    ex = all_reduce(deltas, spec, old)
    config = SparseConfig(chunk, density, bits, transform, decay)
    sent = {}
    for k in deltas:
        owed = {key: decay * old[k][key] + deltas[k][key] for key in deltas[k]}
        sent[k] = {key: decode_sparse(encode_sparse(value, config)) for key, value in owed.items()}
        for key in owed:
            tol = 1e-5 if dtype == np.float32 else 1e-12
            np.testing.assert_allclose(sent[k][key] + ex.residuals[k][key], owed[key], rtol=tol, atol=tol)
    want = average_params([sent[k] for k in range(workers)])
    for key in want:
        np.testing.assert_array_equal(ex.delta[key], want[key])
    assert ex.bytes_sent == (workers - 1) * ex.payload_bytes


def test_full_density_training_is_diloco_up_to_the_order_of_one_subtraction():
    """DiLoCo's milestone computes ``theta - mean_k theta_k``; a worker can only send its own
    ``theta - theta_k``, so the receivers compute ``mean_k (theta - theta_k)``: the same
    number up to the rounding of one subtraction, at most a few ulp of |theta| (2.2e-16
    each, 4.4e-16 for |theta| < 2) per entry and round. Over 3 rounds the params agree to 1e-14
    absolute (measured: 3.3e-16), the held-out losses to 1e-12 relative."""
    x, y, x_eval, y_eval = _digits()
    plain = train("diloco", x, y, BASE, x_eval=x_eval, y_eval=y_eval)
    for family in ({"topk": 1.0}, {"topk": 1.0, "topk_chunk": 7, "error_feedback": True}):
        sparse = train("diloco", x, y, BASE.replace(family=family), x_eval=x_eval, y_eval=y_eval)
        assert np.max(np.abs(_flat(plain.params))) < 2.0
        np.testing.assert_allclose(_flat(sparse.params), _flat(plain.params), rtol=0, atol=1e-14)
        np.testing.assert_allclose([r["eval_loss"] for r in sparse.history],
                                   [r["eval_loss"] for r in plain.history], rtol=1e-12)
        assert not np.array_equal(_flat(sparse.params), _flat(train(
            "diloco", x, y, BASE.replace(family={**family, "topk": 0.5}), x_eval=x_eval, y_eval=y_eval).params))


RESUMED = [{**SPARSE, "error_feedback": True}, {**SPARSE, "topk_bits": 2, "error_feedback": True},
           {"topk": 0.1, "topk_chunk": 16, "topk_transform": "dct", "error_feedback": True, "topk_decay": 0.9,
            "fragments": 2}]


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("family", RESUMED, ids=[json.dumps(f) for f in RESUMED])
def test_resume_restores_the_error_feedback_residuals_bit_for_bit(family, engine, tmp_path):
    config = BASE.replace(engine=engine, family=family)
    data = _digits()
    want, copies = run_keeping_checkpoints("diloco", data, config, tmp_path)
    with np.load(next(copies[1].glob("*.npz"))) as saved:  # the residuals are in the checkpoint, not zero
        residual_keys = [k for k in saved.files if k.startswith("extra.residual")]
        assert residual_keys and any(np.any(saved[k]) for k in residual_keys), saved.files
    assert_resumes_bit_identical("diloco", data, config, want, copies)


@pytest.mark.parametrize("executor", ["reference", "fast"])
def test_the_guard_stops_a_sparse_run(executor):
    x, y, x_eval, y_eval = _digits()
    config = BASE.replace(inner={"lr": 10.0, "weight_decay": 0.0}, family={**SPARSE, "error_feedback": True})
    with pytest.raises(Diverged):
        train("diloco", x, y, config, x_eval=x_eval, y_eval=y_eval, executor=executor, hooks=[Guard("diloco", 2.0)])


BAD = [
    ({"topk": 0.0}, "FamilyConfig.topk must be"), ({"topk": 1.5}, "FamilyConfig.topk must be"),
    ({"topk": float("nan")}, "FamilyConfig.topk"), ({"topk": "0.1"}, "FamilyConfig.topk"),
    ({"topk": 0.1, "topk_chunk": 0}, "FamilyConfig.topk_chunk"),
    ({"topk": 0.1, "topk_chunk": 2.5}, "FamilyConfig.topk_chunk"),
    ({"topk": 0.1, "topk_bits": 3}, "FamilyConfig.topk_bits must be one of"),
    ({"topk": 0.1, "topk_bits": True}, "FamilyConfig.topk_bits"),
    ({"topk": 0.1, "topk_transform": "fft"}, "FamilyConfig.topk_transform must be one of"),
    ({"topk": 0.1, "topk_transform": "dct"}, "FamilyConfig.topk_chunk must be <= 1024 with topk_transform='dct'"),
    ({"topk": 0.1, "topk_decay": 1.5, "error_feedback": True}, "FamilyConfig.topk_decay"),
    ({"topk": 0.1, "topk_decay": 0.9}, "FamilyConfig.topk_decay=0.9 .* needs error_feedback"),
    ({"topk": 0.1, "comm_dtype": "fp4"}, "cannot be combined with comm_dtype"),
    ({"topk": 0.1, "sign_prune": 0.5}, "cannot be combined with comm_dtype or sign_prune"),
    ({"topk_chunk": 64}, "topk_chunk=64 configure.* set topk too"),
    ({"topk_bits": 2}, "topk_bits=2 configure.* set topk too"),
]


@pytest.mark.parametrize("changes, message", BAD, ids=[json.dumps(c) for c, _ in BAD])
def test_bad_settings_name_the_field(changes, message):
    with pytest.raises((TypeError, ValueError), match=message):
        FamilyConfig(**changes)


def test_the_baseline_refuses_top_k_in_one_line():
    with pytest.raises(ValueError, match="topk=0.25, topk_chunk=64 configure.*DiLoCo only") as caught:
        check_algorithm("sync", BASE.replace(family=SPARSE))
    assert "\n" not in str(caught.value)


def test_the_flags_train_compare_and_config_round_trip(tmp_path, capsys):
    from cli_helpers import TINY_DEEP, only_run_dir, run_cli

    flags = ["--topk", "0.25", "--topk-chunk", "64", "--topk-bits", "2", "--error-feedback", "--topk-decay", "0.9"]
    status, _, err = run_cli(["train", *TINY_DEEP, *flags, "--runs-dir", tmp_path / "a"], capsys)
    assert status == 0, err
    saved = json.loads((only_run_dir(tmp_path / "a") / "config.json").read_text())
    family = saved.get("config", saved)["family"]
    assert (family["topk"], family["topk_chunk"], family["topk_bits"], family["topk_decay"]) == (0.25, 64, 2, 0.9)
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(DiLoCoConfig().replace(family=family).to_dict()))
    assert DiLoCoConfig.from_dict(json.loads(config_file.read_text())).family == FamilyConfig(**family)
    status, _, err = run_cli(["train", *TINY_DEEP, "--config", config_file, "--runs-dir", tmp_path / "b"], capsys)
    assert status == 0, err
    history = [json.loads(line) for line in (only_run_dir(tmp_path / "b") / "history.jsonl").read_text().splitlines()]
    assert history[-1]["bytes_sent"] > 0 and "syncs" in history[-1]
    status, _, err = run_cli(["compare", *TINY_DEEP, *flags, "--runs-dir", tmp_path / "c"], capsys)
    assert status == 0, err


@pytest.mark.parametrize("flags, message", [
    (["--topk", "1.5"], "--topk must be"), (["--topk", "0.1", "--topk-chunk", "0"], "--topk-chunk must be"),
    (["--topk", "0.1", "--topk-bits", "4"], "--topk-bits must be one of"),
    (["--topk", "0.1", "--topk-transform", "dct"], "--topk-chunk must be <= 1024"),
    (["--topk-chunk", "64"], "set topk too"), (["--topk", "0.1", "--comm-block", "8"], "--comm-block 8 has no effect"),
])
def test_bad_flags_are_one_line_and_exit_2(flags, message, tmp_path, capsys):
    from cli_helpers import TINY_DEEP, run_cli

    status, out, err = run_cli(["train", *TINY_DEEP, *flags, "--runs-dir", tmp_path], capsys)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err


# --- MPI: the ranks send exactly the messages' bytes ---

MPI_SCRIPT = """
import json, sys
from mpi4py import MPI
from diloco import DiLoCoConfig
from diloco.core.driver import train
sys.path.insert(0, sys.argv[2])
import test_sparse_core as t

x, y, x_eval, y_eval = t._digits()
out = {}
for name, family in (("full", t.SPARSE), ("2-bit", {**t.SPARSE, "topk_bits": 2, "error_feedback": True})):
    result = train("diloco", x, y, t.BASE.replace(family=family), x_eval=x_eval, y_eval=y_eval, executor="mpi",
                   comm=MPI.COMM_WORLD, timeout=60)
    out[name] = {"mpi": [r["mpi_bytes_sent"] for r in result.history], "record": [r["bytes_sent"] for r in
                 result.history], "params": [v.tobytes().hex() for v in result.params.values()],
                 "outer": [r["mpi_allreduce_bytes"] for r in result.history]}
out = MPI.COMM_WORLD.gather(out)
if MPI.COMM_WORLD.rank == 0:
    json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_real_mpi_ranks_send_exactly_the_encoded_bytes(tmp_path):
    """Per round each of the 2 ranks sends (K - 1) = 1 copy of its message (1,498 or 286
    bytes, worked above) after one 8-byte length word, and one other collective: the round's
    training losses, ``{rank: float64 array of H = 4}`` as a JSON head (written out below)
    and 32 bytes of data, after two 8-byte length words."""
    pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")
    from cli_helpers import mpiexec

    (tmp_path / "run.py").write_text(MPI_SCRIPT, encoding="utf-8")
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "run.py", "out.json", str(Path(__file__).parent)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads((tmp_path / "out.json").read_text())
    x, y, x_eval, y_eval = _digits()
    assert BASE.inner_steps == 4
    for rank, out in enumerate(ranks):
        losses = 16 + len(f'[[{rank}, false, [["", [4], "<f8"]]]]') + 8 * 4
        for name, message in (("full", FULL_WIDTH_MESSAGE), ("2-bit", TWO_BIT_MESSAGE)):
            assert out[name]["record"] == [float(message)] * BASE.rounds
            assert out[name]["outer"] == [message] * BASE.rounds, (rank, name)
            assert out[name]["mpi"] == [8 + message + losses] * BASE.rounds, (rank, name)
    family = {**SPARSE, "topk_bits": 2, "error_feedback": True}
    single = train("diloco", x, y, BASE.replace(family=family), x_eval=x_eval, y_eval=y_eval)
    assert ranks[0]["2-bit"]["params"] == [v.tobytes().hex() for v in single.params.values()]


# --- blind spots (issue 41): each checked by planting the mistake --------------------------------

@pytest.mark.parametrize("n", [1, 7, 16, 100, 128, 1000])
def test_the_kept_count_is_the_exact_ceiling_of_density_times_length(n):
    """``k = min(n, max(1, ceil(p n / 100)))`` at every density p/100, in integers: 0.07 x 100 is
    7.000000000000001 in floating point, and a plain ``ceil`` of it keeps 8 (planted: caught)."""
    from diloco.methods.sparse import kept_per_chunk

    for percent in range(1, 101):
        want = min(n, max(1, -(-percent * n // 100)))
        assert kept_per_chunk(n, SparseConfig(chunk=n, density=percent / 100)).tolist() == [want], (percent, n)


@pytest.mark.parametrize("spec", [CommSpec(comm_dtype="float16"), CommSpec(comm_dtype="int8"),
                                  CommSpec(comm_dtype="bfloat16"), CommSpec(topk=1.0, topk_chunk=4)])
def test_a_compressed_average_honours_the_shard_weights(spec):
    """Non-IID shard sizes with compression: workers of weights 3/4 and 1/4 sending 1 and 3
    (exact in every format) average to 1.5, not the uniform 2 (``reduce_decoded`` treating the
    weights as uniform, planted: caught)."""
    workers = {0: {"v": np.ones(4)}, 1: {"v": np.full(4, 3.0)}}
    ex = all_reduce(workers, spec, {}, weights={0: 0.75, 1: 0.25})
    np.testing.assert_array_equal(ex.delta["v"], np.full(4, 1.5))
    uniform = all_reduce(workers, spec, {})
    np.testing.assert_array_equal(uniform.delta["v"], np.full(4, 2.0))
