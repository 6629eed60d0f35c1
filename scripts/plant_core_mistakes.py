"""Plant realistic mistakes in the training core, one at a time, and show which oracle test catches each.

    .venv/bin/python scripts/plant_core_mistakes.py                  # every mistake
    .venv/bin/python scripts/plant_core_mistakes.py --only merge-off-by-one mix-side

The mistakes are ``tests/tooling/core_mistakes.MISTAKES``. The package and the tests
are copied to a temporary folder; each mistake is a text edit of one file of that copy
(the checkout is never touched), after which the oracle tests
(``tests/tooling/test_oracles.py``) run there without shrinking. The first run, with no
mistake planted, must pass. The script prints one row per mistake (caught by
which tests, or MISSED) and one row per test (how many mistakes it caught), and exits 1
if a mistake is missed or a test catches none.

A mistake whose text is no longer in the core (it was refactored) is reported ``n/a``:
update its ``old`` text to the new code rather than dropping it. Each mistake costs
about 10 s of CPU (the oracle tests, and one real-MPI job).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/tooling/test_oracles.py"
TOOLING = ROOT / "tests" / "tooling"


def run_tests(root: Path, tests: str) -> tuple[bool, set, float]:
    """Run the oracle tests in ``root``: (every test passed, the failed tests' names, CPU seconds)."""
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    command = [sys.executable, "-m", "pytest", tests, "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-n0",
               "--hypothesis-profile=ci-noshrink", "-rfE"]
    begin = os.times()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    end = os.times()
    failed = {re.sub(r"\[.*", "", line.split("::", 1)[1].split(" ")[0])
              for line in done.stdout.splitlines() if line.startswith(("FAILED ", "ERROR ")) and "::" in line}
    if done.returncode not in (0, 1) or (done.returncode == 1 and not failed):
        raise SystemExit(f"plant_core_mistakes: pytest could not run (exit {done.returncode}):\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    return done.returncode == 0, failed, end.children_user + end.children_system - begin.children_user \
        - begin.children_system


def copy_checkout(target: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", ".hypothesis", "*.pyc")
    shutil.copytree(ROOT / "src" / "diloco", target / "src" / "diloco", ignore=ignore)
    shutil.copytree(ROOT / "tests", target / "tests", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")


def plant(root: Path, mistake, tests: str) -> tuple[str, set, float]:
    """Apply ``mistake`` to the copy, run the tests, undo it: (status, catching tests, CPU seconds)."""
    path = root / "src" / "diloco" / mistake.path
    original = path.read_text(encoding="utf-8")
    if original.count(mistake.old) != 1:
        return "n/a", set(), 0.0
    path.write_text(original.replace(mistake.old, mistake.new), encoding="utf-8")
    try:
        passed, failed, seconds = run_tests(root, tests)
    finally:
        path.write_text(original, encoding="utf-8")
    return ("MISSED" if passed else "caught"), failed, seconds


def test_names(root: Path, tests: str) -> list:
    """The tests of ``tests`` that must catch a mistake: all but the strict xfails (a known core bug,
    failing already)."""
    text = (root / tests).read_text(encoding="utf-8")
    known_bugs = set(re.findall(r"^@pytest\.mark\.xfail\(strict=True[^@]*?^def (test_\w+)", text,
                                flags=re.MULTILINE | re.DOTALL))
    return [name for name in re.findall(r"^def (test_\w+)", text, flags=re.MULTILINE) if name not in known_bugs]


def report(rows: list, names: list) -> int:
    """Print the two tables; 1 if a mistake was missed or a test caught none."""
    print("\n| mistake | file | status | caught by | CPU s |\n|---|---|---|---|---|")
    for mistake, status, failed, seconds in rows:
        short = ", ".join(sorted(n.removeprefix("test_") for n in failed)) or "-"
        print(f"| {mistake.name}: {mistake.what} | {mistake.path} | {status} | {short} | {seconds:.1f} |")
    counts = {name: sum(name in failed for _, _, failed, _ in rows) for name in names}
    print("\n| oracle test | mistakes caught |\n|---|---|")
    for name, count in counts.items():
        print(f"| {name} | {count} |")
    caught = sum(status == "caught" for _, status, _, _ in rows)
    print(f"\n{caught} of {len(rows)} mistakes caught; "
          f"{sum(status == 'MISSED' for _, status, _, _ in rows)} missed, "
          f"{sum(status == 'n/a' for _, status, _, _ in rows)} no longer apply")
    return 1 if any(status == "MISSED" for _, status, _, _ in rows) or not all(counts.values()) else 0


def load_mistakes() -> tuple:
    """``tests/tooling/core_mistakes.MISTAKES`` (absent from learner workspaces)."""
    if not (TOOLING / "core_mistakes.py").is_file():
        raise SystemExit("plant_core_mistakes: needs the reference checkout's tests/tooling (absent from learner "
                         "workspaces)")
    sys.path.insert(0, str(TOOLING))
    from core_mistakes import MISTAKES

    return MISTAKES


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the temporary copy is removed
    mistakes = load_mistakes()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="plant only these mistakes")
    parser.add_argument("--tests", default=TESTS, help=f"the tests to run (default {TESTS})")
    args = parser.parse_args(argv)
    known = {m.name for m in mistakes}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        parser.error(f"--only: unknown mistake(s) {unknown}; known: {sorted(known)}")
    chosen = [m for m in mistakes if not args.only or m.name in args.only]
    with tempfile.TemporaryDirectory(prefix="plant-") as folder:
        root = Path(folder)
        copy_checkout(root)
        passed, failed, _ = run_tests(root, args.tests)
        if not passed:
            print(f"plant_core_mistakes: the oracle tests fail with no mistake planted: {sorted(failed)}",
                  file=sys.stderr)
            return 2
        rows = []
        for mistake in chosen:
            start = time.monotonic()
            status, caught, seconds = plant(root, mistake, args.tests)
            rows.append((mistake, status, caught, seconds))
            print(f"{mistake.name}: {status} ({time.monotonic() - start:.0f} s)", flush=True)
        return report(rows, test_names(root, args.tests))


if __name__ == "__main__":
    sys.exit(main())
