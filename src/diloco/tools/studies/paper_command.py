"""``diloco study table2|fig4|fig6|table3|fig8|fig9|splits|scaling``: the paper's artefacts in miniature.

One command runs a study (``diloco.tools.studies.paper_studies``) on one task (``--data
shakespeare`` or ``--data mnist1d``) over ``--seeds`` seeds, at ``--total-steps`` steps per
worker (or ``--rounds`` x ``--inner-steps``; the task's default otherwise), and writes a
run folder: ``config.json``, ``results.jsonl`` (one line per finished run), ``summary.json``
(per-arm statistics, the paired claims and their verdicts, ``diloco.tools.studies.paper_report``),
``study.md`` (the two tables) and ``study.png`` (mean curves, final values). Before the
evaluation seeds, each arm's inner lr is tuned over ``--inner-grid`` (the task's grid by
default; ``off`` keeps ``--lr``) on ``--tune-seeds`` seeds from 1000 on, and fig6's outer
lr after it; in table2, fig9 and scaling each DiLoCo arm's outer lr x outer momentum grid
(``paper_runs.outer_step_grid``), then its inner lr again at the chosen pair
(``diloco.tools.studies.paper_runs.tune_arms``). A tuning seed that is also a reported
seed (``--seed`` near 1000) is refused. With ``--run-cache DIR`` a run
already trained (same config, seed and data) is read back instead of trained again. With
``--export DIR`` the summary and the plot are also written as ``DIR/<study>-<task>.json``
and ``.png``: the files ``docs/results.md`` quotes.
"""

from __future__ import annotations

from diloco.tools.cli.errors import CliError
from diloco.tools.cli.flags import load_dataset
from diloco.tools.cli.run_setup import check_plotting, split_values
from diloco.tools.studies.paper_report import (
    judge_claims,
    render_tables,
    summarise_arms,
)
from diloco.tools.studies.paper_runs import parse_numbers, write_study
from diloco.tools.studies.paper_studies import TASKS, H, K, tuning_steps, with_warmup
from diloco.tools.studies.plots import plot_paper_study, plot_scaling_gap  # re-exported: where they were
from diloco.tools.studies.runner import Done, Plan, StudySpec, budget, check_seeds, check_tune_seeds, task_config

__all__ = ["PaperSpec", "plot_paper_study", "plot_scaling_gap"]

def _inner_grid(args, task: str) -> tuple:
    """``--inner-grid``: the task's grid by default, ``()`` for ``off`` (keep ``--lr``)."""
    text = getattr(args, "inner_grid", None)
    if text is None:
        return TASKS[task]["inner_grid"]
    if text.strip().lower() == "off":
        return ()
    try:
        return parse_numbers(split_values(text), float, "inner lr")
    except ValueError as exc:
        raise CliError(f"--inner-grid: {exc}".replace("--values: ", "").replace("--values ", "")) from None


def _outer_grid(args) -> tuple:
    """``--outer-grid LRS:MUS``: ``(lrs, momenta)``, ``()`` when not given (the default grid)."""
    text = getattr(args, "outer_grid", None)
    if text is None:
        return ()
    lrs, colon, momenta = text.partition(":")
    try:
        if not colon:
            raise ValueError
        pair = tuple(float(v) for v in split_values(lrs)), tuple(float(v) for v in split_values(momenta))
    except ValueError:
        raise CliError(f"--outer-grid must be LR1,LR2,...:MU1,MU2,..., got {text!r}") from None
    if not all(pair) or any(v <= 0 for v in pair[0]) or any(not 0 <= v < 1 for v in pair[1]):
        raise CliError(f"--outer-grid: outer lrs must be > 0 and momenta in [0, 1), got {text!r}")
    return pair


class PaperSpec(StudySpec):
    """A paper study (``paper_studies.PAPER_STUDIES``) as a spec of the one runner (``runner.run_spec``)."""

    def __init__(self, study) -> None:
        self.study, self.name = study, study.name

    def plan(self, args) -> Plan:
        study = self.study
        task, config = task_config(args, TASKS, study.name, num_workers=K, inner_steps=H, lr_schedule="cosine")
        steps = budget(args, TASKS[task]["steps"], config.inner_steps, multiple=False)
        seeds = check_seeds(args, config)
        values = split_values(args.values) if getattr(args, "values", None) else None
        inner_grid, outer_grid = _inner_grid(args, task), _outer_grid(args)
        try:
            chosen = None if study.values_tune else values
            arms = with_warmup(study.arms(config, steps, chosen, TASKS[task]["noniid_split"]), config)
            outer_values = parse_numbers(values, float, "outer lr") if study.values_tune else None
        except ValueError as exc:
            raise CliError(f"study {study.name}: {exc}") from None
        tuning = tuning_steps(study, arms, inner_grid, outer_values, outer_grid)
        tune_seeds = check_tune_seeds(args, seeds if tuning else [])
        tune_seeds = tune_seeds if tuning else []
        check_plotting(args)
        data, data_info = load_dataset(args, config.dtype)
        record = {"study": study.name, "task": task, "steps_per_worker": steps, "seeds": seeds,
                  "tune_seeds": tune_seeds, "arms": [a._asdict() for a in arms],
                  "tuning_steps": [t._asdict() for t in tuning], "values": list(values) if values else None}
        banner = (f"study {study.name} ({study.reference}) on {task}: {len(arms)} arms x {len(seeds)} seeds, "
                  f"{steps} steps per worker" + (f", tuned on seeds {tune_seeds}" if tuning else ""))
        expected = len(arms) * len(seeds) + sum(len(t.grid) * len(t.groups) for t in tuning) * len(tune_seeds)
        return Plan(study.name, f"study-{study.name}-{task}", config, arms, seeds, tune_seeds, tuning,
                    data, data_info, record, banner, expected_runs=expected,
                    extra={"task": task, "steps": steps, "values": values})

    def summary(self, plan: Plan, done: Done) -> dict:
        study, task, steps, values = self.study, plan.extra["task"], plan.extra["steps"], plan.extra["values"]
        rows = summarise_arms(done.outcomes, done.arms)
        info = plan.data_info
        return {
            "study": study.name, "title": study.title, "reference": study.reference, "task": task,
            "data": info, "config": plan.config.to_dict(), "steps_per_worker": steps, "seeds": plan.seeds,
            "tune_seeds": plan.tune_seeds, "tuning": done.tuning, "rows": rows,
            "cached_runs": sum(bool(o.get("cached")) for o in done.tuned + done.outcomes),
            "claims": judge_claims(study.claims(done.arms), rows, task),
            "seconds": done.seconds,
            "command": self.command(task, len(plan.seeds),
                                    ("--total-steps", steps if steps != TASKS[task]["steps"] else None),
                                    ("--values", ",".join(values) if values else None),
                                    ("--num-samples", info.get("num_samples")),
                                    ("--eval-windows", info.get("eval_windows"))),
        }

    def write(self, plan: Plan, summary: dict, done: Done, args) -> None:
        study, task = self.study, plan.extra["task"]
        table = render_tables(summary)
        figure = plot_scaling_gap if study.name == "scaling" else plot_paper_study
        write_study(done.run_dir, summary, f"{study.reference}: {study.title} ({task})", table,
                    getattr(args, "export", None), f"{study.name}-{task}", plots=not args.no_plots, figure=figure,
                    preface=f"Seeds {plan.seeds}; {plan.extra['steps']} steps per worker; paired differences "
                            f"over seeds.\n\n")

