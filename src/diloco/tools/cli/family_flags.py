"""Flags of the DiLoCo family (``DiLoCoConfig.family``), shared by train, compare, study and MPI.

``add_config_flags`` (``diloco.tools.cli.config_flags``) calls ``add_family_flags``, so every
command that takes the experiment's flags takes these too; ``build_family``
(``diloco.tools.cli.flags``) turns them into a ``FamilyConfig`` (``CliError`` for a user
error: one line, exit status 2), which ``build_config`` puts in ``DiLoCoConfig.family``.
"""

from __future__ import annotations

import argparse

from diloco.config.sections import PATTERNS, TRANSFORMS
from diloco.core.quantize import FORMATS

__all__ = ["add_family_flags"]

def add_family_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("beyond the 2023 paper (DiLoCoConfig.family; docs/concepts/family.md)")
    group.add_argument("--comm-dtype", choices=FORMATS, default=None,
                       help="wire format of outer gradients (default: the params' dtype, nothing encoded)")
    group.add_argument("--comm-block", type=int, default=None, metavar="N",
                       help="values per power-of-two scale block of int8/fp4; 0 = one scale per tensor (32)")
    group.add_argument("--sign-prune", type=float, default=None, metavar="FRACTION",
                       help="drop this fraction of each outer gradient's smallest entries, TIES merge (0)")
    group.add_argument("--error-feedback", action="store_true", default=None,
                       help="carry each worker's encoding error into its next outer gradient")
    group.add_argument("--topk", type=float, default=None, metavar="FRACTION",
                       help="sparse outer gradients (SparseLoCo): send this fraction of every chunk, e.g. 0.02 "
                            "(docs/concepts/sparse.md)")
    group.add_argument("--topk-chunk", type=int, default=None, metavar="C",
                       help="--topk: values per chunk of the flattened tensor (4096; at most 1024 with the DCT)")
    group.add_argument("--topk-bits", type=int, default=None, metavar="2",
                       help="--topk: kept values as 2-bit codes with one scale per chunk (default: full width)")
    group.add_argument("--topk-transform", choices=TRANSFORMS, default=None,
                       help="--topk: top-k of the values (none) or of their chunked DCT (dct, DeMo)")
    group.add_argument("--topk-decay", type=float, default=None, metavar="BETA",
                       help="--topk --error-feedback: the buffer's decay, e <- beta e + delta (1)")
    group.add_argument("--compress", default=None, metavar="NAME[:KEY=VALUE,...]",
                       help="outer gradients through a codec by name, with the options it owns: a built-in "
                            "(native, dense, topk: set by the flags above) or one a plugin registered in "
                            "diloco.core.registry.CODECS (docs/cli.md)")
    group.add_argument("--fragments", type=int, default=None, metavar="P",
                       help="Streaming DiLoCo: sync P fragments of layers in turn (1)")
    group.add_argument("--fragment-pattern", dest="pattern", choices=PATTERNS, default=None,
                       help="which layers form a fragment (strided, as in the paper)")
    group.add_argument("--overlap", type=int, default=None, metavar="TAU",
                       help="inner steps a fragment's all-reduce overlaps with compute (0; eager: H)")
    group.add_argument("--mix", type=float, default=None, metavar="ALPHA",
                       help="weight of the received global fragment, mix*global + (1-mix)*local (1)")
    group.add_argument("--eager", action="store_true", default=None,
                       help="eager updates (Kale et al., 2025): one-outer-step overlap")
    group.add_argument("--bandwidth", default=None, metavar="RATE",
                       help="simulate a network of this bandwidth, e.g. 1Gbit, 100Mbit/s, 125MB/s")
    group.add_argument("--latency", default=None, metavar="TIME",
                       help="simulated latency per message, e.g. 50ms (0)")
    group.add_argument("--step-time", default=None, metavar="TIME",
                       help="simulated compute time per inner step, e.g. 10ms (default: measured)")
