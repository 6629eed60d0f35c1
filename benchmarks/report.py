"""Turn the measurements of ``bench.py`` into ``benchmarks/results.md``."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import charlm
import mpi_step
import numpy as np
import suite
import transformer_step
from workloads import MODELS, flops_per_worker_step

TORCH_REFERENCE = "torch-fused"  # "PyTorch" in the targets: eager mode with fused AdamW


def _median(values) -> float:
    return float(statistics.median(values))


def _rate(results) -> float:
    """Median worker-steps per second of process CPU time over the repeats (one thread)."""
    return _median([r["worker_steps"] / r["cpu"] for r in results])


def _wall_rate(results) -> float:
    """Median worker-steps per second of wall time over the repeats."""
    return _median([r["worker_steps"] / r["wall"] for r in results])


def peak(peaks, dtype: str) -> float:
    """The single-thread matmul peak: the median over repeats of the best shape."""
    return _median([max(by_shape.values()) for by_shape in peaks[dtype]])


# A measurement is "idle" when the one-minute load average stays below this. The benchmark's own case process
# counts about 1 of it (each case starts as the previous one ends, both busy), so this leaves other processes 0.5.
IDLE_LOAD = 1.5


def loads(results) -> list:
    """Every load average recorded by ``results`` (start and end of each case)."""
    return [value for r in results for value in r.get("load", [])]


def load_cell(results) -> str:
    values = loads(results)
    return f"{_median(values):.2f} ({max(values):.2f})" if values else "not recorded"


def fast_impl(impls) -> str:
    """The fast engine as a user with the ``fast`` extra runs it, else without."""
    return "fast" if "fast" in impls else "fast-numpy"


def machine_rows(load, main_commit: str) -> list:
    cpu = "unknown"
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    if Path("/proc/meminfo").exists():
        total_kb = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{total_kb / 2**20:.0f} GiB"
    rows = [("CPU", cpu), ("cores (affinity)", str(len(os.sched_getaffinity(0)))), ("memory", memory),
            ("OS", platform.platform()), ("Python", platform.python_version()), ("NumPy", np.__version__)]
    try:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            rows.append((f"{pool['user_api']} library",
                         f"{pool.get('internal_api')} {pool.get('version')}, kernel {pool.get('architecture')}, "
                         f"{pool.get('threading_layer')}, {pool['num_threads']} threads"))
    except ImportError:
        rows.append(("BLAS", "threadpoolctl missing: kernel unknown"))
    torch = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True)
    rows.append(("PyTorch", torch.stdout.strip() if torch.returncode == 0 else "not installed (columns skipped)"))
    for name in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS"):
        rows.append((name, os.environ.get(name, "unset")))
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "src"], capture_output=True, text=True).stdout.strip()
    rows.append(("code measured", f"{head}{' + uncommitted changes in src/' if dirty else ''} "
                                  f"(reference@main: {main_commit})"))
    rows.append(("load average (1 min) before / after", f"{load[0][0]:.2f} / {load[1][0]:.2f}"))
    return rows


def _table(header, rows) -> list:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def training_section(training, peaks, impls) -> tuple[list, dict]:
    lines, rates = [], {}
    for model, spec in MODELS.items():
        flops = flops_per_worker_step(spec["sizes"], spec["batch"])
        lines += ["", f"### {spec['label']}", "",
                  f"{flops / 1e6:.2f} MFLOP per worker-step; {spec['workers'] * spec['H'] * spec['rounds']} "
                  "worker-steps timed per run.", ""]
        rows = []
        for dtype in ("float64", "float32"):
            best = peak(peaks, dtype)
            base = _rate(training[(model, dtype, "reference@main")])
            for impl in impls:
                results = training[(model, dtype, impl)]
                rate = rates[(model, dtype, impl)] = _rate(results)
                spread = [r["worker_steps"] / r["cpu"] for r in results]
                gflops = rate * flops / 1e9
                walls = [r["worker_steps"] / r["wall"] for r in results]
                rows.append((dtype, impl, f"{rate:,.0f} ({min(spread):,.0f}-{max(spread):,.0f})",
                             f"{_wall_rate(results):,.0f} ({min(walls):,.0f}-{max(walls):,.0f})", f"{gflops:.1f}",
                             f"{100 * gflops / best:.0f}%", f"{rate / base:.2f}x",
                             f"{_median([r['cpu'] / r['wall'] for r in results]):.2f}",
                             f"{_median([r['peak_rss_mb'] for r in results]):.0f} "
                             f"(+{_median([r['peak_rss_mb'] - r['base_rss_mb'] for r in results]):.0f})",
                             load_cell(results)))
        lines += _table(("dtype", "implementation", "worker-steps per CPU-second, median (min-max)",
                         "per wall second, median (min-max)", "GFLOP/s",
                         "of matmul peak", "vs reference@main", "CPU/wall", "peak RSS MB (+ over imports)",
                         "load average, median (max)"), rows)
    return lines, rates


NOTES = {
    "reference": "The reference path is the learners' pure functions: every step allocates new arrays (forward "
                 "cache, gradients, AdamW's new moments and parameters) and the entry points still check their "
                 "arguments once per call tree. Those costs are the contract of the milestones, not overhead "
                 "the fast engine has.",
    "torch (b)": "On (b) one worker-step is ~8 ms of matrix products (the same BLAS for both) plus element-wise "
                 "work: AdamW over 670k values (see the AdamW table: the numba loop against torch's fused "
                 "kernel), the bias adds, ReLU masks and softmax. What remains of the gap is in that "
                 "element-wise work and in how each library calls the same BLAS.",
    "peak (b)": "What is not matrix products on (b) is the element-wise work of the step: AdamW (the AdamW table), "
                "the bias adds, ReLU masks and softmax on 128 x 512 arrays; a worker's parameters, moments and "
                "gradient are 21 MB in float64, streamed every step through caches that other processes share.",
    "load": "Other processes shared the two cores during this run (the load column of every table and the load "
            "average in Machine): rates are per CPU-second, but caches and memory bandwidth are shared too, so "
            "these ratios are figures of a loaded machine, not idle ones, and move by 10-20% between runs.",
}


def targets_section(rates, training, peaks, compare, memory, impls) -> tuple[list, list]:
    """The targets table (issue 18's, and the earlier ones that still hold) and the notes on missed ones."""
    rows, notes = [], []
    fast = fast_impl(impls)

    def verdict(ok, results=(), note=None):
        if not ok and note is not None and NOTES[note] not in notes:
            notes.append(NOTES[note])
        busy = [value for r in results for value in loads(r)]
        state = " (loaded machine)" if busy and max(busy) >= IDLE_LOAD else ""
        return ("met" if ok else "**missed**") + state

    for dtype in ("float64", "float32"):
        ratio = rates[("a", dtype, "reference")] / rates[("a", dtype, "reference@main")]
        same = training[("a", dtype, "reference")][0].get("params_sha256") == \
            training[("a", dtype, "reference@main")][0].get("params_sha256")
        rows.append((f"reference >= 2x reference@main on (a), {dtype}, bit-identical",
                     f"{ratio:.2f}x, {'bit-identical' if same else 'NOT bit-identical'}",
                     verdict(ratio >= 2 and same, [training[("a", dtype, "reference")]], "reference")))
    if TORCH_REFERENCE in impls:
        for dtype, goal in (("float64", 3.5), ("float32", 5.0)):
            ratio = rates[("a", dtype, fast)] / rates[("a", dtype, TORCH_REFERENCE)]
            rows.append((f"{fast} >= {goal}x PyTorch eager fused AdamW on (a), {dtype}", f"{ratio:.2f}x",
                         verdict(ratio >= goal,
                                 [training[("a", dtype, fast)], training[("a", dtype, TORCH_REFERENCE)]])))
        for dtype in ("float64", "float32"):
            ratio = rates[("b", dtype, fast)] / rates[("b", dtype, TORCH_REFERENCE)]
            rows.append((f"{fast} >= 1.0x PyTorch eager fused AdamW on (b), {dtype}", f"{ratio:.2f}x",
                         verdict(ratio >= 1.0, [training[("b", dtype, fast)], training[("b", dtype, TORCH_REFERENCE)]],
                                 "torch (b)")))
    else:
        rows.append(("fast against PyTorch on (a) and (b)", "PyTorch not installed", "not measured"))
    flops_b = flops_per_worker_step(MODELS["b"]["sizes"], MODELS["b"]["batch"])
    share = rates[("b", "float64", fast)] * flops_b / 1e9 / peak(peaks, "float64")
    rows.append((f"{fast} >= 60% of the single-thread matmul peak on (b), float64", f"{100 * share:.0f}%",
                 verdict(share >= 0.6, [training[("b", "float64", fast)]], "peak (b)")))
    policy = compare["policy (1 thread)"]
    ratio = _median([c["cpu"] / c["wall"] for c in policy])
    rows.append(("make demo (diloco compare on its defaults): CPU time <= 1.2x wall time", f"{ratio:.2f}",
                 verdict(ratio <= 1.2, [policy])))
    for impl in ("reference", "fast"):
        growth = [memory["H"][(impl, h)]["peak_rss_mb"] for h in (10, 50, 200)]
        rows.append((f"peak memory flat in H ({impl}: H = 10, 50, 200)",
                     " / ".join(f"{g:.0f}" for g in growth) + " MB", verdict(max(growth) - min(growth) < 2)))
    return _table(("target (ratios from this one run)", "measured", "verdict"), rows), notes


# The report's hook for bench.EXTRA_WORKLOADS: name -> function(result) -> (lines, target rows), where the
# target rows are (target, measured, verdict) tuples appended to the targets table.
EXTRA_SECTIONS: dict = {
    "charlm": lambda result: charlm.section(result, _median, loads, IDLE_LOAD),
    "mpi": lambda result: mpi_step.section(result, IDLE_LOAD),
    "transformer": transformer_step.section,
    "suite": lambda result: suite.section(result, IDLE_LOAD),
}


def write_fixed_cost(path: Path, result: dict, *, repeats: int, seconds: float, load, main_commit: str) -> None:
    """Rewrite only the fixed-cost section of the report at ``path`` (``bench.py --only fixed-cost``): between
    its markers, or, in a report written before it had one, after the char-LM section (else at the end)."""
    rows = dict(machine_rows(load, main_commit))
    heading = (f"Measured by `benchmarks/bench.py --only fixed-cost` on "
               f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, in {seconds:.0f} s, {repeats} interleaved "
               f"repeats (the rest of this report is from the full run above); code {rows['code measured']}; "
               f"load average (1 min) before / after {rows['load average (1 min) before / after']}.")
    lines, _ = charlm.fixed_cost_section(result, _median, loads, IDLE_LOAD, heading)
    text = path.read_text(encoding="utf-8")
    start, end = text.find(charlm.FIXED_START), text.find(charlm.FIXED_END)
    if start >= 0 and end > start:
        text = text[:start] + "\n".join(lines) + text[end + len(charlm.FIXED_END):]
    else:
        charlm_at = text.find("## The char-LM")
        after = -1 if charlm_at < 0 else text.find("\n## ", charlm_at)
        at = len(text) if after < 0 else after + 1
        text = text[:at].rstrip("\n") + "\n\n" + "\n".join(lines) + "\n" + ("\n" + text[at:] if after >= 0 else "")
    path.write_text(text, encoding="utf-8")


def write_report(path: Path, *, training, gaps, peaks, threads, memory, adamw, compare, layouts, grid, impls,
                 repeats, seconds, load, main_commit, extra=None) -> list:
    """Write the report; return the summary block for the README (targets and notes)."""
    lines = ["# Benchmarks", "",
             f"Generated by `make bench` (`benchmarks/bench.py`) on "
             f"{datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, in {seconds:.0f} s: every case in a fresh "
             f"process, {repeats} interleaved repeats, medians. Do not edit by hand; rerun `make bench`.", "",
             "## Machine", ""]
    lines += _table(("", ""), machine_rows(load, main_commit))
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("OPENBLAS_L2_SIZE"):
        lines += ["", "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE were set, so OpenBLAS ran the kernel named above, "
                      "which can be slower than the one it would pick itself; to measure that one, run "
                      "`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE make bench`."]
    lines += ["", "## Targets", ""]
    training_lines, rates = training_section(training, peaks, impls)
    targets, notes = targets_section(rates, training, peaks, compare, memory, impls)
    extra_lines = []
    for name, result in (extra or {}).items():
        if name in EXTRA_SECTIONS:
            section, target_rows = EXTRA_SECTIONS[name](result)
            extra_lines += section
            targets += [f"| {' | '.join(map(str, row))} |" for row in target_rows]
    busy = [value for results in training.values() for value in loads(results)]
    if busy and max(busy) >= IDLE_LOAD:
        notes.append(NOTES["load"] + f" Load average during the training cases: median {_median(busy):.2f}, "
                                     f"max {max(busy):.2f}.")
    summary = targets + ([""] + [f"- {note}" for note in notes] if notes else [])
    lines += summary
    lines += ["", "## Training throughput, one BLAS thread", "",
              "One DiLoCo run per case (`train_diloco`, `diloco.core.trainers.train_diloco_fast`, or "
              "`benchmarks/torch_mlp.py`), timed from the end of its first round (the warm-up) to the end of the "
              "last, so set-up stays out. Rates are per second of the process's "
              "CPU time, which on one thread equals wall time on a quiet machine and is not inflated when other "
              "processes share the cores (the wall-clock rate is beside it). GFLOP/s counts the matrix products "
              "only: `F = 2 b (2 sum_l d_{l-1} d_l + sum_{l>=2} d_{l-1} d_l)` per worker-step (forward, weight "
              "gradient, input gradient but the first layer's); *of matmul peak* divides by the best "
              "single-thread NumPy matmul below. CPU/wall near 1 means no thread spins. Peak RSS is the "
              "process's high-water mark (Python, NumPy and, for PyTorch, torch included); the bracket is "
              "its growth over the RSS after imports and data."]
    lines += training_lines
    lines += ["", "## Agreement with the reference path", "",
              "Max over the parameter arrays of `max|theta - theta_ref| / max|theta_ref|` after the timed run "
              "(same seed). PyTorch draws its own initial model, so only the NumPy paths are comparable.", ""]
    rows = [(f"({model})", dtype, impl, f"{gap:.1e}") for (model, dtype, impl), gap in gaps.items()
            if not impl.startswith("torch")]
    lines += _table(("model", "dtype", "implementation", "relative difference from `reference`"), rows)
    lines += ["", "## Single-thread matmul peak of this NumPy", "",
              "`np.matmul(a, b, out=c)`, CPU time, best of 5 per repeat, median over the repeats.", ""]
    rows = [(dtype, shape, f"{_median([by_shape[shape] for by_shape in per_repeat]):.1f}")
            for dtype, per_repeat in peaks.items() for shape in per_repeat[0]]
    lines += _table(("dtype", "m x k x n", "GFLOP/s"), rows)
    lines += extra_lines
    lines += layouts_section(layouts, grid)
    lines += ["", "## AdamW update, one thread", "",
              "CPU milliseconds of one update, median of 7 x 10: the engine's AdamW on its flat buffers as "
              "NumPy passes (12-13 per chunk, `adamw_update_numpy`) and as the numba loop of the `fast` extra "
              "(one pass, `adamw_update_numba`; equal to the NumPy passes to the last bit), and PyTorch's "
              "AdamW on one tensor of the same size.", ""]
    names = list(next(iter(adamw.values())))
    rows = [(label, dtype, *(f"{ms[name]:.3f}" for name in names)) for (label, dtype), ms in adamw.items()]
    lines += _table(("values", "dtype", *names), rows)
    lines += threads_section(threads, compare)
    lines += memory_section(memory)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    when = datetime.datetime.now().strftime("%Y-%m-%d")
    cpu = dict(machine_rows(load, main_commit)).get("CPU", "")
    cores = len(os.sched_getaffinity(0))
    return [f"From [benchmarks/results.md](benchmarks/results.md) ({when}, {cpu}, {cores} cores, one BLAS thread, "
            f"rates per CPU-second):", ""] + summary


def layouts_section(layouts, grid) -> list:
    """The fast engine's two layouts forced, against what ``diloco.engine.layout.choose_layout`` picks."""
    from diloco.engine.layout import choose_layout

    lines = ["", "## The fast engine's layouts", "",
             "Worker-steps per CPU-second (medians) with each layout forced. *Stacked*: the K workers step "
             "together (batched matmul, one AdamW pass over a (K, P) buffer); *per-worker*: one worker at a "
             "time in (1, P) buffers. *auto* is `diloco.engine.layout.choose_layout` (its docstring gives the "
             "rule and the grid below is what it was fitted to).", ""]
    rows = []
    for model, spec in MODELS.items():
        num_values = sum(a * b + b for a, b in zip(spec["sizes"][:-1], spec["sizes"][1:], strict=True))
        for dtype in ("float64", "float32"):
            stacked = _rate(layouts[(model, dtype, "stacked")])
            per_worker = _rate(layouts[(model, dtype, "per-worker")])
            picked = choose_layout(spec["workers"], num_values, itemsize=np.dtype(dtype).itemsize)
            rows.append((spec["label"], dtype, f"{stacked:,.0f}", f"{per_worker:,.0f}", f"{stacked / per_worker:.2f}x",
                         picked))
    lines += _table(("model", "dtype", "stacked", "per-worker", "stacked / per-worker", "auto picks"), rows)
    lines += grid_section(grid)
    return lines


def grid_section(grid) -> list:
    """``benchmarks/layout_grid.py``'s cells: the ratio of the layouts and the rule's pick in each."""
    from diloco.engine.layout import choose_layout

    cells = grid["cells"]
    kernel = grid.get("kernel")
    workers = sorted({c["workers"] for c in cells})
    lines = ["", f"### The grid: model w-w-10, batch {grid['batch']}, H = {grid['inner_steps']}, AdamW kernel {kernel}",
             "",
             "Each cell: stacked speed / per-worker speed (CPU time, median of the interleaved repeats), then the "
             "rule's pick (**S** stacked, **W** per-worker); a pick marked `!` is the slower layout by more than "
             "5%. K = 1 runs the same work either way.", ""]
    wrong, costs = 0, []
    for dtype in ("float64", "float32"):
        rows = []
        for width in sorted({c["width"] for c in cells}):
            row = [dtype, f"{width} (P = {_values(cells, width):,})"]
            for k in workers:
                (cell,) = [c for c in cells if c["dtype"] == dtype and c["width"] == width and c["workers"] == k]
                ratio = _median(cell["per-worker"]) / _median(cell["stacked"])
                pick = choose_layout(k, cell["num_values"], itemsize=np.dtype(dtype).itemsize)
                got = ratio if pick == "stacked" else 1 / ratio  # the pick's speed over the other layout's
                if k > 1:
                    costs.append(max(1.0, 1 / got))
                slower = k > 1 and got < 1 / 1.05
                wrong += slower
                row.append(f"{ratio:.2f} {'S' if pick == 'stacked' else 'W'}{' !' if slower else ''}")
            rows.append(row)
        lines += _table(("dtype", "width", *(f"K={k}" for k in workers)), rows) + [""]
    loads_seen = [c["load"] for c in cells]
    lines += [f"With K >= 2 the rule picks the slower layout by more than 5% in {wrong} of {len(costs)} cells; its "
              f"worst pick is {max(costs):.2f}x slower than the better layout, the median {_median(costs):.2f}x. "
              f"Load average "
              f"at the end of each (dtype, width): median {_median(loads_seen):.2f}, max {max(loads_seen):.2f}."]
    return lines


def _values(cells, width) -> int:
    return next(c["num_values"] for c in cells if c["width"] == width)


def threads_section(threads, compare) -> list:
    lines = ["", "## BLAS threads", "",
             "The rule (`diloco.tools.cli.threads`, docs/cli.md): one thread when the largest product of a step is "
             "below 1e7 FLOPs, else the free cores. Wall-clock rates, float64, medians. *As is*: the machine as "
             "it was during the run (its load average is in Machine); *plus a busy process*: one more process "
             "spins on a core meanwhile, as when tests or other runs share the machine.", ""]
    rows = []
    for name, shape in (("a", "32x64x128 (model (a))"), ("b", "128x784x512 (model (b))"),
                        ("square", "1024x1024x1024")):
        cells = [shape]
        for contended in (False, True):
            one = _median(threads["matmul"][(name, 1, contended)])
            two = _median(threads["matmul"][(name, 2, contended)])
            cells += [f"{one:.1f}", f"{two:.1f}", f"{two / one:.2f}x"]
        rows.append(cells)
    lines += _table(("matmul", "as is: 1 thread GFLOP/s", "2 threads", "speed-up", "plus a busy process: 1 thread",
                     "2 threads", "speed-up"), rows)
    lines += ["", "What the policy (`choose_threads`) picked for model (b), in a fresh process at the start of each "
                  "repeat, with the idle cores its probe saw:", ""]
    rows = []
    for contended in (False, True):
        picks = threads["policy"].get(contended, [])
        rows.append(("plus a busy process" if contended else "as is",
                     ", ".join(str(p["threads"]) for p in picks),
                     ", ".join("n/a" if p["idle"] is None else f"{p['idle']:.2f}" for p in picks)))
    lines += _table(("machine", "threads picked", "idle cores seen"), rows)
    lines += [""]
    rows = []
    for model in ("a", "b"):
        cells = [MODELS[model]["label"]]
        for contended in (False, True):
            one = _wall_rate(threads["training"][(model, 1, contended)])
            two = _wall_rate(threads["training"][(model, 2, contended)])
            cpu2 = _median([r["cpu"] / r["wall"] for r in threads["training"][(model, 2, contended)]])
            cells += [f"{one:,.0f}", f"{two:,.0f} (CPU/wall {cpu2:.2f})", f"{two / one:.2f}x"]
        rows.append(cells)
    lines += _table(("fast engine, worker-steps/s", "as is: 1 thread", "2 threads", "speed-up",
                     "plus a busy process: 1 thread", "2 threads", "speed-up"), rows)
    lines += ["", "`diloco compare` on its defaults (digits, K=8, H=50, 10 rounds, both algorithms, reference "
              "path):", ""]
    rows = [(label, f"{_median([r['wall'] for r in runs]):.2f}", f"{_median([r['cpu'] for r in runs]):.2f}",
             f"{_median([r['cpu'] / r['wall'] for r in runs]):.2f}") for label, runs in compare.items()]
    lines += _table(("BLAS threads", "wall s", "CPU s", "CPU/wall"), rows)
    return lines


def memory_section(memory) -> list:
    lines = ["", "## Memory", "",
             "Peak RSS (MB) of one round of model (a), float64, with the growth over the RSS after imports and "
             "data in brackets. The reference keeps one worker's arrays at a time, the fast engine K workers' "
             "parameters, moments, gradients and scratch (stacked layout) or the K workers' moments and one "
             "worker's buffers (per-worker layout); neither keeps anything per step. *fast-numpy* is the fast "
             "engine without numba (AdamW as NumPy passes): what it saves against *fast* is numba's compiler, "
             "loaded into the process for the AdamW loop.", ""]
    rows = []
    impls = [impl for impl in ("reference", "fast", "fast-numpy") if (impl, 10) in memory["H"]]
    for impl in impls:
        cells = [impl]
        for inner_steps in (10, 50, 200):
            r = memory["H"][(impl, inner_steps)]
            cells.append(f"{r['peak_rss_mb']:.0f} (+{r['peak_rss_mb'] - r['base_rss_mb']:.1f})")
        rows.append(cells)
    lines += _table(("implementation", "H = 10", "H = 50", "H = 200"), rows)
    lines += [""]
    rows = []
    for impl in impls:
        cells = [impl]
        for workers in (2, 4, 8, 16):
            r = memory["K"][(impl, workers)]
            cells.append(f"{r['peak_rss_mb']:.0f} (+{r['peak_rss_mb'] - r['base_rss_mb']:.1f})")
        rows.append(cells)
    lines += _table(("implementation", "K = 2", "K = 4", "K = 8", "K = 16"), rows)
    widths = sorted({w for _, w in memory.get("width", {})})
    if widths:  # measured since 2026-12-02: the hidden width of model (a), K = 8
        lines += ["", "The same against the hidden width (64-w-10, K = 8, H = 50):", ""]
        rows = []
        for impl in impls:
            cells = [impl]
            for width in widths:
                r = memory["width"][(impl, width)]
                cells.append(f"{r['peak_rss_mb']:.0f} (+{r['peak_rss_mb'] - r['base_rss_mb']:.1f})")
            rows.append(cells)
        lines += _table(("implementation", *(f"w = {w}" for w in widths)), rows)
    lines += ["", "Model size: see the peak RSS columns of the throughput tables, (a) 9,610 and (b) 669,706 "
              "parameters per worker."]
    return lines
