"""Flags of asynchronous DiLoCo with heterogeneous workers (``DiLoCoConfig.asynchrony``).

``add_config_flags`` (``diloco.tools.cli.config_flags``) calls ``add_async_flags``, so train,
compare and study take them; ``build_async`` (``diloco.tools.cli.flags``) turns them into an
``AsyncConfig`` over the config's own (``CliError``: one line, exit status 2).
"""

from __future__ import annotations

import argparse

__all__ = ["add_async_flags"]


def add_async_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("asynchronous DiLoCo, heterogeneous workers (docs/concepts/asynchrony.md)")
    group.add_argument("--async", dest="asynchronous", action="store_true", default=None,
                       help="apply each worker's pseudo-gradient when it arrives (Liu et al. 2024)")
    group.add_argument("--step-times", default=None, metavar="C1,C2,...",
                       help="simulated seconds per inner step of each worker, e.g. 1,1,1,4 (default: 1 each)")
    group.add_argument("--speed-spread", type=float, default=None, metavar="SIGMA",
                       help="draw each worker's step time exp(SIGMA z), z ~ N(0,1), from the seed (0)")
    group.add_argument("--straggler", type=int, default=None, metavar="K",
                       help="worker K is --straggler-factor times slower")
    group.add_argument("--straggler-factor", type=float, default=None, metavar="F", help="(4)")
    group.add_argument("--delayed-nesterov", type=int, default=None, metavar="N",
                       help="delayed Nesterov: the outer momentum step every N arrivals (needs --async)")
    group.add_argument("--dynamic-local-steps", action="store_true", default=None,
                       help="dynamic local updates: H_k in proportion to worker k's speed (needs --async)")
