"""``make bench``: the speed of the reference path, the fast engine and PyTorch, side by side.

    .venv/bin/python benchmarks/bench.py [--repeats 5] [--out benchmarks/results.md]
    .venv/bin/python benchmarks/bench.py --only fixed-cost   # one section, rewritten in place (minutes)

Every measurement runs in a fresh process (``_case.py``), so its peak memory is its own;
the repeats are interleaved (repeat 1 of every case, then repeat 2, ...) so a burst of
load from elsewhere hits all cases alike, and the tables give medians. Compared:

* ``reference@main``: the milestone path at commit e7f3c6c, before "checks once per call
  tree" (its ``src/`` is extracted with ``git archive`` and put first on ``PYTHONPATH``);
* ``reference``: the milestone path of this checkout (``diloco.train_diloco``);
* ``fast``: ``diloco.engine`` (``DiLoCoConfig.engine = "fast"``) with its AdamW as the numba
  loop (the ``fast`` extra, ``DILOCO_ADAMW_KERNEL=numba``: the kernel a long run ends on);
* ``fast-numpy``: the same with AdamW as NumPy passes (``DILOCO_ADAMW_KERNEL=numpy``: the
  kernel without the extra, and of a process's first 2**28 values);
* ``torch-foreach`` / ``torch-fused``: PyTorch eager with AdamW(foreach / fused), when
  ``torch`` is importable (the ``bench`` extra, which ``make bench`` installs; never needed by the core);
* the single-thread matmul peak of the same NumPy.

One BLAS thread everywhere unless a table says otherwise (the thread policy is measured
in its own section). Every case records the one-minute load average at its start and end,
and the report prints it beside each figure: the machine is often shared, and a figure
taken under load is marked as such, never passed off as an idle one. Speed is reported
here, never asserted in tests.

The char-LM workload and one whole study: ``charlm.py``; CPU per worker-step on K = 4 MPI
processes against both engines: ``mpi_step.py``; the transformer's worker-step against PyTorch:
``transformer_step.py``; ``make test`` and ``make test-all``: ``suite.py`` (``EXTRA_WORKLOADS`` below).
``--only NAME`` (``make bench-transformer``; ``--only suite`` for the test suite's time)
remeasures one of them alone and puts its section and target row into the existing report in place.

``--only fixed-cost`` measures only the fast engine's fixed cost beside its steady state (the
char-LM training cases) and the 10-round char-LM ``compare`` on each engine
(``charlm.measure_fixed_cost``), and rewrites that section of ``--out`` in place, the rest
of the report as it was: a few minutes instead of the full run's 20-30.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import charlm  # noqa: E402
import layout_grid  # noqa: E402
import mpi_step  # noqa: E402
import suite  # noqa: E402
import transformer_step  # noqa: E402
from report import EXTRA_SECTIONS, IDLE_LOAD, write_fixed_cost, write_report  # noqa: E402
from workloads import MODELS  # noqa: E402

MAIN_COMMIT = "e7f3c6c"
IMPLS = ("reference@main", "reference", "fast", "fast-numpy", "torch-foreach", "torch-fused")
# DILOCO_ADAMW_KERNEL of each fast case
KERNEL_OF = {"fast": "numba", "fast-numpy": "numpy", "charlm-fast": "numba", "charlm-fast-numpy": "numpy"}
PEAK_SHAPES = {"a": [32, 64, 128], "b": [128, 784, 512], "square": [1024, 1024, 1024]}


def torch_available() -> bool:
    done = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    return done.returncode == 0


def numba_available() -> bool:
    done = subprocess.run([sys.executable, "-c", "import numba"], capture_output=True)
    return done.returncode == 0


def run_case(spec: dict, main_src: Path | None = None, timeout: float = 300) -> dict:
    """Run ``_case.py`` with ``spec`` in a new process; its JSON result."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if spec.get("impl") in KERNEL_OF:
        env["DILOCO_ADAMW_KERNEL"] = KERNEL_OF[spec["impl"]]
    if spec.get("threads", 1) != 1:
        env.pop("OPENBLAS_NUM_THREADS")  # threadpoolctl raises the limit in the case itself
    if spec.get("impl") == "reference@main":
        spec = {**spec, "impl": "reference"}
        env["PYTHONPATH"] = str(main_src)
    done = subprocess.run([sys.executable, str(HERE / "_case.py"), json.dumps(spec)], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"case {spec} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def extract_main(dest: Path) -> Path:
    """``src/`` of commit ``MAIN_COMMIT`` under ``dest``; the directory to put on PYTHONPATH."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", MAIN_COMMIT, "src/diloco"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


class Competitor:
    """A busy-looping process holding one core, to measure the cost of oversubscription."""

    def __enter__(self):
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        self.process.kill()
        self.process.wait()


def timed_command(argv: list, extra_env: dict | None = None) -> dict:
    """Wall and CPU time (user + system, of the child and its descendants) of one command."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}  # the command's own policy rules
    env.update(extra_env or {})
    load = os.getloadavg()[0]
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
    wall = time.perf_counter() - start
    after = os.times()
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed:\n{done.stderr}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"wall": wall, "cpu": cpu, "load": [load, os.getloadavg()[0]]}


def measure_training(repeats: int, impls, main_src: Path, save_dir: Path, log) -> tuple[dict, dict]:
    """``{(model, dtype, impl): [result per repeat]}`` and ``{dtype: [peak GFLOP/s by shape per repeat]}``.

    The repeats are interleaved, the matmul peak (CPU time, one thread) among them.
    """
    cases = [(model, dtype, impl) for model in MODELS for dtype in ("float64", "float32") for impl in impls]
    results: dict = {case: [] for case in cases}
    peaks: dict = {"float64": [], "float32": []}
    for repeat in range(repeats):
        for dtype in peaks:
            spec = {"impl": "matmul", "dtype": dtype, "shapes": list(PEAK_SHAPES.values()), "clock": "cpu"}
            peaks[dtype].append(run_case(spec)["gflops"])
        for model, dtype, impl in cases:
            spec = {"impl": impl, "model": model, "dtype": dtype}
            if repeat == 0:
                spec["save"] = str(save_dir / f"{model}-{dtype}-{impl}.npz")
            result = run_case(spec, main_src)
            results[(model, dtype, impl)].append(result)
            log(f"  repeat {repeat + 1}/{repeats} {model} {dtype} {impl}: "
                f"{result['worker_steps'] / result['cpu']:.0f} worker-steps per CPU-second "
                f"(CPU/wall {result['cpu'] / result['wall']:.2f}, load {result['load'][0]:.2f})")
    return results, peaks


def compare_params(save_dir: Path, impls) -> dict:
    """Max relative difference of each implementation's final params from ``reference``."""
    gaps = {}
    for model in MODELS:
        for dtype in ("float64", "float32"):
            with np.load(save_dir / f"{model}-{dtype}-reference.npz") as ref:
                for impl in impls:
                    if impl == "reference":
                        continue
                    with np.load(save_dir / f"{model}-{dtype}-{impl}.npz") as other:
                        gaps[(model, dtype, impl)] = max(
                            float(np.max(np.abs(other[k] - ref[k])) / np.max(np.abs(ref[k]))) for k in ref.files)
    return gaps


POLICY_PROBE = ("from diloco.tools.cli.threads import choose_threads, idle_cores; import json; "
                "print(json.dumps({'threads': choose_threads((784, 512, 512, 10), 128), 'idle': idle_cores()}))")


def policy_choice() -> dict:
    """What ``diloco.tools.cli.threads.choose_threads`` picks for model (b) now, in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", POLICY_PROBE], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


def measure_threads(repeats: int, log) -> dict:
    """Matmul time with 1 and 2 threads, alone and beside a busy process; the fast runs likewise.

    Also the thread policy's choice for model (b) in each condition (``out["policy"]``).
    """
    out: dict = {"matmul": {}, "training": {}, "policy": {}}
    for contended in (False, True):
        for _ in range(repeats):
            with Competitor() if contended else _nothing():
                out["policy"].setdefault(contended, []).append(policy_choice())
                for name in ("a", "b", "square"):
                    for threads in (1, 2):
                        result = run_case({"impl": "matmul", "dtype": "float64", "shapes": [PEAK_SHAPES[name]],
                                           "threads": threads})
                        out["matmul"].setdefault((name, threads, contended), []).append(
                            next(iter(result["gflops"].values())))
                for model in ("a", "b"):
                    for threads in (1, 2):
                        spec = {"impl": "fast", "model": model, "dtype": "float64", "threads": threads}
                        result = run_case(spec)
                        out["training"].setdefault((model, threads, contended), []).append(result)
        log(f"  threads measured ({'plus a busy process' if contended else 'as is'})")
    return out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def measure_layouts(repeats: int, log) -> dict:
    """The fast engine with each layout forced: ``{(model, dtype, layout): [result per repeat]}``."""
    out: dict = {}
    for _ in range(repeats):
        for model in MODELS:
            for dtype in ("float64", "float32"):
                for layout in ("stacked", "per-worker"):
                    spec = {"impl": "fast", "model": model, "dtype": dtype, "layout": layout}
                    out.setdefault((model, dtype, layout), []).append(run_case(spec))
    log("  layouts measured")
    return out


MEMORY_WIDTHS = (64, 128, 256, 512)
MEMORY_IMPLS = ("reference", "fast", "fast-numpy")


def measure_memory(log) -> dict:
    """Peak RSS of one-round runs as H, K and the hidden width grow (model (a), float64)."""
    out: dict = {"H": {}, "K": {}, "width": {}}
    for impl in MEMORY_IMPLS:
        for inner_steps in (10, 50, 200):
            spec = {"impl": impl, "model": "a", "dtype": "float64", "inner_steps": inner_steps, "rounds": 1}
            out["H"][(impl, inner_steps)] = run_case(spec)
        for workers in (2, 4, 8, 16):
            spec = {"impl": impl, "model": "a", "dtype": "float64", "workers": workers, "rounds": 1}
            out["K"][(impl, workers)] = run_case(spec)
        for width in MEMORY_WIDTHS:
            spec = {"impl": impl, "model": "a", "dtype": "float64", "hidden": [width], "rounds": 1}
            out["width"][(impl, width)] = run_case(spec)
    log("  memory measured")
    return out


def measure_adamw(with_torch: bool, log) -> dict:
    """One AdamW update: the engine's buffers of model (a) (K = 8 stacked), the char-LM's and (b)'s (one worker)."""
    sizes = {"(a) K x P = 8 x 9,610": 76_880, "char-LM 390-128-65, K x P = 8 x 58,433": 467_464,
             "(b) P = 669,706": 669_706}
    out = {(label, dtype): run_case({"impl": "adamw", "dtype": dtype, "size": size, "torch": with_torch})["ms"]
           for label, size in sizes.items() for dtype in ("float64", "float32")}
    log("  AdamW measured")
    return out


README_START = "<!-- benchmarks:start"
README_END = "<!-- benchmarks:end -->"


def refresh_readme(readme: Path, block: list) -> None:
    """Replace the README's generated block (between the two markers) with ``block``."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        raise RuntimeError(f"{readme} has no {README_START} ... {README_END} block")
    start = text.index("\n", start) + 1
    readme.write_text(text[:start] + "\n".join(block) + "\n" + text[end:], encoding="utf-8")


def measure_compare(repeats: int, log) -> dict:
    """``diloco compare`` on its defaults: the thread policy against ``--threads 2``."""
    out: dict = {}
    diloco = str(Path(sys.executable).parent / "diloco")
    with tempfile.TemporaryDirectory() as runs:
        for _ in range(repeats):
            for label, extra in (("policy (1 thread)", []), ("--threads 2", ["--threads", "2"])):
                argv = [diloco, "compare", "-q", "--no-plots", "--runs-dir", runs, *extra]
                out.setdefault(label, []).append(timed_command(argv))
    log("  diloco compare measured")
    return out


# EXTRA_WORKLOADS: name -> function (repeats, log) -> result, handed to report.EXTRA_SECTIONS[name]
# (a function result -> (lines, target rows)). The char-LM and the whole study: benchmarks/charlm.py; the
# transformer's worker-step against PyTorch: benchmarks/transformer_step.py. `--only NAME` remeasures one alone.
EXTRA_WORKLOADS: dict = {
    "charlm": lambda repeats, log: charlm.measure(repeats, log, run_case, timed_command, sys.executable),
    "transformer": lambda repeats, log: transformer_step.measure(repeats, log, sys.executable),
    "suite": lambda repeats, log: suite.measure(log, timed_command, IDLE_LOAD),  # once: minutes each
}
if mpi_step.available():  # the mpi extra: K = 4 real processes against the engines in one process
    EXTRA_WORKLOADS["mpi"] = lambda repeats, log: mpi_step.measure(max(1, min(3, repeats)), log)


def fixed_cost_only(args, log) -> None:
    """``--only fixed-cost``: measure that section (``charlm.measure_fixed_cost``) and rewrite it in ``--out``."""
    started, load_before = time.time(), os.getloadavg()
    result = charlm.measure_fixed_cost(args.repeats, log, run_case, timed_command, sys.executable)
    write_fixed_cost(Path(args.out), result, repeats=args.repeats, seconds=time.time() - started,
                     load=(load_before, os.getloadavg()), main_commit=MAIN_COMMIT)
    log(f"rewrote the fixed-cost section of {args.out}")


# The report's section that comes after the extra workloads' (report.write_report's order).
AFTER_EXTRA = "## The fast engine's layouts"


def replace_section(lines: list, section: list) -> list:
    """``lines`` with the section whose heading is ``section``'s first heading replaced by ``section``
    (up to the next ``## `` heading), or inserted before ``AFTER_EXTRA`` when it has none yet."""
    body = section[next(i for i, line in enumerate(section) if line.startswith("## ")):]
    if body[0] in lines:
        start = lines.index(body[0])
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    else:
        start = end = lines.index(AFTER_EXTRA) if AFTER_EXTRA in lines else len(lines)
    return lines[:start] + body + ([""] if end < len(lines) else []) + lines[end:]


def replace_rows(lines: list, rows: list) -> list:
    """``lines`` with each target row ``(target, measured, verdict)`` put in place of the row of the same
    target, or appended to the targets table."""
    lines = list(lines)
    for row in rows:
        text = f"| {' | '.join(map(str, row))} |"
        old = [i for i, line in enumerate(lines) if line.startswith(f"| {row[0]} |")]
        if old:
            lines[old[0]] = text
            continue
        end = next(i for i, line in enumerate(lines) if line.startswith("| target (ratios"))
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines.insert(end, text)
    return lines


def write_atomically(path: Path, lines: list) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)


def measure_only(names: list, repeats: int, out: Path, log) -> None:
    """``--only``: remeasure these extra workloads and put their sections and target rows into the existing
    report ``out`` (and, for benchmarks/results.md, the README's summary); every other figure is left as it was."""
    lines = out.read_text(encoding="utf-8").splitlines()
    readme = ROOT / "README.md"
    summary = readme.read_text(encoding="utf-8").splitlines() if out.resolve() == (HERE / "results.md") else None
    for name in names:
        section, rows = EXTRA_SECTIONS[name](EXTRA_WORKLOADS[name](repeats, log))
        lines = replace_rows(replace_section(lines, section), rows)
        summary = replace_rows(summary, rows) if summary is not None else None
    write_atomically(out, lines)
    log(f"wrote the {', '.join(names)} section(s) into {out}")
    if summary is not None:
        write_atomically(readme, summary)
        log("refreshed their target rows in the Benchmarks table of README.md")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats of every case (5)")
    parser.add_argument("--layout-repeats", type=int, default=3,
                        help="interleaved repeats of each cell of the layout grid (3)")
    parser.add_argument("--out", default=str(HERE / "results.md"),
                        help="the Markdown report; when it is benchmarks/results.md, README.md's table is refreshed")
    parser.add_argument("--from-raw", metavar="PICKLE",
                        help="rewrite the report from the measurements a previous run saved beside --out")
    parser.add_argument("--only", metavar="NAME[,NAME]",
                        help=f"remeasure only these sections and put them into the existing --out report in place: "
                             f"fixed-cost (the fast engine's fixed cost beside its steady state, and the 10-round "
                             f"char-LM compare on each engine; a few minutes) or {', '.join(EXTRA_WORKLOADS)}")
    args = parser.parse_args()
    log = lambda text: print(text, flush=True)  # noqa: E731
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.only == "fixed-cost":
        fixed_cost_only(args, log)
        return
    if args.only is not None:
        names = [name.strip() for name in args.only.split(",")]
        unknown = [name for name in names if name not in EXTRA_WORKLOADS]
        if unknown or not names:
            parser.error(f"--only takes fixed-cost or names among {', '.join(EXTRA_WORKLOADS)}, got {args.only!r}")
        if not Path(args.out).exists():
            parser.error(f"--only puts sections into an existing report, and --out {args.out} does not exist")
        measure_only(names, args.repeats, Path(args.out), log)
        return
    raw = Path(args.out).with_suffix(".raw.pickle")  # every measurement, so the report can be redrawn
    if args.from_raw:
        with open(args.from_raw, "rb") as handle:
            write(args, pickle.load(handle), log)
        return
    started = time.time()
    load_before = os.getloadavg()
    impls = [i for i in IMPLS if (not i.startswith("torch") or torch_available())
             and (i != "fast" or numba_available())]
    with tempfile.TemporaryDirectory() as tmp:
        main_src = extract_main(Path(tmp))
        save_dir = Path(tmp) / "params"
        save_dir.mkdir()
        log(f"training throughput ({len(impls)} implementations, {args.repeats} repeats)")
        training, peaks = measure_training(args.repeats, impls, main_src, save_dir, log)
        gaps = compare_params(save_dir, impls)
    threads = measure_threads(max(1, args.repeats // 2), log)
    layouts = measure_layouts(max(1, args.repeats // 2), log)
    log("layout grid (K x width x dtype, both layouts)")
    grid = layout_grid.run_grid(args.layout_repeats, log)
    memory = measure_memory(log)
    adamw = measure_adamw(any(i.startswith("torch") for i in impls), log)
    compare = measure_compare(max(1, args.repeats // 2), log)
    extra = {name: measure(args.repeats, log) for name, measure in EXTRA_WORKLOADS.items()}
    measurements = dict(training=training, gaps=gaps, peaks=peaks, threads=threads, memory=memory, adamw=adamw,
                        compare=compare, layouts=layouts, grid=grid, extra=extra, impls=impls, repeats=args.repeats,
                        seconds=time.time() - started, load=(load_before, os.getloadavg()), main_commit=MAIN_COMMIT)
    with open(raw, "wb") as handle:
        pickle.dump(measurements, handle)
    write(args, measurements, log)


def write(args, measurements: dict, log) -> None:
    """The report (and the README's summary when ``--out`` is benchmarks/results.md) from ``measurements``."""
    summary = write_report(Path(args.out), **measurements)
    log(f"wrote {args.out} ({measurements['seconds']:.0f} s of measuring)")
    if Path(args.out).resolve() == (HERE / "results.md").resolve():
        refresh_readme(ROOT / "README.md", summary)
        log("refreshed the Benchmarks table of README.md")


if __name__ == "__main__":
    main()
