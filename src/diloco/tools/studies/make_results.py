"""``make results``: every study of the two results pages at its documented size, then the pages.

``JOBS`` lists the commands, in the order they are started: each is a ``diloco study``
command line exactly as ``docs/results.md`` and ``docs/results-family.md`` show it beside
its table (``tests/tooling/test_results_page.py`` checks that they agree). Up to
``--jobs`` (2) commands run at once, as separate processes with one BLAS thread each; the
paper studies share ``build/results-cache`` (``run_cache.RunCache``), so a run that two
studies need is trained once. Each command's output goes to ``build/results-logs/``.
Afterwards both pages are rendered again from ``docs/assets/results/``
(``diloco.tools.studies.results_page``), each headline claim's plot against tokens is drawn
again (``diloco.tools.studies.claim_curves``, the tier's claims), and the wall time of every
command and of the whole run is written to ``docs/assets/results/make-results.json``, which
the pages' compute tables quote.

``--tier transformer`` (``make results-transformer``) runs ``TRANSFORMER_JOBS`` instead: the
same paper studies on the transformer language model (``TRANSFORMER``: its scale, chosen so
the tier learns beyond the n-grams and finishes within three hours on two cores
from an empty cache), exported to
``docs/assets/results/transformer/`` with its own ``make-results.json``, for
``docs/results-transformer.md``.

``--minutes M`` runs a piece: after M minutes nothing more starts and the running studies get
SIGINT, so each keeps its finished runs in the run cache; the record notes them as stopped and the
pages are not rendered (exit 3). The same command again goes on from the cache, and the record's
seconds add up over the pieces (``unfinished_run``, then ``last_run`` with its ``pieces``).

``python -m diloco.tools.studies.make_results [--tier mlp|transformer] [--jobs N] [--only NAME,...]
[--minutes M] [--dry-run]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

__all__ = ["Job", "JOBS", "TRANSFORMER_JOBS", "TIERS", "command_of", "main"]

EXPORT = "docs/assets/results"
CACHE = "build/results-cache"
LOGS = "build/results-logs"
TEXT = f"--data shakespeare --eval-windows 2048 --run-cache {CACHE} --export {EXPORT}"
DIGITS1D = f"--data mnist1d --num-samples 50000 --run-cache {CACHE} --export {EXPORT}"


class Job(NamedTuple):
    """One command: its name (``<study>-<task>``), what follows ``diloco study``, and the page."""

    name: str
    args: str
    page: str = "docs/results.md"


def _paper(study: str, task: str, seeds: int = 5, extra: str = "") -> Job:
    data = TEXT if task == "shakespeare" else DIGITS1D
    data = data.replace("--data shakespeare ", "").replace("--data mnist1d ", "")
    return Job(f"{study}-{task}", f"{study} --data {task} --seeds {seeds}{' ' + extra if extra else ''} {data}")


FAMILY = "--export docs/assets/results"

# Started in this order, two at a time: the longest char-LM study first, the MNIST-1D studies
# beside it, the char-LM studies that reuse its runs after it.
JOBS = (
    _paper("table2", "shakespeare"),
    _paper("table2", "mnist1d"),
    _paper("fig9", "mnist1d"),
    _paper("fig8", "mnist1d"),
    _paper("table3", "mnist1d"),
    _paper("fig4", "mnist1d"),
    _paper("fig6", "mnist1d"),
    _paper("splits", "mnist1d", 3),
    Job("family-compression", f"compression --seeds 5 --rounds 24 {FAMILY}", "docs/results-family.md"),
    Job("family-streaming", f"streaming --seeds 5 --rounds 24 {FAMILY}", "docs/results-family.md"),
    Job("family-bandwidth", f"bandwidth --seeds 5 --rounds 24 {FAMILY}", "docs/results-family.md"),
    _paper("fig9", "shakespeare"),
    _paper("fig8", "shakespeare"),
    _paper("table3", "shakespeare"),
    _paper("fig4", "shakespeare"),
    _paper("fig6", "shakespeare"),
    _paper("splits", "shakespeare", 3),
    _paper("scaling", "shakespeare", 3, "--total-steps 2000"),
)


# The transformer tier's scale (issue 38: a model that learns language): the default model
# (2 blocks, d = 64, 4 heads, context 64, 108,352 parameters) on the fast engine, K = 4 workers,
# H = 20, 100 outer steps, batch 16 windows (1,024 predicted characters a worker-step): 2,000
# steps and 2.0M characters per worker, 8.2M for a DiLoCo run (8 passes over the training
# text); evaluated on 1,024 held-out windows (65,536 predicted characters). Tuning is cut in
# breadth, never in tokens: the inner lr over 3e-3 and 1e-2 (extended one step past a chosen
# edge: 1e-3 or 3e-2), the outer lr x momentum over 0.7, 1 x 0.5, 0.9 (likewise), on seed 1000,
# which is never evaluated. A pilot (seed 0, untuned) put the 1-worker baseline at 1.878 nats.
TRANSFORMER_EXPORT = f"{EXPORT}/transformer"
TRANSFORMER = (f"--data shakespeare --model transformer --engine fast -K 4 -H 20 --total-steps 2000 "
               f"--batch-size 16 --lr 3e-3 --inner-grid 3e-3,1e-2 --outer-grid 0.7,1:0.5,0.9 --eval-windows 1024 "
               f"--run-cache {CACHE} --export {TRANSFORMER_EXPORT}")
TRANSFORMER_PAGE = "docs/results-transformer.md"


def _transformer(study: str, extra: str = "") -> Job:
    return Job(f"{study}-transformer", f"{study} --seeds 5{' ' + extra if extra else ''} {TRANSFORMER}",
               TRANSFORMER_PAGE)


# Two at a time. Every study tunes DiLoCo at K = 4 (or an arm that table2 has), so the two commands
# running share those runs through the run cache's claims (``RunCache.claim``: one trains, the other
# waits for it): table2 first, inner-muon beside it (its AdamW arms are table2's DiLoCo and 4x batch,
# tuned in another order, then its Muon arms), then fig9, Streaming and the splits (whose IID arm is
# table2's DiLoCo arm).
TRANSFORMER_JOBS = (
    _transformer("table2"),
    _transformer("inner-muon"),
    _transformer("fig9"),
    _transformer("fragments", "--values 2"),
    _transformer("splits", "--values 0.1"),
)
TIERS = {"mlp": (JOBS, EXPORT), "transformer": (TRANSFORMER_JOBS, TRANSFORMER_EXPORT)}


def command_of(job: Job) -> str:
    """The command line the pages show: ``.venv/bin/diloco study ...``."""
    return f".venv/bin/diloco study {job.args}"


def _run(job: Job, logs: Path, env: dict) -> tuple:
    """Start ``job`` (quiet: no progress bars); ``(process, its open log file)``."""
    argv = [sys.executable, "-m", "diloco", "study", *job.args.split(), "-q"]
    log = open(logs / f"{job.name}.log", "w", encoding="utf-8")  # noqa: SIM115 - closed when the job ends
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log


def _stop(signum, frame):
    raise SystemExit(143)


STOPPED = "stopped at the time budget"
POLL_SECONDS = 2.0


def _loop(pending: list, running: dict, parallel: int, logs: Path, env: dict, record: dict,
          deadline: float | None = None) -> None:
    """Start ``pending`` jobs, ``parallel`` at a time, until all have finished; note each in ``record``.
    Past ``deadline`` (``--minutes``) nothing more starts, and the running commands get SIGINT: a study
    keeps its finished runs in the run cache, so running the same command again goes on from there."""
    stopping = False
    while pending or running:
        while pending and len(running) < parallel and not stopping:
            job = pending.pop(0)
            process, log = _run(job, logs, env)
            running[job.name] = (job, process, log, time.time())
            print(f"[{time.strftime('%H:%M:%S')}] started {job.name}", flush=True)
        if not running:
            return
        time.sleep(POLL_SECONDS)
        if deadline is not None and not stopping and time.time() >= deadline:
            stopping = True
            for _job, process, _log, _start in running.values():
                process.send_signal(signal.SIGINT)
        for name in [n for n, (_j, process, _l, _s) in running.items() if process.poll() is not None]:
            _ended(record, *running.pop(name), stopping)


def _ended(record: dict, job: Job, process, log, start: float, stopping: bool) -> None:
    """Note a finished command: its status and its seconds, added to the seconds of the pieces of it
    that an earlier ``--minutes`` stopped."""
    log.close()
    earlier = record["jobs"].get(job.name, {})
    seconds = time.time() - start + (earlier.get("seconds", 0.0) if earlier.get("status") == STOPPED else 0.0)
    if process.returncode == 0:
        status = "ok"
    else:
        status = STOPPED if stopping else f"failed ({process.returncode})"
    record["jobs"][job.name] = {"command": command_of(job), "seconds": round(seconds, 1), "status": status}
    print(f"[{time.strftime('%H:%M:%S')}] {job.name}: {status} in {seconds / 60:.1f} min", flush=True)


def _merged(record_path: Path, record: dict, jobs: list) -> dict:
    """``record`` as written now: the file read again and only this run's jobs (and whole-run line)
    replaced, so two pieces run side by side (``--only``) keep each other's entries."""
    current = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else {"jobs": {}}
    names = {job.name for job in jobs}
    current["jobs"] = {**current.get("jobs", {}), **{n: r for n, r in record["jobs"].items() if n in names}}
    for key in ("last_run", "unfinished_run"):  # None: the key goes
        if key in record:
            current[key] = record[key]
            if record[key] is None:
                del current[key]
    return current


def _arguments(argv):
    parser = argparse.ArgumentParser(prog="python -m diloco.tools.studies.make_results",
                                     description="run every study of docs/results*.md, then render the pages")
    parser.add_argument("--tier", choices=sorted(TIERS), default="mlp",
                        help="mlp: docs/results.md and results-family.md (default); transformer: "
                             "docs/results-transformer.md")
    parser.add_argument("--jobs", type=int, default=2, help="commands run at once (2)")
    parser.add_argument("--only", help="comma-separated job names (default: all)")
    parser.add_argument("--minutes", type=float,
                        help="a piece: stop after this many minutes, keeping every finished run in the cache; "
                             "the same command again goes on from there (exit 3 until all is done)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands and stop")
    return parser.parse_args(argv)


def _jobs(args) -> list | str:
    """The jobs to run, or the one-line error."""
    if args.jobs < 1:
        return "--jobs must be at least 1"
    if args.minutes is not None and not args.minutes > 0:
        return f"--minutes must be a positive number of minutes, got {args.minutes}"
    tier = TIERS[args.tier][0]
    if not args.only:
        return list(tier)
    names = args.only.split(",")
    unknown = sorted(set(names) - {j.name for j in tier})
    if unknown:
        return f"unknown job(s) {unknown}; known: {[j.name for j in tier]}"
    return [j for j in tier if j.name in names]


def _whole_run(record: dict, jobs: list, tier: tuple, parallel: int, seconds: float, done: bool) -> None:
    """The whole-run line (all of the tier's jobs): ``last_run`` once every piece has finished, its
    seconds summed over the pieces; ``unfinished_run`` in between. A run of some jobs keeps both."""
    if {j.name for j in jobs} != {j.name for j in tier}:
        return
    earlier = record.get("unfinished_run") or {"seconds": 0.0, "pieces": 0}
    so_far = {"seconds": round(earlier["seconds"] + seconds, 1), "pieces": earlier["pieces"] + 1}
    if not done:
        record["unfinished_run"] = so_far
        return
    record.update(unfinished_run=None, last_run={
        "jobs": [j.name for j in jobs], "parallel": parallel, **so_far,
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())})


def main(argv=None) -> int:
    args = _arguments(argv)
    jobs = _jobs(args)
    if isinstance(jobs, str):
        print(f"make_results: {jobs}", file=sys.stderr)
        return 2
    if args.dry_run:
        for job in jobs:
            print(command_of(job))
        return 0
    tier, export = TIERS[args.tier]
    logs = Path(LOGS)
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    record_path = Path(export) / "make-results.json"
    record = json.loads(record_path.read_text(encoding="utf-8")) if record_path.is_file() else {"jobs": {}}
    started, pending, running = time.time(), list(jobs), {}
    deadline = None if args.minutes is None else started + 60 * args.minutes
    signal.signal(signal.SIGTERM, _stop)
    try:
        _loop(pending, running, args.jobs, logs, env, record, deadline)
    finally:
        for _job, process, log, _ in running.values():  # stopped early: stop the commands too
            process.terminate()
            log.close()
    total = time.time() - started
    unfinished = [j.name for j in jobs if record["jobs"].get(j.name, {}).get("status") == STOPPED or j in pending]
    _whole_run(record, jobs, tier, args.jobs, total, done=not unfinished)
    return _finish(args, record_path, record, jobs, total, unfinished)


def _finish(args, record_path: Path, record: dict, jobs: list, total: float, unfinished: list) -> int:
    """Write the record; render the pages and plots unless a piece left jobs unfinished."""
    from diloco.tools.runs.atomic_files import write_json
    from diloco.tools.studies import claim_curves, results_page

    write_json(record_path, _merged(record_path, record, jobs))
    if unfinished:
        print(f"make results: stopped after {total / 60:.1f} min (--minutes {args.minutes:g}); unfinished: "
              f"{unfinished}; their finished runs are in {CACHE}: run the same command again to go on")
        return 3
    tier, export = TIERS[args.tier]
    claim_curves.main([export, "--tier", args.tier])  # one plot per headline claim, against tokens, seed bands
    for page in sorted({j.page for j in tier}):
        results_page.main([page, export])
    failed = [n for n, r in record["jobs"].items() if n in {j.name for j in jobs} and r["status"] != "ok"]
    print(f"make results: {len(jobs)} commands in {total / 60:.1f} min"
          + (f"; failed: {failed} (see {LOGS}/)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
