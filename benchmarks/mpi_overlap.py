"""Streaming DiLoCo's overlap on real processes: the all-reduce in flight during tau inner steps.

    .venv/bin/python benchmarks/mpi_overlap.py [--delay 0.02] [--tau 4] [--repeats 3]

Runs ``mpiexec -n 2 python -m diloco.tools.cli.mpi`` (the project's MPICH) with Streaming DiLoCo,
``--rounds 10 -H 8 --hidden-sizes 64,64 --fragments 2 --overlap TAU``, twice per repeat,
interleaved: *overlap*, as the executor runs it (each native reduce-scatter posted at its
sync and waited at its merge, ``MPIExecutor.reduce_messages(overlap=True)``), and *waited at
the sync* (``overlap`` ignored, as before). A link delay is injected into every outer-gradient
all-reduce: its reduce-scatter completes no sooner than ``--delay`` seconds after it was
posted (a slow network; on one machine the transfer itself takes microseconds). Prints, per
mode, each repeat's training seconds (the run's ``seconds``: from the first round to the
last) and the seconds every rank spent in collectives (``allreduce_seconds`` summed; rank 0's).
Both modes train the same model (their held-out losses are compared).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLAGS = ("--rounds", "10", "-H", "8", "--hidden-sizes", "64,64", "--fragments", "2", "--seed", "1")


def rank_main(delay: float, mode: str, argv: list) -> int:
    """One rank: the MPI command with the injected delay, and ``overlap`` ignored in mode "sync"."""
    import diloco.core.executors as executors
    import diloco.tools.cli.mpi as backend

    post = executors.MPIExecutor._post_reduce_scatter

    def slow_post(self, *args):
        request, finish, sent, payload = post(self, *args)
        posted = time.perf_counter()

        def slow_finish():
            time.sleep(max(0.0, posted + delay - time.perf_counter()))
            return finish()

        return request, slow_finish, sent, payload

    executors.MPIExecutor._post_reduce_scatter = slow_post
    if mode == "sync":
        reduce = executors.MPIExecutor.reduce_messages
        executors.MPIExecutor.reduce_messages = lambda self, *args, overlap=False: reduce(self, *args)
    return backend.main(argv)


def run(delay: float, tau: int, mode: str, folder: Path, tag: str) -> dict:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    out = folder / f"{tag}.json"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, "--rank", str(delay), mode, *FLAGS,
                    "--overlap", str(tau), "--json", str(out)], check=True, capture_output=True, env=env, timeout=300)
    return json.loads(out.read_text())


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        return rank_main(float(sys.argv[2]), sys.argv[3], sys.argv[4:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.02, help="seconds each all-reduce takes at least (0.02)")
    parser.add_argument("--tau", type=int, default=4, help="--overlap: inner steps between a sync and its merge (4)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = {"overlap": [], "sync": []}
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            for mode in rows:
                rows[mode].append(run(args.delay, args.tau, mode, Path(folder), f"{mode}{repeat}"))
    losses = {mode: [r["eval_loss"] for r in runs[0]["history"]] for mode, runs in rows.items()}
    print(f"Streaming DiLoCo, 2 ranks, {' '.join(FLAGS)} --overlap {args.tau}, {args.delay * 1e3:g} ms injected per "
          f"all-reduce "
          f"(20 all-reduces); same held-out losses: {losses['overlap'] == losses['sync']}")
    for mode, runs in rows.items():
        name = "overlap (waited at the merge)" if mode == "overlap" else "waited at the sync"
        print(f"  {name:30s} training s {[round(r['seconds'], 3) for r in runs]}  collectives s "
              f"{[round(sum(x['allreduce_seconds'] for x in r['history']), 3) for r in runs]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
