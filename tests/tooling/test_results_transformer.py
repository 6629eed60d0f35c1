"""``docs/results-transformer.md`` (``make results-transformer``) quotes its files, and nothing else.

Its blocks are rendered from ``docs/assets/results/transformer/`` (``results_page``); the
commands beside them are exactly ``make_results.TRANSFORMER_JOBS``; every headline claim
has its plot against tokens (``claim_curves``); and the recorded whole run finished within
the two hours the target promises. ``claim_curves``' arithmetic is checked by hand.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from diloco.tools.studies.claim_curves import (
    TRANSFORMER_HEADLINE,
    arm_tokens,
    claim_index,
    every_claim,
    plot_claim,
    render_claim_costs,
    token_unit,
    tokens_per_step,
)
from diloco.tools.studies.make_results import TRANSFORMER_EXPORT, TRANSFORMER_JOBS, command_of
from diloco.tools.studies.results_page import BLOCK, TRANSFORMER_ORDER, block_names, load_summaries, render_block

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "results-transformer.md"
RESULTS = ROOT / TRANSFORMER_EXPORT
COMMANDS = {job.name: command_of(job) for job in TRANSFORMER_JOBS}
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d{3,}(?![\w.])")


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def summaries() -> dict:
    return load_summaries(RESULTS)


def test_the_page_holds_exactly_the_renderings_of_its_files(page, summaries):
    names = block_names(page)
    assert {"paper-transformer", "costs-transformer", "compute-transformer"} <= set(names)
    assert {f"{study}-shakespeare" for study in TRANSFORMER_ORDER} <= set(names)
    for match in BLOCK.finditer(page):
        assert match.group("body") == render_block(match.group("name"), summaries), (
            f"block {match.group('name')} differs from the files: run python -m diloco.tools.studies.results_page "
            f"docs/results-transformer.md {TRANSFORMER_EXPORT}")


def test_every_study_has_its_file_its_plot_and_the_command_that_made_it_beside_it(page, summaries):
    shown = set(re.findall(r"^\.venv/bin/diloco study .*$", page, re.M))
    assert shown == set(COMMANDS.values()), "the page's commands are not make results-transformer's"
    for study in TRANSFORMER_ORDER:
        summary = summaries.get((study, "shakespeare"))
        assert summary is not None, f"{RESULTS}/{study}-shakespeare.json is missing"
        assert summary["config"]["model"] == "transformer" and len(summary["seeds"]) == 5
        assert all(row["rounds"] >= 100 for row in summary["rows"]), f"{study}: fewer than 100 outer steps"
        start = page.index(f"<!-- generated: {study}-shakespeare -->")
        section = page[page.rindex("\n## ", 0, start):start]
        assert COMMANDS[f"{study}-transformer"] in section, f"{study}: its command is not beside its block"
        assert (RESULTS / f"{study}-shakespeare.png").exists()


def test_every_headline_claim_has_its_plot_on_the_page(page, summaries):
    for study, start in TRANSFORMER_HEADLINE:
        index = claim_index(summaries[(study, "shakespeare")], start)
        assert index is not None, f"{study}: no claim starts with {start!r}"
        name = f"{study}-shakespeare-claim{index}.png"
        assert (RESULTS / name).exists() and f"assets/results/transformer/{name}" in page


def test_the_whole_run_is_recorded_and_took_under_two_hours(summaries):
    last = summaries["make-results"]["last_run"]
    assert sorted(last["jobs"]) == sorted(COMMANDS) and last["parallel"] == 2
    assert last["seconds"] < 2 * 3600


def test_every_number_in_the_prose_is_one_the_tables_show(page):
    generated = "".join(match.group("body") for match in BLOCK.finditer(page))
    prose = re.sub(r"```.*?```", "", BLOCK.sub("", page), flags=re.S)
    loose = sorted(set(NUMBER.findall(prose)) - set(NUMBER.findall(generated)))
    assert not loose, f"numbers in the prose that no generated table on the page shows: {loose}"


# --- claim_curves by hand ----------------------------------------------------------------------

def _summary(model: str, data: dict | None = None) -> dict:
    curve = [[10, 4.0], [20, 3.0]]
    rows = [{"arm": "A", "algo": "diloco", "changes": {"num_workers": 4}, "seeds": [0, 1], "num_workers": 4,
             "steps_per_worker": 20, "all_reduces": 2, "bytes_sent": 1_500_000, "curve": curve,
             "per_seed_curve": [[4.5, 3.5], [3.5, 2.5]]},
            {"arm": "B", "algo": "sync", "changes": {"num_workers": 1, "batch_size": 2}, "seeds": [0, 1],
             "num_workers": 1, "steps_per_worker": 20, "all_reduces": 20, "bytes_sent": 0, "curve": curve,
             "per_seed_curve": [[4.2, 3.2], [4.0, 3.0]]}]
    claims = [{"text": "A beats B", "better": "A", "worse": "B", "verdict": "holds"}]
    return {"config": {"model": model, "batch_size": 8}, "data": {"context": 64} if data is None else data,
            "rows": rows, "claims": claims}


def test_tokens_count_every_predicted_character():
    transformer, mlp = _summary("transformer"), _summary("mlp")
    a, b = transformer["rows"]
    assert tokens_per_step(transformer, a) == 8 * 64 and tokens_per_step(transformer, b) == 2 * 64
    assert tokens_per_step(mlp, a) == 8, "an MLP window predicts one character"
    assert arm_tokens(transformer, a) == 20 * 4 * 512 and arm_tokens(transformer, b) == 20 * 1 * 128


def test_a_classifier_counts_examples_not_tokens():
    digits = _summary("mlp", data={"num_features": 40})
    a, b = digits["rows"]
    assert token_unit(digits) == "example" and token_unit(_summary("mlp")) == "token"
    assert tokens_per_step(digits, a) == 8 and tokens_per_step(digits, b) == 2
    table = render_claim_costs(every_claim({("s", "mnist1d"): digits}, ["s"], "mnist1d"))
    assert table.startswith("| claim | arm | worker-steps | examples |") and "| A beats B | A | 80 | 640 |" in table
    assert plot_claim(digits, 0).axes[0].get_xlabel().startswith("examples trained on")


def test_the_costs_table_lists_both_arms_of_each_claim():
    table = render_claim_costs(every_claim({("s", "shakespeare"): _summary("transformer")}, ["s", "absent"],
                                           "shakespeare"))
    assert table.startswith("| claim | arm | worker-steps | tokens |")
    assert "| A beats B | A | 80 | 40,960 | 2 | 1.5 MB |" in table
    assert "|  | B | 20 | 2,560 | 20 | 0 B |" in table


def test_a_summary_without_per_seed_curves_is_named_not_drawn(tmp_path, capsys):
    from diloco.tools.runs.atomic_files import write_json
    from diloco.tools.studies.claim_curves import write_plots

    old = _summary("mlp")
    for row in old["rows"]:
        del row["per_seed_curve"]
    with pytest.raises(ValueError, match=r"arm\(s\) \['A', 'B'\] have no per_seed_curve"):
        plot_claim(old, 0)
    write_json(tmp_path / "table2-shakespeare.json", {**old, "claims": [{**old["claims"][0], "margin": None,
                                                                         "metric_difference": {"low": 1, "high": 2,
                                                                                               "mean": 1.5}}]})
    assert write_plots(tmp_path, (("table2", "A beats"),), ("shakespeare",)) == []
    assert "table2-shakespeare: skipped" in capsys.readouterr().err
    from diloco.tools.studies.claim_curves import main

    assert main([str(tmp_path / "absent")]) == 2
    assert capsys.readouterr().err == f"claim_curves: {tmp_path / 'absent'} is not a folder\n"


def test_the_claim_plot_draws_the_mean_and_a_band_from_the_lowest_to_the_highest_seed():
    fig = plot_claim(_summary("transformer"), 0)
    ax = fig.axes[0]
    (x_a, y_a), (x_b, y_b) = ([line.get_xdata(), line.get_ydata()] for line in ax.get_lines())
    assert np.allclose(x_a, [10 * 4 * 512, 20 * 4 * 512]) and np.allclose(y_a, [4.0, 3.0])
    assert np.allclose(x_b, [10 * 128, 20 * 128]) and np.allclose(y_b, [4.1, 3.1])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    assert np.isclose(band.min(), 2.5) and np.isclose(band.max(), 4.5)
