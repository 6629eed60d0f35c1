"""``--config FILE.json``: a bare config, or a run folder's ``config.json``, which is the whole run.

``read_run_file`` reads and checks a run file (a key its command never writes is refused by
name); ``data_flags`` turns its ``"data"`` section into the data flags that load the same data
again (``--config`` and ``--resume`` both use it); ``run_file_settings`` gives the rest of the
run (``--max-loss``, ``--checkpoint-every``, ``train``'s ``--algo``). Errors are ``CliError``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from diloco.tools.cli.errors import CliError
from diloco.tools.runs.atomic_files import read_json

__all__ = ["RUN_FILE_KEYS", "STUDY_FILE_KEYS", "DATA_FILE_KEYS", "read_run_file", "read_config_file", "read_run_config",
           "run_file_settings", "data_flags", "same_data", "with_run_data", "check_sizes", "run_data_name"]

DEFAULT_DATA = "digits"


# The top level of a run folder's config.json (``start_run``; the studies add their spec; "split" is
# read by --resume only: any other run measures its split again):
# anything else is a misplaced or mistyped key, refused rather than ignored.
RUN_FILE_KEYS = frozenset({"command", "algorithms", "blas_threads", "checkpoint_every", "max_loss", "config", "data",
                           "split"})
STUDY_FILE_KEYS = RUN_FILE_KEYS | {"study", "title", "claim", "values", "seeds", "variants", "family", "target_loss",
                                   "task", "steps_per_worker", "tune_seeds", "arms", "tuning_steps"}
# Its "data" section (``load_dataset``'s description): what is loaded again, then what is checked.
DATA_FILE_KEYS = frozenset({"name", "path", "provenance", "num_samples", "split_seed", "test_fraction", "context",
                            "eval_windows", "vocab_size", "input", "num_train", "num_test", "num_features",
                            "num_classes"})
_DATA_SIZES = ("num_train", "num_test", "num_features", "num_classes")


def _read_json_object(path: str) -> dict:
    file = Path(path)
    if not file.is_file():
        raise CliError(f"config file not found: {path}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CliError(f"cannot read config file {path}: {exc}") from None
    except ValueError:  # Python's limit on an integer's digits (sys.get_int_max_str_digits)
        raise CliError(f"cannot read config file {path}: it holds an integer of more than "
                       f"{sys.get_int_max_str_digits():,} digits") from None
    except RecursionError:
        raise CliError(f"cannot read config file {path}: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise CliError(f"config file {path} must hold a JSON object, got {type(data).__name__}")
    return data


def _check_run_file(path: str, run: dict) -> None:
    """Refuse a run folder's config.json with a key its command never writes, naming the key."""
    known = STUDY_FILE_KEYS if run.get("command") == "study" else RUN_FILE_KEYS
    unknown = sorted(set(run) - known)
    if unknown:
        raise CliError(f"config file {path}: unknown top-level key(s) {unknown} (a run's config.json holds "
                       f"{sorted(known)}; the experiment's fields go under \"config\")")
    if not isinstance(run["config"], dict):
        raise CliError(f"config file {path}: \"config\" must be a JSON object, got {type(run['config']).__name__}")
    data = run.get("data", {})
    if not isinstance(data, dict):
        raise CliError(f"config file {path}: \"data\" must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - DATA_FILE_KEYS)
    if unknown:
        raise CliError(f"config file {path}: unknown key(s) {unknown} in \"data\" (known: {sorted(DATA_FILE_KEYS)})")


def read_run_file(path: str | None) -> dict | None:
    """The whole of a run folder's config.json named by ``--config`` (checked), or None for a bare config."""
    if not path:
        return None
    data = _read_json_object(path)
    if "config" not in data:
        return None
    _check_run_file(path, data)
    return data


def read_config_file(path: str) -> dict:
    run = read_run_file(path)
    return run["config"] if run is not None else _read_json_object(path)


def read_run_config(run_dir: Path, *, prefix: str = "", missing: str) -> dict:
    """The ``config.json`` of the run folder ``run_dir``, as it was written (any JSON value).

    Raises ``CliError``, its line after ``prefix``: no such folder, no ``config.json``
    (``missing`` says what to do instead), or a ``config.json`` that cannot be read.
    """
    if not run_dir.is_dir():
        raise CliError(f"{prefix}no run folder {run_dir}")
    if not (run_dir / "config.json").is_file():
        raise CliError(f"{prefix}{run_dir} is not a run folder (no config.json): {missing}")
    try:
        return read_json(run_dir / "config.json")
    except (OSError, ValueError) as exc:
        raise CliError(f"{prefix}{exc}") from None


def run_file_settings(args, command: str) -> dict:
    """What a ``--config`` run folder's config.json sets beside the config and the data: ``max_loss``
    and ``checkpoint_every``, and for ``train`` from a ``train`` run its ``algo``. Empty for a bare config."""
    run = read_run_file(getattr(args, "config", None))
    if run is None:
        return {}
    settings = {name: run[name] for name in ("max_loss", "checkpoint_every") if name in run}
    _check_run_settings(args.config, settings)
    algo = _trained_algo(args.config, run) if command == "train" else None
    return settings if algo is None else {**settings, "algo": algo}


def _check_run_settings(path: str, settings: dict) -> None:
    max_loss, every = settings.get("max_loss"), settings.get("checkpoint_every")
    if max_loss is not None and (isinstance(max_loss, bool) or not isinstance(max_loss, (int, float))
                                 or not max_loss > 0):
        raise CliError(f"config file {path}: max_loss must be a positive number or null, got {max_loss!r}")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise CliError(f"config file {path}: checkpoint_every must be a positive int or null, got {every!r}")


def _trained_algo(path: str, run: dict) -> str | None:
    """The algorithm a ``train`` run trained (``--algo`` of a ``train --config`` of it), or None."""
    algos = run.get("algorithms")
    if run.get("command") != "train" or algos is None:
        return None
    if not (isinstance(algos, list) and len(algos) == 1 and algos[0] in ("diloco", "sync")):
        raise CliError(f"config file {path}: algorithms must be [\"diloco\"] or [\"sync\"], got {algos!r}")
    return algos[0]


def data_flags(info: dict) -> dict:
    """The data flags that load a run's data again, from its config.json "data" section.

    Raises ``CliError`` naming the entry (``data.split_seed``, ...) whose value no flag takes."""
    flags = {"data": info.get("path") or info.get("name") or DEFAULT_DATA}
    if not isinstance(flags["data"], str):
        raise CliError(f"data.name must be a string, got {flags['data']!r}")
    for name, kind in (("split_seed", int), ("test_fraction", float), ("num_samples", int), ("context", int),
                       ("eval_windows", int)):
        value = info.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
            raise CliError(f"data.{name} must be {'a number' if kind is float else 'an int'}, got {value!r}")
        flags[name] = value
    return flags


_DATA_FLAG_NAMES = ("data", "split_seed", "test_fraction", "num_samples", "context", "eval_windows")


def with_run_data(args):
    """``args`` with the data flags left unset taken from ``--config``'s run file, and that file's data section
    (None when no run file gives the data, or when ``--data`` names other data)."""
    run = read_run_file(getattr(args, "config", None))
    info = run.get("data") if run is not None else None
    if not info:
        return args, None
    saved = data_flags(info)
    if not same_data(getattr(args, "data", None) or saved["data"], saved["data"]):
        return args, None  # other data: the file's data section does not describe it
    values = {name: getattr(args, name, None) for name in _DATA_FLAG_NAMES}
    if any(values[name] is not None and name in saved and values[name] != saved[name] for name in _DATA_FLAG_NAMES):
        info = None  # a data flag changes the data: the recorded sizes no longer apply
    filled = {name: saved[name] if values[name] is None and name in saved else values[name]
              for name in _DATA_FLAG_NAMES}
    return argparse.Namespace(**{**vars(args), **filled}), info


def same_data(given, saved) -> bool:
    """Whether ``--data given`` names the data a run recorded as ``saved`` (a name, or the same file)."""
    return given == saved or Path(str(given)).resolve() == Path(str(saved)).resolve()


def check_sizes(path: str, info: dict, loaded: dict) -> None:
    for name in _DATA_SIZES:
        if name in info and info[name] != loaded[name]:
            raise CliError(f"config file {path}: data.{name} is {info[name]!r}, but the data it names has "
                           f"{loaded[name]!r} (the file was edited, or the data changed)")


def run_data_name(args) -> str | None:
    """The data set the run folder ``--resume`` continues, or a ``--config`` run file, names (for the
    flag checks), or None. A resumed run loads its own data, whatever the flags say."""
    resume = getattr(args, "resume", None)
    run = read_run_file(str(Path(resume) / "config.json")) if resume else read_run_file(getattr(args, "config", None))
    data = run.get("data") if run is not None else None
    return data_flags(data)["data"] if data else None
