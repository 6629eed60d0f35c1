"""What produced a run: package versions, interpreter, platform, seed, command line, commit, code.

``environment_record`` is what ``environment.json`` in a run folder holds;
``git_commit`` reads (never changes) the checked-out commit. ``kernels_record`` names the
BLAS kernel and the NumPy SIMD extensions this CPU got: float32 runs reproduce to the last
digit on the same ones, and only to rounding that training amplifies on others. ``source_record`` is the
code itself: the package version and a SHA-256 over every ``.py`` file of the installed
``diloco`` package (names and bytes), so an editable install with uncommitted changes
gets a new hash where the commit stays the same. ``--resume`` compares it
(``diloco.tools.runs.resume``). ``constraints_record`` names the pinned-versions file at the
project root (``constraints.txt`` and the like) and its hash, when there is one.
Re-exported by ``diloco.tools.runs.folders``.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from datetime import datetime
from importlib import metadata
from pathlib import Path

__all__ = ["environment_record", "git_commit", "source_record", "constraints_record", "kernels_record",
           "CONSTRAINTS_FILES"]

_OPTIONAL_PACKAGES = ("numpy", "tqdm", "matplotlib", "mnist1d", "scipy")

# Pinned-versions files looked for at the project root, in this order.
CONSTRAINTS_FILES = ("constraints.txt", "requirements.lock", "requirements-lock.txt", "uv.lock", "pylock.toml")


def _package_dir() -> Path:
    return Path(__file__).resolve().parents[2]  # src/diloco (an editable install) or site-packages/diloco


def source_record(package_dir=None) -> dict:
    """``{"version", "sha256", "files"}`` of the ``diloco`` source: every ``.py`` under the
    package folder, sorted by path, hashed as path and bytes (``__pycache__`` skipped)."""
    import diloco

    root = Path(package_dir) if package_dir is not None else _package_dir()
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return {"version": diloco.__version__, "sha256": digest.hexdigest(), "files": len(files)}


def constraints_record(project_root=None) -> dict | None:
    """``{"file", "sha256"}`` of the first of ``CONSTRAINTS_FILES`` at the project root, or None.

    The project root is two folders above the package (``src/diloco`` -> the checkout);
    an installed wheel has none there, and gets None.
    """
    root = Path(project_root) if project_root is not None else _package_dir().parents[1]
    for name in CONSTRAINTS_FILES:
        path = root / name
        if path.is_file():
            try:
                return {"file": name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
            except OSError:
                return {"file": name, "sha256": None}
    return None


def kernels_record() -> dict:
    """``{"blas", "numpy_simd"}``: the BLAS each library NumPy loaded runs (threadpoolctl's
    ``internal_api``, ``version`` and ``architecture``; None without threadpoolctl) and the SIMD
    extensions NumPy dispatches to on this CPU.

    OpenBLAS picks its kernels when it loads, by CPU (``architecture``: "SkylakeX" with
    AVX-512, "Haswell" without; ``OPENBLAS_CORETYPE`` overrides it). Two kernels round
    float32 products differently, and training amplifies the difference: Fig. 9's
    transformer runs reproduce to the last bit under the kernel they ran on, and moved by up
    to 1% under the other (docs/results-transformer.md, "Reproducibility").
    """
    import numpy as np

    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        blas = None
    else:
        blas = [{key: info.get(key) for key in ("internal_api", "version", "architecture")}
                for info in threadpool_info() if info.get("user_api") == "blas"]
    try:
        simd = list(np.show_config(mode="dicts")["SIMD Extensions"]["found"])
    except (KeyError, TypeError, ValueError):
        simd = None
    return {"blas": blas, "numpy_simd": simd}


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
        "source": source_record(),
        "constraints": constraints_record(),
        "kernels": kernels_record(),
    }
