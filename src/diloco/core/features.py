"""The table of features the one core composes: the composition test's and the docs' single source.

Every ``Feature`` is a flag of ``diloco train`` and the ``DiLoCoConfig`` change it makes. A
plugin's row (``hook="plugin"``) names a part registered from outside the package
(``diloco.core.registry``): the test registers ``tests/tooling/plugins/`` (Lion, random-k) first,
in every MPI rank too.
``tests/tooling/test_core.py`` runs every feature, on every executor (reference, fast,
MPI) and for both algorithms, and proves each cell one of two things:

* **it works**: the fast executor equals the reference within 1e-10 relative
  (float64), the MPI executor equals it bit for bit, and the feature changes the result
  (no silent no-op);
* **it is refused by design, in one line, before any work**: only the synchronous
  baseline refuses, and only what configures an outer gradient it does not have.

``docs/architecture.md`` shows ``render_matrix()``, generated from the same table, with
``REFUSED_COMBINATIONS``: pairs of features that are refused together by design.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Feature", "FEATURES", "REFUSED_COMBINATIONS", "EXECUTOR_NAMES", "cell", "render_matrix"]

EXECUTOR_NAMES = ("reference", "fast", "mpi")


class Feature(NamedTuple):
    """One flag: its ``DiLoCoConfig`` changes (``family`` a dict of ``FamilyConfig`` changes)."""

    name: str
    flag: str
    changes: dict
    diloco_only: bool = False
    hook: str | None = None  # a driver hook rather than a config field; "plugin": a part registered from outside


FEATURES = (
    Feature("lr schedule", "--lr-schedule cosine --warmup-steps 1", {"lr_schedule": "cosine", "warmup_steps": 1}),
    Feature("gradient clipping", "--clip-norm 0.05", {"clip_norm": 0.05}),
    Feature("non-IID shards", "--noniid --alpha 0.3", {"iid": False, "alpha": 0.3}),
    Feature("topic non-IID shards", "--noniid --noniid-split topic", {"iid": False, "noniid_split": "topic"}),
    Feature("float32", "--dtype float32", {"dtype": "float32"}),
    Feature("Muon inner optimizer", "--inner-optimizer muon", {"inner_optimizer": "muon"}),
    Feature("SGD inner optimizer", "--inner-optimizer sgd", {"inner_optimizer": "sgd"}),
    Feature("character-level LM", "--data shakespeare", {}, hook="encode"),
    Feature("inner optimizer of a plugin (Lion)", "--inner-optimizer lion", {"inner_optimizer": "lion"},
            hook="plugin"),
    Feature("outer Adam", "--outer-optimizer adam", {"outer_optimizer": "adam", "outer_lr": 0.05}, True),
    Feature("outer Lion", "--outer-optimizer lion", {"outer_optimizer": "lion", "outer_lr": 0.01}, True),
    Feature("heavy-ball outer momentum", "--no-nesterov", {"nesterov": False}, True),
    Feature("outer lr", "--outer-lr 0.3", {"outer_lr": 0.3}, True),
    Feature("shard-size weights", "--shard-weighting size", {"shard_weighting": "size"}, True),
    Feature("dropped outer gradients", "--drop-prob 0.5", {"drop_prob": 0.5}, True),
    Feature("dropped worker restarts", "--drop-prob 0.5 --drop-rule restart",
            {"drop_prob": 0.5, "drop_rule": "restart"}, True),
    Feature("similarity record", "--record-similarity", {"record_similarity": True}, True),
    Feature("fp4 wire format", "--comm-dtype fp4", {"family": {"comm_dtype": "fp4"}}, True),
    Feature("int8 + error feedback", "--comm-dtype int8 --error-feedback",
            {"family": {"comm_dtype": "int8", "error_feedback": True}}, True),
    Feature("sign pruning", "--sign-prune 0.5", {"family": {"sign_prune": 0.5}}, True),
    Feature("top-k + error feedback", "--topk 0.25 --topk-chunk 64 --error-feedback",
            {"family": {"topk": 0.25, "topk_chunk": 64, "error_feedback": True}}, True),
    Feature("top-k 2-bit + error feedback", "--topk 0.25 --topk-chunk 64 --topk-bits 2 --error-feedback",
            {"family": {"topk": 0.25, "topk_chunk": 64, "topk_bits": 2, "error_feedback": True}}, True),
    Feature("DeMo DCT top-k", "--topk 0.1 --topk-chunk 64 --topk-transform dct --error-feedback --topk-decay 0.9",
            {"family": {"topk": 0.1, "topk_chunk": 64, "topk_transform": "dct", "error_feedback": True,
                        "topk_decay": 0.9}}, True),
    Feature("codec of a plugin, by name (random-k)", "--compress randk:fraction=0.25 --error-feedback",
            {"family": {"compress": "randk:fraction=0.25", "error_feedback": True}}, True, hook="plugin"),
    Feature("streaming fragments", "--fragments 2", {"family": {"fragments": 2}}, True),
    Feature("overlap tau", "--fragments 2 --overlap 1", {"family": {"fragments": 2, "overlap": 1}}, True),
    Feature("mixing", "--fragments 2 --mix 0.5", {"family": {"fragments": 2, "mix": 0.5}}, True),
    Feature("eager updates", "--eager", {"family": {"eager": True}}, True),
    Feature("divergence guard", "--max-loss", {}, hook="guard"),
    Feature("checkpoint and resume", "--checkpoint-every / --resume", {}, hook="resume"),
    Feature("network clock", "--bandwidth 1Mbit", {"family": {"bandwidth": 1e6, "step_time": 0.01}}, hook="clock"),
    Feature("worker speeds (synchronous clock)", "--step-times 1,2", {"asynchrony": {"step_times": (1.0, 2.0)}}, True),
    Feature("asynchronous DiLoCo", "--async --step-times 1,2",
            {"asynchrony": {"asynchronous": True, "step_times": (1.0, 2.0)}}, True),
    Feature("delayed Nesterov", "--async --step-times 1,2 --delayed-nesterov 2",
            {"asynchrony": {"asynchronous": True, "step_times": (1.0, 2.0), "delayed_nesterov": 2}}, True),
    Feature("dynamic local steps", "--async --step-times 1,2 --dynamic-local-steps",
            {"asynchrony": {"asynchronous": True, "step_times": (1.0, 2.0), "dynamic_local_steps": True}}, True),
)

# Combinations refused by design, in one line, before any work (``check_algorithm``).
REFUSED_COMBINATIONS = (
    ("asynchronous DiLoCo", "streaming fragments, overlap tau, eager updates",
     "each arrival updates the whole model at once"),
    ("delayed Nesterov", "outer Adam, outer Lion", "a rule of the SGD/Nesterov outer optimizer"),
    ("delayed Nesterov", "dropped outer gradients", "it counts arrivals, and a dropped one carries nothing"),
    ("eager updates", "dropped outer gradients", "the eager rule needs every worker's fresh outer gradient"),
)


def cell(feature: Feature, algo: str, executor: str) -> str:
    """``"works"``, ``"refused"`` (by design: the baseline has no outer gradient) or
    ``"not offered"`` (the MPI executor writes no checkpoints)."""
    if algo == "sync" and feature.diloco_only:
        return "refused"
    if executor == "mpi" and feature.hook == "resume":
        return "not offered"
    return "works"


def render_matrix() -> str:
    """The feature-by-executor matrix as a Markdown table (``docs/architecture.md``)."""
    header = ["feature", "flag"] + [f"{algo} / {ex}" for algo in ("diloco", "sync") for ex in EXECUTOR_NAMES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for feature in FEATURES:
        cells = [cell(feature, algo, ex) for algo in ("diloco", "sync") for ex in EXECUTOR_NAMES]
        lines.append(f"| {feature.name} | `{feature.flag}` | " + " | ".join(cells) + " |")
    lines += ["", "Every cell holds for both models, the MLP and the transformer (`--model transformer`): the "
              "composition test runs each.", "",
              "A plugin's row runs a part registered from outside the package (`tests/tooling/plugins/`: Lion, "
              "random-k), in every MPI rank too (the MPI tool's `--plugin MODULE`); the DiLoCo cells also equal "
              "the independent oracle (`tests/tooling/oracles`).", ""]
    lines += ["Refused by design, in one line (on every executor):", ""]
    lines += [f"* {feature} with {others}: {why}." for feature, others, why in REFUSED_COMBINATIONS]
    return "\n".join(lines) + "\n"
