"""The char-LM and whole-study workloads of ``make bench`` (``bench.EXTRA_WORKLOADS``).

* **char-LM training**: Tiny Shakespeare, 390-128-65 (6 characters of context, one-hot),
  batch 32, K = 8, H = 50, through the one driver (``diloco.core.driver.train``) on the
  reference executor (the milestone functions) and the fast executor (``--engine
  fast``, its AdamW and first-layer gradient as numba loops; and ``fast-numpy``, both as
  NumPy passes: the engine without the ``fast`` extra), float64 and float32. Timed over 4
  rounds (1,600 worker-steps) after a warm-up round, without held-out evaluation
  (measured on its own below).
* **the first layer's gradient** ``dW_1 = x^T dz_1`` of a one-hot batch (K = 8, b = 32,
  390 x 128): the dense product against the engine's scatter (``WorkerStack``, context) as
  NumPy passes and as the numba loop; CPU microseconds, best of 5 x 200 calls.
* **held-out evaluation**: ``diloco.core.run_records.held_out_metrics`` on the 8,192 held-out
  windows (the first layer gathered from the windows, then milestones 28 and 29), against
  its *matmul floor*: the two dense products ``X W1`` (8,192 x 390 x 128) and
  ``relu(.) W2`` (8,192 x 128 x 65) that a one-hot evaluation would need, timed alone.
* **the fixed cost**: each training case also reads the CPU from its process's start to the
  end of round 1, less one steady round: imports, data, the executor, and for the fast
  engine numba's import and the loading of its kernels (compiled once, then cached on
  disk: ``diloco.engine.optim.numba_jit``). And a *short run*: ``diloco compare --data
  shakespeare --rounds 10`` on each engine, CPU seconds of the whole command, where the
  fixed cost weighs most (the fast engine must still cost less CPU than the reference).
* **a whole study**: ``diloco study table2 --data shakespeare --seeds 5 --total-steps 1000``
  (the fast engine, its default), CPU seconds of the command, against the 152 s the issue
  measured before this work (on this machine's predecessor; the ratio to that fixed
  figure is only indicative) and against ``--engine reference`` in the same run.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

CHARLM = {"workers": 8, "H": 50, "batch": 32, "hidden": (128,), "rounds": 4, "lr": 3e-3}
STUDY_ARGS = ["study", "table2", "--data", "shakespeare", "--seeds", "5", "--total-steps", "1000",
              "-q", "--no-plots"]
SHORT_ARGS = ["compare", "--data", "shakespeare", "--rounds", "10", "-q", "--no-plots"]
STUDY_BEFORE_CPU = 152.0  # seconds, issue 18's figure for the same command before


def run_charlm(spec: dict) -> dict:
    """One char-LM training case (in a fresh ``_case.py`` process)."""
    import numpy as np

    from diloco import AdamWConfig, DiLoCoConfig
    from diloco.core.driver import train
    from diloco.text import load_shakespeare

    text = load_shakespeare(6)
    data = text.dataset
    config = DiLoCoConfig(num_workers=CHARLM["workers"], inner_steps=CHARLM["H"], batch_size=CHARLM["batch"],
                          hidden_sizes=CHARLM["hidden"], dtype=spec["dtype"], rounds=CHARLM["rounds"] + 1,
                          inner=AdamWConfig(lr=CHARLM["lr"]))
    marks = []

    class Clock:
        def finished(self, record, get_state):
            marks.append((time.perf_counter(), time.process_time()))

    executors = {"reference": "reference", "fast": "fast", "fast-numpy": "fast"}
    executor = executors[spec["impl"].removeprefix("charlm-")]
    params = train("diloco", data.x_train, data.y_train, config, encode=text.encode, executor=executor,
                   hooks=[Clock()]).params
    (wall_0, cpu_0), (wall_1, cpu_1) = marks[0], marks[-1]
    steady = (cpu_1 - cpu_0) / CHARLM["rounds"]  # CPU seconds of one round after the warm-up
    out = {"wall": wall_1 - wall_0, "cpu": cpu_1 - cpu_0,
           "worker_steps": CHARLM["workers"] * CHARLM["H"] * CHARLM["rounds"],
           # the fixed cost: CPU from the process's start to the end of round 1 (imports, data, executor,
           # numba's import and its cached kernels' loading), less one steady round
           "fixed_cpu": cpu_0 - steady}
    if spec.get("save"):
        np.savez(spec["save"], **{k: np.asarray(v) for k, v in params.items()})
    return out


def best_cpu_seconds(work, repeats: int, calls: int = 1) -> float:
    """CPU seconds of one ``work()``: after a warm-up call, the best of ``repeats`` timings of ``calls`` calls."""
    work()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(calls):
            work()
        times.append((time.process_time() - start) / calls)
    return min(times)


def run_eval(spec: dict, repeats: int = 5) -> dict:
    """CPU seconds of one held-out evaluation and of its matmul floor (best of ``repeats``)."""
    import numpy as np

    from diloco.core.run_records import held_out_metrics
    from diloco.model import init_model_params
    from diloco.text import load_shakespeare

    text = load_shakespeare(6)
    data, dtype = text.dataset, np.dtype(spec["dtype"])
    params = init_model_params([text.encode.num_features, *CHARLM["hidden"], text.encode.vocab_size],
                               np.random.default_rng(0), dtype=dtype)
    dense = text.encode(data.x_test, dtype)
    hidden = np.empty((len(data.y_test), CHARLM["hidden"][0]), dtype=dtype)
    logits = np.empty((len(data.y_test), text.encode.vocab_size), dtype=dtype)

    def floor():
        np.matmul(dense, params["W1"], out=hidden)
        np.matmul(hidden, params["W2"], out=logits)

    def evaluate():
        held_out_metrics(params, data.x_test, data.y_test, text.encode)

    out = {name: best_cpu_seconds(work, repeats) for name, work in (("eval", evaluate), ("floor", floor))}
    out["windows"] = len(data.y_test)
    return out


def run_first_layer(spec: dict, repeats: int = 5, calls: int = 200) -> dict:
    """CPU microseconds of ``dW_1 = x^T dz_1`` for a one-hot batch of real windows: dense, and scattered."""
    import importlib.util

    import numpy as np

    from diloco.engine import optim
    from diloco.engine.flat import flat_layout
    from diloco.engine.stack import WorkerStack
    from diloco.model import init_model_params
    from diloco.text import load_shakespeare

    text = load_shakespeare(6, eval_windows=8)
    dtype, K, b, hidden = np.dtype(spec["dtype"]), CHARLM["workers"], CHARLM["batch"], CHARLM["hidden"][0]
    rng = np.random.default_rng(0)
    windows = text.dataset.x_train[rng.choice(len(text.dataset.y_train), K * b, replace=False)]
    params = init_model_params([text.encode.num_features, hidden, text.encode.vocab_size], rng, dtype=dtype)
    stack = WorkerStack(flat_layout(params), K, 1, b, dtype, context=text.encode.context)
    stack.columns[...] = text.encode.columns(windows).reshape(K, b, -1)
    dense = text.encode(windows, dtype).reshape(K, b, -1)
    dz = rng.standard_normal((K, b, hidden)).astype(dtype)
    out_dense = np.empty_like(stack.dW[0])
    kernels = ["numpy"] + (["numba"] if importlib.util.find_spec("numba") is not None else [])

    def scatter(kernel):
        def work():
            optim.KERNEL = kernel  # the kernel current_kernel() gives the stack
            stack._first_layer_grads(dz)

        return work

    works = {"dense product": lambda: np.matmul(dense.transpose(0, 2, 1), dz, out=out_dense),
             **{f"scatter, {k}": scatter(k) for k in kernels}}
    return {name: 1e6 * best_cpu_seconds(work, repeats, calls) for name, work in works.items()}


TRAINING_CASES = [(dtype, impl) for dtype in ("float64", "float32")
                  for impl in ("charlm-reference", "charlm-fast", "charlm-fast-numpy")]


def measure_fixed_cost(repeats: int, log, run_case, timed_command, python: str) -> dict:
    """Interleaved repeats of every char-LM training case (its steady rate and fixed cost), then of
    the short run on each engine: ``{"training": {(dtype, impl): [...]}, "short": {engine: [...]}}``
    (``bench.py --only fixed-cost`` measures only this)."""
    out: dict = {"training": {case: [] for case in TRAINING_CASES}, "short": {}}
    for repeat in range(repeats):
        for dtype, impl in TRAINING_CASES:
            result = run_case({"impl": impl, "dtype": dtype})
            out["training"][(dtype, impl)].append(result)
            log(f"  repeat {repeat + 1}/{repeats} char-LM {dtype} {impl}: "
                f"{result['worker_steps'] / result['cpu']:.0f} worker-steps per CPU-second, "
                f"fixed cost {result['fixed_cpu']:.2f} CPU s")
    diloco = str(Path(python).parent / "diloco")
    with tempfile.TemporaryDirectory() as runs:
        for repeat in range(repeats):
            for engine in ("fast", "reference"):
                result = timed_command([diloco, *SHORT_ARGS, "--engine", engine, "--runs-dir", runs])
                out["short"].setdefault(engine, []).append(result)
                log(f"  short run repeat {repeat + 1}/{repeats} {engine}: {result['cpu']:.1f} CPU s")
    return out


def measure(repeats: int, log, run_case, timed_command, python: str) -> dict:
    """The fixed-cost cases (``measure_fixed_cost``), the evaluation, the first layer and the study (the
    suite: ``suite.py``)."""
    out = measure_fixed_cost(repeats, log, run_case, timed_command, python)
    out.update({"eval": {"float64": [], "float32": []}, "study": {}, "first_layer": {"float64": [], "float32": []}})
    for _ in range(repeats):
        for dtype in out["eval"]:
            out["eval"][dtype].append(run_case({"impl": "charlm-eval", "dtype": dtype}))
            out["first_layer"][dtype].append(run_case({"impl": "charlm-first-layer", "dtype": dtype}))
    diloco = str(Path(python).parent / "diloco")
    study_repeats = max(1, min(3, repeats))  # a whole study is minutes; 3 repeats at most
    with tempfile.TemporaryDirectory() as runs:
        for repeat in range(study_repeats):
            for label, extra in (("fast (default)", []), ("reference", ["--engine", "reference"])):
                result = timed_command([diloco, *STUDY_ARGS, "--runs-dir", runs, *extra])
                out["study"].setdefault(label, []).append(result)
                log(f"  study repeat {repeat + 1}/{study_repeats} {label}: {result['cpu']:.0f} CPU s")
    return out


FIXED_START = "<!-- fixed-cost:start (benchmarks/bench.py --only fixed-cost rewrites this section) -->"
FIXED_END = "<!-- fixed-cost:end -->"


def fixed_cost_section(result: dict, median, loads, idle_load: float, heading: str = "") -> tuple[list, list]:
    """The fast engine's fixed cost beside its steady state, and the short run (between the markers); nothing
    for measurements made before either was recorded (``bench.py --from-raw`` of an older run)."""
    training, short = result["training"], result.get("short")
    if not short or not all("fixed_cpu" in r for results in training.values() for r in results):
        return [], []
    lines = [FIXED_START, "", "## The fast engine's fixed cost beside its steady state", ""]
    lines += [heading, ""] if heading else []
    lines += ["The char-LM training cases above (K = 8, H = 50: 400 worker-steps a round), each in a fresh "
              "process. *Fixed cost*: CPU seconds from the process's start to the end of round 1, less one "
              "steady round (imports, data, the executor; for *fast*, numba's import and the loading of its "
              "kernels, compiled once and cached on disk). *Steady round*: CPU seconds of one round after the "
              "warm-up. *Rounds to catch up*: the rounds after which the engine's total CPU is below the "
              "reference's (fixed + n x steady). Median (min-max) over the repeats.", "",
              "| dtype | executor | fixed cost, CPU s | steady round, CPU s | rounds to catch up "
              "| load average, median (max) |", "|---|---|---|---|---|---|"]

    def spread(values, digits=2):
        return f"{median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

    for dtype in ("float64", "float32"):
        ref = training[(dtype, "charlm-reference")]
        ref_fixed, ref_round = median([r["fixed_cpu"] for r in ref]), median([r["cpu"] / CHARLM["rounds"] for r in ref])
        for impl in ("charlm-reference", "charlm-fast", "charlm-fast-numpy"):
            results = training.get((dtype, impl), [])
            if not results:
                continue
            fixed, rounds = [r["fixed_cpu"] for r in results], [r["cpu"] / CHARLM["rounds"] for r in results]
            gain = ref_round - median(rounds)
            catch = "-" if impl == "charlm-reference" else (
                f"{max(0.0, (median(fixed) - ref_fixed) / gain):.1f}" if gain > 0 else "never")
            busy = loads(results)
            lines.append(f"| {dtype} | {impl.removeprefix('charlm-')} | {spread(fixed)} | {spread(rounds)} | {catch} "
                         f"| {median(busy):.2f} ({max(busy):.2f}) |")
    lines += ["", f"A short run, `.venv/bin/diloco {' '.join(SHORT_ARGS)} --engine ENGINE`: CPU seconds of the "
                  f"whole command (user + system of all its processes), median (min-max) of "
                  f"{len(short['fast'])} interleaved repeats; the fixed costs weigh most here.", "",
              "| engine | CPU s | wall s | load average, median (max) |", "|---|---|---|---|"]
    for engine, results in short.items():
        busy = loads(results)
        lines.append(f"| {engine} | {spread([r['cpu'] for r in results], 1)} "
                     f"| {median([r['wall'] for r in results]):.1f} | {median(busy):.2f} ({max(busy):.2f}) |")
    fast_cpu, ref_cpu = (median([r["cpu"] for r in short[e]]) for e in ("fast", "reference"))
    busy = loads(short["fast"] + short["reference"])
    state = " (loaded machine)" if busy and max(busy) >= idle_load else ""
    row = ("a 10-round char-LM compare costs less CPU on the fast engine than on the reference",
           f"{fast_cpu:.1f} s against {ref_cpu:.1f} s ({ref_cpu / fast_cpu:.2f}x)",
           ("met" if fast_cpu < ref_cpu else "**missed**") + state)
    lines += ["", f"Target: {row[0]}: {row[1]}, {row[2]}.", "", FIXED_END]
    return lines, [row]


def section(result: dict, median, loads, idle_load: float) -> tuple[list, list]:
    """The report's char-LM section and its target rows."""

    def state(results):
        busy = loads(results)
        return " (loaded machine)" if busy and max(busy) >= idle_load else ""

    def rate(results):
        return median([r["worker_steps"] / r["cpu"] for r in results])

    def spread(results):
        values = [r["worker_steps"] / r["cpu"] for r in results]
        return f"{median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

    training = result["training"]
    lines = ["", "## The char-LM, one BLAS thread", "",
             "Tiny Shakespeare, 390-128-65, batch 32, K = 8, H = 50, through the one driver: the reference "
             "executor (the milestone functions, which one-hot encode each batch) against the fast executor "
             "(`--engine fast`: the first layer gathered forward and scattered backward, AdamW and the scatter "
             "as numba loops; *fast-numpy*: both as NumPy passes, the engine without the `fast` extra), timed "
             f"over {CHARLM['rounds']} rounds after a warm-up round, no held-out evaluation (below). "
             "Worker-steps per CPU-second, median (min-max); the fixed cost before the first step: the next "
             "section.", "",
             "| dtype | executor | worker-steps per CPU-second | vs reference | load average, median (max) |",
             "|---|---|---|---|---|"]
    rows = []
    for dtype in ("float64", "float32"):
        ref, fast = training[(dtype, "charlm-reference")], training[(dtype, "charlm-fast")]
        ratio = rate(fast) / rate(ref)
        numpy_only = training.get((dtype, "charlm-fast-numpy"), [])
        for impl, results in (("reference", ref), ("fast", fast), ("fast-numpy", numpy_only)):
            if not results:
                continue
            busy = loads(results)
            lines.append(f"| {dtype} | {impl} | {spread(results)} | {rate(results) / rate(ref):.2f}x "
                         f"| {median(busy):.2f} ({max(busy):.2f}) |")
        goal = 2.5 if dtype == "float64" else 4.0
        rows.append((f"fast >= {goal}x the reference path on the char-LM, {dtype}", f"{ratio:.2f}x",
                     ("met" if ratio >= goal else "**missed**") + state(ref + fast)))
    lines += ["", "Held-out evaluation of the 8,192 windows (`held_out_metrics`: the first layer gathered from "
                  "the windows, then milestones 28 and 29 on the rest) against its matmul floor (the dense "
                  "`X W1` and `relu(.) W2` of a one-hot evaluation, timed alone); CPU milliseconds, best of 5 "
                  "per repeat, median over the repeats.", "",
              "| dtype | evaluation ms | matmul floor ms | evaluation / floor |", "|---|---|---|---|"]
    for dtype, results in result["eval"].items():
        ev, fl = median([r["eval"] for r in results]), median([r["floor"] for r in results])
        lines.append(f"| {dtype} | {1e3 * ev:.1f} | {1e3 * fl:.1f} | {ev / fl:.2f} |")
        rows.append((f"held-out evaluation <= 2x its matmul floor, {dtype}", f"{ev / fl:.2f}x",
                     ("met" if ev / fl <= 2 else "**missed**") + state(results)))
    first = result.get("first_layer")
    if first and first["float64"]:
        names = [name for name in first["float64"][0] if name.startswith(("dense", "scatter"))]
        lines += ["", "The first layer's gradient `dW_1 = x^T dz_1` of one step's one-hot batches (K = 8, b = 32, "
                      "390 x 128, real windows): the dense product against the engine's scatter "
                      "(`diloco.engine.stack`), CPU microseconds, best of 5 x 200 calls per repeat, median over "
                      "the repeats; the engine scatters (the two kernels are equal to the last bit).", "",
                  "| dtype | " + " | ".join(names) + " | dense / scatter, " + names[-1].split(", ")[-1] + " |",
                  "|---|" + "---|" * (len(names) + 1)]
        for dtype, results in first.items():
            cells = {name: median([r[name] for r in results]) for name in names}
            lines.append(f"| {dtype} | " + " | ".join(f"{cells[n]:.0f}" for n in names)
                         + f" | {cells[names[0]] / cells[names[-1]]:.2f}x |")
    study = result["study"]
    if study:
        fast_cpu = median([r["cpu"] for r in study["fast (default)"]])
        ref_cpu = median([r["cpu"] for r in study["reference"]])
        lines += ["", f"`diloco {' '.join(STUDY_ARGS)}`: CPU seconds of the whole command (all its processes), "
                      f"median (min-max) of {len(study['fast (default)'])} interleaved repeats.", "",
                  "| engine | CPU s | wall s |", "|---|---|---|"]
        for label, results in study.items():
            cpus, walls = [r["cpu"] for r in results], [r["wall"] for r in results]
            lines.append(f"| {label} | {median(cpus):.0f} ({min(cpus):.0f}-{max(cpus):.0f}) "
                         f"| {median(walls):.0f} |")
        rows.append((f"the study (table2, shakespeare, 5 seeds) >= 3x less CPU than {STUDY_BEFORE_CPU:.0f} s",
                     f"{fast_cpu:.0f} s ({STUDY_BEFORE_CPU / fast_cpu:.2f}x less; {ref_cpu / fast_cpu:.2f}x less "
                     f"than --engine reference in this run)",
                     ("met" if STUDY_BEFORE_CPU / fast_cpu >= 3 else "**missed**")
                     + state(study["fast (default)"])))
    fixed_lines, fixed_rows = fixed_cost_section(result, median, loads, idle_load)
    return lines + [""] + fixed_lines, rows + fixed_rows
