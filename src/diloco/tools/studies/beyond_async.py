"""``diloco study async``: asynchronous DiLoCo against synchronous DiLoCo at equal simulated time.

Liu et al. 2024 ("Asynchronous Local-SGD Training for Language Modeling", arXiv
2401.09135) in miniature. K workers, one of them a straggler (``--straggler``, default
the last worker, ``--straggler-factor`` times slower, 4 by default; or ``--step-times``).
Four arms on the same seeds (so the same shards, initial model and speeds):

* ``synchronous DiLoCo``: every round waits for the straggler (``max_k H c_k``);
* ``async``: each group of arrivals is applied at once by the outer Nesterov step;
* ``async + delayed Nesterov``: the momentum step every N = K arrivals;
* ``async + DN + dynamic local steps``: and H_k in proportion to each worker's speed.

Every arm runs until the simulated clock (``diloco.core.schedule``) reaches the time
synchronous DiLoCo takes for ``--rounds`` rounds, T = R (H c_max + trip); its held-out
metrics at T (the last evaluation at or before T) are compared seed by seed
(``diloco.tools.studies.paper_report``: paired 95% intervals and the verdict words). The
time each arm takes to reach synchronous DiLoCo's mean loss at T is reported beside it.

``--export DIR`` writes ``DIR/beyond-async-<task>.json``; ``render_named`` renders it for
``docs/results-beyond.md`` (through ``results_page``, the one renderer, which
``python -m diloco.tools.studies.beyond_async`` runs on that page).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from diloco.core.driver import train
from diloco.core.schedule import async_plan, synchronous_round_seconds, worker_local_steps
from diloco.tools.cli.errors import CliError
from diloco.tools.studies.paper_report import (
    NOT_RUN,
    claim_rows,
    interval_text,
    judge_claims,
    render_tables,
    summarise_arms,
)
from diloco.tools.studies.paper_runs import Arm, around, outcome_of, self_tuning, write_study
from diloco.tools.studies.paper_studies import Claim
from diloco.tools.studies.runner import Done, Plan, StudySpec, check_seeds, check_tune_seeds, task_config
from diloco.tools.studies.study_stats import mean_interval
from diloco.tools.studies.summaries import block_pattern, exports

__all__ = ["NAME", "TASKS", "arms", "claims", "AsyncSpec", "render_block", "render_named",
           "equal_time_rounds"]

NAME = "async"
# Per task: the model, the inner lr, K, H and the rounds of synchronous DiLoCo that set T.
TASKS = {
    "shakespeare": {"hidden_sizes": (128,), "inner": {"lr": 3e-3}, "num_workers": 4, "inner_steps": 20, "rounds": 10},
    "digits": {"hidden_sizes": (64,), "inner": {"lr": 3e-3}, "num_workers": 4, "inner_steps": 20, "rounds": 10},
}
SYNC, ASYNC, DN, DYLU = ("synchronous DiLoCo", "async", "async + delayed Nesterov",
                         "async + DN + dynamic local steps")
PAPER = "Liu et al. 2024, abstract"


def arms(config) -> list:
    """The four arms over ``config.asynchrony``'s speeds (DN's N = K)."""
    speeds = {k: v for k, v in config.asynchrony.to_dict().items()
              if k in ("step_times", "speed_spread", "straggler", "straggler_factor")}
    period = config.num_workers
    return [Arm(SYNC, "diloco", {"asynchrony": {**speeds}}),
            Arm(ASYNC, "diloco", {"asynchrony": {**speeds, "asynchronous": True}}),
            Arm(DN, "diloco", {"asynchrony": {**speeds, "asynchronous": True, "delayed_nesterov": period}}),
            Arm(DYLU, "diloco", {"asynchrony": {**speeds, "asynchronous": True, "delayed_nesterov": period,
                                                "dynamic_local_steps": True}})]


def claims(_arms=None) -> list:
    """The paper's claims, as orderings of two arms at equal simulated time."""
    return [
        Claim("asynchronous DiLoCo with delayed Nesterov and dynamic local updates beats synchronous DiLoCo "
              "in wall-clock time", DYLU, SYNC,
              f"\"significantly surpasses it in terms of wall clock time\" ({PAPER})"),
        Claim("delayed Nesterov beats plain asynchronous Nesterov (stale momentum is the challenge)", DN, ASYNC,
              f"\"We identify momentum acceleration on the global parameters when worker gradients are stale "
              f"as a key challenge\" ({PAPER})"),
        Claim("dynamic local updates improve on delayed Nesterov alone", DYLU, DN,
              f"\"adjusts the workers' local training steps based on their computation speed\" ({PAPER})"),
        Claim("plain asynchronous DiLoCo beats synchronous DiLoCo in wall-clock time (our question, not a claim "
              "of the paper)", ASYNC, SYNC,
              f"not claimed; per update the paper finds the opposite: \"with naive implementations, asynchronous "
              f"Local-SGD takes more iterations to converge than its synchronous counterpart\" ({PAPER})"),
    ]


def equal_time_rounds(config, horizon: float) -> int:
    """The rounds an asynchronous ``config`` needs for its clock to reach ``horizon`` seconds."""
    rounds = max(1, config.rounds)
    while True:
        plan = async_plan(config.replace(rounds=rounds))
        for index, groups in enumerate(plan):
            if groups[-1].time >= horizon - 1e-9:
                return index + 1
        rounds *= 2


def _at(history: list, horizon: float) -> list:
    """The records up to simulated second ``horizon`` (the evaluation at or before it is the last)."""
    kept = [r for r in history if r["sim_cumulative_seconds"] <= horizon + 1e-9]
    if not kept:
        raise ValueError(f"no evaluation within {horizon:g} simulated seconds: run more rounds")
    return kept


def _steps_per_worker(history: list, config) -> int:
    if not config.asynchrony.asynchronous:
        return len(history) * config.inner_steps
    steps = worker_local_steps(config)
    counts = np.zeros(config.num_workers, dtype=np.int64)
    for record in history:
        for k in record["arrivals"]:
            counts[k] += steps[k]
    return int(counts.max())


def horizon_of(config, seed: int) -> float:
    """T for ``seed``: synchronous DiLoCo's R rounds, each the slowest worker's trip (the speeds may
    be drawn from the seed)."""
    return config.rounds * synchronous_round_seconds(config.replace(seed=int(seed)), 0.0)


def run_arm(arm: Arm, base, seed: int, data, history=None) -> dict:
    """Train ``arm`` with ``seed`` until the clock passes T (``horizon_of``); the outcome at T
    (``history``, the study runner's writer, is not used: the outcome keeps the curve)."""
    config = base.replace(**arm.changes, seed=int(seed))
    horizon = horizon_of(base, seed)
    if config.asynchrony.asynchronous:
        config = config.replace(rounds=equal_time_rounds(config, horizon))
    start = time.perf_counter()
    result = train("diloco", data.x_train, data.y_train, config, x_eval=data.x_test, y_eval=data.y_test,
                   encode=data.encode, executor=config.engine)
    seconds = time.perf_counter() - start
    history = _at(result.history, horizon)
    outcome = outcome_of(arm, seed, config, history, seconds, config.engine)
    outcome["steps_per_worker"] = _steps_per_worker(history, config)
    outcome["sim_seconds"] = history[-1]["sim_cumulative_seconds"]
    outcome["time_curve"] = [[r["sim_cumulative_seconds"], r["eval_loss"]] for r in result.history]
    return outcome


def _time_to(curve: list, target: float):
    return next((t for t, loss in curve if loss <= target), None)


def _time_to_target(outcomes: list, rows: list) -> dict:
    """Each arm's simulated seconds to reach synchronous DiLoCo's mean held-out loss at T."""
    sync = next(row for row in rows if row["arm"] == SYNC)
    target = float(np.mean(sync["per_seed_eval_loss"]))
    table = {"target_loss": target, "arms": []}
    for row in rows:
        times = [_time_to(o["time_curve"], target) for o in sorted(outcomes, key=lambda o: o["seed"])
                 if o["arm"] == row["arm"]]
        reached = [t for t in times if t is not None]
        table["arms"].append({"arm": row["arm"], "per_seed": times, "reached": len(reached), "seeds": len(times),
                              "seconds": mean_interval(reached) if len(reached) >= 2 else None})
    return table


def _base(args) -> tuple:
    """``(task, config)``: the task's, the flags', the default straggler; the per-arm flags refused."""
    task, config = task_config(args, TASKS, NAME, own=("num_workers", "inner_steps", "rounds"))
    if not config.asynchrony.simulates_speeds:  # the default straggler: the last worker, 4x slower
        config = config.replace(asynchrony={"straggler": config.num_workers - 1, "straggler_factor": 4.0})
    if config.asynchrony.asynchronous or config.asynchrony.delayed_nesterov or config.asynchrony.dynamic_local_steps:
        raise CliError("study async sets --async, --delayed-nesterov and --dynamic-local-steps per arm: "
                       "give only the speeds (--step-times, --speed-spread, --straggler, --straggler-factor)")
    return task, config


class AsyncSpec(StudySpec):
    """``diloco study async`` as a spec of the one runner (``runner.run_spec``): each run is
    ``run_arm`` (stopped at T), cached under the runner name ``"async"``."""

    name = NAME

    def plan(self, args) -> Plan:
        from diloco.core.driver import check_algorithm
        from diloco.tools.cli.flags import load_dataset

        task, config = _base(args)
        seeds = check_seeds(args, config)
        study_arms = arms(config)
        try:
            for arm in study_arms:
                check_algorithm("diloco", config.replace(**arm.changes))
        except ValueError as exc:
            raise CliError(f"study async: {exc}") from None
        data, data_info = load_dataset(args, config.dtype)
        if config.family.simulates_network:
            raise CliError("study async compares compute time only: leave out --bandwidth")
        horizons = [horizon_of(config, seed) for seed in seeds]
        horizon = horizons[0] if len(set(horizons)) == 1 else horizons
        record = {"study": NAME, "task": task, "horizon_seconds": horizon, "seeds": seeds,
                  "arms": [a._asdict() for a in study_arms]}
        banner = (f"study async (Liu et al. 2024) on {task}: {len(study_arms)} arms x {len(seeds)} seeds, "
                  f"equal simulated time {horizon} s ({config.rounds} synchronous rounds)")
        return Plan(NAME, f"study-async-{task}", config, study_arms, seeds,
                    check_tune_seeds(args, seeds, count=1), self_tuning(study_arms, around(config.inner.lr)),
                    data, data_info, record, banner, run=run_arm, runner="async",
                    extra={"task": task, "horizon": horizon, "seeds_flag": args.seeds})

    def summary(self, plan: Plan, done: Done) -> dict:
        task, config, outcomes = plan.extra["task"], plan.config, done.outcomes
        rows = summarise_arms(outcomes, done.arms)
        for row in rows:
            row["sim_seconds"] = float(np.mean([o["sim_seconds"] for o in outcomes if o["arm"] == row["arm"]]))
        changed = [(flag, getattr(config, name) if getattr(config, name) != TASKS[task][name] else None)
                   for flag, name in (("--workers", "num_workers"), ("--inner-steps", "inner_steps"),
                                      ("--rounds", "rounds"))]
        command = [self.command(task, plan.extra["seeds_flag"], *changed)]
        return {"study": NAME, "title": "asynchronous DiLoCo against synchronous DiLoCo at equal simulated time",
                "reference": "Liu et al. 2024, arXiv 2401.09135", "task": task, "data": plan.data_info,
                "config": config.to_dict(), "horizon_seconds": plan.extra["horizon"], "seeds": plan.seeds,
                "rows": rows, "tune_seeds": plan.tune_seeds, "tuning": done.tuning,
                "claims": judge_claims(claims(), rows, task), "time_to_target": _time_to_target(outcomes, rows),
                "seconds": done.seconds, "command": " ".join(command + _speed_flags(config))}

    def write(self, plan: Plan, summary: dict, done: Done, args) -> None:
        export, task = getattr(args, "export", None), plan.extra["task"]
        write_study(done.run_dir, summary, f"Asynchronous DiLoCo ({task})", render_block(summary, export), export,
                    f"beyond-async-{task}{_suffix(plan.config)}", plots=not args.no_plots)



def _speed_flags(config) -> list:
    """The speed flags of ``config`` that differ from the study's default straggler."""
    section, flags = config.asynchrony, []
    if section.step_times is not None:
        flags += ["--step-times", ",".join(f"{t:g}" for t in section.step_times)]
    if section.speed_spread:
        flags += ["--speed-spread", f"{section.speed_spread:g}"]
    if section.straggler is not None and (section.straggler != config.num_workers - 1 or section.speed_spread
                                          or section.step_times is not None):
        flags += ["--straggler", str(section.straggler)]
    if section.straggler is not None and section.straggler_factor != 4.0:
        flags += ["--straggler-factor", f"{section.straggler_factor:g}"]
    return flags


def _suffix(config) -> str:
    """``""`` for the default straggler, else e.g. ``"-spread0.5"``: one exported file per setting."""
    flags = _speed_flags(config)
    return "" if not flags else "-" + "".join(f.lstrip("-").split("-")[-1] if f.startswith("--") else f
                                              for f in flags).replace(",", "_")


def _time_table(summary: dict) -> str:
    table = summary["time_to_target"]
    lines = [f"| arm | simulated seconds to synchronous DiLoCo's mean held-out loss at T ({table['target_loss']:.3f}), "
             "mean [95% CI] | seeds that reached it |", "|---|---|---:|"]
    for row in table["arms"]:
        seconds = "n/a" if row["seconds"] is None else interval_text(row["seconds"], digits=0)
        lines.append(f"| {row['arm']} | {seconds} | {row['reached']} of {row['seeds']} |")
    return "\n".join(lines) + "\n"


def render_block(summary: dict, export="docs/assets/results") -> str:
    """The page's block for one task: the command (with ``--export EXPORT`` when given: the
    results page's files are exported, a run folder's study.md says what was run), the
    arms, the claims, the time to target."""
    config = summary["config"]
    speeds = config["asynchrony"]
    horizon = summary["horizon_seconds"]
    horizon = (f"{horizon:g} simulated seconds" if not isinstance(horizon, list) else
               "the seed's own time (" + ", ".join(f"{h:.0f}" for h in horizon) + " simulated seconds)")
    command = summary["command"] + (f" --export {export}" if export else "")
    return (f"Command: `.venv/bin/{command}` "
            f"({summary['seconds'] / 60:.1f} min of wall time, one process). K = {config['num_workers']}, "
            f"H = {config['inner_steps']}, speeds "
            f"{_speeds(speeds, config['num_workers'])}; every arm is compared at T = {horizon}, "
            f"{config['rounds']} synchronous rounds; seeds {summary['seeds']}. Steps/worker: the fastest worker's "
            f"steps by T, and all-reduces: outer steps (groups of arrivals), both of seed {summary['seeds'][0]}.\n\n"
            + render_tables(summary) + "\n" + _time_table(summary)
            + _tuning_text(summary))


def _tuning_text(summary: dict) -> str:
    """The grids and choices (``tuning_table.render_tuning``), or that nothing was tuned."""
    if not summary.get("tuning"):
        return "\nNot tuned: every arm at the study's inner lr and the outer lr and momentum of the config.\n"
    from diloco.tools.studies.tuning_table import render_tuning

    return render_tuning(summary)


def _speeds(section: dict, num_workers: int) -> str:
    if section.get("step_times"):
        return "c = " + ", ".join(f"{t:g}" for t in section["step_times"]) + " s per step"
    text = "1 s per step" if not section.get("speed_spread") else f"log-normal, spread {section['speed_spread']:g}"
    if section.get("straggler") is not None:
        text += f", worker {section['straggler']} {section['straggler_factor']:g}x slower"
    return text


BLOCK = block_pattern(r"beyond-async[\w.-]*")


def _summary_table(summaries: dict) -> str:
    """One row per claim: each task's verdict and the combined one (the weakest run)."""
    tasks = sorted(summaries, key=lambda name: (not name.startswith("shakespeare"), name))
    lines = ["| claim | the paper | " + " | ".join(f"{_label(t)}" for t in tasks) + " | verdict |",
             "|---|---|" + "---|" * len(tasks) + "---|"]
    rows = claim_rows([(c.text, c.paper, c.text) for c in claims()], [summaries[t] for t in tasks],
                      lambda _, judged: NOT_RUN if judged is None else judged["verdict"])
    return "\n".join(lines + rows) + "\n"


def _label(name: str) -> str:
    """``shakespeare-spread0.5`` -> ``char-LM, speeds spread 0.5``."""
    task, _, setting = name.partition("-")
    words = {"shakespeare": "char-LM"}.get(task, task)
    return f"{words}, " + ("one straggler" if not setting else setting.replace("spread", "speeds spread "))


def render_named(name: str, summaries: dict) -> str:
    """The body of the page's block ``name``: ``beyond-async`` (the claims) or ``beyond-async-<task>``,
    from ``summaries`` (``summaries.load_summaries``), judged by today's claims and words."""
    exported = exports(summaries, "beyond-async")
    for summary in exported.values():
        summary["claims"] = judge_claims(claims(), summary["rows"], summary["task"])
    if name == "beyond-async":
        return _summary_table(exported)
    task = name.removeprefix("beyond-async-")
    if task not in exported:
        raise ValueError(f"no summary docs/assets/results/{name}.json for the block {name}")
    return render_block(exported[task])


if __name__ == "__main__":  # python -m diloco.tools.studies.beyond_async: the page's blocks, by the one renderer
    from diloco.tools.studies.results_page import main

    raise SystemExit(main(sys.argv[1:] or ["docs/results-beyond.md"]))
