"""The results pages' plots are what their exports draw, byte for byte.

``make results`` and ``make results-transformer`` draw each study's plot and each headline
claim's plot from the exported summaries (``docs/assets/results/*.json`` and its
``transformer/``). Here every such PNG on the pages is drawn again from a copy of the exports
and compared with the committed file, so a page cannot show a plot that its own numbers no
longer draw (the MLP tier's claim plots were once left in an older style), and a change to
the plotting code that moves a pixel is seen. (The family studies' plots take their spec's
axis values as well as the export, so they are not redrawn here.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from diloco.tools.studies.claim_curves import CLOCKS, TIERS, write_plots  # noqa: E402
from diloco.tools.studies.plots import plot_paper_study, plot_scaling_gap, save_figure  # noqa: E402
from diloco.tools.studies.summaries import load_summaries  # noqa: E402

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "assets" / "results"
FOLDERS = {"mlp": RESULTS, "transformer": RESULTS / "transformer"}


def _exports(folder: Path, into: Path) -> Path:
    into.mkdir()
    for path in folder.glob("*.json"):
        shutil.copy(path, into / path.name)
    return into


@pytest.mark.parametrize("tier", sorted(FOLDERS))
def test_every_claim_plot_is_drawn_again_byte_for_byte(tier, tmp_path):
    folder = FOLDERS[tier]
    drawn = write_plots(_exports(folder, tmp_path / "exports"), *TIERS[tier], CLOCKS.get(tier))
    assert drawn, f"{tier}: no claim plot drawn"
    assert {path.name for path in drawn} == {path.name for path in folder.glob("*-claim*.png")}
    for path in drawn:
        assert path.read_bytes() == (folder / path.name).read_bytes(), (
            f"{folder / path.name} is not what its export draws: run python -m diloco.tools.studies.claim_curves "
            f"{folder.relative_to(ROOT)} --tier {tier}")


@pytest.mark.parametrize("tier", sorted(FOLDERS))
def test_every_study_plot_is_drawn_again_byte_for_byte(tier, tmp_path):
    folder = FOLDERS[tier]
    studies = [(key, summary) for key, summary in load_summaries(folder).items()
               if isinstance(key, tuple) and key[0] != "family" and (folder / f"{key[0]}-{key[1]}.png").exists()]
    assert len(studies) >= 5, f"{tier}: too few study plots found"
    for (study, task), summary in studies:
        draw = plot_scaling_gap if study == "scaling" else plot_paper_study
        path = save_figure(draw(summary), tmp_path / f"{study}-{task}.png")
        want = (folder / path.name).read_bytes()
        assert path.read_bytes() == want, f"{folder / path.name} is not what its export draws"
