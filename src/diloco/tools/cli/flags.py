"""Flags shared by ``train``, ``compare``, ``study`` and ``python -m diloco.tools.cli.mpi``.

Every ``DiLoCoConfig`` field has a flag; ``--config FILE.json`` (a bare config, or a run
folder's ``config.json``) sets the starting point and flags override it. ``build_config``
and ``load_dataset`` turn the parsed flags into a config and a dataset, raising
``CliError`` (one line, exit status 2) for a user error.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from diloco.config import INNER_OPTIMIZER_NAMES, DiLoCoConfig
from diloco.data import (
    DIGITS_PROVENANCE,
    MNIST1D_PROVENANCE,
    Dataset,
    load_digits_split,
    load_mnist1d,
    load_npz_dataset,
)
from diloco.tools.cli.async_flags import add_async_flags, build_async
from diloco.tools.cli.config_file import DEFAULT_DATA, check_sizes, read_config_file, with_run_data
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.family_flags import add_family_flags, build_family
from diloco.tools.cli.flag_checks import check_data_file
from diloco.tools.cli.flag_names import in_config_words, in_flag_words
from diloco.tools.cli.paper_flags import add_mechanism_flags, add_text_flags, load_text_dataset, mechanism_changes

__all__ = ["CONFIG_FLAGS", "INNER_FLAGS", "MUON_FLAGS", "TRANSFORMER_FLAGS", "DATA_DEFAULTS", "DEFAULT_MAX_LOSS",
           "add_config_flags",
           "add_data_flags", "add_execution_flags", "add_output_flags", "add_recovery_flags", "build_config",
           "load_dataset"]

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
    "inner_optimizer": (("--inner-optimizer",), {"choices": INNER_OPTIMIZER_NAMES,
                                                 "help": "the workers' optimizer: AdamW (default), Muon on the "
                                                         "weight matrices with AdamW on the biases (MuLoCo), or "
                                                         "SGD with momentum --beta1"}),
    "model": (("--model",), {"choices": ("mlp", "transformer"),
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
TRANSFORMER_DTYPE = "float32"  # the transformer's default dtype: float32 for speed (float64 for the checks)


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
    if text.strip().lower() in ("off", "none"):
        return math.inf  # no threshold (None is kept for "not given")
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number or 'off', got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number or 'off', got {text!r}")
    return value


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



# --- configuration and data ----------------------------------------------------------------

def _parse_hidden(text: str) -> tuple[int, ...]:
    """``"128,64"`` -> ``(128, 64)``; ``""`` -> ``()`` (no hidden layer). An empty item
    (``64,,32``, ``64,``) is refused, never dropped: it is a typo, not a width."""
    if not text.strip():
        return ()
    parts = [p.strip() for p in text.split(",")]
    if "" in parts:
        raise CliError(f"--hidden-sizes has an empty width in {text!r}; write comma-separated integers such as "
                       f"128,64 (or '' for no hidden layer)")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise CliError(f"--hidden-sizes must be comma-separated integers such as 128,64, got {text!r}") from None


def in_users_words(message: str, args) -> str:
    """A config error as the user gave the value: the flag (``-K/--num-workers must be ...``),
    or, for a value read from ``--config FILE``, the file and its key."""
    config_file = getattr(args, "config", None)
    if not config_file:
        return in_flag_words(message)
    given = {dest for dest, value in vars(args).items() if value is not None and value is not False}
    worded = in_flag_words(message, given)
    return worded if worded != message else f"--config {config_file}: {in_config_words(message)}"


def build_config(args, defaults: dict | None = None, *, base: DiLoCoConfig | None = None) -> DiLoCoConfig:
    """The config from (in increasing priority) the defaults (or ``base``), ``--config`` and the flags."""
    try:
        config = base if base is not None else DiLoCoConfig(**(defaults or {}))
        if getattr(args, "config", None):
            data = read_config_file(args.config)
            merged = {**config.to_dict(), **data}
            if isinstance(data.get("inner"), dict):
                merged["inner"] = {**config.inner.to_dict(), **data["inner"]}
            if isinstance(data.get("family"), dict):
                merged["family"] = {**config.family.to_dict(), **data["family"]}
            if isinstance(data.get("asynchrony"), dict):
                merged["asynchrony"] = {**config.asynchrony.to_dict(), **data["asynchrony"]}
            for section in ("muon", "transformer"):
                if isinstance(data.get(section), dict):
                    merged[section] = {**getattr(config, section).to_dict(), **data[section]}
            config = DiLoCoConfig.from_dict(merged)
        changes = {name: getattr(args, name) for name in CONFIG_FLAGS if getattr(args, name, None) is not None}
        if "hidden_sizes" in changes:
            changes["hidden_sizes"] = _parse_hidden(changes["hidden_sizes"])
        if getattr(args, "iid", None) is not None:
            changes["iid"] = args.iid
        inner = {name: getattr(args, name) for name in INNER_FLAGS if getattr(args, name, None) is not None}
        if inner:
            changes["inner"] = inner
        muon = {name: getattr(args, f"muon_{name}") for name in MUON_FLAGS
                if getattr(args, f"muon_{name}", None) is not None}
        if muon:
            if changes.get("inner_optimizer", config.inner_optimizer) != "muon":
                given = ", ".join(MUON_FLAGS[name][0][0] for name in muon)
                raise CliError(f"{given} configure(s) Muon: add --inner-optimizer muon")
            changes["muon"] = muon
        changes.update(_model_changes(args, config, changes))
        changes.update(mechanism_changes(args))
        family = build_family(args, config.family.to_dict())
        if family != config.family:
            changes["family"] = family
        asynchrony = build_async(args, config.asynchrony.to_dict())
        if asynchrony != config.asynchrony:
            changes["asynchrony"] = asynchrony
        return config.replace(**changes) if changes else config
    except (TypeError, ValueError) as exc:
        raise CliError(in_users_words(str(exc), args)) from None


def _model_changes(args, config: DiLoCoConfig, changes: dict) -> dict:
    """The transformer's shape flags; with ``--model transformer``, float32 unless ``--dtype`` says
    otherwise, and the MLP widths of a study's defaults dropped (``--hidden-sizes`` is refused)."""
    shape = {name: getattr(args, f"transformer_{name}") for name in TRANSFORMER_FLAGS
             if getattr(args, f"transformer_{name}", None) is not None}
    model = changes.get("model", config.model)
    if shape and model != "transformer":
        given = ", ".join(TRANSFORMER_FLAGS[name][0][0] for name in shape)
        raise CliError(f"{given} configure(s) the transformer: add --model transformer")
    out = {"transformer": shape} if shape else {}
    if model == "transformer" and config.model != "transformer":
        if "dtype" not in changes:
            out["dtype"] = TRANSFORMER_DTYPE
        if "hidden_sizes" not in changes:  # a study's MLP widths: not the transformer's (a flag's are refused)
            out["hidden_sizes"] = DiLoCoConfig().hidden_sizes
    return out


def load_dataset(args, dtype: str = "float64") -> tuple[Dataset, dict]:
    """The dataset named by ``--data`` (cast to ``dtype``) and a description for config.json.

    The description records what ``--resume`` and ``--config`` need to load the same data
    again. With ``--config`` a run folder's config.json, each data flag not given comes from
    its ``"data"`` section, and the sizes it recorded must match what is loaded (unless a
    flag names other data).
    """
    args, recorded = with_run_data(args)  # --config run/config.json: its data, unless a flag says otherwise
    data, info = _load_named_data(args, dtype)
    if recorded is not None:
        check_sizes(args.config, recorded, info)
    return data, info


def _load_named_data(args, dtype: str) -> tuple[Dataset, dict]:
    spec, split_seed, test_fraction = (DATA_DEFAULTS[name] if getattr(args, name, None) is None
                                       else getattr(args, name) for name in ("data", "split_seed", "test_fraction"))
    if split_seed < 0:
        raise CliError(f"--split-seed must be a non-negative int, got {split_seed}")
    if not (math.isfinite(test_fraction) and 0 < test_fraction < 1):
        raise CliError(f"--test-fraction must be strictly between 0 and 1, got {test_fraction}")
    try:
        if spec == "digits":
            data = load_digits_split(seed=split_seed, test_fraction=test_fraction)
            info = {"name": "digits", "provenance": DIGITS_PROVENANCE}
        elif spec == "mnist1d":
            num_samples = 5000 if getattr(args, "num_samples", None) is None else args.num_samples
            data = load_mnist1d(cache_dir=getattr(args, "cache_dir", None), num_samples=num_samples)
            info = {"name": "mnist1d", "provenance": MNIST1D_PROVENANCE, "num_samples": num_samples}
        elif spec == "shakespeare":
            data, info = load_text_dataset(args)
        elif spec.endswith(".npz") or Path(spec).exists():
            check_data_file(spec)  # an .npz archive, else a line saying what the file must hold
            data = load_npz_dataset(spec, test_fraction=test_fraction, seed=split_seed)
            info = {"name": Path(spec).stem, "path": str(Path(spec).resolve())}
        else:
            raise CliError(f"--data must be digits, mnist1d, shakespeare or a path to an .npz file, got {spec!r}")
    except FileNotFoundError as exc:
        raise CliError(f"--data: {exc}") from None
    except ImportError as exc:
        raise CliError(str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise CliError(f"--data: {exc}") from None
    except OSError as exc:
        raise CliError(f"--data: cannot read {exc.filename or spec}: {exc.strerror or exc}") from None
    except MemoryError:
        raise CliError(f"--data: {spec} does not fit in memory") from None
    data = data._replace(x_train=data.x_train.astype(dtype, copy=False), x_test=data.x_test.astype(dtype, copy=False))
    recorded = {name: info.pop(name, value) for name, value in (("split_seed", split_seed),
                                                                ("test_fraction", test_fraction))}
    info.update(num_train=len(data.y_train), num_test=len(data.y_test), num_features=data.x_train.shape[1],
                num_classes=data.num_classes, **recorded)  # --data shakespeare records its own split
    return data, info
