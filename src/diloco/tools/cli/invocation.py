"""How the user runs ``diloco`` from where they stand, so that every command we print runs as printed.

In a fresh checkout the command is ``.venv/bin/diloco`` (``make install`` puts no folder
on ``PATH``); in an activated environment, or after ``pip install``, it is ``diloco``.
``program()`` answers for the running process:

* ``diloco`` when that name, looked up on ``PATH``, is the script of this very
  environment (the one next to ``sys.executable``, or the one the user typed);
* otherwise that script's path as the user would type it from the current folder
  (``.venv/bin/diloco``; an absolute path when it lies outside the current folder);
* otherwise (no script: a library import) ``<python> -m diloco``.

``command("train --resume runs/x")`` prefixes it. The usage hints (``see '... --help'``),
the interrupt's ``--resume`` line and the resume refusals all go through here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

__all__ = ["program", "command", "shown_path"]


def shown_path(path) -> str:
    """``path`` as the user would type it here: relative inside the current folder, else absolute."""
    path = Path(path)
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path.absolute())
    return relative if not relative.startswith("..") else str(path.absolute())


def _script() -> Path | None:
    """The ``diloco`` script of this process: the one typed (``sys.argv[0]``), or this environment's."""
    typed = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if typed is not None and typed.name in ("diloco", "diloco.exe") and typed.is_file():
        return typed
    beside = Path(sys.executable).parent / "diloco"
    return beside if beside.is_file() else None


def program() -> str:
    """``diloco``, ``.venv/bin/diloco`` or ``python -m diloco``: how to run diloco from here."""
    script = _script()
    on_path = shutil.which("diloco")
    if script is not None and on_path is not None and os.path.realpath(on_path) == os.path.realpath(script):
        return "diloco"
    if script is not None:
        shown = shown_path(script)
        return shlex.quote(shown if os.sep in shown else os.path.join(".", shown))
    return f"{shlex.quote(shown_path(sys.executable))} -m diloco"


def command(rest: str) -> str:
    """``program()`` followed by ``rest`` (a sub-command and its arguments, already quoted)."""
    return f"{program()} {rest}"
