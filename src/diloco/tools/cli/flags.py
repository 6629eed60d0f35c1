"""Flags shared by ``train``, ``compare``, ``study`` and ``python -m diloco.tools.cli.mpi``.

Every ``DiLoCoConfig`` field has a flag (declared in ``diloco.tools.cli.config_flags``, and
re-exported here); ``--config FILE.json`` (a bare config, or a run folder's ``config.json``)
sets the starting point and flags override it. ``build_config`` and ``load_dataset`` turn
the parsed flags into a config and a dataset, raising ``CliError`` (one line, exit status 2)
for a user error, worded as the user gave the value (``diloco.tools.cli.flag_names``).
"""

from __future__ import annotations

import math
from pathlib import Path

from diloco.config import DiLoCoConfig
from diloco.config.sections import WIRE_FIELDS, AsyncConfig, FamilyConfig
from diloco.core.model_seam import MODEL_KINDS, model_kind, section_owner
from diloco.core.netsim import parse_bandwidth, parse_duration
from diloco.data import (
    DIGITS_PROVENANCE,
    MNIST1D_PROVENANCE,
    Dataset,
    load_digits_split,
    load_mnist1d,
    load_npz_dataset,
)
from diloco.tools.cli.config_file import check_sizes, read_config_file, with_run_data
from diloco.tools.cli.config_flags import (
    CONFIG_FLAGS,
    DATA_DEFAULTS,
    DEFAULT_MAX_LOSS,
    INNER_FLAGS,
    MUON_FLAGS,
    TRANSFORMER_FLAGS,
    add_config_flags,
    add_data_flags,
    add_execution_flags,
    add_output_flags,
    add_recovery_flags,
)
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flag_checks import check_data_file
from diloco.tools.cli.flag_names import in_config_words, in_flag_words
from diloco.tools.cli.paper_flags import load_text_dataset, mechanism_changes

__all__ = ["CONFIG_FLAGS", "INNER_FLAGS", "MUON_FLAGS", "TRANSFORMER_FLAGS", "DATA_DEFAULTS", "DEFAULT_MAX_LOSS",
           "add_config_flags",
           "add_data_flags", "add_execution_flags", "add_output_flags", "add_recovery_flags", "build_config",
           "build_family", "build_async", "load_dataset"]


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
        config = _from_config_file(args, base if base is not None else DiLoCoConfig(**(defaults or {})))
        changes = _field_changes(args, config)
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


def _from_config_file(args, config: DiLoCoConfig) -> DiLoCoConfig:
    """``config`` with ``--config FILE``'s fields over it; a section's fields over the section's."""
    if not getattr(args, "config", None):
        return config
    data = read_config_file(args.config)
    merged = {**config.to_dict(), **data}
    for section in ("inner", "family", "asynchrony", "muon", "transformer"):
        if isinstance(data.get(section), dict):
            merged[section] = {**getattr(config, section).to_dict(), **data[section]}
    return DiLoCoConfig.from_dict(merged)


def _field_changes(args, config: DiLoCoConfig) -> dict:
    """The top-level fields, the inner AdamW's and Muon's that the flags give."""
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
    return changes


def _model_changes(args, config: DiLoCoConfig, changes: dict) -> dict:
    """The transformer's shape flags; with ``--model transformer``, float32 unless ``--dtype`` says
    otherwise, and the MLP widths of a study's defaults dropped (``--hidden-sizes`` is refused)."""
    shape = {name: getattr(args, f"transformer_{name}") for name in TRANSFORMER_FLAGS
             if getattr(args, f"transformer_{name}", None) is not None}
    kind, owner = MODEL_KINDS[changes.get("model", config.model)], section_owner("transformer")
    if shape and kind is not owner:
        given = ", ".join(TRANSFORMER_FLAGS[name][0][0] for name in shape)
        raise CliError(f"{given} configure(s) the transformer: add --model {owner.name}")
    out = {"transformer": shape} if shape else {}
    if kind is not model_kind(config):  # --model changes the model: what the new one sets, unless given
        if kind.flag_dtype is not None and "dtype" not in changes:
            out["dtype"] = kind.flag_dtype
        defaults = DiLoCoConfig()  # a study's MLP widths: not the transformer's (a flag's are refused)
        out.update({name: getattr(defaults, name) for name in kind.flag_resets if name not in changes})
    return out


def load_dataset(args, dtype: str = "float64") -> tuple[Dataset, dict]:
    """The dataset named by ``--data`` (cast to ``dtype``) and a description for config.json.

    The arrays are read-only: every run of a command reads the same data, and
    ``diloco.core.shard_reuse`` fingerprints them once. The description records what
    ``--resume`` and ``--config`` need to load the same data again. With ``--config`` a run
    folder's config.json, each data flag not given comes from its ``"data"`` section, and the
    sizes it recorded must match what is loaded (unless a flag names other data).
    """
    args, recorded = with_run_data(args)  # --config run/config.json: its data, unless a flag says otherwise
    data, info = _load_named_data(args, dtype)
    if recorded is not None:
        check_sizes(args.config, recorded, info)
    for array in (data.x_train, data.y_train, data.x_test, data.y_test):  # every run reads these: none may change them
        array.setflags(write=False)
    return data, info


def _load_named_data(args, dtype: str) -> tuple[Dataset, dict]:
    spec, split_seed, test_fraction = (DATA_DEFAULTS[name] if getattr(args, name, None) is None
                                       else getattr(args, name) for name in ("data", "split_seed", "test_fraction"))
    if split_seed < 0:
        raise CliError(f"--split-seed must be a non-negative int, got {split_seed}")
    if not (math.isfinite(test_fraction) and 0 < test_fraction < 1):
        raise CliError(f"--test-fraction must be strictly between 0 and 1, got {test_fraction}")
    try:
        data, info = _load_by_name(args, spec, split_seed, test_fraction)
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


def _load_by_name(args, spec: str, split_seed: int, test_fraction: float) -> tuple[Dataset, dict]:
    """The dataset ``--data`` names and its description (a library error, for the caller to word)."""
    if spec == "digits":
        data = load_digits_split(seed=split_seed, test_fraction=test_fraction)
        return data, {"name": "digits", "provenance": DIGITS_PROVENANCE}
    if spec == "mnist1d":
        num_samples = 5000 if getattr(args, "num_samples", None) is None else args.num_samples
        data = load_mnist1d(cache_dir=getattr(args, "cache_dir", None), num_samples=num_samples)
        return data, {"name": "mnist1d", "provenance": MNIST1D_PROVENANCE, "num_samples": num_samples}
    if spec == "shakespeare":
        return load_text_dataset(args)
    if spec.endswith(".npz") or Path(spec).exists():
        check_data_file(spec)  # an .npz archive, else a line saying what the file must hold
        data = load_npz_dataset(spec, test_fraction=test_fraction, seed=split_seed)
        return data, {"name": Path(spec).stem, "path": str(Path(spec).resolve())}
    raise CliError(f"--data must be digits, mnist1d, shakespeare or a path to an .npz file, got {spec!r}")


# --- the family's and asynchrony's sections ---------------------------------------------------

def build_family(args, defaults: dict | None = None) -> FamilyConfig:
    """The ``FamilyConfig`` of the parsed flags (over ``defaults``)."""
    changes = dict(defaults or {})
    for name in WIRE_FIELDS + ("fragments", "pattern", "overlap", "mix", "eager"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    try:
        if getattr(args, "bandwidth", None) is not None:
            changes["bandwidth"] = parse_bandwidth(args.bandwidth)
        if getattr(args, "latency", None) is not None:
            changes["latency"] = parse_duration(args.latency)
        if getattr(args, "step_time", None) is not None:
            changes["step_time"] = parse_duration(args.step_time)
        family = FamilyConfig(**changes)
    except (TypeError, ValueError) as exc:
        raise CliError(in_flag_words(str(exc))) from None
    if not family.simulates_network and (family.latency or family.step_time):
        raise CliError("--latency and --step-time need --bandwidth (they configure the simulated network)")
    return family


def _step_times(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in str(text).split(","))
    except ValueError:
        raise CliError(f"--step-times must be comma-separated seconds per step, e.g. 1,1,2,4, got {text!r}") from None


def build_async(args, defaults: dict | None = None) -> AsyncConfig:
    """The ``AsyncConfig`` of the parsed flags (over ``defaults``, a ``to_dict()``)."""
    changes = dict(defaults or {})
    for name in ("asynchronous", "speed_spread", "straggler", "straggler_factor", "delayed_nesterov",
                 "dynamic_local_steps"):
        if getattr(args, name, None) is not None:
            changes[name] = getattr(args, name)
    if getattr(args, "step_times", None) is not None:
        changes["step_times"] = _step_times(args.step_times)
    try:
        return AsyncConfig.from_dict(changes)
    except (TypeError, ValueError) as exc:
        raise CliError(in_flag_words(str(exc))) from None
