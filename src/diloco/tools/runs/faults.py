"""How a command ends when something goes wrong: one line, an exit status, a truthful run folder.

Once a run folder exists, ``run_outcome`` turns every way a run can end early into a
``summary.json`` status and a one-line error (``CliError``):

========================  ===============  ===========  ==============================
what happened             status           exit status  the line says
========================  ===============  ===========  ==============================
SIGINT, SIGTERM, SIGHUP   ``interrupted``  128 + n      the signal, the round saved, the
                                                        ``--resume`` line
non-finite or huge loss   ``diverged``     3            round, worker, quantity
``OSError`` (disk full,   ``failed``       2            the file and the OS's reason
read-only, name too long)
``MemoryError``           ``failed``       2            out of memory
``TypeError/ValueError``  ``failed``       2            the library's message
========================  ===============  ===========  ==============================

``failed`` is written only if the folder can still be written: the run folder's
``.reserve`` (``diloco.tools.runs.run_lock``) is deleted first, so a disk that filled up
still has room for it; the line is printed either way. ``settle_runs`` is the safety net
of ``diloco.tools.cli.main``: a run folder this process holds whose summary still says
``"running"`` when the command ends early gets the status of how it ended. ``late_step``
keeps a completed run ``"completed"`` when a later step (the plots) fails, and records
that step's failure beside it. ``shorten`` cuts echoed values to 200 characters. ``quiet_numpy`` keeps NumPy's
RuntimeWarnings (overflow, invalid value) off the terminal: the divergence guard's
message says what they would have said, and where.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import signal
import warnings
from pathlib import Path

import numpy as np

from diloco.runtime import stop_signals
from diloco.runtime.stop_signals import Stopped, Terminated, exit_status
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.invocation import command, shown_path
from diloco.tools.runs.atomic_files import read_json, write_json
from diloco.tools.runs.run_lock import free_reserves, held_runs
from diloco.tools.runs.training import Diverged

__all__ = ["Terminated", "Stopped", "quiet_numpy", "describe_os_error", "run_outcome", "DIVERGED_STATUS",
           "settle_runs", "stop_message", "resume_line", "late_step", "shorten", "ECHO_LIMIT"]

DIVERGED_STATUS = 3  # the exit status of a diverged run
ECHO_LIMIT = 200  # characters of a value echoed back in a message
_LINE_LIMIT = 2000  # characters of a whole message line


def shorten(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` with every run of more than ``limit`` non-space characters cut to ``limit``
    (and its length said), and the whole cut to ``_LINE_LIMIT``: a 50 MB value in a config
    file is not echoed back in a 50 MB line."""
    text = str(text)
    if len(text) <= limit:
        return text

    def cut(match):
        word = match.group(0)
        return f"{word[:limit]}...[{len(word):,} characters]"

    text = re.sub(rf"\S{{{limit + 1},}}", cut, text)
    if len(text) > _LINE_LIMIT:
        text = f"{text[:_LINE_LIMIT]}...[message of {len(text):,} characters cut]"
    return text


def _signal_of(exc: BaseException) -> tuple[int, str]:
    signum = getattr(exc, "signum", signal.SIGINT)
    return signum, signal.Signals(signum).name


def _saved_rounds(run_dir: Path) -> tuple[dict, int | None]:
    """({algo: the round of its newest checkpoint, 0 for none}, the run's rounds) of a train/compare folder."""
    from diloco.tools.runs.checkpoint import latest_checkpoint

    try:
        saved = read_json(run_dir / "config.json")
        algos, rounds = list(saved["algorithms"]), saved["config"].get("rounds")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, None
    found = {}
    for algo in algos:
        manifest = latest_checkpoint(run_dir / "checkpoints", algo) if algo in ("diloco", "sync") else None
        found[algo] = int(manifest.stem.rsplit("round", 1)[1]) if manifest is not None else 0
    return found, rounds


def resume_line(run_dir: Path, made_by: str) -> str:
    """What ``--resume`` of a stopped run will do, and the command: ``round 25 of 200 is saved; continue
    from round 26 with: .venv/bin/diloco train --resume runs/x``. A run with no finished round
    restarts, and the line says so (it never says "continue" then)."""
    found, rounds = _saved_rounds(run_dir)
    again = command(f"{made_by} --resume {shlex.quote(shown_path(run_dir))}")
    if not any(found.values()):
        return f"no round had finished, so nothing was saved; start it again with: {again}"
    of = f" of {rounds}" if rounds else ""
    if len(found) == 1:
        (done,) = found.values()
        return f"round {done}{of} is saved; continue from round {done + 1} with: {again}"
    parts = ", ".join(f"{algo} complete" if rounds and done == rounds else
                      f"{algo} round {done}{of} saved" if done else f"{algo} not started"
                      for algo, done in found.items())
    return f"{parts}; continue with: {again}"


def stop_message(command_name: str, exc: BaseException) -> tuple[int, str]:
    """(exit status 128 + n, the one line) for a command stopped by a signal."""
    signum, name = _signal_of(exc)
    runs = held_runs()
    line = f"diloco {command_name}: interrupted by {name}"
    if getattr(exc, "kept", None):  # a study: its finished runs are in the run cache (studies.runner)
        return exit_status(signum), f"{line}; {exc.kept}"
    if not runs:
        return exit_status(signum), f"{line} before its run folder was made; nothing was written"
    resumable = [resume_line(path, made_by) for path, made_by in runs.items() if made_by in ("train", "compare")]
    if resumable:
        return exit_status(signum), f"{line}; {'; '.join(resumable)}"
    folders = ", ".join(shlex.quote(shown_path(path)) for path in runs)
    return exit_status(signum), f"{line}; files already written are kept in {folders} (a study does not resume: " \
                                f"run it again)"


def settle_runs(status: str, reason: str, extra: dict | None = None) -> None:
    """Give every run folder this process holds whose summary still says ``"running"`` the
    status ``status`` (the safety net for an end outside ``run_outcome``)."""
    free_reserves()
    for path in held_runs():
        with contextlib.suppress(OSError, MemoryError, ValueError):
            summary = read_json(path / "summary.json")
            if isinstance(summary, dict) and summary.get("status") == "running":
                summary.pop("pid", None)
                write_json(path / "summary.json", {**summary, "status": status, "reason": reason, **(extra or {})})


@contextlib.contextmanager
def late_step(summary_path, summary: dict, step: str):
    """A step after training completed (``step`` = "plots"): a failure keeps the status
    ``"completed"`` and records ``summary[step] = "failed: <reason>"``, then a ``CliError``."""
    try:
        yield
    except (OSError, MemoryError, RuntimeError, ValueError) as exc:
        reason = describe_os_error(exc) if isinstance(exc, OSError) else (
            "out of memory" if isinstance(exc, MemoryError) else shorten(str(exc) or type(exc).__name__))
        free_reserves()
        with contextlib.suppress(OSError, MemoryError):
            write_json(summary_path, {**summary, step: f"failed: {reason}"})
        raise CliError(f"training completed, but the {step} failed: {reason}") from None


@contextlib.contextmanager
def quiet_numpy():
    """No NumPy floating-point warnings inside (the divergence guard reports instead)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def describe_os_error(exc: OSError) -> str:
    """``cannot write runs/x/history.jsonl: No space left on device`` style, one line."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is not None:
        return f"cannot write {exc.filename}: {reason}"
    return f"input/output error: {reason}"


@contextlib.contextmanager
def run_outcome(write_summary):
    """Map an early end inside to a summary status and a ``CliError``.

    ``write_summary(status, reason, extra)`` writes ``summary.json``; an ``OSError`` it
    raises itself (a full disk) is ignored, the line is still printed.
    """

    def record(status: str, reason: str, extra: dict | None = None) -> None:
        free_reserves()  # the space kept for this very write
        with contextlib.suppress(OSError, MemoryError):
            write_summary(status, reason, extra or {})

    try:
        with stop_signals.signal_first():  # an error from a clean-up a signal cut short is the signal
            yield
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP (diloco.runtime.stop_signals)
        _, name = _signal_of(exc)
        record("interrupted", f"stopped by {name}", {"signal": name})
        raise
    except Diverged as exc:
        record("diverged", str(exc), {"divergence": exc.as_dict()})
        raise CliError(str(exc), status=DIVERGED_STATUS) from None
    except OSError as exc:
        reason = describe_os_error(exc)
        record("failed", reason)
        raise CliError(reason) from None
    except MemoryError:
        reason = "out of memory during training"
        record("failed", reason)
        raise CliError(reason) from None
    except (TypeError, ValueError) as exc:
        reason = f"cannot train: {shorten(str(exc))}"
        record("failed", reason)
        raise CliError(reason) from None
