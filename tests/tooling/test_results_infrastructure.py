"""What the results pages stand on: the drop rule, the topic split, --num-samples, the run
cache, the inner-lr tuning, the warmup, the contrast claims of the scaling row, the family
claims, and ``make results``' command list. Fixtures are worked by hand in the comments."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diloco import DiLoCoConfig
from diloco.core.driver import train
from diloco.core.sync import merge_targets
from diloco.data import load_digits_split
from diloco.text import topic_segments, topic_shard_dataset
from diloco.tools.cli.main import main
from diloco.tools.studies.family_report import FamilyClaim, judge_family_claims
from diloco.tools.studies.paper_report import HOLDS, NOT_RUN, PARTLY, REVERSED, judge_claims, summarise_arms
from diloco.tools.studies.paper_runs import (
    INNER_LR,
    Arm,
    RunCache,
    TuneStep,
    apply_value,
    run_arm,
    tune_arms,
    with_warmup,
)
from diloco.tools.studies.paper_studies import Claim

pytestmark = pytest.mark.tooling

BASE = DiLoCoConfig(num_workers=2, inner_steps=3, rounds=3, hidden_sizes=(6,), batch_size=8, seed=4)


def _digits():
    data = load_digits_split(seed=0)
    return data.x_train[:200], data.y_train[:200], data.x_test[:50], data.y_test[:50]


# --- the drop rule ---------------------------------------------------------------------------

def test_merge_targets_by_hand():
    # kept workers 0 and 2 of 4: carrying on merges only them; restarting merges everyone
    assert merge_targets([0, 2], range(4), "carry") == (0, 2)
    assert merge_targets([0, 2], range(4), "restart") == (0, 1, 2, 3)
    assert merge_targets([], range(3), "carry") == ()
    assert merge_targets([], range(3), "restart") == (0, 1, 2)


def test_the_drop_rule_is_a_checked_config_field():
    assert DiLoCoConfig().drop_rule == "carry"
    with pytest.raises(ValueError, match="drop_rule must be one of"):
        DiLoCoConfig(drop_prob=0.5, drop_rule="resume")
    with pytest.raises(ValueError, match="drop_rule='restart' needs drop_prob > 0"):
        DiLoCoConfig(drop_rule="restart")
    config = DiLoCoConfig(drop_prob=0.5, drop_rule="restart")
    assert DiLoCoConfig.from_dict(config.to_dict()) == config
    assert DiLoCoConfig.from_dict({"rounds": 2}).drop_rule == "carry", "an old config.json gets the default"


@pytest.mark.parametrize("executor", ["reference", "fast"])
def test_restarting_changes_a_run_only_through_the_rounds_with_a_drop(executor):
    x, y, xe, ye = _digits()
    run = {rule: train("diloco", x, y, BASE.replace(drop_prob=0.5, drop_rule=rule), x_eval=xe, y_eval=ye,
                       executor=executor) for rule in ("carry", "restart")}
    dropped = [r["dropped_workers"] for r in run["carry"].history]
    assert [r["dropped_workers"] for r in run["restart"].history] == dropped, "the same draws under both rules"
    first = next(i for i, d in enumerate(dropped) if d)  # the first round with a drop (seed 4: round 1)
    for i in range(first + 1):  # up to and including it, the global models agree: the rule acts afterwards
        assert run["carry"].history[i]["eval_loss"] == run["restart"].history[i]["eval_loss"]
    assert first + 1 < len(dropped), "the fixture needs a round after the first drop"
    assert run["carry"].history[first + 1]["eval_loss"] != run["restart"].history[first + 1]["eval_loss"]
    # with nothing ever dropped (p tiny), the two rules are the same run, bit for bit
    tiny = {rule: train("diloco", x, y, BASE.replace(drop_prob=1e-12, drop_rule=rule), x_eval=xe, y_eval=ye,
                        executor=executor) for rule in ("carry", "restart")}
    assert all(a.tobytes() == b.tobytes() for a, b in zip(tiny["carry"].params.values(),
                                                          tiny["restart"].params.values(), strict=True))


def test_the_baseline_refuses_a_drop_rule_in_one_line():
    x, y, *_ = _digits()
    with pytest.raises(ValueError, match="no outer gradient.*drop_prob=0.5, drop_rule='restart'"):
        train("sync", x, y, BASE.replace(drop_prob=0.5, drop_rule="restart"))


# --- the topic split -------------------------------------------------------------------------

def test_topic_segments_by_hand():
    # floor(i * 4 / 10) for i = 0..9
    assert topic_segments(10, 4).tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]
    assert topic_segments(3, 8).tolist() == [0, 2, 5]  # fewer rows than segments: one row each
    with pytest.raises(ValueError, match="segments"):
        topic_segments(10, 0)


def test_topic_shards_partition_the_rows_in_order_and_skew_by_segment():
    n = 4000
    x = np.arange(n, dtype=np.float64)[:, None] * 10.0  # x tells each row's index
    y = np.arange(n) % 7
    shards = topic_shard_dataset(x, y, 4, np.random.default_rng(0), alpha=0.01, segments=16)
    rows = np.concatenate([s[0][:, 0] / 10.0 for s in shards]).astype(int)
    assert sorted(rows.tolist()) == list(range(n)), "disjoint and together the whole data set"
    for xs, ys in shards:
        index = (xs[:, 0] / 10.0).astype(int)
        assert np.all(np.diff(index) > 0), "each worker's rows keep their order"
        assert np.array_equal(ys, y[index]), "labels travel with their rows"
    segment = topic_segments(n, 16)
    owner = np.empty(n, dtype=int)
    for k, (xs, _) in enumerate(shards):
        owner[(xs[:, 0] / 10.0).astype(int)] = k
    # alpha = 0.01: nearly every segment lies on one worker
    share = [np.bincount(owner[segment == s], minlength=4).max() / np.sum(segment == s) for s in range(16)]
    assert np.mean(share) > 0.9
    iid_like = topic_shard_dataset(x, y, 4, np.random.default_rng(0), alpha=100.0, segments=16)
    owner_iid = np.empty(n, dtype=int)
    for k, (xs, _) in enumerate(iid_like):
        owner_iid[(xs[:, 0] / 10.0).astype(int)] = k
    share_iid = [np.bincount(owner_iid[segment == s], minlength=4).max() / np.sum(segment == s) for s in range(16)]
    assert np.mean(share_iid) < 0.5, "large alpha spreads every segment over the workers"
    with pytest.raises(ValueError, match="same number of rows"):
        topic_shard_dataset(x, y[:-1], 4, np.random.default_rng(0))


def test_the_topic_split_is_a_checked_config_field_the_trainer_uses():
    with pytest.raises(ValueError, match="noniid_split='topic' needs iid=False"):
        DiLoCoConfig(noniid_split="topic")
    with pytest.raises(ValueError, match="noniid_split must be one of"):
        DiLoCoConfig(iid=False, noniid_split="scene")
    x, y, xe, ye = _digits()
    label = train("diloco", x, y, BASE.replace(iid=False), x_eval=xe, y_eval=ye)
    topic = train("diloco", x, y, BASE.replace(iid=False, noniid_split="topic"), x_eval=xe, y_eval=ye)
    assert label.history[-1]["eval_loss"] != topic.history[-1]["eval_loss"]


# --- --num-samples -----------------------------------------------------------------------------

def test_num_samples_is_refused_where_it_has_no_effect(tmp_path, capsys):
    assert main(["train", "--data", "digits", "--num-samples", "100", "--runs-dir", str(tmp_path), "-q",
                 "--no-plots"]) == 2
    assert "--num-samples has no effect with --data digits" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # argparse refuses it, one line
        main(["train", "--data", "mnist1d", "--num-samples", "0", "--runs-dir", str(tmp_path)])
    assert stopped.value.code == 2 and "--num-samples: must be a positive int" in capsys.readouterr().err


def test_num_samples_generates_and_caches_that_many(tmp_path):
    pytest.importorskip("mnist1d")
    from diloco.data import load_mnist1d

    data = load_mnist1d(cache_dir=tmp_path, num_samples=500)
    assert len(data.y_train) + len(data.y_test) == 500 and (tmp_path / "mnist1d-n500-seed42.npz").is_file()
    again = load_mnist1d(cache_dir=tmp_path, num_samples=500)
    assert np.array_equal(again.x_train, data.x_train)
    assert not list(tmp_path.glob(".*tmp*")), "no partial file left behind"


# --- runs, the cache, tuning, warmup ---------------------------------------------------------

class _Data:
    def __init__(self):
        self.x_train, self.y_train, self.x_test, self.y_test = _digits()


def test_the_run_cache_returns_the_stored_outcome_and_keys_on_everything_a_run_depends_on(tmp_path):
    cache, data = RunCache(tmp_path / "cache"), _Data()
    arm = Arm("a", "diloco", {})
    first = run_arm(arm, BASE, 0, data, cache=cache, data_key={"name": "digits"})
    again = run_arm(arm._replace(label="b"), BASE, 0, data, cache=cache, data_key={"name": "digits"})
    assert again["cached"] and again["arm"] == "b" and again["eval_loss"] == first["eval_loss"]
    assert len(list((tmp_path / "cache").glob("*.json"))) == 1
    keys = {RunCache.key("diloco", BASE, 0, {"name": "digits"}), RunCache.key("diloco", BASE, 1, {"name": "digits"}),
            RunCache.key("sync", BASE, 0, {"name": "digits"}), RunCache.key("diloco", BASE.replace(rounds=4), 0,
                                                                             {"name": "digits"}),
            RunCache.key("diloco", BASE, 0, {"name": "digits", "num_samples": 9})}
    assert len(keys) == 5, "seed, algorithm, config and data each change the key"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        RunCache(tmp_path / "file")


def test_apply_value_sets_the_inner_lr_or_a_field():
    assert apply_value({"rounds": 2}, INNER_LR, 0.01) == {"rounds": 2, "inner": {"lr": 0.01}}
    assert BASE.replace(**apply_value({}, INNER_LR, 0.01)).inner.lr == 0.01
    assert apply_value({}, "outer_lr", 0.3) == {"outer_lr": 0.3}


def test_tuning_gives_each_group_its_probes_best_value():
    data = _Data()
    arms = [Arm("p", "diloco", {}), Arm("q", "diloco", {"outer_lr": 0.3})]
    tuned, records = tune_arms([TuneStep(INNER_LR, (1e-4, 3e-2), (("p", ("p", "q")),))], arms, BASE, data, [7],
                               extend=0)
    by_value = {r["value"]: r["eval_loss"] for r in records}
    best = min(by_value, key=by_value.get)
    assert [r["chosen"] for r in records] == [v == best for v in (1e-4, 3e-2)]
    assert all(a.changes["inner"]["lr"] == best for a in tuned) and tuned[1].changes["outer_lr"] == 0.3
    assert [a.label for a in tuned] == ["p", "q"] and records[0]["targets"] == ["p", "q"]


def test_the_ladder_by_hand():
    from diloco.tools.studies.paper_runs import next_on_ladder

    assert [next_on_ladder(v, up=True) for v in (0.01, 0.03, 0.02, 0.7, 3.0)] == [0.03, 0.1, 0.03, 1.0, 10.0]
    assert [next_on_ladder(v, up=False) for v in (0.01, 0.003, 0.3, 0.7)] == [0.003, 0.001, 0.1, 0.3]


def test_a_best_value_at_the_grids_end_extends_the_grid(monkeypatch):
    import diloco.tools.studies.paper_runs as runs

    # a fake run whose loss is (log10 lr + 1.5)^2: best at lr = 10^-1.5 = 0.0316
    def fake(arm, base, seed, dataset, **_):
        lr = arm.changes["inner"]["lr"]
        return {"eval_loss": (np.log10(lr) + 1.5) ** 2}

    monkeypatch.setattr(runs, "run_arm", fake)
    arms = [Arm("p", "diloco", {})]
    tuned, records = runs.tune_arms([TuneStep(INNER_LR, (1e-3, 3e-3), (("p", ("p",)),))], arms, BASE, None, [0])
    # 3e-3 is the top: try 1e-2 (still the top), then 3e-2 (interior now? 0.03 is the top again; the
    # limit of two added values stops there)
    assert [r["value"] for r in records] == [1e-3, 3e-3, 1e-2, 3e-2]
    assert tuned[0].changes["inner"]["lr"] == 3e-2 and [r["chosen"] for r in records] == [False] * 3 + [True]
    _, records = runs.tune_arms([TuneStep(INNER_LR, (1e-2, 3e-2, 1e-1), (("p", ("p",)),))], arms, BASE, None, [0])
    assert [r["value"] for r in records] == [1e-2, 3e-2, 1e-1], "an interior best adds nothing"


def test_warmup_is_two_percent_of_each_arms_steps_by_hand():
    cosine = BASE.replace(lr_schedule="cosine")
    arms = with_warmup([Arm("a", "diloco", {"rounds": 100, "inner_steps": 50}),  # 5,000 steps: 100
                        Arm("b", "sync", {"rounds": 10, "inner_steps": 5}),  # 50 steps: 1
                        Arm("c", "diloco", {"warmup_steps": 7})], cosine)
    assert [a.changes["warmup_steps"] for a in arms] == [100, 1, 7]
    assert arms[0].changes["record_similarity"] and "record_similarity" not in arms[1].changes
    assert "warmup_steps" not in with_warmup([Arm("a", "diloco", {})], BASE)[0].changes


# --- claims ----------------------------------------------------------------------------------

def _outcome(arm, seed, loss):
    return {"arm": arm, "algo": "diloco", "seed": seed, "num_workers": 1, "inner_steps": 1, "rounds": 1,
            "steps_per_worker": 1, "eval_loss": loss, "eval_perplexity": float(np.exp(loss)),
            "eval_bits": loss, "eval_accuracy": 0.5, "best_eval_loss": loss, "all_reduces": 1, "bytes_sent": 0,
            "curve": [[1, loss]], "seconds": 0.0, "engine": "fast"}


def test_a_contrast_claim_compares_the_two_gaps_seed_by_seed():
    # gaps to DP: small model 0.30, 0.40, 0.50; large model 0.10, 0.10, 0.20; d = 0.2, 0.3, 0.3
    losses = {"DP s": [2.0, 2.0, 2.0], "K s": [2.3, 2.4, 2.5], "DP l": [1.0, 1.1, 1.0], "K l": [1.1, 1.2, 1.2]}
    outcomes = [_outcome(arm, s, v) for arm, values in losses.items() for s, v in enumerate(values)]
    rows = summarise_arms(outcomes, [Arm(a, "diloco", {}) for a in losses])
    (claim,) = judge_claims([Claim("gap shrinks", "K l", "K s", "paper", better_base="DP l", worse_base="DP s")],
                            rows, "shakespeare")
    assert claim["metric_difference"]["mean"] == pytest.approx(0.8 / 3)
    assert claim["better_metric"] == pytest.approx(0.4 / 3) and claim["worse_metric"] == pytest.approx(0.4)
    assert claim["verdict"] == HOLDS and claim["metric"] == "loss gap"


def test_family_claims_by_hand():
    # fp4 costs 2%, 1%, 3% of native's loss. Against a 3% margin: 3% - cost = 1, 2, 0 points, mean 1,
    # sd 1, half-width 4.303 / sqrt(3) = 2.48 points: [-1.5, +3.5], the mean only: holds partly
    outcomes = [{"variant": v, "seed": s, "eval_loss": loss} for v, values in
                {"native": [1.0, 2.0, 1.0], "fp4": [1.02, 2.02, 1.03]}.items() for s, loss in enumerate(values)]
    (cost,) = judge_family_claims([FamilyClaim("fp4 costs under 3%", "native", "fp4", "p", 0.03)], outcomes)
    assert cost["metric_difference"]["mean"] == pytest.approx(0.02) and cost["verdict"] == PARTLY
    # "fp4 beats native": d = native - fp4 = -0.02, -0.02, -0.03, mean -0.0233, sd 0.00577,
    # half-width 4.303 * 0.00577 / sqrt(3) = 0.0143: [-0.0377, -0.0090], below 0
    (order,) = judge_family_claims([FamilyClaim("fp4 beats native", "fp4", "native", "p")], outcomes)
    assert order["verdict"] == REVERSED
    assert order["metric_difference"]["high"] == pytest.approx(-0.0090, abs=1e-4)
    seconds = {("a", "1Mbit"): {0: 1.0, 1: 2.0}, ("b", "1Mbit"): {0: 3.0, 1: None}}
    (time_claim,) = judge_family_claims([FamilyClaim("a first", "a", "b", "p", field="seconds@1Mbit")], [], seconds)
    assert time_claim["verdict"] == NOT_RUN and "b did not reach" in time_claim["note"]


# --- make results -----------------------------------------------------------------------------

def test_make_results_lists_its_commands(capsys):
    from diloco.tools.studies.make_results import JOBS
    from diloco.tools.studies.make_results import main as make_results

    assert make_results(["--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(JOBS) and all(line.startswith(".venv/bin/diloco study ") for line in printed)
    assert make_results(["--only", "nope", "--dry-run"]) == 2
    assert "unknown job" in capsys.readouterr().err
    assert make_results(["--jobs", "0"]) == 2
    assert len({j.name for j in JOBS}) == len(JOBS)
    assert json.dumps([j._asdict() for j in JOBS])  # plain data


def test_a_non_iid_claim_is_one_row_across_the_two_splits():
    from diloco.tools.studies.paper_studies import claim_setting

    assert claim_setting("non-IID topic a=0.5") == claim_setting("non-IID label skew a=0.5") == "non-IID a=0.5"
    assert claim_setting("IID") == "IID"


# --- the outer step: lr x momentum, then the inner lr again -----------------------------------

def _bowl(arm, base, seed, dataset, **_):
    """A fake run: loss (lr - 0.5)^2 + (mu - 0.5)^2 + (log10 inner lr + 2)^2 / 10, plus a
    seed-dependent offset, so the argmin is known by hand: lr 0.5, mu 0.5, inner lr 0.01."""
    c = arm.changes
    inner = c.get("inner", {}).get("lr", 1e-3)
    return {"eval_loss": (c.get("outer_lr", 0.7) - 0.5) ** 2 + (c.get("outer_momentum", 0.9) - 0.5) ** 2
            + (np.log10(inner) + 2) ** 2 / 10 + 0.001 * seed}


def test_the_outer_step_is_the_grids_argmin_and_the_inner_lr_is_tuned_again_after_it(monkeypatch):
    import diloco.tools.studies.paper_runs as runs
    from diloco.tools.studies.paper_studies import PAPER_STUDIES, tuning_steps

    monkeypatch.setattr(runs, "run_arm", _bowl)
    arms = PAPER_STUDIES["fig9"].arms(BASE.replace(num_workers=1), 9)
    steps = tuning_steps(PAPER_STUDIES["fig9"], arms, (3e-3, 1e-2, 3e-2))
    assert [s.field for s in steps] == [INNER_LR, runs.OUTER_STEP, INNER_LR]
    assert len(steps[1].grid) == 12 and (1.0, 0.9) in steps[1].grid and (0.3, 0.0) in steps[1].grid
    diloco = arms[1].label
    assert steps[1].groups == ((diloco, (diloco,)),) == steps[2].groups, "the baseline has no outer step"
    tuned, records = runs.tune_arms(steps, arms, BASE, None, [1000])
    outer = [r for r in records if r["step"] == 1]
    assert len(outer) == 12, "the best pair (0.5, 0.5) is inside the grid: nothing past it is tried"
    assert [r["value"] for r in outer if r["chosen"]] == [(0.5, 0.5)]
    by_value = {r["value"]: r["eval_loss"] for r in outer}
    assert min(by_value, key=by_value.get) == (0.5, 0.5)
    assert tuned[1].changes["outer_lr"] == 0.5 and tuned[1].changes["outer_momentum"] == 0.5
    assert tuned[1].changes["inner"]["lr"] == 1e-2 and "outer_lr" not in tuned[0].changes
    again = [r for r in records if r["step"] == 2]
    assert again and all(r["arm"] == diloco for r in again)


def test_scaling_tunes_dilocos_inner_lr_apart_from_data_parallelisms():
    from diloco.tools.studies.paper_studies import PAPER_STUDIES, tuning_steps

    study = PAPER_STUDIES["scaling"]
    arms = study.arms(BASE.replace(inner_steps=50), 2000)
    inner, outer, again = tuning_steps(study, arms, (1e-2, 3e-2))
    assert inner.groups == tuple((a.label, (a.label,)) for a in arms), "each arm on itself"
    assert {probe for probe, _ in outer.groups} == {a.label for a in arms if a.algo == "diloco"} == {
        probe for probe, _ in again.groups}
    assert len(outer.groups) == 12  # K = 1, 2, 4, 8 at widths 32, 64, 128


def test_a_tuning_seed_is_never_a_reported_seed(tmp_path, capsys):
    from diloco.tools.studies.paper_runs import check_tuning_seeds

    check_tuning_seeds([1000], [0, 1, 2])
    with pytest.raises(ValueError, match=r"\[1000\]"):
        check_tuning_seeds([1000, 1001], [998, 999, 1000])
    code = main(["study", "fig9", "--data", "mnist1d", "--seed", "999", "--seeds", "3", "--runs-dir", str(tmp_path),
                 "-q", "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "--seed" in err and "1000" in err
    assert not any(tmp_path.iterdir()), "refused before any work"


def test_every_exported_paper_study_was_tuned_on_seeds_it_does_not_report():
    from pathlib import Path

    from diloco.tools.studies.results_page import load_summaries

    summaries = load_summaries(Path(__file__).resolve().parents[2] / "docs" / "assets" / "results")
    for key, summary in summaries.items():
        if isinstance(key, tuple) and key[0] != "family":
            assert not set(summary["tune_seeds"]) & set(summary["seeds"]), key


def test_the_tuning_printout_names_the_grid_and_bolds_the_choice():
    from diloco.tools.studies.results_page import render_tuning

    outer = [{"arm": "D", "field": ["outer_lr", "outer_momentum"], "value": [lr, mu], "eval_loss": loss,
              "targets": ["D"], "chosen": (lr, mu) == (1.0, 0.5), "step": 1}
             for (lr, mu), loss in (((0.3, 0.0), 2.5), ((1.0, 0.5), 1.25), ((0.7, 0.9), 2.0))]
    inner = [{"arm": "D", "field": INNER_LR, "value": v, "eval_loss": 3 - v, "targets": ["D"], "chosen": v == 0.03,
              "step": step} for step in (0, 2) for v in (0.01, 0.03)]
    text = render_tuning({"tune_seeds": [1000], "tuning": inner[:2] + outer + inner[2:]})
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    assert lines == ["- inner lr of D: 0.01: 2.990, **0.03: 2.970**",
                     "- outer lr x outer momentum (lr/mu) of D: 0.3/0: 2.500, 0.7/0.9: 2.000, **1/0.5: 1.250** "
                     "(chosen at the grid's edge: lr 1 is its largest)",
                     "- inner lr of D, again at the chosen outer step: 0.01: 2.990, **0.03: 2.970**"]
    assert "[1000], which are not reported seeds" in text


def _tilted_bowl(centre):
    def run(arm, base, seed, dataset, **_):
        c = arm.changes
        lr, mu = c.get("outer_lr", 0.7), c.get("outer_momentum", 0.9)
        return {"eval_loss": (lr - centre[0]) ** 2 + (mu - centre[1]) ** 2}
    return run


def _outer_records(centre, **kwargs):
    import diloco.tools.studies.paper_runs as runs

    arm = runs.Arm("DiLoCo", "diloco", {})
    step = runs.outer_step_grid((("DiLoCo", ("DiLoCo",)),))
    tuned, records = runs.tune_arms([step], [arm], BASE, None, [1000], run=_tilted_bowl(centre), **kwargs)
    return tuned[0].changes, records


def test_a_chosen_outer_step_at_the_grids_edge_is_tried_past_it_one_coordinate_at_a_time():
    # by hand: (1.0, 0.9) wins the 12 pairs; past it (1.4, 0.9) and (1.0, 0.95); (1.4, 0.9) wins
    # and is the largest lr, so (2.0, 0.9) is tried; it loses, and 1.4 is no longer an edge
    changes, records = _outer_records((1.4, 0.95))
    tried = [tuple(r["value"]) for r in records]
    assert len(tried) == 15 and tried[12:] == [(1.4, 0.9), (1.0, 0.95), (2.0, 0.9)]
    assert [tuple(r["value"]) for r in records if r["chosen"]] == [(1.4, 0.9)]
    assert (changes["outer_lr"], changes["outer_momentum"]) == (1.4, 0.9)


def test_momentum_zero_is_not_extended_and_each_direction_stops_at_its_limit():
    # the bowl's centre lies below every ladder: lr goes down twice (0.2, then 0.1) and stops;
    # momentum 0 is the lowest there is
    changes, records = _outer_records((0.0, -1.0))
    assert [tuple(r["value"]) for r in records][12:] == [(0.2, 0.0), (0.1, 0.0)]
    assert (changes["outer_lr"], changes["outer_momentum"]) == (0.1, 0.0)
    _, as_it_is = _outer_records((0.0, -1.0), extend=0)
    assert len(as_it_is) == 12


def test_make_results_pieces_side_by_side_keep_each_others_times(tmp_path):
    """Two ``--only`` pieces read the record at their start; the one that ends last must not drop the
    other's entry (it rereads the file and replaces only its own jobs)."""
    from diloco.tools.studies.make_results import Job, _merged

    path = tmp_path / "make-results.json"
    path.write_text(json.dumps({"jobs": {"a": {"seconds": 1}, "b": {"seconds": 2}}}))
    stale_b = {"jobs": {"a": {"seconds": 1}, "b": {"seconds": 20}}}  # piece b read the file, then ran b
    path.write_text(json.dumps({"jobs": {"a": {"seconds": 10}, "b": {"seconds": 2}}}))  # piece a wrote first
    merged = _merged(path, stale_b, [Job("b", "")])
    assert merged["jobs"] == {"a": {"seconds": 10}, "b": {"seconds": 20}}
    assert "last_run" not in merged


def test_make_results_minutes_runs_a_piece_and_the_next_piece_goes_on(tmp_path, monkeypatch, capsys):
    """``--minutes``: past the budget nothing more starts and the running commands get SIGINT (each
    fake study here ends 130 on it, as a study does, its runs kept); nothing is rendered (exit 3).
    The same command again runs the rest, and the whole run's seconds add up over the pieces."""
    import subprocess
    import sys

    from diloco.tools.studies import claim_curves, results_page
    from diloco.tools.studies import make_results as mr

    jobs = (mr.Job("slow", "1.5"), mr.Job("later", "0"), mr.Job("last", "0"))
    monkeypatch.setattr(mr, "TIERS", {"mlp": (jobs, str(tmp_path))})
    monkeypatch.setattr(mr, "LOGS", str(tmp_path / "logs"))
    monkeypatch.setattr(mr, "POLL_SECONDS", 0.1)
    rendered = []
    done = tmp_path / "done"
    script = ("import pathlib, signal, sys, time\n"
              "signal.signal(signal.SIGINT, lambda *a: sys.exit(130))\n"
              f"done = pathlib.Path({str(done)!r}) / sys.argv[2]\n"
              "time.sleep(0 if done.exists() else float(sys.argv[1]) * 60)\n"
              "done.touch()\n")
    done.mkdir()

    def fake_run(job, logs, env):
        log = open(logs / f"{job.name}.log", "w", encoding="utf-8")  # noqa: SIM115
        return subprocess.Popen([sys.executable, "-c", script, job.args, job.name], stdout=log), log

    monkeypatch.setattr(mr, "_run", fake_run)
    monkeypatch.setattr(claim_curves, "main", lambda argv: rendered.append(argv))
    monkeypatch.setattr(results_page, "main", lambda argv: rendered.append(argv))
    assert mr.main(["--jobs", "1", "--minutes", "0.05"]) == 3  # 3 s: "slow" (90 s) is stopped, the rest wait
    record = json.loads((tmp_path / "make-results.json").read_text())
    assert record["jobs"]["slow"]["status"] == mr.STOPPED and set(record["jobs"]) == {"slow"}
    assert rendered == [] and "unfinished: ['slow', 'later', 'last']" in capsys.readouterr().out
    assert record["unfinished_run"]["pieces"] == 1 and "last_run" not in record
    (done / "slow").touch()  # the study's runs are in the cache now: it ends at once
    assert mr.main(["--jobs", "1", "--minutes", "5"]) == 0
    record = json.loads((tmp_path / "make-results.json").read_text())
    assert {r["status"] for r in record["jobs"].values()} == {"ok"} and "unfinished_run" not in record
    assert record["last_run"]["pieces"] == 2 and record["last_run"]["seconds"] >= 3
    assert record["jobs"]["slow"]["seconds"] >= 3  # the stopped piece's time is carried
    assert len(rendered) == 2  # the plots and the one page
    assert mr.main(["--minutes", "0"]) == 2
