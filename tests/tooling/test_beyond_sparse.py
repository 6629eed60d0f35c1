"""``diloco study sparse`` (diloco.tools.studies.beyond_sparse): the byte budgets worked by hand
and against the records, the matched densities, the command's refusals, and the results
page's section, which must hold exactly the rendering of the exported files."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from diloco import DiLoCoConfig
from diloco.core.driver import train
from diloco.data import load_digits_split
from diloco.methods.sparse import SparseConfig
from diloco.tools.studies.beyond_sparse import (
    BLOCK,
    TASKS,
    fp4_round_bytes,
    matched_density,
    render_block,
    sparse_arms,
    sparse_round_bytes,
    tensor_shapes,
)
from diloco.tools.studies.results_page import load_summaries, rebuild
from diloco.tools.studies.summaries import exports

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results-beyond.md"
RESULTS = ROOT / "docs" / "assets" / "results"


def test_the_budgets_worked_by_hand():
    assert tensor_shapes(3, (4,), 2) == [(3, 4), (4,), (4, 2), (2,)]
    # 64 values in fp4 blocks of 32: per block 32 x 4 bits = 16 bytes + 1 scale byte; two blocks = 34
    # bytes; K = 2: (K-1)/K x (payload + reduced payload) = 1/2 x 68 = 34.
    assert fp4_round_bytes([(64,)], 2) == 34.0
    # 64 values, chunks of 64, 25%: 16 kept, 6-bit indices (12 bytes) + 16 float64 (128); K = 3: 2 copies.
    assert sparse_round_bytes([(64,)], 3, SparseConfig(chunk=64, density=0.25)) == 2 * 140.0
    # the same, 2-bit: one float64 scale (8) + 12 bytes of indices + 16 x 2 bits (4 bytes) = 24.
    assert sparse_round_bytes([(64,)], 3, SparseConfig(chunk=64, density=0.25, bits=2)) == 2 * 24.0


def test_the_matched_density_is_the_largest_that_fits():
    shapes = tensor_shapes(64, (16,), 10)
    budget = fp4_round_bytes(shapes, 4)
    density = matched_density(shapes, 4, budget, chunk=256, bits=2)
    assert sparse_round_bytes(shapes, 4, SparseConfig(chunk=256, density=density, bits=2)) <= budget
    assert sparse_round_bytes(shapes, 4, SparseConfig(chunk=256, density=density + 0.001, bits=2)) > budget
    with pytest.raises(ValueError, match="no density fits"):
        matched_density(shapes, 4, 1.0, chunk=256)


def test_the_arms_record_the_bytes_the_study_budgets():
    data = load_digits_split(seed=0)
    x, y = data.x_train[:240], data.y_train[:240]
    shapes = tensor_shapes(64, (16,), 10)
    arms = sparse_arms(shapes, 4, 4, 2)
    budget = fp4_round_bytes(shapes, 4)
    base = DiLoCoConfig(hidden_sizes=(16,), batch_size=8, seed=0)
    sent = {}
    for arm in arms:
        history = train("diloco", x, y, base.replace(**arm.changes), x_eval=x[:20], y_eval=y[:20]).history
        sent[arm.label] = history[-1]["cumulative_bytes"]
    fp4, full = sent[arms[1].label], sent[arms[0].label]
    assert fp4 == 2 * budget and full == 2 * 2 * 3 / 4 * 8 * sum(int(np.prod(s)) for s in shapes)
    for arm in arms[2:6]:  # the equal-bytes arms: at most the fp4 budget
        assert sent[arm.label] <= fp4, arm.label
        assert sent[arm.label] > 0.9 * fp4, arm.label


@pytest.mark.parametrize("argv, message", [
    (["--data", "mnist1d", "--seeds", "4"], "--seeds must be at least 5"),
    (["--data", "digits", "--seeds", "5"], "study sparse runs on --data shakespeare or --data mnist1d"),
    (["--data", "mnist1d", "--seeds", "5", "--total-steps", "12"], "--total-steps must be a positive multiple"),
])
def test_the_command_refuses_in_one_line(argv, message, tmp_path, capsys):
    from cli_helpers import run_cli

    status, _, err = run_cli(["study", "sparse", *argv, "--runs-dir", tmp_path, "-q"], capsys)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_the_results_page_section_is_exactly_the_rendering_of_the_files():
    page = PAGE.read_text(encoding="utf-8")
    loaded = load_summaries(RESULTS)
    summaries = exports(loaded, "beyond-sparse")
    assert set(summaries) == set(TASKS), "docs/assets/results/beyond-sparse-<task>.json: run the study"
    names = [m.group("name") for m in BLOCK.finditer(page)]
    assert sorted(names) == sorted(f"beyond-sparse-{task}" for task in TASKS)
    for match in BLOCK.finditer(page):
        task = match.group("name").removeprefix("beyond-sparse-")
        assert match.group("body") == render_block(summaries[task]), (
            "run python -m diloco.tools.studies.beyond_sparse to render the section again")
        before = page[page.rindex("\n## ", 0, match.start()):match.start()]
        commands = re.findall(rf"^\.venv/bin/diloco study sparse --data {task}\b.*$", before, re.M)
        assert commands, f"no command beside the block of {task}"
        command = commands[-1]
        assert "--export docs/assets/results" in command
        assert int(re.search(r"--seeds (\d+)", command).group(1)) == len(summaries[task]["seeds"]) >= 5
        steps = re.search(r"--total-steps (\d+)", command)
        assert (int(steps.group(1)) if steps else TASKS[task]["steps"]) == summaries[task]["steps_per_worker"]
    assert rebuild(page, loaded) == page


def test_every_arm_is_tuned_and_sparseloco_tunes_its_feedback_decay_in_place_of_momentum():
    from diloco.tools.studies.beyond_sparse import DECAYS, OUTER_LRS, OUTER_MOMENTA, SGD_LRS, sparse_tuning_steps
    from diloco.tools.studies.paper_runs import FEEDBACK_DECAY, INNER_LR, OUTER_STEP, apply_value

    arms = sparse_arms(tensor_shapes(40, (128,), 10), 4, 50, 5)
    inner, nesterov, sparseloco = sparse_tuning_steps(arms, 3e-3)
    labels = [a.label for a in arms]
    # the inner lr: 1e-3, 3e-3, 1e-2, probed on full-precision DiLoCo for every arm
    assert inner.field == INNER_LR and inner.grid == (1e-3, 3e-3, 1e-2)
    assert inner.groups == ((labels[0], tuple(labels)),)
    # the five Nesterov arms each on itself over 3 x 2 pairs; the two SGD-outer arms over lr x beta
    assert nesterov.field == OUTER_STEP and [g[0] for g in nesterov.groups] == labels[:5]
    assert len(nesterov.grid) == len(OUTER_LRS) * len(OUTER_MOMENTA) == 6
    assert sparseloco.field == ("outer_lr", FEEDBACK_DECAY) and [g[0] for g in sparseloco.groups] == labels[5:]
    assert all(g[1] == (g[0],) for g in nesterov.groups + sparseloco.groups)
    assert (8.0, 0.99) in sparseloco.grid and len(sparseloco.grid) == len(SGD_LRS) * len(DECAYS)
    # a pair sets the outer lr and the buffer's decay, and leaves the rest of the wire alone
    changes = apply_value(arms[6].changes, sparseloco.field, (0.7, 0.9))
    assert changes["outer_lr"] == 0.7 and changes["family"]["topk_decay"] == 0.9
    assert {k: v for k, v in changes["family"].items() if k != "topk_decay"} == {
        k: v for k, v in arms[6].changes["family"].items() if k != "topk_decay"}
    assert changes["outer_momentum"] == 0.0 and changes["outer_optimizer"] == "sgd"


def test_a_feedback_decay_chosen_at_its_grids_top_is_tried_higher_up_to_no_decay():
    from diloco.tools.studies.paper_runs import FEEDBACK_DECAY, past_the_edge

    field = ("outer_lr", FEEDBACK_DECAY)
    grid = [(lr, b) for lr in (0.5, 1.0) for b in (0.9, 0.99)]
    added: dict = {}
    assert past_the_edge(field, grid, (0.5, 0.99), added, 2) == [(0.3, 0.99), (0.5, 1.0)]
    grid += [(0.3, 0.99), (0.5, 1.0)]
    # 1.0 is the ladder's top, and lr 0.5 is no longer the smallest tried: nothing more
    assert past_the_edge(field, grid, (0.5, 1.0), added, 2) == []


@pytest.mark.slow
def test_the_study_tunes_every_arm_then_reads_every_run_back_from_its_cache(tmp_path, capsys):
    import json

    from cli_helpers import run_cli

    argv = ["study", "sparse", "--data", "mnist1d", "--seeds", "5", "--total-steps", "10", "--num-samples", "600",
            "--run-cache", str(tmp_path / "cache"), "--runs-dir", str(tmp_path / "runs"), "-q"]
    summaries = []
    for export in ("first", "second"):
        status, _, err = run_cli([*argv, "--export", str(tmp_path / export)], capsys)
        assert status == 0, err
        summaries.append(json.loads((tmp_path / export / "beyond-sparse-mnist1d.json").read_text()))
    first, second = summaries
    tuned = {t["arm"] for t in first["tuning"]}
    assert tuned == {row["arm"] for row in first["rows"]} and first["tune_seeds"] == [1000]
    # every tuning candidate and every (arm, seed) is one run; the second command trains none of them
    assert first["runs"] == len(first["tuning"]) + 7 * 5 == second["runs"]
    assert second["run_seconds"] == first["run_seconds"] > 0 and second["rows"] == first["rows"]
    assert f"{first['runs']} runs, tuning included" in render_block(first)
