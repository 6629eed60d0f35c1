"""The command line's error type and argument parser, shared by every sub-command module."""

from __future__ import annotations

import argparse

__all__ = ["CliError", "Parser"]


class CliError(Exception):
    """A user error or a fault: printed as one line, exit status ``status`` (2 unless said)."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit status 2), like ``CliError``.

    Sub-parsers inherit the class, so this holds for every sub-command's flags too.
    """

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")
