"""The paper's tables and figures in miniature: arms, claims, and the runs behind them.

Ten studies; the first six are named after the artefact of Douillard et al. (2023) they
reproduce:

* ``table2``: a 1-worker baseline, the 8x-batch synchronous baseline, 8x the updates on
  one worker, and DiLoCo (K = 8), at the same steps per worker.
* ``fig4``: inner steps H at a fixed number of steps per worker, against sync.
* ``fig6``: outer optimizers (Nesterov, heavy ball, SGD, Adam), each with its outer
  learning rate tuned over a grid on tuning seeds that are not the evaluation seeds.
* ``table3``: K = 1 .. 16 workers at fixed steps per worker, IID and non-IID shards.
* ``fig8``: outer gradients dropped with probability p, IID and non-IID, under both drop
  rules (a dropped worker carries on from its own parameters, or restarts from the new
  global model).
* ``fig9``: DiLoCo with a single worker against the plain 1-worker baseline.
* ``splits``: IID shards against the two non-IID splits (Dirichlet label skew; contiguous
  topic segments of the rows), alpha swept.
* ``scaling``: the hidden width swept at a fixed token budget, DiLoCo at K = 1, 2, 4, 8
  against data parallelism at the same global batch (Charles et al. 2025).
* ``inner-muon``: Muon against AdamW inside DiLoCo and in synchronous training (MuLoCo).
* ``fragments``: Streaming DiLoCo's P fragments against DiLoCo (Douillard et al. 2025).

An arm is a label, an algorithm and the config fields it changes on the study's base.
Every arm runs on every seed; a seed fixes the shards, the initial model and the
mini-batch streams, so arms with the same K see the same mini-batches, and differences
between arms are compared seed by seed (``diloco.tools.studies.paper_report``). Each claim is a
``Claim``: which arm the paper found better, by how much, and where it says so.

Budget: ``steps`` per worker (``--total-steps``, or ``--rounds`` x ``--inner-steps``);
per-data defaults in ``TASKS`` (5,000: 100 outer steps at H = 50). The inner schedule is
the paper's (linear warmup over 2% of an arm's steps, then cosine decay). Each study's
``tune`` says which inner lr (and, for fig6, which outer lr) each arm is tuned on, over
the task's grid on tuning seeds that are not the evaluation seeds; in every study but fig6
(``outer_groups``) each DiLoCo arm's (or its group's probe's) outer lr x momentum is tuned
too, past the grid's edges where one is chosen (scaling: tried as it is), and its own lr
again after it; scaling tunes every arm's inner lr on itself (DiLoCo apart from data
parallelism). Running an arm, tuning and the run cache are in ``diloco.tools.studies.paper_runs``;
the command is ``diloco.tools.studies.paper_command``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from diloco.config import DiLoCoConfig
from diloco.core.model_seam import model_kind
from diloco.tools.studies.paper_runs import (
    INNER_LR,
    MUON_LR,
    Arm,
    TuneStep,
    arm_engine,
    outer_step_grid,
    parse_numbers,
    per_arm,
    with_warmup,
)

__all__ = ["Arm", "Claim", "PaperStudy", "TASKS", "PAPER_STUDIES", "OUTER_GRIDS", "arm_engine",
           "with_warmup", "tuning_steps", "outer_step_then_lr"]


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
    better_base: str | None = None  # a contrast: d = (worse - worse_base) - (better - better_base)
    worse_base: str | None = None


class PaperStudy(NamedTuple):
    name: str
    title: str
    reference: str
    arms: Callable  # (base config, steps per worker, values or None, the task's non-IID split) -> [Arm]
    claims: Callable[[list], list]  # (arms) -> [Claim]
    inner_groups: Callable[[list], tuple] | None = None  # (arms) -> ((probe, targets), ...); None: per arm
    outer_tune: dict | None = None  # fig6: {arm label: outer lr grid} (x OUTER_TUNE_MOMENTA with momentum)
    values_tune: bool = False  # --values replaces the outer lr grid (fig6) rather than choosing arms
    outer_groups: Callable[[list], tuple] | None = None  # (arms) -> groups whose outer lr x momentum is tuned


# Per task: the model, the inner lr before tuning, the grid it is tuned over, the non-IID split
# of table3 and fig8 (topic segments of the text for the char-LM; label skew for MNIST-1D,
# whose rows have no order) and the default
# budget (steps per worker: 100 outer steps at H = 50; for the char-LM at K = 8 and batch 32,
# 1.28M windows, 1.3 passes over the 1.0M training windows). The paper's inner AdamW (lr
# 4e-4, weight decay 0.1) is for transformers at 512 x 1024 tokens a step; its schedule
# (warmup, cosine decay) is the studies' default, its lr is replaced by a grid tuned per arm.
TASKS = {
    "shakespeare": {"hidden_sizes": (64,), "inner": {"lr": 1e-2}, "steps": 5000,
                    "inner_grid": (3e-3, 1e-2, 3e-2), "noniid_split": "topic"},
    "mnist1d": {"hidden_sizes": (128,), "inner": {"lr": 3e-3}, "steps": 2500,
                "inner_grid": (1e-3, 3e-3, 1e-2), "noniid_split": "label"},
}
K = 8  # workers, as the paper's main setting (the study default; -K changes it)
H = 50  # inner steps of the main setting (the paper's 500, at our small budgets; -H changes it)

# The paper tunes each outer optimizer's lr over {1, .7, .5, .3, .1}. Three values per arm
# fit the budget: around 0.7 for momentum, higher for SGD without momentum (unit-size steps
# where momentum takes ~1/(1-mu)), lower for Adam (whose step is lr-sized per coordinate).
OUTER_GRIDS = {"Nesterov": (0.3, 0.7, 1.0), "heavy ball": (0.3, 0.7, 1.0),
               "SGD (no momentum)": (1.0, 2.0, 3.0), "Adam (eps 0.1)": (0.03, 0.1, 0.3)}
OUTER_TUNE_MOMENTA = (0.5, 0.9)  # fig6: each momentum method's momentum (Adam's beta1), with its lr


def diloco_arms(arms) -> tuple:
    """Every DiLoCo arm tuned on itself (the synchronous arms have no outer step)."""
    return per_arm(arms, lambda a: a.algo == "diloco")


def shared(probe_of: Callable[[Arm], str]) -> Callable[[list], tuple]:
    """Arms grouped by ``probe_of(arm)`` (a label): each group takes its probe's tuned value."""
    def groups(arms) -> tuple:
        out: dict = {}
        for arm in arms:
            out.setdefault(probe_of(arm), []).append(arm.label)
        return tuple((probe, tuple(targets)) for probe, targets in out.items())
    return groups


# Muon's lr (its matrices; ``diloco study muon`` tunes over a wider grid at smaller budgets):
# Muon's default 0.02 sits inside it, and the grid is extended past an end that is chosen.
MUON_GRID = (3e-3, 1e-2, 3e-2)


def lr_field(arm: Arm) -> str:
    """The lr that an arm's own lr tuning sets: Muon's (its matrices) for a Muon arm, the
    inner AdamW's otherwise."""
    return MUON_LR if arm.changes.get("inner_optimizer") == "muon" else INNER_LR


def tuning_steps(study: PaperStudy, arms: list, inner_grid: tuple, outer_values=None, outer_grid: tuple = ()) -> list:
    """The study's ``TuneStep`` list: the inner lr first, then each Muon arm's Muon lr
    (``MUON_GRID``); then (fig6) each arm's outer lr; then (``outer_groups``) the outer lr x
    momentum grid (``outer_step_grid``) of each group's probe, at its tuned lrs, and the
    probe's own lr (``lr_field``) again at the chosen pair. ``outer_grid`` (``(lrs, momenta)``,
    ``--outer-grid``) replaces the default outer grid. An empty ``inner_grid``
    (``--inner-grid off``) leaves the inner lr out."""
    by_label = {arm.label: arm for arm in arms}
    muon = per_arm(arms, lambda a: lr_field(a) == MUON_LR)
    steps = [TuneStep(INNER_LR, tuple(inner_grid), (study.inner_groups or per_arm)(arms)),
             TuneStep(MUON_LR, MUON_GRID, muon), *_per_arm_outer_lr(study, by_label, outer_values)]
    if study.outer_groups:
        steps += outer_step_then_lr(study.outer_groups(arms), by_label, inner_grid, outer_grid)
    return [step for step in steps if step.grid and step.groups]


def _per_arm_outer_lr(study: PaperStudy, by_label: dict, outer_values) -> list:
    """Fig. 6's steps: each named arm's outer lr over its grid (``--values`` replaces it)."""
    return [_outer_tune_step(by_label[label], tuple(outer_values) if outer_values else grid)
            for label, grid in (study.outer_tune or {}).items() if label in by_label]


def outer_step_then_lr(groups: tuple, by_label: dict, inner_grid: tuple, outer_grid: tuple = (),
                       muon_grid: tuple = MUON_GRID) -> list:
    """Each group's outer lr x momentum (``outer_grid``: ``(lrs, momenta)``, the default grid when
    empty), then its probe's own lr (``lr_field``: inner over ``inner_grid``, or Muon's) again."""
    return [outer_step_grid(groups, *outer_grid),
            *(TuneStep(field, tuple(grid), tuple(g for g in groups if lr_field(by_label[g[0]]) == field))
              for field, grid in ((INNER_LR, inner_grid), (MUON_LR, muon_grid)))]


def _outer_tune_step(arm: Arm, lrs: tuple) -> TuneStep:
    """fig6: an outer optimizer with momentum (Nesterov, heavy ball, Adam's beta1) tunes its
    outer lr x momentum over ``lrs`` x ``OUTER_TUNE_MOMENTA``; one without, its lr alone."""
    group = ((arm.label, (arm.label,)),)
    if arm.changes.get("outer_momentum"):
        return outer_step_grid(group, lrs, OUTER_TUNE_MOMENTA)
    return TuneStep("outer_lr", lrs, group)


def _no_values(study: str, values) -> None:
    if values:
        raise ValueError(f"study {study} has fixed arms and takes no --values")


def _rounds(steps: int, h: int) -> int:
    if steps % h:
        raise ValueError(f"steps per worker ({steps}) must be a multiple of H={h}; set --total-steps")
    return steps // h


def _setting(base: DiLoCoConfig, steps: int, k: int | None = None, h: int | None = None) -> dict:
    """K and H (the study's unless given), and the rounds that make ``steps`` per worker."""
    h = base.inner_steps if h is None else h
    return {"num_workers": base.num_workers if k is None else k, "inner_steps": h, "rounds": _rounds(steps, h)}


def _diloco_label(k: int, h: int) -> str:
    return f"DiLoCo (K={k}, H={h})"


def _table2_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    _no_values("table2", values)
    k, h = base.num_workers, base.inner_steps
    one = _setting(base, steps, k=1)
    return [
        Arm("baseline (1 worker)", "sync", one),
        Arm(f"{k}x batch (sync, K={k})", "sync", _setting(base, steps)),
        Arm(f"{k}x updates (1 worker, {k}x steps)", "sync", {**one, "inner_steps": k * h}),
        Arm(_diloco_label(k, h), "diloco", _setting(base, steps)),
    ]


def _table2_claims(arms) -> list:
    base, batch, updates, diloco = (a.label for a in arms)
    k = arms[1].changes["num_workers"]  # the paper's 8; the transformer tier runs 4
    return [
        Claim(f"DiLoCo beats the {k}x-batch synchronous baseline", diloco, batch,
              "15.02 vs 15.30 perplexity (Table 2)"),
        Claim("DiLoCo beats the 1-worker baseline", diloco, base, "15.02 vs 16.23 (Table 2)"),
        Claim(f"{k}x updates on one worker beat DiLoCo", updates, diloco, "14.72 vs 15.02 (Table 2)"),
        Claim(f"{k}x batch beats the 1-worker baseline", batch, base, "15.30 vs 16.23 (Table 2)"),
    ]


FIG4_H = (10, 50, 250, 500)


def _fig4_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    chosen = parse_numbers(values, int, "H") or FIG4_H
    arms = [Arm(f"H={h}", "diloco", _setting(base, steps, h=h)) for h in chosen if steps % h == 0 and steps // h >= 2]
    if not arms:
        raise ValueError(f"no H in {chosen} leaves two rounds or more of {steps} steps per worker")
    return arms + [Arm(f"sync (K={base.num_workers})", "sync", _setting(base, steps))]


def _fig4_claims(arms) -> list:
    labels = {a.label for a in arms if a.algo == "diloco"}
    pairs = [("H=50", "H=250", "communicating every 50 steps beats every 250",
              "perplexity rises slowly with H, from H=50 to H=2000 (Fig. 4)"),
             ("H=50", "H=500", "communicating every 50 steps beats every 500", "H=50 below H=500 (Fig. 4)"),
             ("H=10", "H=50", "communicating every 10 steps beats every 50",
              "not tested (Fig. 4 starts at H=50): the trend, extrapolated")]
    return [Claim(text, better, worse, paper) for better, worse, text, paper in pairs if {better, worse} <= labels]


def _fig4_probe(arm: Arm) -> str:
    return arm.label if arm.algo == "sync" else "H=50"


OUTER_ARMS = {
    "Nesterov": {"outer_optimizer": "sgd", "outer_momentum": 0.9, "nesterov": True},
    "heavy ball": {"outer_optimizer": "sgd", "outer_momentum": 0.9, "nesterov": False},
    "SGD (no momentum)": {"outer_optimizer": "sgd", "outer_momentum": 0.0, "nesterov": False},
    "Adam (eps 0.1)": {"outer_optimizer": "adam", "outer_momentum": 0.9, "outer_eps": 0.1},
}


def _fig6_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    return [Arm(label, "diloco", {**_setting(base, steps), **changes}) for label, changes in OUTER_ARMS.items()]


def _fig6_claims(arms) -> list:
    nesterov, heavy, sgd, adam = (a.label for a in arms)
    return [
        Claim("Nesterov beats outer SGD without momentum (each outer step tuned)", nesterov, sgd,
              "Nesterov best, SGD (FedAvg at lr 1) worst (Fig. 6)"),
        Claim("Nesterov beats outer Adam (each outer step tuned)", nesterov, adam, "Nesterov below Adam (Fig. 6)"),
        Claim("Nesterov beats heavy-ball momentum (each outer step tuned)", nesterov, heavy,
              "Nesterov is the paper's choice; heavy ball is not in Fig. 6"),
    ]


TABLE3_K = {"IID": (1, 8, 16), "non-IID": (1, 8, 16)}


def _noniid_setting(base: DiLoCoConfig, split: str) -> tuple[str, dict]:
    """The non-IID shards of table3 and fig8 at the study's alpha: the task's split (``TASKS``)."""
    name = "topic" if split == "topic" else "label skew"
    return f"non-IID {name} a={base.alpha:g}", {"iid": False, "noniid_split": split}


def claim_setting(setting: str) -> str:
    """A shard setting as claims name it: ``non-IID a=0.5`` whichever split the task uses (the
    arms' labels say which), so one claim is one row across the two tasks."""
    return setting.replace("non-IID topic ", "non-IID ").replace("non-IID label skew ", "non-IID ")


def _table3_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    chosen = parse_numbers(values, int, "K")
    arms = []
    setting, noniid = _noniid_setting(base, split)
    for name, label, shards in (("IID", "IID", {"iid": True}), ("non-IID", setting, noniid)):
        arms += [Arm(f"{label} / K={k}", "diloco", {**_setting(base, steps, k=k), **shards})
                 for k in (chosen or TABLE3_K[name])]
    return arms


def _table3_probe(arm: Arm) -> str:
    """Each K's inner lr is tuned on IID shards and used for both shardings."""
    return f"IID / K={arm.label.rsplit('=', 1)[1]}"


def _table3_claims(arms) -> list:
    labels, claims = {a.label for a in arms}, []
    for setting in ("IID", arms[-1].label.split(" / ")[0]):
        label = {k: f"{setting} / K={k}" for k in (1, 2, 4, 8, 16)}
        name = claim_setting(setting)
        if {label[8], label[1]} <= labels:
            claims.append(Claim(f"{name}: 8 workers beat 1 at fixed steps per worker", label[8], label[1],
                                "perplexity falls as replicas grow from 1 to 8 (Table 3)"))
        if {label[16], label[8]} <= labels:
            claims.append(Claim(f"{name}: 16 workers beat 8", label[16], label[8],
                                "still falling at 16, with diminishing returns (Table 3)"))
    return claims


DROP_P = (0.0, 0.5)
# "Small": the paper reports a degradation of a few percent of perplexity at p = 0.5; a claim
# of robustness is judged against this relative margin.
DROP_MARGIN = 0.05


DROP_RULES = ("carry", "restart")


def _fig8_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    probabilities = parse_numbers(values, float, "p") or DROP_P
    arms = []
    shared_fields = _setting(base, steps)
    for setting, shards in (("IID", {"iid": True}), _noniid_setting(base, split)):
        for p in probabilities:
            if p == 0:
                arms.append(Arm(f"{setting} / p=0", "diloco", {**shared_fields, **shards}))
                continue
            arms += [Arm(f"{setting} / p={p:g} {rule}", "diloco",
                         {**shared_fields, **shards, "drop_prob": p, "drop_rule": rule}) for rule in DROP_RULES]
    return arms


def _fig8_probe(arm: Arm) -> str:
    return "IID / p=0"


def _fig8_claims(arms) -> list:
    labels, claims = {a.label for a in arms}, []
    for setting in ("IID", arms[-1].label.split(" / ")[0]):
        name = claim_setting(setting)
        for rule in DROP_RULES:
            if {f"{setting} / p=0", f"{setting} / p=0.5 {rule}"} <= labels:
                claims.append(Claim(f"{name}, a dropped worker {'carries on' if rule == 'carry' else 'restarts'}"
                                    f": dropping half the outer gradients costs under {DROP_MARGIN:.0%}",
                                    f"{setting} / p=0", f"{setting} / p=0.5 {rule}",
                                    "a small degradation, larger non-IID (Fig. 8)", margin=DROP_MARGIN))
        if {f"{setting} / p=0.5 carry", f"{setting} / p=0.5 restart"} <= labels:
            claims.append(Claim(f"{name}, half dropped: carrying on beats restarting from the global model",
                                f"{setting} / p=0.5 carry", f"{setting} / p=0.5 restart",
                                "not in the paper: the drop rule's own effect"))
    return claims


def _fig9_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    _no_values("fig9", values)
    one = _setting(base, steps, k=1)
    return [Arm("baseline (1 worker)", "sync", one), Arm(f"DiLoCo (1 worker, H={base.inner_steps})", "diloco", one)]


def _fig9_claims(arms) -> list:
    return [Claim("DiLoCo with one worker beats the 1-worker baseline", arms[1].label, arms[0].label,
                  "faster convergence and lower final perplexity (Fig. 9)")]


NONIID_ALPHAS = (0.1, 0.5, 1.0, 10.0)
NONIID_SPLITS = (("label", "label skew"), ("topic", "topic"))  # swept over alpha; text adds speaker shards


def _noniid_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    alphas = parse_numbers(values, float, "alpha") or NONIID_ALPHAS
    shared_fields = _setting(base, steps)
    arms = [Arm("IID", "diloco", {**shared_fields, "iid": True})]
    # the topic split needs rows in a meaningful order (the text's); a task whose rows have
    # none (MNIST-1D's are shuffled) runs the label skew only
    for kind, name in NONIID_SPLITS if split == "topic" else NONIID_SPLITS[:1]:
        arms += [Arm(f"{name} a={a:g}", "diloco", {**shared_fields, "iid": False, "alpha": a, "noniid_split": kind})
                 for a in alphas]
    if split == "topic":  # text: whole speeches per worker (diloco.corpus.speakers), no alpha
        arms.append(Arm("speaker", "diloco", {**shared_fields, "iid": False, "noniid_split": "speaker"}))
    return arms


def _noniid_claims(arms) -> list:
    claims = []
    for arm in arms[1:]:
        claims.append(Claim(f"non-IID {arm.label}: costs under {DROP_MARGIN:.0%} against IID", "IID", arm.label,
                            "\"great robustness to the data distribution of each worker\" (abstract)",
                            margin=DROP_MARGIN))
    labels = {a.label for a in arms}
    if {"speaker", "topic a=0.1"} <= labels:
        claims.append(Claim("speaker shards cost more than topic shards at a=0.1", "topic a=0.1", "speaker",
                            "not in the paper: whether the split that is most non-IID for text costs more"))
    for alpha in ("0.1", "0.5"):
        if {f"topic a={alpha}", f"label skew a={alpha}"} <= labels:
            claims.append(Claim(f"at a={alpha}, topic shards cost less than label-skewed ones", f"topic a={alpha}",
                                f"label skew a={alpha}", "not in the paper: which non-IID split is milder here"))
    return claims


SCALING_WIDTHS = (32, 64, 128)
SCALING_K = (1, 2, 4, 8)
GLOBAL_BATCH = 256  # data parallelism: 8 workers x 32; DiLoCo with K workers: 256 / K each


def _width(base: DiLoCoConfig, width: int) -> dict:
    """The model at ``width``: the MLP's hidden width, or the transformer's d_model (its heads kept)."""
    return model_kind(base).width(width)


def _scaling_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    widths = parse_numbers(values, int, "width") or SCALING_WIDTHS
    h, rounds = base.inner_steps, _rounds(steps, base.inner_steps)
    arms = []
    for width in widths:
        arms.append(Arm(f"DP w={width}", "sync", {"num_workers": 8, "batch_size": GLOBAL_BATCH // 8,
                                                  **_width(base, width), "inner_steps": h, "rounds": rounds}))
        arms += [Arm(f"K={k} w={width}", "diloco", {"num_workers": k, "batch_size": GLOBAL_BATCH // k,
                                                    **_width(base, width), "inner_steps": h, "rounds": rounds})
                 for k in SCALING_K]
    return arms


def _scaling_claims(arms) -> list:
    widths = sorted({int(a.label.rsplit("=", 1)[1]) for a in arms})
    if len(widths) < 2:
        return []
    small, large = widths[0], widths[-1]
    return [Claim(f"DiLoCo K={k}'s loss gap to data parallelism is smaller at width {large} than at {small}",
                  f"K={k} w={large}", f"K={k} w={small}",
                  "\"when well-tuned, DiLoCo scales better than data-parallel training with model size\" "
                  "(Charles et al. 2025, abstract)", better_base=f"DP w={large}", worse_base=f"DP w={small}")
            for k in SCALING_K]


def _inner_label(optimizer: str, k: int) -> str:
    return f"DiLoCo, {optimizer} inside (K={k})"


def _sync_label(optimizer: str, k: int) -> str:
    return f"sync, {optimizer} (K={k})"


def _inner_muon_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    """Muon and AdamW inside DiLoCo, and the same two without DiLoCo (synchronous data parallelism
    at K workers, the K x batch arm of table2), so the claim separates the optimizer from the method."""
    _no_values("inner-muon", values)
    k, muon = base.num_workers, {"inner_optimizer": "muon"}
    return [Arm(_inner_label("Muon", k), "diloco", {**_setting(base, steps), **muon}),
            Arm(_inner_label("AdamW", k), "diloco", _setting(base, steps)),
            Arm(_sync_label("Muon", k), "sync", {**_setting(base, steps), **muon}),
            Arm(_sync_label("AdamW", k), "sync", _setting(base, steps))]


def _inner_muon_claims(arms) -> list:
    muon, adamw, muon_sync, adamw_sync = (a.label for a in arms)
    return [Claim("Muon as the inner optimizer beats AdamW (each tuned)", muon, adamw,
                  "\"MuLoCo (Muon inner optimizer DiLoCo) achieves superior performance to DiLoCo in absolute "
                  "terms\" (Therien et al. 2025, abstract v2)"),
            Claim("Muon beats AdamW without DiLoCo too (synchronous, each tuned)", muon_sync, adamw_sync,
                  "not in the paper: the optimizer's own effect, apart from the method"),
            Claim("Muon gains more over AdamW inside DiLoCo than in synchronous training", muon, adamw,
                  "not in the paper: whether Muon's lead belongs to DiLoCo", better_base=muon_sync,
                  worse_base=adamw_sync)]


FRAGMENTS_P = (2,)


def _fragments_arms(base: DiLoCoConfig, steps: int, values=None, split: str = "label") -> list:
    fragments = parse_numbers(values, int, "P") or FRAGMENTS_P
    arms = [Arm(f"Streaming P={p}", "diloco", {**_setting(base, steps), "family": {"fragments": p}})
            for p in fragments if p > 1]
    if not arms:
        raise ValueError(f"--values: P must be 2 or more fragments, got {list(fragments)}")
    return arms + [Arm(_diloco_label(base.num_workers, base.inner_steps), "diloco", _setting(base, steps))]


def _fragments_claims(arms) -> list:
    return [Claim(f"{arm.label} (1/{arm.changes['family']['fragments']} of the peak bandwidth) costs under "
                  f"{DROP_MARGIN:.0%} against DiLoCo", arms[-1].label, arm.label,
                  "\"similar performance\" with P fragments synchronised in turn (Douillard et al. 2025)",
                  margin=DROP_MARGIN) for arm in arms[:-1]]


def _adamw_probe(arm: Arm) -> str:
    """The inner-muon study's inner (AdamW) lr is tuned on the AdamW arm of the same method
    (DiLoCo or synchronous): a Muon arm's non-matrix arrays take AdamW at that lr, as in
    ``diloco study muon``."""
    label = _inner_label if arm.algo == "diloco" else _sync_label
    return label("AdamW", arm.changes["num_workers"])


def _diloco_probe(arm: Arm) -> str:
    """The fragments study's inner lr is tuned on its DiLoCo arm, for every arm."""
    return _diloco_label(arm.changes["num_workers"], arm.changes["inner_steps"])


PAPER_STUDIES = {
    "table2": PaperStudy("table2", "Baselines against DiLoCo at equal steps per worker", "Table 2",
                         _table2_arms, _table2_claims, outer_groups=diloco_arms),
    "fig4": PaperStudy("fig4", "Inner steps H at a fixed total of steps per worker", "Fig. 4", _fig4_arms,
                       _fig4_claims, shared(_fig4_probe), outer_groups=diloco_arms),
    "fig6": PaperStudy("fig6", "Outer optimizers, each with its lr and momentum tuned", "Fig. 6", _fig6_arms,
                       _fig6_claims, shared(lambda arm: "Nesterov"), outer_tune=OUTER_GRIDS, values_tune=True),
    "table3": PaperStudy("table3", "Number of workers K at fixed steps per worker", "Table 3",
                         _table3_arms, _table3_claims, shared(_table3_probe), outer_groups=shared(_table3_probe)),
    "fig8": PaperStudy("fig8", "Dropped outer gradients, both drop rules", "Fig. 8", _fig8_arms, _fig8_claims,
                       shared(_fig8_probe), outer_groups=shared(_fig8_probe)),
    "fig9": PaperStudy("fig9", "One worker: DiLoCo against the plain baseline", "Fig. 9", _fig9_arms, _fig9_claims,
                       outer_groups=diloco_arms),
    "splits": PaperStudy("splits", "Non-IID splits: label skew and topic segments, alpha swept; speakers (text)",
                         "the abstract's robustness claim", _noniid_arms, _noniid_claims, shared(lambda arm: "IID"),
                         outer_groups=shared(lambda arm: "IID")),
    "scaling": PaperStudy("scaling", "Model width at a fixed token budget: DiLoCo against data parallelism",
                          "Charles et al. 2025", _scaling_arms, _scaling_claims, outer_groups=diloco_arms),
    "inner-muon": PaperStudy("inner-muon", "Muon against AdamW as DiLoCo's inner optimizer, each tuned",
                             "MuLoCo (Therien et al. 2025)", _inner_muon_arms, _inner_muon_claims,
                             shared(_adamw_probe), outer_groups=diloco_arms),
    "fragments": PaperStudy("fragments", "Streaming DiLoCo's P fragments against DiLoCo, each tuned",
                            "Streaming DiLoCo (Douillard et al. 2025)", _fragments_arms, _fragments_claims,
                            shared(_diloco_probe), outer_groups=diloco_arms),
}
