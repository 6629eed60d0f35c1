"""The fast engine (``diloco.engine``) runs the milestone path's algorithm.

With one seed, ``train_diloco_fast`` / ``train_synchronous_fast`` must draw the same
mini-batches as ``train_diloco`` / ``train_synchronous_baseline`` and end at the same
parameters and history: float64 within 1e-10 relative after several rounds (in practice
the DiLoCo path agrees to the last bit), float32 within 1e-5 (a few float32 roundings,
2^-24 each, of the baseline's joined-batch gradient sum, carried by AdamW's update).
The comparison is against the milestone functions as they run (the reference path), for
both algorithms, both shard modes, both dtypes and both layouts. The tools' dispatch
(``studies.trainer``, ``--engine``) and the workspace exclusion are checked at the end.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from cli_helpers import TINY as TINY_CLI
from cli_helpers import run_cli

from diloco import DiLoCoConfig, sample_worker_batch, train_diloco, train_synchronous_baseline
from diloco.core.trainers import FAST_TRAINERS as TRAINERS
from diloco.core.trainers import train_diloco_fast, train_synchronous_fast
from diloco.data import load_digits_split
from diloco.engine import STACKED_MAX_BYTES, choose_layout
from diloco.engine.fast import draw_batch as _draw_batch
from diloco.tools.studies import ablations as studies
from diloco.tools.workspace.regions import PACKAGE_DIR, is_reference_only

# The reference executor: the milestone trainers for the course's algorithm, else the driver on it.
REFERENCE = {"diloco": studies.trainer("diloco"), "sync": studies.trainer("sync")}
RTOL = {"float64": 1e-10, "float32": 1e-5}
# Two hidden layers exercise the ReLU mask between hidden layers; 3 rounds of H = 4 carry
# the AdamW moments (and the step count of the bias correction) across rounds.
SMALL = dict(num_workers=3, inner_steps=4, rounds=3, batch_size=8, hidden_sizes=(16, 8))


@pytest.fixture(scope="module")
def digits():
    return load_digits_split(0)


def relative_gap(got: dict, want: dict) -> float:
    """``max_key max|got - want| / max|want|``: 0 for identical params."""
    assert list(got) == list(want)
    return max(float(np.max(np.abs(got[k] - want[k])) / max(np.max(np.abs(want[k])), 1e-300)) for k in want)


def run_both(algo, config, data, **fast_options):
    x, x_eval = data.x_train.astype(config.dtype), data.x_test.astype(config.dtype)
    kwargs = dict(x_eval=x_eval, y_eval=data.y_test)
    want = REFERENCE[algo](x, data.y_train, config, **kwargs)
    got = TRAINERS[algo](x, data.y_train, config, **kwargs, **fast_options)
    return got, want


def assert_same_run(got, want, dtype):
    rtol = RTOL[dtype]
    gap = relative_gap(got.params, want.params)
    assert gap <= rtol, f"final params differ by {gap:.3g} relative (allowed {rtol:g})"
    assert {k: v.dtype for k, v in got.params.items()} == {k: v.dtype for k, v in want.params.items()}
    assert len(got.history) == len(want.history)
    for mine, gold in zip(got.history, want.history, strict=True):
        assert list(mine) == list(gold), "the record schema must be the loop's"
        for field in ("round", "step", "all_reduces", "bytes_sent", "cumulative_bytes"):
            assert mine[field] == gold[field], field
        for field in ("inner_loss", "eval_loss", "eval_accuracy", "pseudo_grad_norm"):
            if field in gold:
                np.testing.assert_allclose(mine[field], gold[field], rtol=rtol, atol=rtol, err_msg=field)
        np.testing.assert_allclose(mine["worker_losses"], gold["worker_losses"], rtol=rtol, err_msg="worker_losses")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("iid", [True, False], ids=["iid", "noniid"])
@pytest.mark.parametrize("layout", ["stacked", "per-worker"])
def test_diloco_equals_the_milestone_path(layout, iid, dtype, digits):
    config = DiLoCoConfig(**SMALL, iid=iid, alpha=0.3, dtype=dtype, seed=5)
    got, want = run_both("diloco", config, digits, layout=layout)
    assert_same_run(got, want, dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("iid", [True, False], ids=["iid", "noniid"])
def test_baseline_equals_the_milestone_path(iid, dtype, digits):
    config = DiLoCoConfig(**SMALL, iid=iid, alpha=0.3, dtype=dtype, seed=5)
    got, want = run_both("sync", config, digits)
    assert_same_run(got, want, dtype)


@pytest.mark.parametrize("algo", ["diloco", "sync"])
def test_heavy_ball_linear_model_and_batches_drawn_with_replacement(algo, digits):
    """Shards of 7 examples and batches of 10: the with-replacement draw; no hidden layer;
    plain momentum instead of Nesterov."""
    small = type(digits)(digits.x_train[:28], digits.y_train[:28], digits.x_test, digits.y_test)
    config = DiLoCoConfig(num_workers=4, inner_steps=3, rounds=3, batch_size=10, hidden_sizes=(), seed=2)
    if algo == "diloco":  # the outer settings are DiLoCo's: the baseline refuses them
        config = config.replace(nesterov=False, outer_lr=0.5)
    got, want = run_both(algo, config, small)
    assert_same_run(got, want, "float64")


def test_a_different_seed_is_not_the_same_run(digits):
    """The comparison can fail: the engine with another seed's batches is far off."""
    config = DiLoCoConfig(**SMALL)
    want = train_diloco(digits.x_train, digits.y_train, config)
    got = train_diloco_fast(digits.x_train, digits.y_train, config.replace(seed=1))
    assert relative_gap(got.params, want.params) > 1e-3


@pytest.mark.parametrize("n, batch_size", [(50, 8), (5, 8)], ids=["without-replacement", "with-replacement"])
def test_batches_are_sample_worker_batch_draws(n, batch_size):
    rng_data = np.random.default_rng(0)
    x, y = rng_data.standard_normal((n, 3)), rng_data.integers(0, 4, n)
    x_out, y_out = np.empty((batch_size, 3)), np.empty(batch_size, dtype=np.intp)
    mine, gold = np.random.default_rng(9), np.random.default_rng(9)
    for _ in range(3):
        _draw_batch((x, y.astype(np.intp)), batch_size, mine, x_out, y_out)
        x_want, y_want = sample_worker_batch(x, y, batch_size, gold)
        np.testing.assert_array_equal(x_out, x_want)
        np.testing.assert_array_equal(y_out, y_want)


# --- One-hot inputs: the first layer gathered forward, scattered backward (WorkerStack, context) ---

def _one_hot_stacks(windows, vocab, hidden, dtype, groups=1):
    """Two WorkerStacks of the same MLP and batch: dense one-hot ``x`` (the product) and ``context``
    (the gather and scatter); ``windows`` has shape (S, G b, c)."""
    from diloco.engine.flat import flat_layout
    from diloco.engine.stack import WorkerStack
    from diloco.model import init_model_params
    from diloco.text import OneHot

    S, rows, context = windows.shape
    encode = OneHot(vocab, context)
    params = init_model_params([encode.num_features, hidden, vocab], np.random.default_rng(3), dtype=np.dtype(dtype))
    layout = flat_layout(params)
    labels = np.random.default_rng(4).integers(0, vocab, (S, rows))
    dense = WorkerStack(layout, S, groups, rows // groups, dtype)
    hot = WorkerStack(layout, S, groups, rows // groups, dtype, context=context)
    assert hot.x is None and hot.columns.shape == (S, rows, context)
    for stack in (dense, hot):
        stack.params[...] = np.random.default_rng(5).standard_normal(stack.params.shape) * 0.3
        stack.labels[...] = labels
    for s in range(S):
        dense.x[s] = encode(windows[s], dtype)
        hot.columns[s] = encode.columns(windows[s])
    return dense, hot


def test_one_hot_first_layer_gradient_by_hand():
    """V = 2, c = 2: windows (0, 1) and (0, 0) are columns {0, 3} and {0, 2}; dW_1 row 0 gets both
    rows' dz (a repeated column), rows 2 and 3 one each, row 1 none."""
    dense, hot = _one_hot_stacks(np.array([[[0, 1], [0, 0]]]), vocab=2, hidden=2, dtype="float64")
    dz = np.array([[[1.0, 2.0], [10.0, 20.0]]])
    hot._first_layer_grads(dz)
    np.testing.assert_array_equal(hot.dW[0][0], [[11.0, 22.0], [0.0, 0.0], [10.0, 20.0], [1.0, 2.0]])


@pytest.mark.parametrize("kernel", ["numpy", "numba"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("models, groups, repeated", [(3, 1, False), (3, 1, True), (1, 3, False), (1, 3, True)],
                         ids=["stacked", "stacked-one-window", "baseline-groups", "baseline-one-window"])
def test_one_hot_inputs_give_the_dense_products_loss_and_gradients(models, groups, repeated, dtype, kernel,
                                                                    monkeypatch):
    """The gather and the scatter against the dense one-hot product, on random windows and on a batch
    of one repeated window (every column repeated in every row: the scatter's hardest case). Twice,
    so a gradient buffer left uncleared from the step before shows."""
    if kernel == "numba":
        pytest.importorskip("numba")
    from diloco.engine import optim

    monkeypatch.setattr(optim, "KERNEL", kernel)
    rng = np.random.default_rng(0)
    shape = (models, 4 * groups, 3)
    windows = np.broadcast_to(rng.integers(0, 5, 3), shape).copy() if repeated else rng.integers(0, 5, shape)
    dense, hot = _one_hot_stacks(windows, vocab=5, hidden=6, dtype=dtype, groups=groups)
    hot.loss_and_grads()
    loss_dense, loss_hot = dense.loss_and_grads(), hot.loss_and_grads()
    rtol = RTOL[dtype] / 100
    np.testing.assert_allclose(loss_hot, loss_dense, rtol=rtol)
    np.testing.assert_allclose(hot.grads, dense.grads, rtol=rtol, atol=rtol * np.abs(dense.grads).max())
    assert np.abs(dense.grads).max() > 0


def test_the_numba_scatter_is_the_numpy_scatter_to_the_last_bit(monkeypatch):
    """The two kernels add the same terms in the same order (so the "auto" switch changes no result)."""
    pytest.importorskip("numba")
    from diloco.engine import optim
    from diloco.text import load_shakespeare

    text = load_shakespeare(6, eval_windows=8)
    rng = np.random.default_rng(1)
    windows = text.dataset.x_train[rng.choice(len(text.dataset.x_train), 8 * 32)].reshape(8, 32, 6)
    _, hot = _one_hot_stacks(windows.astype(np.int64), vocab=65, hidden=16, dtype="float64")
    dz = rng.standard_normal((8, 32, 16))
    out = {}
    for kernel in ("numpy", "numba"):
        monkeypatch.setattr(optim, "KERNEL", kernel)
        hot._first_layer_grads(dz)
        out[kernel] = hot.dW[0].copy()
    assert np.array_equal(out["numpy"], out["numba"]) and np.abs(out["numpy"]).max() > 0


def test_on_round_sees_every_finished_record_and_inputs_are_untouched(digits):
    config = DiLoCoConfig(**SMALL)
    x, y = digits.x_train.copy(), digits.y_train.copy()
    seen = []
    result = train_diloco_fast(x, y, config, x_eval=digits.x_test, y_eval=digits.y_test, on_round=seen.append)
    assert seen == result.history and [r["round"] for r in seen] == [1, 2, 3]
    np.testing.assert_array_equal(x, digits.x_train)
    np.testing.assert_array_equal(y, digits.y_train)
    assert all(value.flags.owndata for value in result.params.values()), "params must not be engine buffers"


def test_choose_layout():
    """The rule of diloco.engine.layout (measured in benchmarks/layout_grid.json; test_layout.py)."""
    assert choose_layout(8, 9_610, "auto", itemsize=8) == "stacked"  # model (a): 0.6 MB
    assert choose_layout(8, 669_706, "auto", itemsize=8) == "per-worker"  # model (b): 5.4 MB a model
    assert choose_layout(1, 9_610, "auto", itemsize=8) == "per-worker"  # one worker: the same work
    assert choose_layout(16, STACKED_MAX_BYTES // 64, "auto", itemsize=4) == "stacked"
    assert choose_layout(16, STACKED_MAX_BYTES // 64 + 1, "auto", itemsize=4) == "per-worker"
    assert choose_layout(8, 669_706, "stacked", itemsize=8) == "stacked"
    with pytest.raises(ValueError, match="layout"):
        choose_layout(8, 10, "diagonal", itemsize=8)


def test_bad_input_is_checked_as_in_the_loop(digits):
    with pytest.raises(TypeError, match="config"):
        train_diloco_fast(digits.x_train, digits.y_train, {"rounds": 1})
    with pytest.raises(ValueError, match="y_eval"):
        train_synchronous_fast(digits.x_train, digits.y_train, DiLoCoConfig(), x_eval=digits.x_test)


# --- selection by the tools -----------------------------------------------------------------

def test_config_engine_field():
    assert DiLoCoConfig().engine == "reference"
    config = DiLoCoConfig(engine="fast")
    assert DiLoCoConfig.from_dict(config.to_dict()) == config
    assert DiLoCoConfig.from_dict({"rounds": 2}).engine == "reference"  # config files from before the field
    with pytest.raises(ValueError, match="DiLoCoConfig.engine"):
        DiLoCoConfig(engine="gpu")


def test_trainer_dispatch():
    assert studies.trainer("diloco", "fast") is train_diloco_fast
    assert studies.trainer("sync", "fast") is train_synchronous_fast
    data = load_digits_split()
    x, y = data.x_train[:200], data.y_train[:200]
    config = DiLoCoConfig(num_workers=2, inner_steps=2, rounds=1, hidden_sizes=(4,))
    for algo, milestone_trainer in (("diloco", train_diloco), ("sync", train_synchronous_baseline)):
        got = studies.trainer(algo, "reference")(x, y, config)  # plain settings: the milestone function itself
        want = milestone_trainer(x, y, config)
        assert all(np.array_equal(got.params[k], want.params[k]) for k in want.params)
    assert studies.default_engine() == "fast"
    for algo, engine in (("diloco", "gpu"), ("adam", "fast")):
        with pytest.raises(ValueError):
            studies.trainer(algo, engine)




TINY = [*TINY_CLI, "--no-plots"]


def test_cli_engine_flag_and_study_default(tmp_path, capsys):
    status, _, err = run_cli(["train", *TINY, "--engine", "fast", "--runs-dir", tmp_path / "t"], capsys)
    assert status == 0, err
    saved = json.loads(next((tmp_path / "t").glob("*/config.json")).read_text())
    assert saved["config"]["engine"] == "fast"
    argv = ["study", "workers", "--values", "1,2", "--seeds", "1", *TINY, "--runs-dir", tmp_path / "s"]
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    saved = json.loads(next((tmp_path / "s").glob("*/config.json")).read_text())
    assert saved["config"]["engine"] == "fast"  # studies default to the fast engine
    status, _, err = run_cli(["compare", *TINY, "--runs-dir", tmp_path / "c"], capsys)
    assert status == 0, err
    saved = json.loads(next((tmp_path / "c").glob("*/config.json")).read_text())
    assert saved["config"]["engine"] == "reference"  # compare and train run the milestone functions


def test_every_mechanism_runs_on_the_fast_engine_and_is_recorded(tmp_path, capsys):
    """Was refused (clip_norm on --engine fast) or fell back to the reference path in studies."""
    config_file = tmp_path / "clip.json"
    config_file.write_text(json.dumps({"clip_norm": 1.0}))
    argv = ["train", *TINY, "--engine", "fast", "--config", config_file, "--runs-dir", tmp_path / "t"]
    status, _, err = run_cli(argv, capsys)
    assert status == 0, err
    saved = json.loads(next((tmp_path / "t").glob("*/config.json")).read_text())
    assert saved["config"]["engine"] == "fast" and saved["config"]["clip_norm"] == 1.0


def test_workspace_leaves_the_engine_out_and_asking_for_it_is_one_line(tmp_path, capsys, monkeypatch):
    assert is_reference_only(PACKAGE_DIR / "engine") and is_reference_only(PACKAGE_DIR / "engine" / "stack.py")
    assert is_reference_only(PACKAGE_DIR / "tools" / "cli" / "mpi.py")
    assert not is_reference_only(PACKAGE_DIR / "loop.py")
    from diloco.tools.workspace.create import _ignore

    assert "engine" in _ignore(str(PACKAGE_DIR), os.listdir(PACKAGE_DIR))
    # In a workspace the package is absent: simulate it.
    monkeypatch.setattr(studies, "fast_engine_available", lambda: False)
    assert studies.default_engine() == "reference"
    status, _, err = run_cli(["train", *TINY, "--engine", "fast", "--runs-dir", tmp_path], capsys)
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "not part of a learner workspace" in err and "--engine reference" in err
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written


def test_readme_benchmark_summary_matches_results_md():
    """README's Benchmarks summary is the one `make bench` wrote into benchmarks/results.md."""
    root = PACKAGE_DIR.parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    results = (root / "benchmarks" / "results.md").read_text(encoding="utf-8")
    start, end = readme.index("<!-- benchmarks:start"), readme.index("<!-- benchmarks:end -->")
    block = [line for line in readme[start:end].splitlines()[1:] if line.strip()]
    assert any(line.startswith("| fast >=") for line in block), "run `make bench` to fill README's summary"
    for line in block[1:]:  # the first line links to results.md with its date
        assert line in results, f"README line not in benchmarks/results.md (rerun make bench): {line}"



def test_a_study_on_text_trains_on_the_engine_it_is_given(monkeypatch):
    """``run_study`` used to force text onto the reference path; the fast engine runs encoders too."""
    from diloco.text import load_shakespeare

    asked = []
    real = studies.trainer

    def spy(algo, engine="reference"):
        asked.append(engine)
        return real(algo, engine)

    monkeypatch.setattr(studies, "trainer", spy)
    text = load_shakespeare(6, eval_windows=16)
    chars = text.dataset._replace(encode=text.encode)
    config = DiLoCoConfig(num_workers=2, inner_steps=2, rounds=1, hidden_sizes=(4,), batch_size=4, engine="fast")
    rows = studies.run_study(studies.STUDIES["inner-steps"], config, chars, [0], ("2",))
    assert asked == ["fast"] * len(rows) and all(np.isfinite(row["eval_loss"]) for row in rows)
