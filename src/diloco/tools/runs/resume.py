"""``diloco train|compare --resume RUN_DIR``: pick a stopped run up where its checkpoints left it.

``plan_resume`` reads the run folder and checks, before changing anything, that the run
can be continued exactly:

* something was saved: a folder stopped while it was being made (no ``environment.json``, no
  checkpoint) is refused with the command that starts it again from its ``config.json``;
* no other process is writing the folder (``diloco.tools.runs.run_lock``: the lock taken
  here is held until the command ends; it and ``.reserve`` are the only files written);
* the code is the code the run was made with (``environment.json``'s ``source``: the
  version and a hash of the ``diloco`` sources), else refused naming both; with
  ``--allow-code-change`` the resume goes ahead, and ``record_code_change`` writes the
  change into ``environment.json`` (``code_changes``, and ``source`` becomes the new
  code) and into the first history record written after the resume (``code_change``);
* the folder was made by the same command (and, for ``train``, the same ``--algo``);
* flags given with ``--resume`` agree with the run's ``config.json`` (a resumed run keeps
  its config; ``--config`` is refused, other flags may only repeat the saved values);
* the data loads again as it was (same source, split seed and fraction);
* each algorithm's newest checkpoint loads and matches the config and the data
  (``diloco.tools.runs.checkpoint.load_checkpoint``), else the run is refused with its reason.

An algorithm without a checkpoint starts from round 0, which is also exactly what an
uninterrupted run does. Only then is ``history.jsonl`` cut back to the rounds the
checkpoints hold (a torn last line is dropped, and said so), so the resumed run appends
exactly the records an uninterrupted run would have written after them.
"""

from __future__ import annotations

import shlex
from argparse import Namespace
from pathlib import Path
from typing import NamedTuple

from diloco.config import DiLoCoConfig
from diloco.data import Dataset
from diloco.tools.cli.config_file import data_flags, read_run_config, same_data
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flags import build_config, load_dataset
from diloco.tools.cli.invocation import command as cli_command
from diloco.tools.cli.invocation import shown_path
from diloco.tools.runs.checkpoint import (
    CheckpointError,
    config_changes,
    data_fingerprint,
    latest_checkpoint,
    load_checkpoint,
)
from diloco.tools.runs.folders import read_json, read_jsonl, repair_jsonl, write_json
from diloco.tools.runs.run_environment import source_record
from diloco.tools.runs.run_lock import RunLocked, lock_run_dir

__all__ = ["CHECKPOINT_DIR", "ResumePlan", "plan_resume", "record_code_change"]

CHECKPOINT_DIR = "checkpoints"  # inside the run folder


class ResumePlan(NamedTuple):
    """What ``plan_resume`` found: everything needed to continue, nothing written yet."""

    run_dir: Path
    saved: dict                 # the run's config.json
    config: DiLoCoConfig
    data: Dataset
    data_info: dict
    algos: tuple
    starts: dict                # algo -> Checkpoint, or None to start from round 0
    history: list               # the history.jsonl records to keep
    notes: list                 # lines to tell the user (a repaired history, a fresh start)
    code_change: dict | None = None  # {"from": source, "to": source} under --allow-code-change


def _described(source) -> str:
    if not isinstance(source, dict) or not isinstance(source.get("sha256"), str):
        return "code environment.json does not record (a run made before the source hash)"
    return f"diloco {source.get('version')} (source sha256 {source['sha256'][:12]})"


def _code_change(run_dir: Path, args) -> dict | None:
    """None when this is the code the run was made with; else refused, or (allowed) the change."""
    try:
        environment = read_json(run_dir / "environment.json")
    except (OSError, ValueError):
        environment = {}
    then = environment.get("source") if isinstance(environment, dict) else None
    now = source_record()
    if isinstance(then, dict) and then.get("sha256") == now["sha256"]:
        return None
    if not getattr(args, "allow_code_change", False):
        raise CliError(f"--resume: the run was made by {_described(then)}, this is {_described(now)}; the result "
                       f"could differ from an uninterrupted run (pass --allow-code-change to resume anyway, "
                       f"recorded in the history)")
    return {"from": then, "to": now}


def record_code_change(plan: ResumePlan, history) -> None:
    """Under ``--allow-code-change``: the change into ``environment.json`` and the next history record."""
    if plan.code_change is None:
        return
    after = {algo: start.round if start else 0 for algo, start in plan.starts.items()}
    change = {**plan.code_change, "after_rounds": after}
    path = plan.run_dir / "environment.json"
    try:
        environment = read_json(path)
    except (OSError, ValueError):
        environment = {}
    environment = environment if isinstance(environment, dict) else {}
    write_json(path, {**environment, "source": plan.code_change["to"],
                      "code_changes": [*environment.get("code_changes", []), change]})
    history.mark_next(code_change=change)


def _saved_run(run_dir: Path, command: str) -> dict:
    saved = read_run_config(run_dir, prefix="--resume: ", missing="a run stopped while its folder was being made "
                            "saved nothing; start it again with the command that made it")
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict) or not saved.get("algorithms"):
        raise CliError(f"--resume: {run_dir / 'config.json'} is not a train or compare run's config.json")
    if saved.get("command") != command:
        again = cli_command(f"{saved.get('command')} --resume {shlex.quote(shown_path(run_dir))}")
        raise CliError(f"--resume: {run_dir} was made by 'diloco {saved.get('command')}'; resume it with: {again}")
    return saved


def _refuse_if_nothing_saved(run_dir: Path, command: str, algos) -> None:
    """A run stopped while its folder was being made (no ``environment.json``) and before any
    checkpoint: nothing to resume; the line gives the command that starts it again from its
    ``config.json`` (a run file: the same config and data)."""
    if (run_dir / "environment.json").is_file() or any(
            latest_checkpoint(run_dir / CHECKPOINT_DIR, algo) is not None for algo in algos):
        return
    again = cli_command(f"{command} --config {shlex.quote(shown_path(run_dir / 'config.json'))} --runs-dir "
                        f"{shlex.quote(shown_path(run_dir.parent))}")
    raise CliError(f"--resume: {run_dir} was stopped before its first round (it has no environment.json and no "
                   f"checkpoint): nothing was saved; start it again with: {again}")


def _resumed_data(args, saved: dict, config: DiLoCoConfig) -> tuple[Dataset, dict]:
    again = data_flags(saved.get("data") or {})  # every data flag the run was made with
    for name, value in again.items():
        given = getattr(args, name, None)
        if given is not None and not (same_data(given, value) if name == "data" else given == value):
            flag = "--" + name.replace("_", "-")
            raise CliError(f"--resume: the run used {flag} {value}; a resumed run keeps its data (drop {flag})")
    return load_dataset(Namespace(**again, cache_dir=getattr(args, "cache_dir", None)), config.dtype)


def plan_resume(args, command: str, algos: tuple) -> ResumePlan:
    """Check that ``args.resume`` can be continued; see the module docstring. Writes nothing."""
    run_dir = Path(args.resume)
    saved = _saved_run(run_dir, command)
    _lock(run_dir, command)
    saved_algos = tuple(saved["algorithms"])
    _refuse_if_nothing_saved(run_dir, command, saved_algos)
    code_change = _code_change(run_dir, args)
    config = _resumed_config(args, run_dir, saved, command)
    data, data_info = _resumed_data(args, saved, config)
    fingerprint = data_fingerprint(data.x_train, data.y_train, data.x_test, data.y_test)
    notes = []
    starts = {algo: _latest_start(run_dir, algo, config, fingerprint, notes) for algo in saved_algos}
    kept = _kept_records(run_dir / "history.jsonl", saved_algos, starts, notes)
    return ResumePlan(run_dir, saved, config, data, data_info, saved_algos, starts, kept, notes, code_change)


def _lock(run_dir: Path, command: str) -> None:
    try:
        lock_run_dir(run_dir, command)  # one writer: a second resume of the same run is refused here
    except RunLocked as exc:
        raise CliError(f"--resume: {exc.strerror}") from None
    except OSError as exc:
        raise CliError(f"--resume: cannot lock {run_dir}: {exc.strerror or exc}") from None


def _resumed_config(args, run_dir: Path, saved: dict, command: str) -> DiLoCoConfig:
    """The run's own config, once the flags neither pick another algorithm nor change it."""
    saved_algos = tuple(saved["algorithms"])
    if command == "train" and getattr(args, "algo", None) not in (None, *saved_algos):
        raise CliError(f"--resume: {run_dir} trained --algo {saved_algos[0]}, not {args.algo}")
    if getattr(args, "config", None):
        raise CliError("--resume takes the config from the run folder; --config cannot be combined with it")
    try:
        config = DiLoCoConfig.from_dict(saved["config"])
    except (TypeError, ValueError) as exc:
        raise CliError(f"--resume: {run_dir / 'config.json'} holds an invalid config: {exc}") from None
    changes = config_changes(config, build_config(args, base=config))
    if changes:
        raise CliError(f"--resume: a resumed run keeps its config, but the flags change {'; '.join(changes)}")
    return config


def _latest_start(run_dir: Path, algo: str, config: DiLoCoConfig, fingerprint: str, notes: list):
    """``algo``'s newest checkpoint, or None (noted) where it has none; a damaged one is refused."""
    manifest = latest_checkpoint(run_dir / CHECKPOINT_DIR, algo)
    if manifest is None:
        notes.append(f"{algo}: no checkpoint, starting it from round 0")
        return None
    try:
        return load_checkpoint(manifest, algo=algo, config=config, fingerprint=fingerprint)
    except CheckpointError as exc:
        older = [p.name for p in sorted((run_dir / CHECKPOINT_DIR).glob(f"{algo}-round*.json")) if p != manifest]
        hint = f"; an older one exists: delete {manifest.name} and its .npz to resume from it" if older else ""
        raise CliError(f"--resume: {exc}; nothing was changed{hint}") from None


def _kept_records(history_path: Path, algos: tuple, starts: dict, notes: list) -> list[dict]:
    """Each algorithm's history records up to its checkpoint's round (a torn last line repaired,
    noted); a record the checkpoint has but the file lost comes from the checkpoint."""
    records = []
    if history_path.is_file():
        try:
            note = repair_jsonl(history_path)
            records = read_jsonl(history_path)
        except (OSError, ValueError) as exc:
            raise CliError(f"--resume: {exc}") from None
        if note:
            notes.append(note)
    kept = []
    for algo in algos:
        done = starts[algo].round if starts[algo] is not None else 0
        mine = {r.get("round"): r for r in records if r.get("algo") == algo and r.get("round", 0) <= done}
        for round_index in range(1, done + 1):
            kept.append(mine.get(round_index) or {"algo": algo, **starts[algo].history[round_index - 1], "time": None})
    return kept
