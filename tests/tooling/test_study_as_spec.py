"""A study added as a spec alone: a new study written here as data only (``ablations.Study``:
its base config, its arms, its claim), run by the one study runner on a tiny config, with
its rendered table and its claim's verdict checked. Nothing of it is in the package."""

from __future__ import annotations

import json

import pytest

from diloco.tools.cli.main import build_parser
from diloco.tools.studies.ablation_spec import AblationSpec
from diloco.tools.studies.ablations import Study, Variant
from diloco.tools.studies.paper_studies import Claim
from diloco.tools.studies.runner import run_spec

pytestmark = pytest.mark.tooling

INNER_LR = Study(
    "inner-lr", "A useful inner learning rate against a negligible one",
    "AdamW at lr 1e-2 learns in 40 steps; at lr 1e-7 it does not", "inner lr",
    {"num_workers": 2, "rounds": 4, "inner_steps": 10, "hidden_sizes": (16,), "batch_size": 16},
    ("1e-2", "1e-7"),
    lambda config, values: [Variant(f"lr {v}", "diloco", {"inner": {"lr": float(v)}}) for v in values],
    claims=(Claim("a useful inner lr beats a negligible one", "lr 1e-2", "lr 1e-7", "our own claim"),
            Claim("a negligible inner lr beats a useful one", "lr 1e-7", "lr 1e-2", "the opposite, to be reversed")),
)


def _run(tmp_path, capsys, name: str = "first") -> tuple:
    args = build_parser().parse_args(["study", "workers", "--seeds", "3", "-q", "--no-plots", "--name", name,
                                      "--runs-dir", str(tmp_path)])
    assert run_spec(AblationSpec(INNER_LR), args) == 0
    (run_dir,) = tmp_path.glob(f"*{name}")
    return capsys.readouterr().out, json.loads((run_dir / "summary.json").read_text()), run_dir


def test_a_study_written_as_data_alone_runs_renders_its_table_and_judges_its_claims(tmp_path, capsys):
    out, summary, run_dir = _run(tmp_path, capsys)
    assert [(row["variant"], row["seeds"]) for row in summary["rows"]] == [("lr 1e-2", [0, 1, 2]),
                                                                           ("lr 1e-7", [0, 1, 2])]
    useful, negligible = summary["rows"]
    assert useful["eval_loss"]["mean"] < negligible["eval_loss"]["mean"] - 0.1
    lines = out.splitlines()
    assert lines[0].startswith("| variant | algorithm | held-out accuracy, mean [95% CI] | held-out loss")
    assert lines[2].startswith("| lr 1e-2 | diloco | ") and lines[3].startswith("| lr 1e-7 | diloco | ")
    assert [c["verdict"] for c in summary["claims"]] == ["holds", "reversed"]
    claims = [line for line in lines if line.startswith("| a ")]
    assert claims[0].startswith("| a useful inner lr beats a negligible one | our own claim | ")
    assert claims[0].endswith("| **holds** |") and claims[1].endswith("| **reversed** |")
    assert "| **holds** |" in (run_dir / "study.md").read_text()


def test_the_study_run_again_reads_every_run_back_from_the_run_cache(tmp_path, capsys):
    _, first, _ = _run(tmp_path, capsys)
    _, again, run_dir = _run(tmp_path, capsys, "again")
    lines = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and all(line["cached"] for line in lines)
    strip = [{k: v for k, v in row.items() if k != "seconds"} for row in first["rows"]]
    assert [{k: v for k, v in row.items() if k != "seconds"} for row in again["rows"]] == strip
    assert again["claims"] == first["claims"]
