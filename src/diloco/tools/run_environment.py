"""What produced a run: package versions, interpreter, platform, seed, command line, commit.

``environment_record`` is what ``environment.json`` in a run folder holds;
``git_commit`` reads (never changes) the checked-out commit. Re-exported by
``diloco.tools.runs``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path

__all__ = ["environment_record", "git_commit"]

_OPTIONAL_PACKAGES = ("numpy", "tqdm", "matplotlib", "mnist1d", "scipy")


def git_commit(directory=None) -> str | None:
    """The commit checked out in ``directory`` (default: where this package lives), or None.

    Read-only (``git rev-parse HEAD``); a ``+dirty`` suffix marks uncommitted changes.
    """
    directory = Path(directory) if directory is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=directory, capture_output=True, text=True,
                                timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=directory,
                               capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not commit:
        return None
    return commit + ("+dirty" if dirty else "")


def environment_record(seed=None, argv=None) -> dict:
    """What produced a run: versions, interpreter, platform, seed, command line, commit."""
    import diloco

    packages = {"diloco": diloco.__version__}
    for name in _OPTIONAL_PACKAGES:
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    return {
        "created": datetime.now().isoformat(timespec="seconds"),
        "seed": seed,
        "argv": list(sys.argv if argv is None else argv),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": packages,
        "git_commit": git_commit(),
    }
