"""``diloco study NAME``: the study's spec, run by the one study runner (``diloco.tools.studies.runner``).

The four ablations (``diloco.tools.studies.ablation_spec``), the paper's studies, the
family's, the sparse, asynchronous and Muon studies: every one keeps each finished run in
the run cache, so the same command run again goes on from them.
"""

from __future__ import annotations

from diloco.tools.cli.errors import CliError
from diloco.tools.studies.family_study import FAMILY_STUDIES
from diloco.tools.studies.paper_studies import PAPER_STUDIES
from diloco.tools.studies.runner import run_spec

__all__ = ["run_study_command", "study_spec"]


def run_study_command(args) -> int:
    return run_spec(study_spec(args), args)


def study_spec(args):
    """The spec of ``args.study``: a study with its own module (sparse, async, muon, the
    family's), a paper study (``paper_command``), else an ablation (``ablation_spec``)."""
    name = args.study
    if name == "sparse":  # SparseLoCo and DeMo at equal bytes
        from diloco.tools.studies.beyond_sparse import SparseSpec

        return SparseSpec()
    if name == "async":  # asynchronous DiLoCo at equal simulated time
        from diloco.tools.studies.beyond_async import AsyncSpec

        return AsyncSpec()
    if name == "muon":  # MuLoCo's claims
        from diloco.tools.studies.beyond_muon import MuonSpec

        return MuonSpec()
    if name in FAMILY_STUDIES:  # compression, streaming, bandwidth
        from diloco.tools.studies.family_study import FamilySpec

        return FamilySpec(FAMILY_STUDIES[name])
    if getattr(args, "target_loss", None) is not None:
        raise CliError("--target-loss applies only to the bandwidth study")
    if name in PAPER_STUDIES:  # the paper's tables and figures
        from diloco.tools.studies.paper_command import PaperSpec

        return PaperSpec(PAPER_STUDIES[name])
    from diloco.tools.studies.ablation_spec import AblationSpec  # the four ablations
    from diloco.tools.studies.ablations import STUDIES

    return AblationSpec(STUDIES[name])
