"""The command line's error type and argument parser, shared by every sub-command module."""

from __future__ import annotations

import argparse
import difflib
import re

__all__ = ["CliError", "Parser", "closest_flag"]

# argparse's message for a positional given a value outside its choices (Python 3.10-3.13).
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)")


class CliError(Exception):
    """A user error or a fault: printed as one line, exit status ``status`` (2 unless said)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


def closest_flag(flag: str, known) -> str | None:
    """The known flag nearest to ``flag`` (``--round`` -> ``--rounds``), or None.

    The text before any ``=`` is compared; an exact match up to case comes first, then
    ``difflib.get_close_matches`` with cutoff 0.7 (``--round`` and ``--rounds`` score 0.93,
    ``--batch`` and ``--batch-size`` 0.74; an unrelated ``--bogus`` gets no suggestion).
    """
    name = flag.split("=", 1)[0]
    known = sorted(set(known))
    folded = [option for option in known if option.lower() == name.lower() and option != name]
    if folded:
        return folded[0]
    matches = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    return matches[0] if matches else None


class Parser(argparse.ArgumentParser):
    """argparse, but stricter and clearer, for ``diloco`` and every sub-command.

    * A usage error is one line (exit status 2, like ``CliError``), printed against the
      sub-command it belongs to (``diloco train: error: ...``), never the top level.
    * No abbreviations (``allow_abbrev=False``): ``--round`` is not silently taken as
      ``--rounds``; it is an error that suggests the closest flag.
    * An unknown flag or sub-command gets a "did you mean" suggestion (``difflib``), and the
      ``--help`` command to see them all, as the user can run it from where they stand
      (``diloco.tools.cli.invocation``).

    Sub-parsers made by ``add_subparsers().add_parser`` are of this class too, so all of
    this holds for every sub-command's flags.
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.has_subcommands = False

    def add_subparsers(self, **kwargs):
        self.has_subcommands = True
        return super().add_subparsers(**kwargs)

    def known_flags(self) -> list[str]:
        """Every option string of this parser (``--rounds``, ``-H``, ``--help``, ...)."""
        return list(self._option_string_actions)  # argparse's table of this parser's own flags

    def unrecognized(self, extras) -> str:
        """The error message for arguments this parser does not know, with suggestions."""
        hints = []
        for token in extras:
            if token.startswith("-") and len(token) > 1:
                suggestion = closest_flag(token, self.known_flags())
                if suggestion is not None:
                    hints.append((token.split("=", 1)[0], suggestion))
        message = f"unrecognized arguments: {' '.join(extras)}"
        if len(hints) == 1:
            message += f"; did you mean {hints[0][1]}?"
        elif hints:
            message += "; did you mean " + ", ".join(f"{flag} for {typo}" for typo, flag in hints) + "?"
        return message

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not self.has_subcommands:
            # A sub-command's parser (argparse calls parse_known_args on it) reports its own
            # unknown arguments, so the error names it rather than the top-level ``diloco``.
            self.error(self.unrecognized(extras))
        return namespace, extras

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unrecognized(extras))
        return namespace

    def error(self, message):
        choice = _INVALID_CHOICE.search(message)
        if choice is not None:
            options = re.findall(r"'([^']*)'", choice["choices"])
            matches = difflib.get_close_matches(choice["value"], options, n=1)
            if matches:
                message += f"; did you mean '{matches[0]}'?"
        self.exit(2, f"{self.prog}: error: {message} (see '{help_command(self.prog)}')\n")


def help_command(prog: str) -> str:
    """``.venv/bin/diloco train --help`` for the parser ``diloco train``, ``.venv/bin/python -m
    diloco.tools.cli.mpi --help`` for ``python -m diloco.tools.cli.mpi``: runnable from here."""
    import shlex
    import sys

    from diloco.tools.cli.invocation import command, shown_path

    words = prog.split()
    if words[:1] == ["diloco"]:
        return command(" ".join([*words[1:], "--help"]))
    if words[:2] == ["python", "-m"]:
        return " ".join([shlex.quote(shown_path(sys.executable)), *words[1:], "--help"])
    return f"{prog} --help"
