"""The fault campaign of issue 31 ("Reliability, round four"), through the command line.

Every case runs ``python -m diloco`` in a fresh folder and is judged on what a user sees and
what the run leaves on disk:

* ``config``: a run on every data set (digits with its own split, MNIST-1D with its own
  sample count, Tiny Shakespeare with its own context, an ``.npz``, the baseline), by
  ``train`` and ``compare``, rerun from its own ``config.json`` with no other flag, must give
  the same history and the same parameter bytes; a misplaced or mistyped key must be refused.
* ``speeds``: asynchronous speeds the schedule cannot serve, refused in one line; the legal
  extremes (equal denormal step times, a thousand workers) are bounded runs.
* ``work``: a run that cannot fit in memory (``-K 1000 -H 1000000`` under a 3 GB address-space
  limit, both engines) refused with the numbers; ``--checkpoint-every`` beyond the run refused;
  ``-H 1000000`` shows its progress within the first round on a terminal, then stops on SIGINT.
* ``divergence``: a non-finite pseudo-gradient under each compression ends "diverged", exit 3,
  naming the round.
* ``api``: ``tests/tooling/test_api_fuzz.py``'s report, which must hold no silent case.

A refusal is exit status 2, one line on standard error, no traceback and no run folder left.
Usage (about five minutes on an idle 2-core machine)::

    .venv/bin/python scripts/fault_campaign.py [--json results.json] [--only CLASS]
"""

from __future__ import annotations

import argparse
import collections
import fcntl
import json
import os
import pty
import re
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--rounds", "2", "-H", "3", "-K", "2", "--hidden-sizes", "8", "--batch-size", "8", "-q", "--no-plots"]
BLOW_UP = ["--lr", "1e200", "--weight-decay", "0", "--max-loss", "off"]
LIMIT_SECONDS = 300.0  # --timeout: the longest any one command may take


def diloco(argv, cwd: Path, *, timeout: float = 300, limit_bytes: int | None = None):
    """``(exit status, stderr)`` of ``python -m diloco ARGV`` run in ``cwd``."""
    cwd.mkdir(parents=True, exist_ok=True)

    def limited():
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, resource.getrlimit(resource.RLIMIT_AS)[1]))

    timeout = min(timeout, LIMIT_SECONDS)
    try:
        done = subprocess.run([sys.executable, "-m", "diloco", *map(str, argv)], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout, preexec_fn=limited if limit_bytes else None)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:g} s"
    return done.returncode, done.stderr


def runs_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def refused(status, err, runs: Path, *words) -> str:
    lines = err.strip().splitlines()
    ok = status == 2 and len(lines) == 1 and "Traceback" not in err and not runs_in(runs)
    ok = ok and all(word in err for word in words)
    return "refused" if ok else f"FAIL: exit {status}, {err.strip()[:300]!r}"


def _history(run_dir: Path) -> list:
    lines = (run_dir / "history.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "time"} for line in lines]


def _params(run_dir: Path) -> dict:
    out = {}
    for path in sorted(run_dir.glob("params-*.npz")):
        with np.load(path) as arrays:
            out[path.name] = {k: arrays[k].tobytes() for k in arrays.files}
    return out


# --- the classes ---------------------------------------------------------------------------------

def config_cases(work: Path):
    work.mkdir(parents=True, exist_ok=True)
    npz = work / "blobs.npz"
    rng = np.random.default_rng(5)
    np.savez(npz, x=rng.normal(size=(60, 6)), y=np.arange(60) % 3)
    cache = ["--cache-dir", work / "cache"]
    rows = {"digits": ["--split-seed", "3", "--test-fraction", "0.3", "--comm-dtype", "int8"],
            "mnist1d": ["--data", "mnist1d", "--num-samples", "300"],
            "shakespeare": ["--data", "shakespeare", "--context", "3", "--eval-windows", "64"],
            "npz": ["--data", npz, "--split-seed", "2", "--test-fraction", "0.25"],
            "sync": ["--algo", "sync", "--data", "shakespeare", "--context", "2", "--eval-windows", "32"]}
    for name, flags in rows.items():
        for command in ("train", "compare"):
            if command == "compare" and name == "sync":
                continue
            case = work / f"config-{command}-{name}"
            status, err = diloco([command, *TINY, *flags, *cache, "--checkpoint-every", "2", "--runs-dir", "a"],
                                 case)
            if status != 0:
                yield f"{command} {name}", f"FAIL: first run exit {status}: {err.strip()[:200]}"
                continue
            first = runs_in(case / "a")[0]
            status, err = diloco([command, "--config", first / "config.json", *cache, "-q", "--no-plots",
                                  "--runs-dir", "b"], case)
            if status != 0:
                yield f"{command} {name}", f"FAIL: rerun exit {status}: {err.strip()[:200]}"
                continue
            second = runs_in(case / "b")[0]
            same = _history(first) == _history(second) and _params(first) == _params(second)
            yield f"{command} {name} from its config.json", "identical" if same else "FAIL: differs"
    base = work / "config-base"
    diloco(["train", *TINY, "--runs-dir", "a"], base)
    saved = json.loads((runs_in(base / "a")[0] / "config.json").read_text())
    edits = {"a \"family\" section at the top level": ("family", lambda s: s.update(family={"comm_dtype": "fp4"})),
             "a typo at the top level": ("seeed", lambda s: s.update(seeed=3)),
             "a typo in \"data\"": ("contxt", lambda s: s["data"].update(contxt=4)),
             "an edited data size": ("data.num_train", lambda s: s["data"].update(num_train=10))}
    for label, (word, edit) in edits.items():
        changed = json.loads(json.dumps(saved))
        edit(changed)
        path = base / f"{word}.json"
        path.write_text(json.dumps(changed))
        status, err = diloco(["train", "--config", path, "-q", "--no-plots", "--runs-dir", "b"], base)
        yield f"config.json with {label}", refused(status, err, base / "b", word)


def speed_cases(work: Path):
    cases = {"--async --step-times 1,1e9": ["--async", "--step-times", "1,1e9"],
             "--step-times 1e308,1e308": ["--step-times", "1e308,1e308"],
             "--async --step-times 1e308,1e308": ["--async", "--step-times", "1e308,1e308"],
             "--async -K 8 --speed-spread 1000": ["--async", "-K", "8", "--speed-spread", "1000"],
             "--async --step-times 5e-324,1": ["--async", "--step-times", "5e-324,1"]}
    for label, flags in cases.items():
        case = work / f"speeds-{len(label)}-{abs(hash(label)) % 10**6}"
        start = time.monotonic()
        status, err = diloco(["train", *TINY, *flags, "--runs-dir", "r"], case, timeout=60)
        verdict = refused(status, err, case / "r", "--step-times")
        yield label, f"{verdict} in {time.monotonic() - start:.1f} s" if verdict == "refused" else verdict
    bounded = {"--async --step-times 5e-324,5e-324": ["--async", "--step-times", "5e-324,5e-324"],
               "-K 1000 --async -H 1": ["--async", "-K", "1000", "-H", "1", "--batch-size", "1"]}
    for label, flags in bounded.items():
        case = work / f"bounded-{abs(hash(label)) % 10**6}"
        start = time.monotonic()
        status, err = diloco(["train", *TINY, *flags, "--runs-dir", "r"], case, timeout=300)
        took = time.monotonic() - start
        yield label, f"bounded run in {took:.0f} s" if status == 0 else f"FAIL: exit {status}: {err.strip()[:200]}"


def _on_a_terminal(argv, cwd: Path, seconds: float) -> tuple[int, str]:
    """Run ``diloco ARGV`` on a pseudo-terminal for ``seconds``, then SIGINT; (exit status, output)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        time.sleep(0.2)  # the parent sets the window size first (a 0-column terminal hides the bar)
        os.execv(sys.executable, [sys.executable, "-m", "diloco", *map(str, argv)])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    out, deadline, stopped = [], time.monotonic() + seconds, False
    while True:
        if not stopped and time.monotonic() > deadline:
            os.kill(pid, signal.SIGINT)
            stopped = True
        elif stopped and time.monotonic() > deadline + 30:  # SIGINT did not stop it
            os.kill(pid, signal.SIGKILL)
        if not select.select([fd], [], [], 0.5)[0]:  # silent: look at the clock again
            continue
        try:
            ready = os.read(fd, 65536)
        except OSError:
            break
        if not ready:
            break
        out.append(ready)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(out).decode(errors="replace")


def work_cases(work: Path):
    for engine in ("reference", "fast"):
        case = work / f"work-memory-{engine}"
        status, err = diloco(["train", "-K", "1000", "-H", "1000000", "--engine", engine, "-q", "--no-plots",
                              "--runs-dir", "r"], case, limit_bytes=3 * 10**9, timeout=120)
        yield f"-K 1000 -H 1000000 --engine {engine} under a 3 GB limit", refused(status, err, case / "r",
                                                                                  "GB of memory", "available")
    case = work / "work-checkpoint"
    status, err = diloco(["train", *TINY, "--checkpoint-every", str(10**9), "--runs-dir", "r"], case)
    yield "--checkpoint-every 10**9", refused(status, err, case / "r", "--checkpoint-every")
    case = work / "work-progress"
    case.mkdir(parents=True, exist_ok=True)
    status, output = _on_a_terminal(["train", "-K", "2", "-H", "1000000", "--hidden-sizes", "8", "--no-plots",
                                     "--runs-dir", "r"], case, seconds=20)
    shown = re.findall(r"round 1: ([\d,]+)/2,000,000 worker steps", output)
    summary = json.loads((runs_in(case / "r")[0] / "summary.json").read_text()) if runs_in(case / "r") else {}
    ok = len(shown) >= 3 and status == 130 and summary.get("status") == "interrupted"
    yield "-H 1000000 on a terminal for 20 s, then SIGINT", (
        f"progress within round 1 ({len(shown)} updates, last {shown[-1]} steps), interrupted" if ok
        else f"FAIL: exit {status}, {len(shown)} updates, status {summary.get('status')}")


def divergence_cases(work: Path):
    rows = {"fp4": ["--comm-dtype", "fp4"], "int8": ["--comm-dtype", "int8"], "float16": ["--comm-dtype", "float16"],
            "eager": ["--eager"], "int8 + sign pruning": ["--comm-dtype", "int8", "--sign-prune", "0.5"],
            "top-k": ["--topk", "0.1"], "int8 + error feedback": ["--comm-dtype", "int8", "--error-feedback"],
            "fp4 on the fast engine": ["--comm-dtype", "fp4", "--engine", "fast"]}
    for command in ("train", "compare"):
        for label, flags in rows.items():
            if command == "compare" and label not in ("fp4", "eager"):
                continue
            case = work / f"diverge-{command}-{abs(hash(label)) % 10**6}"
            status, err = diloco([command, *TINY, *flags, *BLOW_UP, "--runs-dir", "r"], case)
            found = runs_in(case / "r")
            summary = json.loads((found[0] / "summary.json").read_text()) if found else {}
            ok = (status == 3 and len(err.strip().splitlines()) == 1 and "diverged in round" in err
                  and summary.get("status") == "diverged" and summary.get("divergence", {}).get("round"))
            yield f"{command} {label} --lr 1e200", (f"diverged in round {summary['divergence']['round']}, exit 3"
                                                     if ok else f"FAIL: exit {status}, {err.strip()[:200]!r}")


def api_cases(work: Path):
    env = {**os.environ, "DILOCO_FUZZ_REPORT": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "tests/tooling/test_api_fuzz.py", "-q", "-s", "-n0",
                           "-p", "no:randomly", "-p", "no:cacheprovider"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    report = re.search(r"api fuzz: (\d+) cases: (.*)", done.stdout)
    ok = done.returncode == 0 and report and "silent" not in report.group(2) and "unclear" not in report.group(2)
    yield "tests/tooling/test_api_fuzz.py", (f"{report.group(1)} cases: {report.group(2)}" if ok
                                             else f"FAIL: exit {done.returncode}: {done.stdout[-300:]}")


CLASSES = {"config": config_cases, "speeds": speed_cases, "work": work_cases, "divergence": divergence_cases,
           "api": api_cases}


def main(argv=None) -> int:
    global LIMIT_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="also write the outcomes as JSON")
    parser.add_argument("--only", choices=sorted(CLASSES), action="append", help="run only these classes")
    parser.add_argument("--timeout", type=float, default=LIMIT_SECONDS,
                        help=f"seconds any one command may take before it counts as a hang ({LIMIT_SECONDS:g})")
    args = parser.parse_args(argv)
    LIMIT_SECONDS = args.timeout
    outcomes, counts = [], collections.Counter()
    with tempfile.TemporaryDirectory(prefix="diloco-campaign-") as folder:
        for name, cases in CLASSES.items():
            if args.only and name not in args.only:
                continue
            for label, verdict in cases(Path(folder) / name):
                passed = not verdict.startswith("FAIL")
                counts[name, passed] += 1
                outcomes.append({"class": name, "case": label, "outcome": verdict, "passed": passed})
                print(f"{name:<10} {'ok  ' if passed else 'FAIL'} {label}: {verdict}", flush=True)
    print("\n| class | cases | as required |\n|---|---|---|")
    for name in CLASSES:
        total = counts[name, True] + counts[name, False]
        if total:
            print(f"| {name} | {total} | {counts[name, True]} |")
    if args.json:
        Path(args.json).write_text(json.dumps(outcomes, indent=2) + "\n")
    return 0 if not any(passed is False for (_, passed), n in counts.items() if n) else 1


if __name__ == "__main__":
    raise SystemExit(main())
