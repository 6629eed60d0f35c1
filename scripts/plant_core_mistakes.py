"""Plant realistic mistakes in the training core, one at a time, and show which oracle test catches each.

    .venv/bin/python scripts/plant_core_mistakes.py                  # every mistake
    .venv/bin/python scripts/plant_core_mistakes.py --only merge-off-by-one mix-side

The package and the tests are copied to a temporary folder; each mistake is a text
edit of one file of that copy (the checkout is never touched), after which the oracle
tests (``tests/tooling/test_oracles.py``) run there without shrinking. The first run,
with no mistake planted, must pass. The script prints one row per mistake (caught by
which tests, or MISSED) and one row per test (how many mistakes it caught), and exits 1
if a mistake is missed or a test catches none.

A mistake whose text is no longer in the core (it was refactored) is reported ``n/a``:
update its ``old`` text to the new code rather than dropping it.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
TESTS = "tests/tooling/test_oracles.py"


class Mistake(NamedTuple):
    name: str
    path: str  # inside src/diloco
    old: str
    new: str
    what: str


MISTAKES = (
    Mistake("merge-off-by-one", "core/schedule.py", "+ h + tau\n", "+ h + tau + 1\n",
            "a received fragment is merged one step late"),
    Mistake("merge-stops-before-syncs", "core/driver.py",
            "        h = inner_steps if asynchronous else 0\n"
            "        while h < inner_steps:  # the next stop is taken after each one, so a merge due in this round "
            "is a stop\n"
            "            stops = event_steps(plan, [item[0] for item in pending], round_index, inner_steps)\n"
            "            h = min([s for s in stops if s > done] + [inner_steps])\n",
            "        stops = event_steps(plan, [item[0] for item in pending], round_index, inner_steps)\n"
            "        for h in [] if asynchronous else sorted(set(stops) | {inner_steps}):\n",
            "the round's stops are taken before its syncs add their merges (the bug f050480 fixed)"),
    Mistake("mix-side", "core/sync.py", "mix * value + (1.0 - mix) * local[key]",
            "(1.0 - mix) * value + mix * local[key]", "mix weights the local side instead of the received one"),
    Mistake("first-fragment-offset", "core/schedule.py", "SyncEvent(offset if offset > 0 else inner_steps, p,",
            "SyncEvent(max(offset, 1), p,", "fragment 0 syncs after step 1 (offset 0 read as step 1, not H)"),
    Mistake("offsets-rounded", "core/schedule.py", "[(p * inner_steps) // fragments for p in range(fragments)]",
            "[round(p * inner_steps / fragments) for p in range(fragments)]",
            "t_p = round(pH/P) instead of floor(pH/P)"),
    Mistake("drop-rule-swapped", "core/sync.py", 'return tuple(arriving) if drop_rule == "restart"',
            'return tuple(arriving) if drop_rule == "carry"', "carry and restart swapped"),
    Mistake("all-dropped-steps", "core/sync.py",
            "        received = {key: value.copy() for key, value in sub_global.items()}\n"
            "        same = copy_outer_state(outer_state) if isinstance(outer_state, OuterState) else outer_state\n",
            "        received, same = outer_optimizer(config).update(sub_global, delta, outer_state, config)\n",
            "a round with every worker dropped still takes an outer step (on a zero gradient)"),
    Mistake("absent-residuals-lost", "core/sync.py", "new_residuals = {**residuals, **ex.residuals}",
            "new_residuals = dict(ex.residuals)", "a dropped worker's error-feedback residual is forgotten"),
    Mistake("dense-weights-ignored", "core/comm.py",
            "        w = None if weights is None else [weights[k] for k in order]\n        items = ",
            "        w = None\n        items = ", "shard-size weights ignored in the dense all-reduce"),
    Mistake("topk-weights-ignored", "core/comm.py",
            "delta = average_params(decoded, None if weights is None else [weights[k] for k in order])",
            "delta = average_params(decoded)", "shard-size weights ignored under top-k"),
    Mistake("topk-bytes", "core/comm.py", "float((len(order) - 1) * mean_message)", "float(len(order) * mean_message)",
            "the all-gather counted as K messages instead of K - 1"),
    Mistake("topk-ties-late", "methods/sparse.py", 'np.argsort(-np.abs(rows), axis=1, kind="stable")[:, :counts[0]]',
            'np.argsort(np.abs(rows), axis=1, kind="stable")[:, ::-1][:, :counts[0]]',
            "top-k ties go to the later index"),
    Mistake("topk-floor", "methods/sparse.py", "math.ceil(round(config.density * n, 9))", "int(config.density * n)",
            "k per chunk rounded down"),
    Mistake("decay-on-delta", "methods/sparse.py", "config.decay * old + value", "config.decay * (old + value)",
            "the error-feedback decay also scales the fresh outer gradient"),
    Mistake("eager-own-previous", "core/sync.py",
            "others = subtract_params(global_previous, scale_params(local_previous, share))",
            "others = global_previous", "eager: the others' previous average keeps the worker's own share"),
    Mistake("eager-consensus-unweighted", "core/sync.py",
            "return average_params([everyone[k] for k in sorted(everyone)], weights)",
            "return average_params([everyone[k] for k in sorted(everyone)])",
            "eager: the evaluated consensus ignores shard weights"),
    Mistake("group-count-ignored", "methods/asynchrony.py", "(count * delta[k] / period)", "(delta[k] / period)",
            "delayed Nesterov: a group of g arrivals moves the model as one arrival"),
    Mistake("pending-unweighted", "methods/asynchrony.py",
            "average_params([d for _, d in pending], [c for c, _ in pending])",
            "average_params([d for _, d in pending])", "delayed Nesterov: pending groups averaged, not by count"),
    Mistake("ties-not-grouped", "core/schedule.py", "while j < n and arrivals.time[j] == arrivals.time[i]:",
            "while j < n and j == i:", "simultaneous arrivals applied one by one, not as one group"),
    Mistake("non-arrivals-kept", "core/sync.py", "kept = [k for k in arriving if k not in dropped]",
            "kept = [k for k in range(num_workers) if k not in dropped]",
            "a group's average includes workers that did not arrive"),
    Mistake("version-per-group", "core/driver.py", "version += len(group.workers)", "version += 1",
            "staleness counts groups, not arrivals"),
    Mistake("start-version", "methods/asynchrony.py", "(restart + float(duration[k]), k, applied))",
            "(restart + float(duration[k]), k, applied - len(group)))",
            "a restarted worker's version omits its own group"),
    Mistake("dylu-ceil", "methods/asynchrony.py", "np.floor(inner_steps * ratio + 1e-9)",
            "np.ceil(inner_steps * ratio - 1e-9)", "dynamic local steps rounded up"),
    Mistake("streaming-dropped-repeats", "core/driver.py",
            'record["dropped_workers"] = sorted(set(dropped)) if len(plan) > 1 else dropped',
            'record["dropped_workers"] = dropped', "Streaming: a worker dropped by two fragments is listed twice"),
)


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


def plant(root: Path, mistake: Mistake, tests: str) -> tuple[str, set, float]:
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="plant only these mistakes")
    parser.add_argument("--tests", default=TESTS, help=f"the tests to run (default {TESTS})")
    args = parser.parse_args(argv)
    known = {m.name for m in MISTAKES}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        parser.error(f"--only: unknown mistake(s) {unknown}; known: {sorted(known)}")
    chosen = [m for m in MISTAKES if not args.only or m.name in args.only]
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
