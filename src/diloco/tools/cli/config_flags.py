"""The experiment's flags: one for every ``DiLoCoConfig`` field, and the data, execution,
recovery and output flags that ``train``, ``compare``, ``study`` and MPI share.

This module only declares the flags. ``diloco.tools.cli.flag_names`` reads them back from a
parser (``-K/--num-workers`` for ``num_workers``), and ``diloco.tools.cli.flags`` turns the
parsed flags into a config and a dataset, wording its errors through ``flag_names``. The
family's, asynchrony's and the paper mechanisms' flags are declared in their own modules,
which ``add_config_flags`` calls.
"""

from __future__ import annotations

import argparse
import math

from diloco.core.model_seam import MODEL_KINDS, TRANSFORMER_DTYPE
from diloco.core.registry import INNER_OPTIMIZERS
from diloco.tools.cli.arg_types import positive_finite
from diloco.tools.cli.async_flags import add_async_flags
from diloco.tools.cli.config_file import DEFAULT_DATA
from diloco.tools.cli.family_flags import add_family_flags
from diloco.tools.cli.paper_flags import add_mechanism_flags, add_text_flags

__all__ = ["CONFIG_FLAGS", "INNER_FLAGS", "MUON_FLAGS", "TRANSFORMER_FLAGS", "TRANSFORMER_DTYPE", "DATA_DEFAULTS",
           "DEFAULT_MAX_LOSS", "add_config_flags", "add_data_flags", "add_execution_flags", "add_output_flags",
           "add_recovery_flags"]

# Flags of DiLoCoConfig fields: (flag(s), argparse options). Inner AdamW fields follow.
CONFIG_FLAGS = {
    "num_workers": (("-K", "--num-workers", "--workers"), {"type": int, "metavar": "K",
                                                          "help": "K, the number of workers (8)"}),
    "inner_steps": (("-H", "--inner-steps"), {"type": int, "metavar": "H",
                                              "help": "H, inner AdamW steps per round (50)"}),
    "rounds": (("--rounds",), {"type": int, "help": "outer rounds; steps per worker = rounds * H (10)"}),
    "batch_size": (("--batch-size",), {"type": int, "help": "examples per worker per step (32)"}),
    "hidden_sizes": (("--hidden-sizes",), {"metavar": "W1,W2,...",
                                           "help": "hidden layer widths, comma-separated; '' for none (128)"}),
    "outer_lr": (("--outer-lr",), {"type": float, "help": "outer learning rate (0.7)"}),
    "outer_momentum": (("--outer-momentum",), {"type": float, "help": "outer momentum mu (0.9)"}),
    "nesterov": (("--nesterov",), {"action": argparse.BooleanOptionalAction,
                                   "help": "Nesterov (default) or plain heavy-ball outer momentum"}),
    "alpha": (("--alpha",), {"type": float, "help": "Dirichlet concentration of --noniid shards (0.5)"}),
    "seed": (("--seed",), {"type": int, "help": "seeds sharding, initialisation and batches (0)"}),
    "dtype": (("--dtype",), {"choices": ("float32", "float64"),
                             "help": "parameter dtype (float64; float32 with --model transformer)"}),
    # the registry itself: a name a plugin registers before the parser reads the flags is a choice too
    "inner_optimizer": (("--inner-optimizer",), {"choices": INNER_OPTIMIZERS,
                                                 "help": "the workers' optimizer: AdamW (default), Muon on the "
                                                         "weight matrices with AdamW on the biases (MuLoCo), "
                                                         "SGD with momentum --beta1, or one a plugin registered "
                                                         "in diloco.core.registry.INNER_OPTIMIZERS"}),
    "model": (("--model",), {"choices": tuple(MODEL_KINDS),
                             "help": "the MLP of the milestones (mlp, default) or a causal transformer language "
                                     "model (transformer: --data shakespeare only; docs/transformer.md)"}),
    "engine": (("--engine",), {"choices": ("reference", "fast"),
                               "help": "executor: the milestone functions (reference, the default of train and "
                                       "compare) or diloco.engine, the same algorithm faster (fast, the default "
                                       "of study)"}),
}
INNER_FLAGS = {
    "lr": (("--lr", "--inner-lr"), {"type": float, "help": "inner AdamW learning rate (1e-3)"}),
    "beta1": (("--beta1",), {"type": float, "help": "AdamW beta1, or SGD's momentum (0.9)"}),
    "beta2": (("--beta2",), {"type": float, "help": "AdamW beta2 (0.999)"}),
    "eps": (("--eps",), {"type": float, "help": "AdamW epsilon (1e-8)"}),
    "weight_decay": (("--weight-decay",), {"type": float, "help": "AdamW decoupled weight decay (0.01)"}),
}
# Muon's fields (DiLoCoConfig.muon), with --inner-optimizer muon; dest "muon_<field>".
MUON_FLAGS = {
    "lr": (("--muon-lr",), {"type": float, "help": "Muon learning rate of the weight matrices (0.02)"}),
    "momentum": (("--muon-momentum",), {"type": float, "help": "Muon momentum mu (0.95)"}),
    "nesterov": (("--muon-nesterov",), {"action": argparse.BooleanOptionalAction,
                                        "help": "orthogonalise G + mu B (default) or B (--no-muon-nesterov)"}),
    "weight_decay": (("--muon-weight-decay",), {"type": float, "help": "Muon decoupled weight decay (0)"}),
    "ns_steps": (("--muon-ns-steps",), {"type": int, "help": "Newton-Schulz steps (5)"}),
    "scale": (("--muon-scale",), {"choices": ("muon", "moonlight"),
                                  "help": "shape scale: sqrt(max(1, fan_out/fan_in)) (muon, default) or "
                                          "0.2 sqrt(max(fan_in, fan_out)) (moonlight)"}),
}

# The transformer's shape (DiLoCoConfig.transformer), with --model transformer; dest "transformer_<field>".
TRANSFORMER_FLAGS = {
    "d_model": (("--d-model",), {"type": int, "metavar": "D", "help": "the residual stream's width d (64)"}),
    "n_heads": (("--n-heads",), {"type": int, "metavar": "N", "help": "attention heads; must divide d (4)"}),
    "n_layers": (("--n-layers",), {"type": int, "metavar": "N", "help": "transformer blocks (2)"}),
    "mlp_ratio": (("--mlp-ratio",), {"type": int, "metavar": "R", "help": "the MLP's width is R d (4)"}),
    "tied": (("--tied",), {"action": argparse.BooleanOptionalAction,
                           "help": "output head tied to the token embedding (default) or its own (--no-tied)"}),
}


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("experiment (every DiLoCoConfig field; flags override --config)")
    group.add_argument("--config", metavar="FILE.json",
                       help="start from this config; a run's config.json is the whole run (its data, --max-loss, ...)")
    for name, (flags, options) in {**CONFIG_FLAGS, **INNER_FLAGS}.items():
        group.add_argument(*flags, dest=name, default=None, **options)
    muon = parser.add_argument_group("Muon inner optimizer (with --inner-optimizer muon; docs/concepts/muon.md)")
    for name, (flags, options) in MUON_FLAGS.items():
        muon.add_argument(*flags, dest=f"muon_{name}", default=None, **options)
    transformer = parser.add_argument_group("transformer (with --model transformer; docs/transformer.md)")
    for name, (flags, options) in TRANSFORMER_FLAGS.items():
        transformer.add_argument(*flags, dest=f"transformer_{name}", default=None, **options)
    sharding = group.add_mutually_exclusive_group()
    sharding.add_argument("--iid", dest="iid", action="store_true", default=None, help="IID shards (default)")
    sharding.add_argument("--noniid", dest="iid", action="store_false",
                          help="non-IID shards, skewed as --noniid-split says (default: labels, per class "
                               "Dirichlet(alpha) proportions across workers)")
    add_mechanism_flags(parser)  # the paper's mechanisms: lr schedule, clipping, weights, outer Adam, drops
    add_family_flags(parser)  # compression, Streaming DiLoCo, eager, the simulated network
    add_async_flags(parser)  # asynchronous DiLoCo, the workers' speeds


def add_execution_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("execution")
    group.add_argument("--threads", type=int, metavar="N",
                       help="BLAS threads (default: 1 for small matrices, the free cores for large ones; "
                            "see docs/cli.md)")


# The data flags' defaults. The flags themselves default to None, so a resumed run can tell
# a flag the user gave (which must agree with the run's data) from one left alone.
DATA_DEFAULTS = {"data": DEFAULT_DATA, "split_seed": 0, "test_fraction": 0.2}

# A training or held-out cross-entropy above this is divergence (--max-loss). Chance level
# is ln(C), 2.3 for 10 classes; a mean of 1000 puts e^-1000 on the right class, which no
# run that is learning reaches, while a diverging one passes it within a round or two.
DEFAULT_MAX_LOSS = 1000.0


def add_data_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("data")
    group.add_argument("--data", metavar="digits|mnist1d|shakespeare|PATH.npz",
                       help="built-in digits (default), MNIST-1D (the 'mnist1d' extra; generated locally, cached), "
                            "Tiny Shakespeare next-character prediction (bundled; --context), "
                            "or an .npz with arrays x, y and optionally x_test, y_test")
    group.add_argument("--split-seed", type=int,
                       help="seed of the train/test split when the data has no test part (0)")
    group.add_argument("--test-fraction", type=float,
                       help="held-out fraction when the data has no test part (0.2)")
    group.add_argument("--cache-dir", metavar="DIR",
                       help="where generated MNIST-1D is cached ($DILOCO_CACHE_DIR or ~/.cache/diloco)")
    group.add_argument("--num-samples", type=_positive_int, metavar="N",
                       help="MNIST-1D: examples generated (80%% train, 20%% held out; cached per N) (5000)")
    add_text_flags(group)  # --context, --eval-windows of --data shakespeare


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def _max_loss(text: str) -> float:
    """``--max-loss``: a positive finite loss, or ``off`` (no threshold: inf; None is kept for "not given")."""
    return positive_finite(text, not_a_number="must be a positive number or 'off'",
                           not_positive="must be a positive finite number or 'off'", off=math.inf)


def add_recovery_flags(parser: argparse.ArgumentParser, *, resume: bool = True) -> None:
    """``--max-loss`` and, for ``train`` and ``compare``, ``--checkpoint-every`` and ``--resume``."""
    group = parser.add_argument_group("failure and recovery (docs/failure-and-recovery.md)")
    if resume:
        group.add_argument("--checkpoint-every", type=_positive_int, metavar="N",
                           help="checkpoint every N rounds into the run folder (the last round is always "
                                "checkpointed)")
        group.add_argument("--resume", metavar="RUN_DIR",
                           help="continue the run in RUN_DIR from its newest checkpoint, bit-identically")
        group.add_argument("--allow-code-change", action="store_true",
                           help="with --resume: go ahead although the diloco code differs from the run's "
                                "(recorded in environment.json and the history)")
    group.add_argument("--max-loss", type=_max_loss, metavar="LOSS",
                       help=f"a training or held-out loss above LOSS stops the run as diverged "
                            f"({DEFAULT_MAX_LOSS:g}; 'off' disables)")


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--runs-dir", default="runs", metavar="DIR", help="parent of the run folder (runs)")
    group.add_argument("--name", help="run folder name after the time stamp (default: the command)")
    group.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    group.add_argument("--no-plots", action="store_true", help="skip the PNG plots (no matplotlib needed)")
