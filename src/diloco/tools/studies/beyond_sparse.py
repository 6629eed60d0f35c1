"""``diloco study sparse``: sparse outer gradients (SparseLoCo, DeMo) against DiLoCo at equal bytes.

Seven arms on one task (``--data shakespeare`` or ``--data mnist1d``), K = 4 workers, H = 5,
200 rounds (1,000 steps per worker: at 2% density a value waits about 50 rounds to be sent,
so the error feedback has four such cycles). The first five keep DiLoCo's outer Nesterov,
so only the wire differs; the last two follow SparseLoCo's recipe, in which the
error-feedback buffer (decay beta) replaces the outer momentum: outer SGD without momentum.

Every arm is tuned on seed 1000, never a reported seed (``sparse_tuning_steps``, through
``paper_runs.tune_arms``): the inner lr on full-precision DiLoCo for all arms (the arms
differ only in the outer step and the wire), then each Nesterov arm's outer lr x momentum
over ``OUTER_LRS`` x ``OUTER_MOMENTA`` and each SparseLoCo arm's outer lr x beta over
``SGD_LRS`` x ``DECAYS``, each grid extended past a chosen edge (``past_the_edge``). The
grids and the choices are printed under the tables. The arms:

* ``DiLoCo (float64)``: full precision, the ring all-reduce's ``2 (K-1)/K N 8`` bytes a round;
* ``DiLoCo fp4``: 4-bit outer gradients (E2M1, one scale per 32 values), the byte budget
  of the equal-bytes arms;
* ``top-k 2-bit + EF``: SparseLoCo's transform, chunks of 4096, values as 2-bit codes,
  error feedback, at the density ``matched_density`` finds: the largest multiple of 0.1%
  whose message does not cost more bytes a round than ``DiLoCo fp4`` (counted exactly,
  ``methods.sparse.encoded_nbytes``);
* ``top-k 2-bit, no EF``: the same bytes, the residual dropped;
* ``DeMo: DCT top-k + EF``: top-k of the chunked DCT (chunks of 1024), values at full
  width, at its own matched density;
* ``SparseLoCo (SGD outer) top-k 2-bit + EF``: SparseLoCo's recipe at the matched density
  of the third arm;
* ``SparseLoCo (SGD outer) 2%``: the paper's setting, 2% of each chunk, 2-bit, error
  feedback (far fewer bytes than every other arm).

The char-LM is evaluated on 2,048 held-out windows (``--eval-windows``), every round.
Every run (tuning included) is kept in the run cache (``--run-cache DIR``, by default
``RUNS_DIR/study-cache``; ``diloco.tools.studies.runner``), so a study cut short resumes.
The claims (``Claim``) are judged as the paper studies' (``paper_report``): paired over
seeds, 95% interval, the five verdict words. ``--export DIR`` writes
``DIR/beyond-sparse-<task>.json``; ``render_named`` renders the ``beyond-sparse-*`` blocks of
``docs/results-beyond.md`` from those files, through ``results_page`` (the one renderer, which
``python -m diloco.tools.studies.beyond_sparse`` runs on that page; a test requires the page
to hold exactly that).
"""

from __future__ import annotations

import sys

import numpy as np

from diloco.core.quantize import encode
from diloco.methods.sparse import SparseConfig, encoded_nbytes
from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flags import load_dataset
from diloco.tools.studies.paper_report import (
    judge_claims,
    render_tables,
    summarise_arms,
    verdict,
)
from diloco.tools.studies.paper_runs import (
    FEEDBACK_DECAY,
    INNER_LR,
    OUTER_STEP,
    TuneStep,
    around,
    outer_step_grid,
    per_arm,
    write_study,
)
from diloco.tools.studies.paper_studies import Arm, Claim
from diloco.tools.studies.runner import Done, Plan, StudySpec, budget, check_seeds, check_tune_seeds, task_config
from diloco.tools.studies.summaries import block_pattern, exports, missing_block
from diloco.tools.studies.tuning_table import render_tuning

__all__ = ["TASKS", "K", "H", "FP4_BLOCK", "tensor_shapes", "fp4_round_bytes", "sparse_round_bytes",
           "matched_density", "sparse_arms", "sparse_claims", "SparseSpec", "render_bytes_table",
           "render_block", "render_named"]

TASKS = {
    "shakespeare": {"hidden_sizes": (128,), "inner": {"lr": 3e-3}, "steps": 1000},
    "mnist1d": {"hidden_sizes": (128,), "inner": {"lr": 1e-3}, "steps": 1000},
}
K, H = 4, 5
EVAL_WINDOWS = 2048  # the char-LM's held-out windows (--eval-windows), evaluated every round
FP4_BLOCK = 32
TOPK_CHUNK, DCT_CHUNK = 4096, 1024
PAPER_DENSITY = 0.02
# SparseLoCo's recipe: the error-feedback buffer (decay beta) replaces the outer momentum.
SPARSELOCO_OUTER = {"outer_optimizer": "sgd", "outer_momentum": 0.0, "nesterov": False, "outer_lr": 1.0}
SPARSELOCO_FEEDBACK = {"error_feedback": True, "topk_decay": 0.95}
# The tuning grids (each extended past a chosen edge); the tuning seed is never reported.
OUTER_LRS, OUTER_MOMENTA = (0.5, 0.7, 1.0), (0.5, 0.9)
# Outer SGD without momentum takes larger steps than Nesterov, whose momentum 0.9 multiplies
# a steady step about tenfold: on the char-LM its tuning still improved at lr 8 on a grid
# of 1, 2, 4 extended twice.
SGD_LRS, DECAYS = (2.0, 4.0, 8.0), (0.9, 0.95, 0.99)
MARGIN = 0.05  # "comparable": a relative cost under 5% of the metric
BLOCK = block_pattern(r"beyond-sparse-[\w-]+")


def tensor_shapes(num_features: int, hidden_sizes, num_classes: int) -> list:
    """The MLP's tensors: per layer its weight (in, out) and its bias (out,)."""
    widths = (num_features, *hidden_sizes, num_classes)
    return [shape for a, b in zip(widths[:-1], widths[1:], strict=True) for shape in ((a, b), (b,))]


def fp4_round_bytes(shapes, workers: int, block: int = FP4_BLOCK) -> float:
    """Bytes a worker sends a round with ``--comm-dtype fp4``: ``(K-1)/K (payload + reduced payload)``."""
    payload = sum(encode(np.zeros(shape), "fp4", block_size=block).nbytes for shape in shapes)
    return (workers - 1) / workers * 2 * payload


def sparse_round_bytes(shapes, workers: int, config: SparseConfig, dtype=np.float64) -> float:
    """Bytes a worker sends a round with sparse outer gradients: ``(K-1)`` copies of its message."""
    return float((workers - 1) * sum(encoded_nbytes(int(np.prod(s)), config, dtype) for s in shapes))


def matched_density(shapes, workers: int, budget: float, **sparse) -> float:
    """The largest density, a multiple of 0.001, whose round costs at most ``budget`` bytes."""
    best = None
    for step in range(1, 1001):
        density = step / 1000
        if sparse_round_bytes(shapes, workers, SparseConfig(density=density, **sparse)) > budget:
            break
        best = density
    if best is None:
        raise ValueError(f"no density fits {budget:.0f} bytes a round")
    return best


def sparse_arms(shapes, workers: int, steps: int, inner_steps: int) -> list:
    """The seven arms of the module doc, for a model of ``shapes`` (densities matched to fp4's bytes)."""
    budget = fp4_round_bytes(shapes, workers)
    topk = matched_density(shapes, workers, budget, chunk=TOPK_CHUNK, bits=2)
    dct = matched_density(shapes, workers, budget, chunk=DCT_CHUNK, transform="dct")
    shared = {"num_workers": workers, "inner_steps": inner_steps, "rounds": steps // inner_steps}
    two_bit = {"topk_chunk": TOPK_CHUNK, "topk_bits": 2}
    return [
        Arm("DiLoCo (float64)", "diloco", shared),
        Arm("DiLoCo fp4", "diloco", {**shared, "family": {"comm_dtype": "fp4", "comm_block": FP4_BLOCK}}),
        Arm(f"top-k {topk:.1%} 2-bit + EF", "diloco",
            {**shared, "family": {"topk": topk, **two_bit, "error_feedback": True}}),
        Arm(f"top-k {topk:.1%} 2-bit, no EF", "diloco", {**shared, "family": {"topk": topk, **two_bit}}),
        Arm(f"DeMo: DCT top-k {dct:.1%} + EF", "diloco",
            {**shared, "family": {"topk": dct, "topk_chunk": DCT_CHUNK, "topk_transform": "dct",
                                  "error_feedback": True}}),
        Arm(f"SparseLoCo (SGD outer) top-k {topk:.1%} 2-bit + EF", "diloco",
            {**shared, **SPARSELOCO_OUTER, "family": {"topk": topk, **two_bit, **SPARSELOCO_FEEDBACK}}),
        Arm(f"SparseLoCo (SGD outer) {PAPER_DENSITY:.0%} 2-bit + EF", "diloco",
            {**shared, **SPARSELOCO_OUTER, "family": {"topk": PAPER_DENSITY, **two_bit, **SPARSELOCO_FEEDBACK}}),
    ]


SPARSELOCO = ('"extreme compression ratios of up to 1-3% sparsity and 2-bit quantization while outperforming '
              'full-precision DiLoCo" (SparseLoCo, abstract)')


def sparse_tuning_steps(arms, inner_lr: float) -> list:
    """``paper_runs.TuneStep`` list of the module doc: the inner lr (``inner_lr`` and its
    1-3-10 neighbours) probed on the first arm for all, then each Nesterov arm's outer lr x
    momentum, then each SGD-outer (SparseLoCo) arm's outer lr x feedback decay."""
    labels = tuple(arm.label for arm in arms)
    sgd = per_arm(arms, lambda a: a.changes.get("outer_optimizer") == "sgd")
    nesterov = per_arm(arms, lambda a: a.changes.get("outer_optimizer") != "sgd")
    decay = (OUTER_STEP[0], FEEDBACK_DECAY)
    return [TuneStep(INNER_LR, around(inner_lr), ((labels[0], labels),)),
            outer_step_grid(nesterov, OUTER_LRS, OUTER_MOMENTA),
            TuneStep(decay, tuple((lr, beta) for lr in SGD_LRS for beta in DECAYS), sgd)]


def sparse_claims(arms) -> list:
    full, fp4, topk, no_ef, demo, recipe, paper = (a.label for a in arms)
    return [
        Claim("SparseLoCo at 2%, 2-bit, with error feedback beats full-precision DiLoCo", paper, full, SPARSELOCO),
        Claim("At equal bytes, SparseLoCo (top-k 2-bit + EF, SGD outer) beats DiLoCo with fp4 outer gradients",
              recipe, fp4, "not in these words: SparseLoCo reports lower loss than DiLoCo at fewer bytes "
              "(abstract); the equal-bytes test is ours"),
        Claim("At equal bytes, error feedback makes top-k better (Nesterov outer)", topk, no_ef,
              '"outer momentum can be locally approximated by an error feedback combined with aggressive '
              'sparsity" (SparseLoCo, abstract)'),
        Claim(f"DeMo-style DCT top-k + EF costs under {MARGIN:.0%} against full-precision DiLoCo", full, demo,
              '"transmits up to 85x less data per GPU than AdamW-DDP while achieving comparable loss and accuracy" '
              "(DeMo, abstract; there against data-parallel AdamW)", margin=MARGIN),
    ]


def _num_features(data) -> int:
    encode_fn = getattr(data, "encode", None)
    return encode_fn.num_features if encode_fn is not None else int(data.x_train.shape[1])


class SparseSpec(StudySpec):
    """``diloco study sparse`` as a spec of the one runner (``runner.run_spec``)."""

    name = "sparse"

    def plan(self, args) -> Plan:
        task, config = task_config(args, TASKS, "sparse", num_workers=K, inner_steps=H)
        if getattr(args, "values", None):
            raise CliError("study sparse has fixed arms and takes no --values")
        steps = budget(args, TASKS[task]["steps"], config.inner_steps, rounds=False)
        seeds = check_seeds(args, config, 5, "this study's paired intervals")
        if task == "shakespeare" and getattr(args, "eval_windows", None) is None:
            args.eval_windows = EVAL_WINDOWS
        data, data_info = load_dataset(args, config.dtype)
        shapes = tensor_shapes(_num_features(data), config.hidden_sizes, data.num_classes)
        arms = sparse_arms(shapes, config.num_workers, steps, config.inner_steps)
        tune_seeds = check_tune_seeds(args, seeds, count=1)
        record = {"study": "sparse", "task": task, "steps_per_worker": steps, "seeds": seeds,
                  "arms": [a._asdict() for a in arms]}
        banner = f"study sparse on {task}: {len(arms)} arms x {len(seeds)} seeds, {steps} steps per worker"
        return Plan("sparse", f"study-sparse-{task}", config, arms, seeds, tune_seeds,
                    sparse_tuning_steps(arms, config.inner.lr), data, data_info, record, banner,
                    extra={"task": task, "steps": steps, "seeds_flag": args.seeds,
                           "num_samples": getattr(args, "num_samples", None)})

    def summary(self, plan: Plan, done: Done) -> dict:
        task, steps, extra = plan.extra["task"], plan.extra["steps"], plan.extra
        rows = summarise_arms(done.outcomes, done.arms)
        command = ".venv/bin/" + self.command(task, extra["seeds_flag"],
                                              ("--total-steps", steps if steps != TASKS[task]["steps"] else None),
                                              ("--num-samples", extra["num_samples"]))
        runs = done.tuned + done.outcomes
        return {"study": "sparse", "title": "Sparse outer gradients at equal bytes", "reference": "SparseLoCo, DeMo",
                "task": task, "data": plan.data_info, "config": plan.config.to_dict(), "steps_per_worker": steps,
                "seeds": plan.seeds, "tune_seeds": plan.tune_seeds, "tuning": done.tuning,
                "blas_threads": done.threads, "rows": rows,
                "claims": judge_claims(sparse_claims(done.arms), rows, task),
                "seconds": done.seconds, "command": command, "runs": len(runs),
                "run_seconds": sum(o["seconds"] for o in runs)}

    def write(self, plan: Plan, summary: dict, done: Done, args) -> None:
        write_study(done.run_dir, summary, f"Sparse outer gradients ({plan.extra['task']})", render_block(summary),
                    getattr(args, "export", None), f"beyond-sparse-{plan.extra['task']}", plots=not args.no_plots)



def render_bytes_table(summary: dict) -> str:
    """Markdown: each arm's bytes sent per worker over the run, and against full-precision DiLoCo."""
    rows = summary["rows"]
    full = rows[0]["bytes_sent"]
    lines = ["| arm | bytes sent per worker, whole run | of full-precision DiLoCo's |", "|---|---:|---:|"]
    lines += [f"| {row['arm']} | {row['bytes_sent']:,.0f} | {row['bytes_sent'] / full:.2%} |" for row in rows]
    return "\n".join(lines) + "\n"


def render_block(summary: dict) -> str:
    """The results page's block of one task: bytes, arms, claims."""
    return (render_bytes_table(summary) + "\n" + render_tables(summary)
            + f"\nSeeds {summary['seeds']}; {summary['steps_per_worker']} steps per worker, H = "
              f"{summary['config']['inner_steps']}; {summary['runs']} runs, tuning included, which trained for "
              f"{summary['run_seconds'] / 60:.1f} min in all (one process each; a run read from the run cache is "
              f"counted at its first training); this command's wall time {summary['seconds'] / 60:.1f} min.\n"
              + render_tuning(summary))


def render_named(name: str, summaries: dict) -> str:
    """The page's block ``beyond-sparse-<task>`` from ``summaries`` (``summaries.load_summaries``),
    each verdict judged again."""
    summary = exports(summaries, "beyond-sparse").get(name.removeprefix("beyond-sparse-"))
    if summary is None:
        return missing_block(name)
    for claim in summary["claims"]:
        claim["verdict"] = verdict(claim["metric_difference"], claim.get("margin"))
    return render_block(summary)


if __name__ == "__main__":  # python -m diloco.tools.studies.beyond_sparse: the page's blocks, by the one renderer
    from diloco.tools.studies.results_page import main

    raise SystemExit(main(sys.argv[1:] or ["docs/results-beyond.md"]))
