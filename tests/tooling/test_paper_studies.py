"""The paper studies: paired statistics and verdicts by hand, the arms of each study, and
one tiny study end to end (run folder, summary, export)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diloco import DiLoCoConfig
from diloco.tools.cli.main import main
from diloco.tools.studies.paper_report import (
    HOLDS,
    NOT_RUN,
    PARTLY,
    REVERSED,
    TIE,
    combine_verdicts,
    judge_claims,
    paired_difference,
    summarise_arms,
    verdict,
)
from diloco.tools.studies.paper_studies import PAPER_STUDIES, Arm, Claim, arm_engine

pytestmark = pytest.mark.tooling


def test_paired_difference_is_the_t_interval_of_the_per_seed_differences():
    worse, better = [3.0, 5.0, 4.0], [1.0, 2.0, 3.0]  # differences 2, 3, 1: mean 2, sd 1
    diff = paired_difference(worse, better)
    assert diff["mean"] == 2.0 and diff["n"] == 3
    assert diff["half_width"] == pytest.approx(4.303 * 1.0 / np.sqrt(3))
    unpaired_sd = np.sqrt(np.var(worse, ddof=1) / 3 + np.var(better, ddof=1) / 3)
    assert diff["half_width"] < 4.303 * unpaired_sd, "pairing removes the noise the arms share"
    with pytest.raises(ValueError, match="same seeds"):
        paired_difference([1.0], [1.0, 2.0])


@pytest.mark.parametrize("low, mean, high, expected", [(0.1, 0.5, 0.9, HOLDS), (-0.1, 0.5, 1.1, PARTLY),
                                                       (-0.5, 0.0, 0.5, TIE), (-0.5, -0.1, 0.3, TIE),
                                                       (-0.9, -0.4, -0.1, REVERSED)])
def test_verdicts_follow_the_interval(low, mean, high, expected):
    assert verdict({"low": low, "mean": mean, "high": high}) == expected


@pytest.mark.parametrize("low, mean, high, expected", [(0.01, 0.02, 0.04, HOLDS), (0.01, 0.04, 0.07, PARTLY),
                                                       (0.03, 0.06, 0.09, TIE), (0.06, 0.07, 0.09, REVERSED)])
def test_a_robustness_claim_holds_when_the_relative_cost_stays_under_its_margin(low, mean, high, expected):
    assert verdict({"low": low, "mean": mean, "high": high}, margin=0.05) == expected


def test_a_margin_claim_is_judged_on_the_relative_cost_seed_by_seed():
    arms = [Arm("p=0", "diloco", {}), Arm("p=0.5", "diloco", {})]
    # perplexity exp(loss): p=0.5 costs exactly 3% on every seed
    outcomes = [outcome("p=0", s, 1.0 + s) for s in range(3)]
    outcomes += [outcome("p=0.5", s, 1.0 + s + np.log(1.03)) for s in range(3)]
    rows = summarise_arms(outcomes, arms)
    (judged,) = judge_claims([Claim("drops cost under 5%", "p=0", "p=0.5", "paper", margin=0.05)], rows,
                             "shakespeare")
    assert judged["metric_difference"]["mean"] == pytest.approx(0.03) and judged["verdict"] == HOLDS
    (tight,) = judge_claims([Claim("drops cost under 2%", "p=0", "p=0.5", "paper", margin=0.02)], rows,
                            "shakespeare")
    assert tight["verdict"] == REVERSED, "3% on every seed is beyond a 2% margin"


def test_a_claim_takes_the_weakest_verdict_of_the_tasks_it_ran_on():
    assert combine_verdicts([HOLDS, HOLDS]) == HOLDS
    assert combine_verdicts([HOLDS, PARTLY]) == PARTLY
    assert combine_verdicts([HOLDS, REVERSED]) == REVERSED, "a reversal on one task is not a partial hold"
    assert combine_verdicts([PARTLY, TIE]) == TIE
    assert combine_verdicts([HOLDS, NOT_RUN]) == HOLDS, "a task not run is no evidence either way"
    assert combine_verdicts([NOT_RUN, NOT_RUN]) == NOT_RUN


def outcome(arm, seed, loss, accuracy=0.5):
    return {"arm": arm, "algo": "diloco", "seed": seed, "num_workers": 2, "inner_steps": 1, "rounds": 1,
            "steps_per_worker": 1, "eval_loss": loss, "eval_accuracy": accuracy, "eval_perplexity": float(np.exp(loss)),
            "eval_bits": loss / np.log(2), "best_eval_loss": loss, "all_reduces": 1, "bytes_sent": 0.0,
            "pseudo_grad_cosine": None, "curve": [[1, loss]], "seconds": 0.0, "engine": "reference"}


def test_claims_are_judged_on_the_tasks_metric_seed_by_seed():
    arms = [Arm("a", "diloco", {}), Arm("b", "diloco", {})]
    # a is better than b on every seed by 0.1 although the seeds differ by much more
    outcomes = [outcome("a", s, 1.0 + s) for s in range(3)] + [outcome("b", s, 1.1 + s) for s in range(3)]
    rows = summarise_arms(outcomes, arms)
    (judged,) = judge_claims([Claim("a beats b", "a", "b", "paper")], rows, "mnist1d")
    assert judged["verdict"] == HOLDS and judged["metric_difference"]["mean"] == pytest.approx(0.1)
    (text,) = judge_claims([Claim("a beats b", "a", "b", "paper")], rows, "shakespeare")
    expected = np.mean([np.exp(1.1 + s) - np.exp(1.0 + s) for s in range(3)])
    assert text["metric_difference"]["mean"] == pytest.approx(expected), "the char-LM is judged on perplexity"
    (reverse,) = judge_claims([Claim("b beats a", "b", "a", "paper")], rows, "mnist1d")
    assert reverse["verdict"] == REVERSED


def test_every_study_builds_its_arms_and_claims_at_the_default_budgets():
    base = DiLoCoConfig()
    for study in PAPER_STUDIES.values():
        arms = study.arms(base, 1000)
        labels = {arm.label for arm in arms}
        assert len(labels) == len(arms), f"{study.name}: arm labels must be unique"
        for claim in study.claims(arms):
            assert {claim.better, claim.worse} <= labels, (study.name, claim)
        for arm in arms:
            config = base.replace(**arm.changes)
            assert config.total_steps == 1000 or arm.label.startswith("8x updates"), (study.name, arm.label)
    table2 = {a.label: a for a in PAPER_STUDIES["table2"].arms(base, 1000)}
    assert base.replace(**table2["8x updates (1 worker, 8x steps)"].changes).total_steps == 8000
    with pytest.raises(ValueError, match="multiple of H=50"):  # -H sets the studies' H
        PAPER_STUDIES["table2"].arms(base, 1001)


def test_arms_run_on_the_engine_their_config_names_whatever_their_mechanisms_and_task():
    pytest.importorskip("diloco.engine")
    fast = DiLoCoConfig(engine="fast")
    assert arm_engine(fast.replace(drop_prob=0.1), "diloco") == "fast"
    assert arm_engine(fast, "diloco", encode=object()) == "fast"
    assert arm_engine(fast.replace(iid=False), "sync") == "fast"
    assert arm_engine(fast.replace(engine="reference"), "diloco", encode=object()) == "reference"


@pytest.mark.slow
def test_a_paper_study_runs_on_the_fast_engine_unless_told_reference(tmp_path, capsys):
    """--engine reference was silently ignored (every arm ran on the fast engine)."""
    pytest.importorskip("diloco.engine")
    argv = ["study", "fig9", "--data", "shakespeare", "--seeds", "2", "--total-steps", "4", "-H", "2",
            "--eval-windows", "32", "--context", "2", "--hidden-sizes", "4", "-q", "--no-plots", "--inner-grid", "off"]
    engines = {}
    for extra in ([], ["--engine", "reference"]):
        runs = tmp_path / (extra[-1] if extra else "default")
        assert main([*argv, "--runs-dir", str(runs), *extra]) == 0, capsys.readouterr().err
        (run_dir,) = [p for p in runs.iterdir() if p.name.endswith("study-fig9-shakespeare")]
        lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
        engines[extra[-1] if extra else "default"] = {line["engine"] for line in lines}
    assert engines == {"default": {"fast"}, "reference": {"reference"}}


@pytest.mark.slow
def test_a_tiny_study_writes_its_tables_summary_and_export(tmp_path, capsys):
    export = tmp_path / "export"
    argv = ["study", "fig9", "--data", "shakespeare", "--seeds", "2", "--total-steps", "4", "-H", "2",
            "--eval-windows", "32", "--context", "2", "--hidden-sizes", "4", "-q", "--no-plots",
            "--runs-dir", str(tmp_path), "--export", str(export)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "DiLoCo with one worker beats the 1-worker baseline" in out and "perplexity" in out
    summary = json.loads((export / "fig9-shakespeare.json").read_text())
    assert summary["task"] == "shakespeare" and summary["seeds"] == [0, 1] and summary["steps_per_worker"] == 4
    assert [row["arm"] for row in summary["rows"]] == ["baseline (1 worker)", "DiLoCo (1 worker, H=2)"]
    assert summary["claims"][0]["verdict"] in (HOLDS, PARTLY, TIE, REVERSED)
    (run_dir,) = [p for p in tmp_path.iterdir() if p.name.endswith("study-fig9-shakespeare")]
    lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    phases = [line["phase"] for line in lines]
    # 2 arms x 2 seeds, after 2 arms x 3 inner lr values (or more, where a best value at the
    # grid's end extends it), DiLoCo's 12 outer lr x momentum pairs and its 3 inner lr values
    # again, on tuning seed 1000
    assert phases.count("eval") == 4 and phases.count("tune") == len(summary["tuning"]) >= 6 + 12 + 3
    steps = {"baseline (1 worker)": [0], "DiLoCo (1 worker, H=2)": [0, 1, 2]}
    for arm, arm_steps in steps.items():
        for step in arm_steps:
            assert sum(t["chosen"] for t in summary["tuning"] if t["arm"] == arm and t["step"] == step) == 1
    assert (run_dir / "study.md").exists()
    assert {line["seed"] for line in lines if line["phase"] == "tune"} == {1000}


def test_the_paper_studies_need_a_task_they_are_defined_for(tmp_path, capsys):
    assert main(["study", "table2", "--data", "digits", "--runs-dir", str(tmp_path), "-q", "--no-plots"]) == 2
    assert "--data shakespeare or --data mnist1d" in capsys.readouterr().err


def test_the_budget_and_grid_help_strings_are_read_from_the_defaults(monkeypatch, capsys):
    """``--total-steps`` and ``--inner-grid`` print the defaults the studies use, so a changed
    default changes the help (they once showed 1000 / 2000 steps after the budget moved)."""
    import argparse

    from diloco.tools.cli.commands import total_steps_help
    from diloco.tools.cli.paper_flags import add_paper_study_flags
    from diloco.tools.studies import paper_studies

    assert "shakespeare 5000, mnist1d 2500" in total_steps_help()
    monkeypatch.setitem(paper_studies.TASKS, "mnist1d", {**paper_studies.TASKS["mnist1d"], "steps": 1234,
                                                         "inner_grid": (0.5, 0.25)})
    assert "mnist1d 1234" in total_steps_help()
    parser = argparse.ArgumentParser()
    add_paper_study_flags(parser)
    assert "mnist1d 0.5,0.25" in " ".join(parser.format_help().split())


# --- the transformer tier's studies ------------------------------------------------------------

def test_inner_muon_tunes_adamw_on_the_adamw_arm_then_muons_lr_then_each_outer_step_then_each_own_lr():
    from diloco.tools.studies.paper_runs import INNER_LR, MUON_LR, OUTER_STEP
    from diloco.tools.studies.paper_studies import tuning_steps

    study = PAPER_STUDIES["inner-muon"]
    base = DiLoCoConfig(num_workers=4, inner_steps=10)
    arms = study.arms(base, 100)
    muon, adamw, muon_sync, adamw_sync = arms
    assert [a.algo for a in arms] == ["diloco", "diloco", "sync", "sync"]
    assert muon.changes["inner_optimizer"] == "muon" == muon_sync.changes["inner_optimizer"]
    assert "inner_optimizer" not in adamw.changes and "inner_optimizer" not in adamw_sync.changes
    assert {base.replace(**a.changes).rounds for a in arms} == {10}
    assert {base.replace(**a.changes).num_workers for a in arms} == {4}
    steps = tuning_steps(study, arms, (1e-3, 3e-3))
    assert [s.field for s in steps] == [INNER_LR, MUON_LR, OUTER_STEP, INNER_LR, MUON_LR]
    assert steps[0].groups == ((adamw.label, (muon.label, adamw.label)),
                               (adamw_sync.label, (muon_sync.label, adamw_sync.label))), \
        "each Muon arm's biases take the AdamW lr of its own method"
    assert steps[1].groups == ((muon.label, (muon.label,)), (muon_sync.label, (muon_sync.label,)))
    assert steps[2].groups == ((muon.label, (muon.label,)), (adamw.label, (adamw.label,))), "sync has no outer step"
    assert steps[4].groups == ((muon.label, (muon.label,)),)
    assert steps[3].groups == ((adamw.label, (adamw.label,)),)
    absolute, without, contrast = study.claims(arms)
    assert (absolute.better, absolute.worse) == (muon.label, adamw.label)
    assert (without.better, without.worse) == (muon_sync.label, adamw_sync.label)
    assert (contrast.better, contrast.worse, contrast.better_base, contrast.worse_base) == \
        (muon.label, adamw.label, muon_sync.label, adamw_sync.label)


def test_inner_muons_sync_adamw_arm_is_table2s_k_x_batch_arm():
    """The same changes, so the run cache trains the K x batch runs once for both studies."""
    base = DiLoCoConfig(num_workers=4, inner_steps=10)
    adamw_sync = PAPER_STUDIES["inner-muon"].arms(base, 100)[3]
    batch = PAPER_STUDIES["table2"].arms(base, 100)[1]
    assert (adamw_sync.algo, adamw_sync.changes) == (batch.algo, batch.changes)


def test_fragments_compares_each_p_with_diloco_and_shares_dilocos_inner_lr():
    from diloco.tools.studies.paper_studies import tuning_steps

    study = PAPER_STUDIES["fragments"]
    base = DiLoCoConfig(num_workers=4, inner_steps=10)
    arms = study.arms(base, 100, ["2", "5"])
    assert [base.replace(**a.changes).family.fragments for a in arms] == [2, 5, 1]
    steps = tuning_steps(study, arms, (1e-3,))
    assert steps[0].groups == ((arms[-1].label, tuple(a.label for a in arms)),)
    assert [c.margin for c in study.claims(arms)] == [0.05, 0.05]
    assert all(c.better == arms[-1].label for c in study.claims(arms))
    with pytest.raises(ValueError, match="P must be 2 or more"):
        study.arms(base, 100, ["1"])


def test_text_splits_add_a_speaker_arm_and_tune_every_arm_on_the_iid_probe():
    from diloco.tools.studies.paper_studies import tuning_steps

    study = PAPER_STUDIES["splits"]
    base = DiLoCoConfig(num_workers=4, inner_steps=10)
    text = study.arms(base, 100, ["0.1"], "topic")
    assert [a.label for a in text] == ["IID", "label skew a=0.1", "topic a=0.1", "speaker"]
    assert base.replace(**text[-1].changes).noniid_split == "speaker"
    assert [a.label for a in study.arms(base, 100, ["0.1"], "label")] == ["IID", "label skew a=0.1"]
    steps = tuning_steps(study, text, (1e-3,))
    assert all(group[0] == "IID" for step in steps for group in step.groups)
    assert any("speaker" in c.text and c.worse == "speaker" for c in study.claims(text))


def test_the_scaling_study_sweeps_the_transformers_width_on_the_transformer():
    base = DiLoCoConfig(model="transformer", num_workers=4, inner_steps=10)
    arms = PAPER_STUDIES["scaling"].arms(base, 100, ["32", "64"])
    widths = {a.label: base.replace(**a.changes).transformer.d_model for a in arms}
    assert widths["DP w=32"] == 32 and widths["K=8 w=64"] == 64
    mlp = PAPER_STUDIES["scaling"].arms(DiLoCoConfig(), 100, ["32"])
    assert DiLoCoConfig().replace(**mlp[0].changes).hidden_sizes == (32,)


def test_table2s_claims_name_the_studys_k():
    arms = PAPER_STUDIES["table2"].arms(DiLoCoConfig(num_workers=4, inner_steps=10), 100)
    texts = [c.text for c in PAPER_STUDIES["table2"].claims(arms)]
    assert texts[0] == "DiLoCo beats the 4x-batch synchronous baseline" and texts[2].startswith("4x updates")


def test_outer_grid_replaces_the_outer_step_grid_and_bad_ones_are_refused(capsys):
    from diloco.tools.studies.paper_runs import OUTER_STEP
    from diloco.tools.studies.paper_studies import tuning_steps

    study = PAPER_STUDIES["fig9"]
    arms = study.arms(DiLoCoConfig(num_workers=1, inner_steps=10), 100)
    outer, = [s for s in tuning_steps(study, arms, (1e-3,), None, ((0.5, 1.0), (0.9,))) if s.field == OUTER_STEP]
    assert outer.grid == ((0.5, 0.9), (1.0, 0.9))
    for bad, words in (("1,2", "LR1,LR2"), ("1:1.5", "momenta in [0, 1)"), ("0:0.5", "lrs must be > 0"),
                       ("a:0.5", "LR1,LR2")):
        assert main(["study", "fig9", "--data", "shakespeare", "--outer-grid", bad, "-q"]) == 2
        assert words in capsys.readouterr().err


def test_fig6_tunes_each_momentum_methods_lr_and_momentum_and_sgds_lr_alone():
    from diloco.tools.studies.paper_runs import OUTER_STEP
    from diloco.tools.studies.paper_studies import tuning_steps

    study = PAPER_STUDIES["fig6"]
    arms = study.arms(DiLoCoConfig(num_workers=4, inner_steps=10), 100)
    steps = {s.groups[0][0]: s for s in tuning_steps(study, arms, (1e-3,))[1:]}
    assert sorted(steps) == sorted(a.label for a in arms)
    for label in ("Nesterov", "heavy ball", "Adam (eps 0.1)"):  # Adam's momentum is its beta1
        assert steps[label].field == OUTER_STEP and {mu for _, mu in steps[label].grid} == {0.5, 0.9}
    assert steps["Nesterov"].grid == ((0.3, 0.5), (0.3, 0.9), (0.7, 0.5), (0.7, 0.9), (1.0, 0.5), (1.0, 0.9))
    assert steps["SGD (no momentum)"].field == "outer_lr" and steps["SGD (no momentum)"].grid == (1.0, 2.0, 3.0)
    # --values replaces the lr grid, still crossed with the momenta
    replaced = {s.groups[0][0]: s for s in tuning_steps(study, arms, (1e-3,), (0.5,))[1:]}
    assert replaced["heavy ball"].grid == ((0.5, 0.5), (0.5, 0.9)) and replaced["SGD (no momentum)"].grid == (0.5,)
