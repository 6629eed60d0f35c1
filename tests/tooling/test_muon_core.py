"""Muon as the core's inner optimizer: the config, the dispatch, the fast executor against
the reference, checkpoint and resume, the guard, the flags, and the study's judging.

The feature-by-executor matrix (``diloco.core.features``, row "Muon inner optimizer") runs
in ``tests/tooling/test_core.py``, MPI included; this file tests what that table does not.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import TINY, only_run_dir, run_cli
from resume_helpers import assert_resumes_bit_identical, run_keeping_checkpoints

from diloco import DiLoCoConfig
from diloco.adamw import AdamWState, init_adamw_state
from diloco.config import AdamWConfig, MuonConfig
from diloco.core.divergence import Diverged
from diloco.core.driver import is_course_algorithm, train
from diloco.core.hooks import Guard
from diloco.core.mechanisms import init_inner_state, inner_step, scheduled_adamw_step
from diloco.data import load_digits_split
from diloco.engine.flat import flat_layout, layer_views, pack, unpack
from diloco.engine.optim import adamw_scratch, muon_update
from diloco.methods.muon import MuonState, as_moments, from_moments, init_muon, muon_step
from diloco.text import OneHot, char_windows

BASE = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=2, hidden_sizes=(8, 8), batch_size=8, seed=1)
MUON = BASE.replace(inner_optimizer="muon", muon={"lr": 0.01})


def _digits():
    data = load_digits_split(seed=0)
    return data.x_train[:241], data.y_train[:241], data.x_test[:60], data.y_test[:60]


def _flat(params) -> np.ndarray:
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in params.values()])


def _params(rng, dtype=np.float64):
    return {"W1": rng.standard_normal((5, 3)).astype(dtype), "b1": rng.standard_normal(3).astype(dtype),
            "W2": rng.standard_normal((3, 4)).astype(dtype), "b2": rng.standard_normal(4).astype(dtype)}


# --- the config ------------------------------------------------------------------------------

def test_the_config_round_trips_and_refuses_what_would_be_ignored():
    config = BASE.replace(inner_optimizer="muon", muon={"lr": 0.05, "momentum": 0.9, "nesterov": False,
                                                        "weight_decay": 0.1, "ns_steps": 3, "scale": "moonlight",
                                                        "keys": ["W2"]})
    again = DiLoCoConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config and again.muon.keys == ("W2",)
    assert DiLoCoConfig.from_dict({k: v for k, v in BASE.to_dict().items()
                                   if k not in ("inner_optimizer", "muon")}) == BASE  # old config files
    with pytest.raises(ValueError, match="inner_optimizer"):
        BASE.replace(inner_optimizer="rmsprop")
    with pytest.raises(ValueError, match="muon settings need inner_optimizer='muon'"):
        BASE.replace(muon={"lr": 0.05})
    with pytest.raises(TypeError, match="DiLoCoConfig.muon"):
        DiLoCoConfig(inner_optimizer="muon", muon={"lr": 0.1})
    with pytest.raises(ValueError, match="MuonConfig: unknown"):
        DiLoCoConfig.from_dict({**BASE.to_dict(), "muon": {"learning_rate": 0.1}})


def test_muon_never_takes_the_milestone_path():
    assert is_course_algorithm(BASE) and not is_course_algorithm(MUON)
    params = _params(np.random.default_rng(0))
    assert isinstance(init_inner_state(params, BASE), AdamWState)
    state = init_inner_state(params, MUON)
    assert isinstance(state, MuonState) and list(state.momentum) == ["W1", "W2"]


def test_the_dispatch_is_adamw_or_muon_with_the_runs_adamw_on_the_biases():
    rng = np.random.default_rng(1)
    params, grads = _params(rng), _params(rng)
    config = BASE.replace(inner={"lr": 0.01, "weight_decay": 0.1})
    got, _ = inner_step(params, init_adamw_state(params), grads, config)
    want, _ = scheduled_adamw_step(params, init_adamw_state(params), grads, config)
    assert all(np.array_equal(got[k], want[k]) for k in params)
    muon = config.replace(inner_optimizer="muon", muon={"lr": 0.05})
    got, state = inner_step(params, init_muon(params), grads, muon)
    want, _ = muon_step(params, init_muon(params), grads, MuonConfig(lr=0.05), AdamWConfig(lr=0.01, weight_decay=0.1))
    assert all(np.array_equal(got[k], want[k]) for k in params) and state.step == 1


def test_the_lr_schedule_scales_both_learning_rates():
    # Cosine with 2 warmup steps: step 1 runs at half of each peak (lr * 1 / 2), worked by hand.
    rng = np.random.default_rng(2)
    params, grads = _params(rng), _params(rng)
    config = BASE.replace(inner_optimizer="muon", muon={"lr": 0.04}, inner={"lr": 0.01}, lr_schedule="cosine",
                          warmup_steps=2)
    got, _ = inner_step(params, init_muon(params), grads, config)
    want, _ = muon_step(params, init_muon(params), grads, MuonConfig(lr=0.02), AdamWConfig(lr=0.005))
    assert all(np.array_equal(got[k], want[k]) for k in params)


def test_clipping_clips_before_muon():
    # Step 1's gradient is under the clip norm (left alone), step 2's is 10x over it (scaled by
    # clip / (norm + 1e-6)), so the momentum mixes them in another proportion than unclipped.
    rng = np.random.default_rng(3)
    params, small, large = _params(rng), _params(rng), _params(rng)
    norm = lambda g: float(np.sqrt(sum(np.sum(v * v) for v in g.values())))  # noqa: E731
    clip = 2 * norm(small)
    large = {k: v * 10 * clip / norm(large) for k, v in large.items()}
    config = MUON.replace(clip_norm=clip)
    got, state = inner_step(params, init_muon(params), small, config)
    got, _ = inner_step(got, state, large, config)
    coef = clip / (norm(large) + 1e-6)
    want, state = muon_step(params, init_muon(params), small, config.muon, config.inner)
    want, _ = muon_step(want, state, {k: v * coef for k, v in large.items()}, config.muon, config.inner)
    for key in params:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-13)
    plain, state = muon_step(params, init_muon(params), small, config.muon, config.inner)
    plain, _ = muon_step(plain, state, large, config.muon, config.inner)
    assert not np.allclose(got["W1"], plain["W1"]) and not np.allclose(got["b1"], plain["b1"])


# --- the fast executor ---------------------------------------------------------------------

def test_the_state_in_adamws_shape_round_trips_exactly():
    rng = np.random.default_rng(4)
    params = _params(rng)
    state = init_muon(params)
    for _ in range(3):
        params, state = muon_step(params, state, _params(rng), MuonConfig())
    moments = as_moments(state, params)
    assert list(moments.m) == list(params) and not moments.v["W1"].any() and moments.step == 3
    back = from_moments(moments, MuonConfig())
    assert back.step == state.step and back.adam.step == state.adam.step
    for got, want in ((back.momentum, state.momentum), (back.adam.m, state.adam.m), (back.adam.v, state.adam.v)):
        assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)
    with pytest.raises(TypeError, match="state"):
        as_moments(moments, params)
    with pytest.raises(TypeError, match="moments"):
        from_moments(state, MuonConfig())


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize("nesterov", [True, False])
def test_the_flat_update_is_muon_step_on_every_row(dtype, rtol, nesterov):
    rng = np.random.default_rng(5)
    config, adam = MuonConfig(lr=0.03, weight_decay=0.2, nesterov=nesterov), AdamWConfig(lr=0.01, weight_decay=0.1)
    rows = [_params(rng, dtype) for _ in range(3)]
    layout = flat_layout(rows[0])
    size = layout.size
    params, m, v, grads = (np.zeros((3, size), dtype) for _ in range(4))
    states = [init_muon(p) for p in rows]
    for k, p in enumerate(rows):
        pack(p, params[k], layout)
    for step in (1, 2):
        gs = [_params(rng, dtype) for _ in range(3)]
        for k, g in enumerate(gs):
            pack(g, grads[k], layout)
        muon_update(params, m, v, grads, step, config, adam, layout, ("W1", "W2"), adamw_scratch(params.size, dtype))
        for k in range(3):
            rows[k], states[k] = muon_step(rows[k], states[k], gs[k], config, adam)
    for k in range(3):
        got = unpack(params[k], layout)
        for key in rows[k]:
            np.testing.assert_allclose(got[key], rows[k][key], rtol=rtol, atol=rtol)
        moments = as_moments(states[k], rows[k])
        np.testing.assert_allclose(m[k], np.concatenate([moments.m[key].ravel() for key in layout.keys]), rtol=rtol)
        assert not layer_views(v, layout)["W1"].any()


def _chars():
    ids = np.random.default_rng(3).integers(0, 6, 300)
    x, y = char_windows(ids, 3)
    return x[:240], y[:240], x[240:], y[240:]


CASES = [("float64", {}, "auto"), ("float64", {}, "per-worker"), ("float32", {}, "auto"),
         ("float64", {"lr_schedule": "cosine", "warmup_steps": 2, "clip_norm": 0.05}, "auto"),
         ("float64", {"muon": {"lr": 0.01, "nesterov": False, "weight_decay": 0.5, "scale": "moonlight",
                               "keys": ["W2"]}}, "auto"),
         ("float64", {"chars": True}, "auto")]


@pytest.mark.parametrize("algo", ["diloco", "sync"])
@pytest.mark.parametrize("dtype, changes, layout", CASES, ids=[json.dumps(c[1]) + c[2] + c[0] for c in CASES])
def test_stacked_equals_the_reference(algo, dtype, changes, layout):
    changes = dict(changes)
    chars = changes.pop("chars", False)
    config = MUON.replace(dtype=dtype, **changes)
    x, y, x_eval, y_eval = _chars() if chars else _digits()
    encode = OneHot(6, 3) if chars else None
    reference = train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, encode=encode)
    stacked = train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, encode=encode, executor="fast",
                    layout=layout)
    rtol = 1e-5 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(_flat(stacked.params), _flat(reference.params), rtol=rtol, atol=rtol * 1e-2)
    np.testing.assert_allclose([r["eval_loss"] for r in stacked.history], [r["eval_loss"] for r in reference.history],
                               rtol=rtol)
    adamw = train(algo, x, y, config.replace(inner_optimizer="adamw", muon=MuonConfig()), x_eval=x_eval,
                  y_eval=y_eval, encode=encode)
    assert not np.allclose(_flat(adamw.params), _flat(reference.params))


# --- checkpoint, resume, the guard ------------------------------------------------------------

@pytest.mark.parametrize("engine", ["reference", "fast"])
@pytest.mark.parametrize("algo", ["diloco", "sync"])
def test_resume_from_every_round_is_bit_identical(algo, engine, tmp_path):
    config = MUON.replace(rounds=3, engine=engine, muon={"lr": 0.01, "keys": ["W1", "W3"]})
    data = _digits()
    want, copies = run_keeping_checkpoints(algo, data, config, tmp_path)
    assert_resumes_bit_identical(algo, data, config, want, copies)
    with np.load(next(copies[1].glob("*.npz"))) as arrays:  # the momentum of W1 stored under m, zeros under v
        assert arrays["worker0.m.W1"].any() and not arrays["worker0.v.W1"].any() and arrays["worker0.v.W2"].any()


@pytest.mark.parametrize("executor", ["reference", "fast"])
@pytest.mark.parametrize("algo", ["diloco", "sync"])
def test_the_guard_stops_a_diverging_muon_run(algo, executor):
    x, y, x_eval, y_eval = _digits()
    config = MUON.replace(muon={"lr": 50.0}, inner={"lr": 10.0, "weight_decay": 0.0}, rounds=3)
    with pytest.raises(Diverged, match="exceeds max_loss 2|not finite|is nan|is inf"):
        train(algo, x, y, config, x_eval=x_eval, y_eval=y_eval, executor=executor, hooks=[Guard(algo, 2.0)])


# --- the flags --------------------------------------------------------------------------------

def test_the_flags_reach_the_config_and_round_trip(tmp_path, capsys):
    flags = ["--inner-optimizer", "muon", "--muon-lr", "0.03", "--muon-momentum", "0.9", "--no-muon-nesterov",
             "--muon-weight-decay", "0.1", "--muon-ns-steps", "4", "--muon-scale", "moonlight"]
    status, _, err = run_cli(["train", *TINY, "--no-plots", "--runs-dir", tmp_path / "a", *flags], capsys)
    assert status == 0, err
    saved = json.loads((only_run_dir(tmp_path / "a") / "config.json").read_text())["config"]
    assert saved["inner_optimizer"] == "muon"
    assert saved["muon"] == {"lr": 0.03, "momentum": 0.9, "nesterov": False, "weight_decay": 0.1, "ns_steps": 4,
                             "scale": "moonlight", "keys": None}
    status, _, err = run_cli(["train", "--config", only_run_dir(tmp_path / "a") / "config.json", "--no-plots", "-q",
                              "--runs-dir", tmp_path / "b"], capsys)
    assert status == 0, err
    first, again = (np.load(only_run_dir(tmp_path / d) / "params-diloco.npz") for d in ("a", "b"))
    assert all(np.array_equal(first[k], again[k]) for k in first)


def test_muon_flags_without_muon_are_one_line_errors(tmp_path, capsys):
    status, _, err = run_cli(["train", *TINY, "--runs-dir", tmp_path, "--muon-lr", "0.03", "--muon-ns-steps", "3"],
                             capsys)
    assert status == 2 and "--muon-lr, --muon-ns-steps configure(s) Muon: add --inner-optimizer muon" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    status, _, err = run_cli(["train", *TINY, "--runs-dir", tmp_path, "--inner-optimizer", "muon",
                              "--muon-momentum", "1.5"], capsys)
    assert status == 2 and "--muon-momentum must be < 1.0" in err and len(err.strip().splitlines()) == 1


def test_compare_runs_muon_on_both_algorithms(tmp_path, capsys):
    status, out, err = run_cli(["compare", *TINY, "--no-plots", "--runs-dir", tmp_path, "--inner-optimizer", "muon",
                                "--engine", "fast"], capsys)
    assert status == 0, err
    saved = json.loads((only_run_dir(tmp_path) / "config.json").read_text())
    assert json.dumps(saved).count('"inner_optimizer": "muon"') >= 1


# --- the study's judging ----------------------------------------------------------------------

def _row(arm, values):
    return {"arm": arm, "seeds": [0, 1, 2], "per_seed_eval_loss": values}


def test_a_gap_claim_is_the_paired_difference_of_two_differences():
    from diloco.tools.studies.beyond_muon import judge_interactions

    rows = [_row("a", [3.0, 3.2, 3.1]), _row("b", [2.0, 2.1, 2.0]), _row("c", [1.5, 1.6, 1.5]),
            _row("d", [1.0, 1.0, 1.1])]
    spec = ("gap", "paper", ("a", "b"), ("c", "d"), False)
    (judged,) = judge_interactions([spec], rows, "mnist1d")
    # per seed: (a - b) - (c - d) = (1.0 - 0.5, 1.1 - 0.6, 1.1 - 0.4) = (0.5, 0.5, 0.7), mean 0.5667
    assert judged["metric_difference"]["mean"] == pytest.approx(0.5666666666666667)
    # sd = 0.11547, t_{0.975, 2} = 4.3027: half width 0.2869, so [0.280, 0.854]: above 0
    assert judged["metric_difference"]["low"] == pytest.approx(0.5666667 - 4.303 * 0.1154701 / np.sqrt(3), rel=1e-5)
    assert judged["verdict"] == "holds"
    (relative,) = judge_interactions([(*spec[:4], True)], rows, "mnist1d")
    # (a - b) / b - (c - d) / d per seed: (0.5 - 0.5, 0.5238 - 0.6, 0.55 - 0.3636)
    assert relative["metric_difference"]["mean"] == pytest.approx((0.0 + (1.1 / 2.1 - 0.6) + (0.55 - 0.4 / 1.1)) / 3)
    (missing,) = judge_interactions([("gap", "paper", ("a", "x"), ("c", "d"), False)], rows, "mnist1d")
    assert missing["verdict"] == "not run"


def test_the_arms_pair_every_k_at_equal_bytes():
    from diloco.tools.studies.beyond_muon import muon_arms, muon_claims

    lrs = {"diloco K=1": {"adamw": 0.003, "muon": 0.02}, "diloco K=4": {"adamw": 0.003, "muon": 0.02},
           "sync K=4": {"adamw": 0.001, "muon": 0.01}}
    arms = muon_arms(10, 100, (1, 4), lrs)
    by_label = {a.label: a for a in arms}
    for k in (1, 4):
        adam, muon = by_label[f"DiLoCo (AdamW) K={k}"], by_label[f"MuLoCo (Muon) K={k}"]
        same = {key: value for key, value in adam.changes.items() if key not in ("inner_optimizer", "muon")}
        assert {key: muon.changes[key] for key in same} == same  # same K, H, rounds, wire, AdamW
        assert muon.changes["muon"]["lr"] == 0.02 and muon.changes["inner_optimizer"] == "muon"
        BASE.replace(**adam.changes), BASE.replace(**muon.changes)  # valid configs
    assert {c.better for c in muon_claims((1, 4))} <= set(by_label)
    with pytest.raises(ValueError, match="multiple of H"):
        muon_arms(30, 100, (1,), lrs)


def test_the_results_page_holds_the_rendered_summaries():
    from diloco.tools.studies.results_page import load_summaries, rebuild

    root = Path(__file__).resolve().parents[2]
    page = (root / "docs" / "results-beyond.md").read_text(encoding="utf-8")
    assert rebuild(page, load_summaries(root / "docs" / "assets" / "results")) == page, \
        "docs/results-beyond.md: run python -m diloco.tools.studies.beyond_muon"
    for task in ("shakespeare", "mnist1d"):
        assert f"<!-- generated: beyond-muon-{task} -->" in page


@pytest.mark.slow
def test_a_tiny_muon_study_tunes_runs_judges_and_exports(tmp_path, capsys):
    export = tmp_path / "export"
    argv = ["study", "muon", "--data", "shakespeare", "--seeds", "2", "--total-steps", "4", "-H", "2",
            "--eval-windows", "32", "--context", "2", "--hidden-sizes", "4", "-q", "--values", "1,4",
            "--lr", "0.003", "--inner-optimizer", "muon", "--muon-lr", "0.02", "--muon-momentum", "0.9",
            "--runs-dir", tmp_path, "--export", export]
    status, out, err = run_cli(argv, capsys)
    assert status == 0, err
    summary = json.loads((export / "beyond-muon-shakespeare.json").read_text())
    assert summary["ks"] == [1, 4] and summary["seeds"] == [0, 1] and summary["tune_seeds"] == [1000]
    assert set(summary["tuned_lr"]) == {"diloco K=1", "diloco K=4", "sync K=4"}
    assert all(lr == {"adamw": 0.003, "muon": 0.02} for lr in summary["tuned_lr"].values())  # fixed by the flags
    rows = {row["arm"]: row for row in summary["rows"]}
    assert rows["DiLoCo (AdamW) K=4"]["bytes_sent"] == rows["MuLoCo (Muon) K=4"]["bytes_sent"]  # equal bytes
    assert rows["MuLoCo (Muon) K=4, fp4 + error feedback"]["bytes_sent"] < rows["MuLoCo (Muon) K=4"]["bytes_sent"]
    muon_arm = next(row for row in summary["rows"] if row["arm"] == "MuLoCo (Muon) K=4")
    assert muon_arm["changes"]["muon"]["momentum"] == 0.9  # --muon-* reach the Muon arms
    assert [c["verdict"] for c in summary["claims"] + summary["gaps"]]
    assert "MuLoCo beats DiLoCo at K=4" in out
    # each DiLoCo arm's outer lr x momentum: the 12 pairs on itself, the grid's argmin taken, and
    # the fp4 arm given its uncompressed arm's pair
    outer = [r for r in summary["outer_tuning"] if r["step"] == 0]
    probes = {r["arm"] for r in outer}
    assert probes == {"DiLoCo (AdamW) K=1", "MuLoCo (Muon) K=1", "DiLoCo (AdamW) K=4", "MuLoCo (Muon) K=4"}
    for probe in probes:
        mine = [r for r in outer if r["arm"] == probe]
        best = min(mine, key=lambda r: (r["eval_loss"], r["value"]))
        # the 12 pairs, then past a chosen edge one coordinate at a time (at most 2 a side)
        assert 12 <= len(mine) <= 20 and [r["value"] for r in mine if r["chosen"]] == [best["value"]]
        chosen = dict(zip(("outer_lr", "outer_momentum"), best["value"], strict=True))
        targets = [probe] + ([f"{probe}, fp4 + error feedback"] if "K=4" in probe else [])
        assert mine[0]["targets"] == targets
        for label in targets:
            assert {f: rows[label]["changes"][f] for f in chosen} == chosen, label
    assert "outer_lr" not in rows["data-parallel Muon (sync, K=4)"]["changes"]
    status, _, err = run_cli(["study", "muon", "--data", "digits", "--runs-dir", tmp_path, "-q"], capsys)
    assert status == 2 and "--data shakespeare or --data mnist1d" in err
