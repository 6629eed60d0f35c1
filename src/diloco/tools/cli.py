"""The ``diloco`` command line (also ``python -m diloco``).

Each sub-command module contributes its parsers through ``add_parsers(subparsers)``,
setting ``func`` (a callable taking the parsed arguments and returning an exit status).
The modules are imported explicitly here; they depend on ``diloco.tools.errors``, never
on this module, so there is no import cycle. Usage errors and faults (``OSError``,
``MemoryError``) exit with status 2 and print one line; a diverged run exits with 3,
Ctrl-C with 130 and SIGTERM, handled like Ctrl-C, with 143.
"""

from __future__ import annotations

import argparse
import sys

from diloco.tools import commands, grading, workspace
from diloco.tools.errors import CliError, Parser
from diloco.tools.faults import Terminated, describe_os_error, sigterm_as_interrupt

__all__ = ["main", "build_parser", "CliError"]

# Modules that contribute sub-commands, in help order.
_COMMAND_MODULES = (commands, workspace, grading)


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
    args = parser.parse_args(argv)
    try:
        with sigterm_as_interrupt():
            return int(args.func(args) or 0)
    except CliError as exc:
        print(f"diloco {args.command}: error: {exc}", file=sys.stderr)
        return exc.status
    except Terminated:
        print(f"diloco {args.command}: terminated (SIGTERM); files already written are kept", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"diloco {args.command}: interrupted; files already written are kept", file=sys.stderr)
        return 130
    except OSError as exc:  # a fault no command turned into a CliError: still one line, never a traceback
        print(f"diloco {args.command}: error: {describe_os_error(exc)}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"diloco {args.command}: error: out of memory", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
