"""Create a learner workspace with nothing installed: ``python3 scripts/create_workspace.py [DIR]``.

``make workspace`` runs this with the machine's ``python3``, so a learner's first ``make
grade`` (inside the workspace, which installs its own small environment) is their only
install. ``diloco workspace create`` needs only the standard library, but ``import
diloco`` imports NumPy (the package's ``__init__`` re-exports the milestones), so this
launcher registers ``src/diloco`` as the ``diloco`` package without running its
``__init__`` and calls the same command (``diloco.tools.workspace.create``): the same
workspace, the same lines printed, the same refusals.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "diloco"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python3 scripts/create_workspace.py [DIR]  (default: workspace)", file=sys.stderr)
        return 2
    package = types.ModuleType("diloco")  # the package without its __init__ (which imports NumPy)
    package.__path__ = [str(PACKAGE)]
    sys.modules.setdefault("diloco", package)
    from diloco.tools.cli.errors import CliError
    from diloco.tools.workspace.create import _cmd_create

    try:
        return _cmd_create(types.SimpleNamespace(directory=argv[0] if argv else "workspace"))
    except CliError as exc:
        print(f"diloco workspace: error: {exc}", file=sys.stderr)
        return exc.status


if __name__ == "__main__":
    raise SystemExit(main())
