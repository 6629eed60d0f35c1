"""Build the Gradescope autograder zip (``make autograder``): ``python scripts/build_autograder.py [ZIP]``.

The zip holds this project's source as its sdist does (``SOURCES``, the list of
``[tool.hatch.build.targets.sdist]`` in pyproject.toml, plus pyproject.toml itself) and,
at its top, ``setup.sh`` and ``run_autograder`` from ``scripts/autograder/``: Gradescope
unpacks it into ``/autograder/source``, runs ``setup.sh`` once and ``run_autograder`` for
each submission (docs/instructor-guide.md, "Gradescope"). Default ZIP: build/autograder.zip.

``--tests DIR`` (``make autograder TESTS=DIR``) adds a hidden suite as ``hidden-tests/``;
``run_autograder`` then grades with it (``diloco grade --tests``), and a failing hidden test
shows only its milestone (``--hidden milestone``, the default with ``--tests``).
"""

from __future__ import annotations

import importlib.util
import io
import sys
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _atomic_files():
    """``diloco.tools.runs.atomic_files`` (standard library only), loaded as a file: no install, no NumPy needed."""
    path = ROOT / "src" / "diloco" / "tools" / "runs" / "atomic_files.py"
    spec = importlib.util.spec_from_file_location("_atomic_files", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

# The sdist's own list (pyproject.toml), read rather than copied, plus pyproject.toml itself.
SOURCES = (*tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
           ["tool"]["hatch"]["build"]["targets"]["sdist"]["include"], "pyproject.toml")
SKIPPED = {"__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints"}
EXECUTABLE = {"setup.sh", "run_autograder"}
HIDDEN = "hidden-tests"  # the folder run_autograder passes to --tests when the zip has it


def _files(root: Path):
    for name in SOURCES:
        path = root / name
        if path.is_file():
            yield path
        else:
            for file in sorted(path.rglob("*")):
                parts = set(file.relative_to(root).parts)
                if file.is_file() and not parts & SKIPPED and file.suffix != ".pyc":
                    yield file


def _add(archive: zipfile.ZipFile, name: str, data: bytes, executable: bool) -> None:
    info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))  # the same bytes from the same tree
    info.external_attr = (0o100755 if executable else 0o100644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, data)


def _hidden_files(tests: Path):
    """The files of a hidden suite, caches left out."""
    for file in sorted(tests.rglob("*")):
        if file.is_file() and not set(file.relative_to(tests).parts) & SKIPPED and file.suffix != ".pyc":
            yield file


def build(destination: Path, root: Path = ROOT, tests: Path | None = None) -> Path:
    """Write the autograder zip of the project at ``root`` to ``destination`` (atomically), with
    the hidden suite ``tests`` as ``hidden-tests/`` when given."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name in sorted(EXECUTABLE):
            _add(archive, name, (root / "scripts" / "autograder" / name).read_bytes(), True)
        for file in _files(root):
            _add(archive, file.relative_to(root).as_posix(), file.read_bytes(), False)
        for file in _hidden_files(tests) if tests is not None else ():
            _add(archive, f"{HIDDEN}/{file.relative_to(tests).as_posix()}", file.read_bytes(), False)
    destination.parent.mkdir(parents=True, exist_ok=True)
    return _atomic_files().atomic_write_bytes(destination, buffer.getvalue())


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="build_autograder.py", description="Build the Gradescope autograder zip.")
    parser.add_argument("zip", nargs="?", default=str(ROOT / "build" / "autograder.zip"))
    parser.add_argument("--tests", metavar="DIR", help="a hidden suite, graded instead of the shipped one")
    args = parser.parse_args(argv)
    tests = Path(args.tests).resolve() if args.tests else None
    if tests is not None and not any(tests.glob("test_*.py")):
        print(f"build_autograder.py: error: --tests: no test_*.py in {tests} (TESTS=DIR)", file=sys.stderr)
        return 2
    out = build(Path(args.zip), tests=tests)
    hidden = f", hidden tests from {tests}" if tests else ""
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB{hidden})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
