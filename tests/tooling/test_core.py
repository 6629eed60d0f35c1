"""The one training core: the driver against the learner's loops, and the composition matrix.

* On the reference executor with default settings the driver is milestone 26 / 27 bit
  for bit.
* Every feature of ``diloco.core.features.FEATURES``, for both algorithms and both models
  (the MLP and a tiny transformer), on every executor: it works (stacked within 1e-10
  relative of the reference in float64, MPI bit for bit, and the feature changes the
  result), or it is refused by design in one
  line before any work. The table is the docs' matrix too.
* A plugin's parts (``plugins/``: Lion, random-k by name with its option), registered from
  outside the package for this module and in every MPI rank, are rows of that table; their
  DiLoCo cells also equal the independent oracle (``oracles.diloco``) on every executor.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import plugins
import pytest
from oracles import diloco as diloco_oracle
from resume_helpers import assert_resumes_bit_identical, run_keeping_checkpoints

from diloco import DiLoCoConfig, train_diloco, train_synchronous_baseline
from diloco.config import TransformerShape
from diloco.core.divergence import Diverged
from diloco.core.driver import check_algorithm, train
from diloco.core.features import FEATURES, cell, render_matrix
from diloco.core.hooks import Guard, NetworkTimer
from diloco.data import load_digits_split
from diloco.text import OneHot, char_windows

BASE = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=2, hidden_sizes=(8, 8), batch_size=8, seed=1)
# The transformer's cells: a tiny one (1 block, d = 8, 2 heads) on 3-character windows of a 6-letter text.
BASES = {"mlp": BASE, "transformer": DiLoCoConfig(num_workers=2, inner_steps=4, rounds=2, batch_size=8, seed=1,
                                                   model="transformer",
                                                   transformer=TransformerShape(d_model=8, n_heads=2, n_layers=1))}
ALGOS = ("diloco", "sync")
MODELS = tuple(BASES)


@pytest.fixture(autouse=True, scope="module")
def _plugins():
    """The plugin rows' parts, registered as a plugin would (the MPI script registers them in each rank)."""
    plugins.register()
    yield
    plugins.unregister()


def _digits():
    data = load_digits_split(seed=0)
    return data.x_train[:241], data.y_train[:241], data.x_test[:60], data.y_test[:60]  # unequal shards


def _chars():
    ids = np.random.default_rng(3).integers(0, 6, 300)
    x, y = char_windows(ids, 3)
    return x[:241], y[:241], x[241:], y[241:]  # unequal shards


def _config(feature, model="mlp"):
    changes = dict(feature.changes)
    family = changes.pop("family", None)
    config = BASES[model].replace(**changes)
    return config.replace(family=family) if family else config


def _data(feature, model="mlp"):
    """``(x, y, x_eval, y_eval, encode)``: characters for the LM feature and for the transformer, else digits."""
    if feature.hook == "encode" or model == "transformer":
        return (*_chars(), OneHot(6, 3))
    return (*_digits(), None)


def _run(feature, algo, executor="reference", model="mlp", **kwargs):
    config = _config(feature, model)
    x, y, x_eval, y_eval, encode = _data(feature, model)
    hooks = [NetworkTimer(config)] if feature.hook == "clock" else []
    return train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, encode=encode, executor=executor, hooks=hooks,
                 **kwargs)


def _flat(params) -> np.ndarray:
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in params.values()])


def _sign_of_noise_out(feature, model, result):
    """``result`` with the attention's key biases zeroed when Lion trains the transformer, else as it is.

    Softmax ignores a shift shared by every key, so their gradient is zero but for rounding, and
    Lion's ``sign`` turns that noise into full steps, which any two orders of summation take apart
    (the reference, the stacked executor and the oracle all differ there, by up to lr per step, and so
    does the outer gradient's norm); the loss never sees them, and the losses are compared in full."""
    if model != "transformer" or _config(feature, model).inner_optimizer != "lion":
        return result
    d = _config(feature, model).transformer.d_model
    params = {key: value.copy() for key, value in result.params.items()}
    for key in (key for key in params if key.endswith("attn.qkv_bias")):
        params[key][d:2 * d] = 0.0
    return result._replace(params=params)


@pytest.mark.parametrize("algo", ALGOS)
def test_the_driver_is_the_learners_loop_bit_for_bit(algo):
    x, y, x_eval, y_eval = _digits()
    learner = train_diloco if algo == "diloco" else train_synchronous_baseline
    want = learner(x, y, BASE, x_eval=x_eval, y_eval=y_eval)
    got = train(algo, x, y, BASE, x_eval=x_eval, y_eval=y_eval)
    assert all(got.params[k].tobytes() == want.params[k].tobytes() for k in want.params)
    assert got.history == want.history


def test_the_matrix_in_the_docs_is_the_table_the_tests_run():
    page = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert render_matrix() in page, "docs/architecture.md: regenerate the matrix with diloco.core.features"


CELLS = [(f, algo, model) for f in FEATURES for algo in ALGOS for model in MODELS]
PLAIN = FEATURES[[f.name for f in FEATURES].index("character-level LM")]  # no config change: each model's plain run


@pytest.mark.parametrize("feature, algo, model", CELLS, ids=[f"{f.name}-{a}-{m}" for f, a, m in CELLS])
def test_every_feature_works_on_reference_and_stacked_or_is_refused_in_one_line(feature, algo, model):
    if cell(feature, algo, "reference") == "refused":
        with pytest.raises(ValueError) as caught:
            check_algorithm(algo, _config(feature, model))
        message = str(caught.value)
        assert "\n" not in message and "no outer gradient" in message
        assert feature.changes and any(name.split("=")[0] in message for name in _names(feature)), message
        x, y, *_, encode = _data(feature, model)
        with pytest.raises(ValueError, match="no outer gradient"):  # the driver refuses before any work
            train(algo, x, y, _config(feature, model), encode=encode, hooks=[_NoWork()])
        return
    if feature.hook in ("guard", "resume"):
        pytest.skip("a hook, tested below on every executor")
    reference = _sign_of_noise_out(feature, model, _run(feature, algo, model=model))
    stacked = _sign_of_noise_out(feature, model, _run(feature, algo, "fast", model=model))
    rtol = 1e-5 if _config(feature, model).dtype == "float32" else 1e-10
    atol = rtol * (1e-1 if model == "transformer" else 1e-2)  # float32 attention: a few ulps of 1e-2 params
    np.testing.assert_allclose(_flat(stacked.params), _flat(reference.params), rtol=rtol, atol=atol)
    np.testing.assert_allclose([r["eval_loss"] for r in stacked.history],
                               [r["eval_loss"] for r in reference.history], rtol=rtol)
    assert set(stacked.history[-1]) == set(reference.history[-1])
    if feature.hook == "encode":
        return  # another task (the MLP), or the transformer's plain run: nothing to compare it with
    plain = train(algo, *_digits()[:2], BASE, x_eval=_digits()[2], y_eval=_digits()[3]) if model == "mlp" else \
        _run(PLAIN, algo, model=model)
    changed = not np.array_equal(_flat(reference.params), _flat(plain.params))
    new_fields = set(reference.history[-1]) - set(plain.history[-1])
    assert changed or new_fields, f"{feature.flag} had no effect on {algo}"


# Not Lion on the transformer: its key biases' steps, and the outer gradient's norm with them, are
# rounding noise's signs (``_sign_of_noise_out``); the executors are compared on everything else.
PLUGGED = [(f, model) for f in FEATURES if f.hook == "plugin" for model in MODELS
           if not (model == "transformer" and f.changes.get("inner_optimizer") == "lion")]


@pytest.mark.parametrize("executor", ["reference", "fast"])
@pytest.mark.parametrize("feature, model", PLUGGED, ids=[f"{f.name}-{m}" for f, m in PLUGGED])
def test_a_plugins_diloco_cell_equals_the_independent_oracle(feature, model, executor):
    """Lion written from its paper and random-k from its description (``oracles.common.inner_lion``,
    ``oracles.compression.send_random_k``), not the plugin's code nor the core's lifts and collectives:
    the params, and round by round the workers' losses, the outer gradient's norm, the held-out loss
    and the bytes sent (MPI equals the reference bit for bit, below)."""
    from test_oracles import assert_matches

    config = _config(feature, model)
    x, y, x_eval, y_eval, encode = _data(feature, model)
    want = diloco_oracle(x, y, config, x_eval, y_eval, vocab_size=6 if model == "transformer" else None)
    got = train("diloco", x, y, config, x_eval=x_eval, y_eval=y_eval, encode=encode, executor=executor,
                sync_fields=True)
    assert_matches(*(_sign_of_noise_out(feature, model, r) for r in (got, want)),
                   rtol=1e-11 if model == "transformer" else 1e-12)


def _names(feature):
    changes = dict(feature.changes)
    return list(changes.pop("family", {}) or {}) + list(changes)


class _NoWork:
    def trained(self, record, trained):
        raise AssertionError("a refused configuration trained")


@pytest.mark.parametrize("executor", ["reference", "fast"])
@pytest.mark.parametrize("algo", ALGOS)
def test_the_guard_stops_every_algorithm_on_every_executor(algo, executor):
    x, y, x_eval, y_eval = _digits()
    config = BASE.replace(inner={"lr": 10.0, "weight_decay": 0.0}, rounds=3)
    with pytest.raises(Diverged, match="exceeds max_loss 2|not finite|is nan|is inf"):
        train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, executor=executor, hooks=[Guard(algo, 2.0)])


RESUMED = [("diloco", {}), ("sync", {}), ("diloco", {"family": {"comm_dtype": "int8", "error_feedback": True}}),
           ("diloco", {"family": {"fragments": 2, "overlap": 1, "mix": 0.5}}), ("diloco", {"family": {"eager": True}}),
           ("diloco", {"drop_prob": 0.5}), ("diloco", {"outer_optimizer": "adam", "outer_lr": 0.05}),
           ("diloco", {"inner_optimizer": "sgd"}), ("sync", {"inner_optimizer": "sgd"}),
           ("diloco", {"model": "transformer"}), ("sync", {"model": "transformer"}),
           ("diloco", {"model": "transformer", "inner_optimizer": "muon", "family": {"fragments": 2, "overlap": 1}})]


@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("algo, changes", RESUMED, ids=[f"{a}-{json.dumps(c)}" for a, c in RESUMED])
def test_resume_from_every_round_is_bit_identical_for_every_algorithm(algo, changes, engine, tmp_path):
    changes = dict(changes)
    family = changes.pop("family", None)
    model = changes.pop("model", "mlp")
    config = BASES[model].replace(rounds=3, engine=engine, **changes)
    config = config.replace(family=family) if family else config
    *data, encode = _data(PLAIN if model == "transformer" else FEATURES[0], model)
    want, copies = run_keeping_checkpoints(algo, data, config, tmp_path, encode=encode)
    assert_resumes_bit_identical(algo, data, config, want, copies, encode=encode)


# --- MPI: one job runs every cell, each rank compares with nothing; the test compares bytes ---

SCRIPT = """
import json, sys
import numpy as np
from mpi4py import MPI
from diloco.core.driver import train
from diloco.core.features import FEATURES, cell
sys.path.insert(0, sys.argv[2])
import plugins
import test_core as t

plugins.register()  # a plugin's parts reach a rank as they reach any process: registered in it

out = {}
for feature in FEATURES:
    for algo in t.ALGOS:
        if cell(feature, algo, "mpi") != "works" or feature.hook in ("guard", "resume"):
            continue
        for model in t.MODELS:
            result = t._run(feature, algo, "mpi", model, comm=MPI.COMM_WORLD, timeout=60)
            flat = np.concatenate([v.ravel() for v in result.params.values()])
            out[f"{feature.name}|{algo}|{model}"] = [flat.tobytes().hex(), [r["eval_loss"] for r in result.history]]
if MPI.COMM_WORLD.rank == 0:
    json.dump(out, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_every_feature_on_real_mpi_ranks_is_the_single_process_run_bit_for_bit(tmp_path):
    pytest.importorskip("mpi4py", reason="the mpi extra (mpi4py, mpich) is not installed")
    from cli_helpers import mpiexec

    (tmp_path / "run.py").write_text(SCRIPT, encoding="utf-8")
    done = subprocess.run([mpiexec(), "-n", "2", sys.executable, "run.py", "out.json", str(Path(__file__).parent)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads((tmp_path / "out.json").read_text())
    expected = {f"{f.name}|{a}|{m}" for f in FEATURES for a in ALGOS for m in MODELS
                if cell(f, a, "mpi") == "works" and f.hook not in ("guard", "resume")}
    assert set(got) == expected
    for key, (params_hex, losses) in got.items():
        name, algo, model = key.split("|")
        feature = next(f for f in FEATURES if f.name == name)
        want = _run(feature, algo, model=model)
        flat = np.concatenate([v.ravel() for v in want.params.values()])
        assert flat.tobytes().hex() == params_hex, key
        assert losses == [r["eval_loss"] for r in want.history], key


def test_the_config_names_exactly_the_registered_outer_optimizers():
    from diloco.config import OUTER_OPTIMIZER_NAMES
    from diloco.core.outer import OUTER_OPTIMIZERS

    assert set(OUTER_OPTIMIZER_NAMES) == set(OUTER_OPTIMIZERS)


def test_outer_lion_by_hand():
    """theta -= lr sign(b1 m + (1 - b1) delta); m = b2 m + (1 - b2) delta, b1 = 0.9, b2 = 0.999."""
    from diloco.core.outer import OUTER_OPTIMIZERS
    from diloco.outer import OuterState

    config = BASE.replace(outer_optimizer="lion", outer_lr=0.1)
    params, delta = {"w": np.array([1.0, 1.0, 1.0])}, {"w": np.array([0.5, -2.0, 0.01])}
    state = OuterState({"w": np.array([0.0, 0.0, -1.0])})
    new, state = OUTER_OPTIMIZERS["lion"].update(params, delta, state, config)
    # signs: 0.05 > 0, -0.2 < 0, -0.9 + 0.001 < 0
    np.testing.assert_array_equal(new["w"], [0.9, 1.1, 1.1])
    np.testing.assert_allclose(state.momentum["w"], [0.0005, -0.002, -0.999 + 0.00001], rtol=1e-12)


@pytest.mark.parametrize("losses, where", [
    ({0: [1.0, 1.0, 1.0, 1.0, np.nan], 1: [1.0, 1.0, np.inf, np.nan, np.nan]}, "round 2, step 3, worker 1: "
                                                                              "training loss is inf"),
    ({0: [1.0, np.nan, np.nan], 1: [1.0, np.nan, 1.0], 2: [np.inf, 1.0, 1.0]}, "round 2, step 1, worker 2: "
                                                                               "training loss is inf"),
    ({0: [1.0, np.nan], 1: [1.0, np.nan]}, "round 2, step 2, worker 0: training loss is nan"),
])
def test_the_guard_names_the_first_step_that_went_bad_and_its_worker(losses, where):
    """The earliest step of any worker (a tie: the lower worker), 1-based; not the first worker
    with a bad step, nor the last step (both planted: caught). Hand-made losses."""
    record = {"round": 2, "worker_losses": [1.0] * len(losses), "pseudo_grad_norm": 1.0}
    with pytest.raises(Diverged) as caught:
        Guard("diloco").trained(record, ({"W": np.ones(2)}, {k: np.array(v) for k, v in losses.items()}))
    assert str(caught.value) == f"DiLoCo diverged in {where}"


@pytest.mark.parametrize("algo", ALGOS)
def test_a_float32_runs_records_are_evaluated_in_float32(algo):
    """The last record's held-out loss is ``evaluate_loss`` of the final float32 params on float32
    held-out data, to the bit (a record evaluated in float64 differs in the 7th digit: planted,
    caught), with the held-out data given in float64 as users give it."""
    from diloco import evaluate_loss

    x, y, x_eval, y_eval = _digits()
    config = BASE.replace(dtype="float32")
    learner = train_diloco if algo == "diloco" else train_synchronous_baseline
    result = learner(x, y, config, x_eval=x_eval, y_eval=y_eval)
    assert all(v.dtype == np.float32 for v in result.params.values())
    want = evaluate_loss(result.params, x_eval.astype(np.float32), y_eval)
    assert result.history[-1]["eval_loss"] == want
