"""The paper's tables and figures in miniature: arms, claims, and the runs behind them.

Six studies, each named after the artefact of Douillard et al. (2023) it reproduces:

* ``table2``: a 1-worker baseline, the 8x-batch synchronous baseline, 8x the updates on
  one worker, and DiLoCo (K = 8), at the same steps per worker.
* ``fig4``: inner steps H at a fixed number of steps per worker, against sync.
* ``fig6``: outer optimizers (Nesterov, heavy ball, SGD, Adam), each with its outer
  learning rate tuned over a grid on tuning seeds that are not the evaluation seeds.
* ``table3``: K = 1 .. 16 workers at fixed steps per worker, IID and non-IID shards.
* ``fig8``: outer gradients dropped with probability p, IID and non-IID.
* ``fig9``: DiLoCo with a single worker against the plain 1-worker baseline.

An arm is a label, an algorithm and the config fields it changes on the study's base.
Every arm runs on every seed; a seed fixes the shards, the initial model and the
mini-batch streams, so arms with the same K see the same mini-batches, and differences
between arms are compared seed by seed (``diloco.tools.studies.paper_report``). Each claim is a
``Claim``: which arm the paper found better, by how much, and where it says so.

Budget: ``steps`` per worker (``--total-steps``, or ``--rounds`` x ``--inner-steps``);
per-data defaults in ``TASKS``. Running an arm and tuning the outer learning rate are in
``diloco.tools.studies.paper_runs`` (re-exported here). NumPy only; the command is
``diloco.tools.studies.paper_command``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from diloco.config import DiLoCoConfig
from diloco.tools.studies.paper_runs import Arm, arm_engine, outcome_of, parse_numbers, run_arm, tune_outer_lr

__all__ = ["Arm", "Claim", "PaperStudy", "TASKS", "PAPER_STUDIES", "OUTER_GRID", "arm_engine", "run_arm",
           "tune_outer_lr", "outcome_of"]


class Claim(NamedTuple):
    """One claim of the paper about two arms, judged on the task's held-out metric.

    An ordering: ``better`` is the arm the paper found better (lower perplexity), ``worse``
    the other. With ``margin`` (a fraction), a robustness claim instead: ``worse`` costs
    less than ``margin`` relative to ``better``. ``paper`` gives the paper's numbers or
    words and where they are.
    """

    text: str
    better: str
    worse: str
    paper: str
    margin: float | None = None


class PaperStudy(NamedTuple):
    name: str
    title: str
    reference: str
    arms: Callable  # (base config, steps per worker, values or None) -> [Arm]
    claims: Callable[[list], list]  # (arms) -> [Claim]
    tune: dict | None = None  # fig6: {arm label: (config field, grid)}


# Per task: the model, the inner lr and the default budget (steps per worker). The inner
# lr is the constant AdamW lr at which the 8x-batch baseline did best in a short probe;
# the paper's own values (4e-4, weight decay 0.1, warmup then cosine decay) are for
# transformers at 512 x 1024 tokens a step and are available as flags.
TASKS = {
    "shakespeare": {"hidden_sizes": (128,), "inner": {"lr": 3e-3}, "steps": 1000},
    "mnist1d": {"hidden_sizes": (128,), "inner": {"lr": 1e-3}, "steps": 2000},
}
K = 8  # workers, as the paper's main setting (the study default; -K changes it)
H = 50  # inner steps of the main setting (the paper's 500, at our small budgets; -H changes it)

# The paper tunes each outer optimizer's lr over {1, .7, .5, .3, .1}; the grid adds 2 and
# 3 because outer SGD without momentum takes unit-size steps where momentum takes ~1/(1-mu).
OUTER_GRID = (0.1, 0.3, 0.5, 0.7, 1.0, 2.0, 3.0)


def _no_values(study: str, values) -> None:
    if values:
        raise ValueError(f"study {study} has fixed arms and takes no --values")


def _rounds(steps: int, h: int) -> int:
    if steps % h:
        raise ValueError(f"steps per worker ({steps}) must be a multiple of H={h}; set --total-steps")
    return steps // h


def _table2_arms(base: DiLoCoConfig, steps: int, values=None) -> list:
    _no_values("table2", values)
    k, h = base.num_workers, base.inner_steps
    one = {"num_workers": 1, "inner_steps": h, "rounds": _rounds(steps, h)}
    return [
        Arm("baseline (1 worker)", "sync", one),
        Arm(f"{k}x batch (sync, K={k})", "sync", {"num_workers": k, "inner_steps": h, "rounds": _rounds(steps, h)}),
        Arm(f"{k}x updates (1 worker, {k}x steps)", "sync", {**one, "rounds": k * _rounds(steps, h)}),
        Arm(f"DiLoCo (K={k}, H={h})", "diloco", {"num_workers": k, "inner_steps": h, "rounds": _rounds(steps, h)}),
    ]


def _table2_claims(arms) -> list:
    base, batch, updates, diloco = (a.label for a in arms)
    return [
        Claim("DiLoCo beats the 8x-batch synchronous baseline", diloco, batch,
              "15.02 vs 15.30 perplexity (Table 2)"),
        Claim("DiLoCo beats the 1-worker baseline", diloco, base, "15.02 vs 16.23 (Table 2)"),
        Claim("8x updates on one worker beat DiLoCo", updates, diloco, "14.72 vs 15.02 (Table 2)"),
        Claim("8x batch beats the 1-worker baseline", batch, base, "15.30 vs 16.23 (Table 2)"),
    ]


FIG4_H = (10, 25, 50, 100, 250, 500)


def _fig4_arms(base: DiLoCoConfig, steps: int, values=None) -> list:
    k, h_sync = base.num_workers, base.inner_steps
    chosen = parse_numbers(values, int, "H") or FIG4_H
    arms = [Arm(f"H={h}", "diloco", {"num_workers": k, "inner_steps": h, "rounds": _rounds(steps, h)})
            for h in chosen if steps % h == 0 and steps // h >= 2]
    if not arms:
        raise ValueError(f"no H in {chosen} leaves two rounds or more of {steps} steps per worker")
    arms.append(Arm(f"sync (K={k})", "sync", {"num_workers": k, "inner_steps": h_sync,
                                              "rounds": _rounds(steps, h_sync)}))
    return arms


def _fig4_claims(arms) -> list:
    labels = {a.label for a in arms if a.algo == "diloco"}
    pairs = [("H=50", "H=250", "communicating every 50 steps beats every 250",
              "perplexity rises slowly with H, from H=50 to H=2000 (Fig. 4)"),
             ("H=50", "H=500", "communicating every 50 steps beats every 500", "H=50 below H=500 (Fig. 4)"),
             ("H=10", "H=50", "communicating every 10 steps beats every 50",
              "not tested (Fig. 4 starts at H=50): the trend, extrapolated")]
    return [Claim(text, better, worse, paper) for better, worse, text, paper in pairs if {better, worse} <= labels]


OUTER_ARMS = {
    "Nesterov (mu 0.9)": {"outer_optimizer": "sgd", "outer_momentum": 0.9, "nesterov": True},
    "heavy ball (mu 0.9)": {"outer_optimizer": "sgd", "outer_momentum": 0.9, "nesterov": False},
    "SGD (no momentum)": {"outer_optimizer": "sgd", "outer_momentum": 0.0, "nesterov": False},
    "Adam (b1 0.9, eps 0.1)": {"outer_optimizer": "adam", "outer_momentum": 0.9, "outer_eps": 0.1},
}


def _fig6_arms(base: DiLoCoConfig, steps: int, values=None) -> list:
    h = base.inner_steps
    shared = {"num_workers": base.num_workers, "inner_steps": h, "rounds": _rounds(steps, h)}
    return [Arm(label, "diloco", {**shared, **changes}) for label, changes in OUTER_ARMS.items()]


def _fig6_claims(arms) -> list:
    nesterov, heavy, sgd, adam = (a.label for a in arms)
    return [
        Claim("Nesterov beats outer SGD without momentum (each lr tuned)", nesterov, sgd,
              "Nesterov best, SGD (FedAvg at lr 1) worst (Fig. 6)"),
        Claim("Nesterov beats outer Adam (each lr tuned)", nesterov, adam, "Nesterov below Adam (Fig. 6)"),
        Claim("Nesterov beats heavy-ball momentum (each lr tuned)", nesterov, heavy,
              "Nesterov is the paper's choice; heavy ball is not in Fig. 6"),
    ]


TABLE3_K = (1, 2, 4, 8, 16)


def _table3_arms(base: DiLoCoConfig, steps: int, values=None) -> list:
    workers = parse_numbers(values, int, "K") or TABLE3_K
    arms = []
    for setting, shards in (("IID", {"iid": True}), (f"non-IID a={base.alpha:g}", {"iid": False})):
        arms += [Arm(f"{setting} / K={k}", "diloco", {"num_workers": k, "inner_steps": base.inner_steps,
                                                      "rounds": _rounds(steps, base.inner_steps), **shards})
                 for k in workers]
    return arms


def _table3_claims(arms) -> list:
    labels, claims = {a.label for a in arms}, []
    for setting in ("IID", arms[-1].label.split(" / ")[0]):
        label = {k: f"{setting} / K={k}" for k in TABLE3_K}
        if {label[8], label[1]} <= labels:
            claims.append(Claim(f"{setting}: 8 workers beat 1 at fixed steps per worker", label[8], label[1],
                                "perplexity falls as replicas grow from 1 to 8 (Table 3)"))
        if {label[16], label[8]} <= labels:
            claims.append(Claim(f"{setting}: 16 workers beat 8", label[16], label[8],
                                "still falling at 16, with diminishing returns (Table 3)"))
    return claims


DROP_P = (0.0, 0.1, 0.3, 0.5)
# "Small": the paper reports a degradation of a few percent of perplexity at p = 0.5; a claim
# of robustness is judged against this relative margin.
DROP_MARGIN = 0.05


def _fig8_arms(base: DiLoCoConfig, steps: int, values=None) -> list:
    probabilities = parse_numbers(values, float, "p") or DROP_P
    arms = []
    for setting, shards in (("IID", {"iid": True}), (f"non-IID a={base.alpha:g}", {"iid": False})):
        arms += [Arm(f"{setting} / p={p:g}", "diloco", {"num_workers": base.num_workers, "drop_prob": p,
                                                        "inner_steps": base.inner_steps, "record_similarity": True,
                                                        "rounds": _rounds(steps, base.inner_steps), **shards})
                 for p in probabilities]
    return arms


def _fig8_claims(arms) -> list:
    claims = []
    for setting in ("IID", arms[-1].label.split(" / ")[0]):
        claims.append(Claim(f"{setting}: dropping half the outer gradients costs under {DROP_MARGIN:.0%}",
                            f"{setting} / p=0", f"{setting} / p=0.5", "a small degradation, larger non-IID (Fig. 8)",
                            margin=DROP_MARGIN))
    return claims


def _fig9_arms(base: DiLoCoConfig, steps: int, values=None) -> list:
    _no_values("fig9", values)
    h = base.inner_steps
    one = {"num_workers": 1, "inner_steps": h, "rounds": _rounds(steps, h)}
    return [Arm("baseline (1 worker)", "sync", one), Arm(f"DiLoCo (1 worker, H={h})", "diloco", one)]


def _fig9_claims(arms) -> list:
    return [Claim("DiLoCo with one worker beats the 1-worker baseline", arms[1].label, arms[0].label,
                  "faster convergence and lower final perplexity (Fig. 9)")]


PAPER_STUDIES = {
    "table2": PaperStudy("table2", "Baselines against DiLoCo at equal steps per worker", "Table 2",
                         _table2_arms, _table2_claims),
    "fig4": PaperStudy("fig4", "Inner steps H at fixed steps per worker", "Fig. 4", _fig4_arms, _fig4_claims),
    "fig6": PaperStudy("fig6", "Outer optimizers, each with its lr tuned", "Fig. 6", _fig6_arms, _fig6_claims,
                       tune={label: ("outer_lr", OUTER_GRID) for label in OUTER_ARMS}),
    "table3": PaperStudy("table3", "Number of workers K at fixed steps per worker", "Table 3",
                         _table3_arms, _table3_claims),
    "fig8": PaperStudy("fig8", "Dropped outer gradients", "Fig. 8", _fig8_arms, _fig8_claims),
    "fig9": PaperStudy("fig9", "One worker: DiLoCo against the plain baseline", "Fig. 9", _fig9_arms, _fig9_claims),
}
