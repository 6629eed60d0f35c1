"""``diloco study NAME``: the study's spec, run by the one study runner (``diloco.tools.studies.runner``).

The four ablations (``diloco.tools.studies.ablation_spec``), the paper's studies, the
family's, the sparse, asynchronous and Muon studies: every one keeps each finished run in
the run cache, so the same command run again goes on from them.
"""

from __future__ import annotations

from diloco.tools.cli.errors import CliError
from diloco.tools.studies.family_study import FAMILY_STUDIES
from diloco.tools.studies.paper_studies import PAPER_STUDIES

__all__ = ["run_study_command"]


def run_study_command(args) -> int:
    runner = _own_runner(args.study)
    if runner is not None:
        return runner(args)
    if getattr(args, "target_loss", None) is not None:
        raise CliError("--target-loss applies only to the bandwidth study")
    if args.study in PAPER_STUDIES:  # the paper's tables and figures: diloco.tools.studies.paper_command
        from diloco.tools.studies.paper_command import run_paper_study

        return run_paper_study(args)
    from diloco.tools.studies.ablation_spec import run_ablation_study  # the four ablations

    return run_ablation_study(args)


def _own_runner(name: str):
    """The runner of a study with its own module (sparse, async, muon, the family's), else None."""
    if name == "sparse":  # SparseLoCo and DeMo at equal bytes: diloco.tools.studies.beyond_sparse
        from diloco.tools.studies.beyond_sparse import run_sparse_study

        return run_sparse_study
    if name == "async":  # asynchronous DiLoCo at equal simulated time: diloco.tools.studies.beyond_async
        from diloco.tools.studies.beyond_async import run_async_study

        return run_async_study
    if name == "muon":  # MuLoCo's claims: diloco.tools.studies.beyond_muon
        from diloco.tools.studies.beyond_muon import run_muon_study

        return run_muon_study
    if name in FAMILY_STUDIES:  # compression, streaming, bandwidth: diloco.tools.studies.family_study
        from diloco.tools.studies.family_study import run_family_study_command

        return run_family_study_command
    return None
