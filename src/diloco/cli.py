"""The ``diloco`` command line (also ``python -m diloco``).

Sub-commands are registered by the modules that own them, each through a function
``add_parsers(subparsers)`` that adds its parsers and sets ``func`` (a callable taking
the parsed arguments and returning an exit status). Usage errors exit with status 2
and print one line.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "build_parser", "CliError"]


class CliError(Exception):
    """A user error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2), like ``CliError``.

    Sub-parsers inherit the class, so this holds for every sub-command's flags too.
    """

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="diloco",
        description="DiLoCo in pure NumPy: train, compare, study, and learn it in 30 milestones.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in _COMMAND_MODULES:
        try:
            module = __import__(module_name, fromlist=["add_parsers"])
        except ImportError:  # a command module not present in this build
            continue
        module.add_parsers(subparsers)
    return parser


# Modules that contribute sub-commands, in help order.
_COMMAND_MODULES = ("diloco.commands", "diloco.workspace", "diloco.grading")


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"diloco {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"diloco {args.command}: interrupted; files already written are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
