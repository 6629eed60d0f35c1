"""Flags of the paper's mechanisms and of the character-level task, for every command.

``add_mechanism_flags`` adds one flag per ``DiLoCoConfig`` mechanism field
(``diloco.core.mechanisms``) and ``mechanism_changes`` reads them back for ``build_config``;
``add_text_flags`` and ``load_text_dataset`` serve ``--data shakespeare``
(``diloco.text``). ``diloco.tools.cli.flags`` calls all four.
"""

from __future__ import annotations

import argparse

from diloco.config import NONIID_SPLITS, OUTER_OPTIMIZER_NAMES, DiLoCoConfig
from diloco.core.model_seam import MODEL_KINDS
from diloco.tools.cli.errors import CliError

__all__ = ["MECHANISM_FLAGS", "add_mechanism_flags", "mechanism_changes", "add_text_flags", "load_text_dataset",
           "text_sizes", "add_paper_study_flags"]

MECHANISM_FLAGS = {
    "lr_schedule": (("--lr-schedule",), {"choices": ("constant", "cosine"),
                                         "help": "inner lr: constant (default) or linear warmup then cosine decay "
                                                 "to a tenth of --lr at the last step, as in the paper"}),
    "warmup_steps": (("--warmup-steps",), {"type": int, "metavar": "N",
                                           "help": "warmup steps of --lr-schedule cosine (0)"}),
    "clip_norm": (("--clip-norm",), {"type": float, "metavar": "C",
                                     "help": "clip each inner gradient to global L2 norm C (off)"}),
    "shard_weighting": (("--shard-weighting",), {"choices": ("auto", "uniform", "size"),
                                                 "help": "pseudo-gradient weights: by shard size, as the paper does "
                                                         "for non-IID data; auto (default) = size for --noniid, "
                                                         "uniform for IID"}),
    "outer_optimizer": (("--outer-optimizer",), {"choices": OUTER_OPTIMIZER_NAMES,
                                                 "help": "sgd (default; Nesterov, heavy ball with --no-nesterov, "
                                                         "plain SGD with --outer-momentum 0) or adam (beta1 = "
                                                         "--outer-momentum)"}),
    "outer_beta2": (("--outer-beta2",), {"type": float, "help": "outer Adam beta2 (0.999)"}),
    "outer_eps": (("--outer-eps",), {"type": float, "help": "outer Adam epsilon, large as in the paper (0.1)"}),
    "drop_prob": (("--drop-prob",), {"type": float, "metavar": "P",
                                     "help": "drop each worker's outer gradient with probability P each round; "
                                             "a dropped worker goes on as --drop-rule says (0)"}),
    "drop_rule": (("--drop-rule",), {"choices": ("carry", "restart"),
                                     "help": "where a dropped worker goes on from: its own parameters (carry, "
                                             "default) or the new global model (restart; needs --drop-prob)"}),
    "noniid_split": (("--noniid-split",), {"choices": NONIID_SPLITS,
                                           "help": "what --noniid skews: labels (default, Dirichlet label skew), "
                                                   "topics (contiguous segments of the training rows, e.g. stretches "
                                                   "of the text, spread by Dirichlet(--alpha)) or speakers (--data "
                                                   "shakespeare: each worker the whole speeches of its own "
                                                   "speakers; no --alpha)"}),
    "record_similarity": (("--record-similarity",), {"action": "store_true", "default": None,
                                                     "help": "record the mean pairwise cosine similarity of the "
                                                             "workers' pseudo-gradients every round"}),
}


def add_mechanism_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the paper's mechanisms (DiLoCoConfig fields; defaults are the course's "
                                      "algorithm)")
    for name, (flags, options) in MECHANISM_FLAGS.items():
        group.add_argument(*flags, dest=name, **({"default": None} | options))


def mechanism_changes(args) -> dict:
    """The mechanism fields the user set, for ``DiLoCoConfig.replace``."""
    return {name: getattr(args, name) for name in MECHANISM_FLAGS if getattr(args, name, None) is not None}


def add_text_flags(group) -> None:
    group.add_argument("--context", type=int, default=None, metavar="C",
                       help="--data shakespeare: characters of context the model sees (6; 64 with --model transformer)")
    group.add_argument("--eval-windows", type=int, default=None, metavar="N",
                       help="--data shakespeare: held-out windows, evenly spaced over the text's tail (8192)")


def text_sizes(args) -> tuple[int, int]:
    """``(--context, --eval-windows)`` of ``--data shakespeare``, their defaults filled in, checked positive."""
    context, eval_windows = (getattr(args, name, None) for name in ("context", "eval_windows"))
    if context is None:
        context = MODEL_KINDS[getattr(args, "model", None) or DiLoCoConfig().model].default_context
    eval_windows = 8192 if eval_windows is None else eval_windows
    for flag, value in (("--context", context), ("--eval-windows", eval_windows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CliError(f"{flag} must be a positive int, got {value!r}")
    return context, eval_windows


def load_text_dataset(args):
    """``--data shakespeare``: the dataset (with its ``encode``) and its description."""
    from diloco.text import SHAKESPEARE_PROVENANCE, SHAKESPEARE_TEST_FRACTION, load_shakespeare

    context, eval_windows = text_sizes(args)
    text = load_shakespeare(context, test_fraction=SHAKESPEARE_TEST_FRACTION, eval_windows=eval_windows)
    info = {"name": "shakespeare", "provenance": SHAKESPEARE_PROVENANCE, "context": context,
            "test_fraction": SHAKESPEARE_TEST_FRACTION, "split_seed": None,  # the text's tail: no random split
            "vocab_size": text.encode.vocab_size, "eval_windows": len(text.dataset.y_test),
            "input": f"one-hot index windows, {context} x {text.encode.vocab_size} = {text.encode.num_features} inputs"}
    return text.dataset._replace(encode=text.encode), info


def add_paper_study_flags(study_parser) -> None:
    """``--export`` and ``--tune-seeds`` of the paper studies (``diloco study table2`` ...)."""
    group = study_parser.add_argument_group("paper studies (table2, fig4, fig6, table3, fig8, fig9, splits, scaling, "
                                            "inner-muon, fragments)")
    group.add_argument("--export", metavar="DIR",
                       help="also write the summary and plot as DIR/<study>-<data>.json and .png "
                            "(docs/assets/results for the results page)")
    group.add_argument("--tune-seeds", type=int, default=1, metavar="N",
                       help="seeds on which each arm's inner lr (and its outer lr x momentum; fig6's SGD arm its "
                            "outer lr) is tuned, from 1000 on, never a reported seed (1)")
    from diloco.tools.studies.paper_runs import OUTER_LR_GRID, OUTER_MOMENTUM_GRID
    from diloco.tools.studies.paper_studies import TASKS

    def _numbers(values) -> str:
        return ",".join(f"{v:g}" for v in values)

    grids = ", ".join(f"{task} {_numbers(spec['inner_grid'])}" for task, spec in TASKS.items())
    group.add_argument("--inner-grid", metavar="LR1,LR2,...",
                       help=f"inner lr values each arm is tuned over (the task's grid: {grids}); "
                            "off: no tuning, --lr for every arm")
    group.add_argument("--outer-grid", metavar="LR1,LR2,...:MU1,MU2,...",
                       help="the outer lr values and outer momenta whose every pair a DiLoCo arm is tuned over "
                            f"({_numbers(OUTER_LR_GRID)}:{_numbers(OUTER_MOMENTUM_GRID)}), extended past a chosen edge")
    group.add_argument("--run-cache", metavar="DIR",
                       help="read a run already trained (same config, seed and data) from DIR instead of training "
                            "it again; write new runs there (make results uses build/results-cache)")
