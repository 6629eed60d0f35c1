"""The ``diloco`` command line (also ``python -m diloco``).

Each sub-command module contributes its parsers through ``add_parsers(subparsers)``,
setting ``func`` (a callable taking the parsed arguments and returning an exit status).
The modules are imported explicitly here; they depend on ``diloco.tools.cli.errors``, never
on this module, so there is no import cycle. Usage errors and faults (``OSError``,
``MemoryError``) exit with status 2 and print one line; a diverged run exits with 3. SIGINT, SIGTERM
and SIGHUP are handled from the first import on (``diloco.runtime.stop_signals``; see
``_stops``): status "interrupted", exit 128 + n, one line with the ``--resume`` command.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

from diloco.runtime import stop_signals
from diloco.tools.cli import commands, plot_command
from diloco.tools.cli.errors import CliError, Parser
from diloco.tools.grading import grade_command as grading
from diloco.tools.runs.faults import describe_os_error, settle_runs, shorten, stop_message
from diloco.tools.runs.run_lock import release_runs
from diloco.tools.studies.ablations import shared_shards
from diloco.tools.workspace import create as workspace

__all__ = ["main", "build_parser", "CliError"]

# Modules that contribute sub-commands, in help order.
_COMMAND_MODULES = (commands, plot_command, workspace, grading)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="diloco",
        description="DiLoCo in pure NumPy: train, compare, study, and learn it in 30 milestones.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module in _COMMAND_MODULES:
        module.add_parsers(subparsers)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # a signal until here: one line, nothing written (stop_signals)
    with _stops(), shared_shards():  # the command's runs share the shards a seed cuts
        return _run(args)


# --- signals and run folders (docs/failure-and-recovery.md) ---------------------------------

@contextlib.contextmanager
def _stops():
    """Signals raise inside (``stop_signals.session``); every run folder's lock is released after."""
    try:
        with stop_signals.session():
            yield
    finally:
        release_runs()


def _run(args) -> int:
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        message = shorten(str(exc))
        settle_runs("failed", message)
        print(f"diloco {args.command}: error: {message}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt as exc:  # SIGINT, SIGTERM, SIGHUP
        name = getattr(exc, "name", "SIGINT")
        settle_runs("interrupted", f"stopped by {name}", {"signal": name})
        status, line = stop_message(args.command, exc)
        print(line, file=sys.stderr)
        return status
    except OSError as exc:  # a fault no command turned into a CliError: still one line, never a traceback
        settle_runs("failed", describe_os_error(exc))
        print(f"diloco {args.command}: error: {shorten(describe_os_error(exc))}", file=sys.stderr)
        return 2
    except MemoryError:
        settle_runs("failed", "out of memory")
        print(f"diloco {args.command}: error: out of memory", file=sys.stderr)
        return 2
    except NotImplementedError as exc:  # in a workspace: a milestone or exercise not written yet, in one line
        from diloco.exercises import stub_code
        from diloco.milestones import stub_number

        if stub_number(str(exc)) is None and stub_code(str(exc)) is None:
            raise
        settle_runs("failed", str(exc))
        print(f"diloco {args.command}: error: {shorten(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
