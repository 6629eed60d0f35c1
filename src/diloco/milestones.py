"""The 30 milestones and the graph of which depends on which, declared once.

The grader, the lessons' "before you start" lines and the README's milestone list all
read this table. A milestone *depends on* another when its tests call that function
(directly or through the code it composes), so it cannot pass before the other does.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Milestone", "MILESTONES", "PARTS", "by_number", "by_name", "dependencies", "all_dependencies",
           "stub_message", "stub_number", "test_command"]


class Milestone(NamedTuple):
    number: int
    name: str
    module: str
    depends_on: tuple[int, ...]
    summary: str

    @property
    def marker(self) -> str:
        """The pytest marker, ``m07``."""
        return f"m{self.number:02d}"

    @property
    def lesson(self) -> str:
        """Path of the lesson, relative to the repository root."""
        return f"docs/milestones/{self.number:02d}-{self.name.replace('_', '-')}.md"

    @property
    def label(self) -> str:
        """``07 init_adamw_state``."""
        return f"{self.number:02d} {self.name}"


PARTS = {
    "model": "Part 1 - model, forward and loss",
    "adamw": "Part 2 - inner optimizer AdamW",
    "params": "Part 3 - parameter arithmetic",
    "sharding": "Part 4 - sharding and the local worker",
    "outer": "Part 5 - outer optimizer",
    "loop": "Part 6 - training loop and baseline",
    "evaluation": "Part 7 - evaluation and communication",
}

MILESTONES: tuple[Milestone, ...] = (
    Milestone(1, "init_model_params", "model", (), "He-initialised MLP weights, zero biases"),
    Milestone(2, "relu", "model", (), "max(x, 0) element-wise"),
    Milestone(3, "model_forward", "model", (2,), "affine layers with ReLU between them"),
    Milestone(4, "softmax", "model", (), "row-wise softmax, stable for huge logits"),
    Milestone(5, "cross_entropy_loss", "model", (), "mean cross-entropy via log-sum-exp"),
    Milestone(6, "model_backward", "model", (2, 3, 4), "gradient of the mean cross-entropy"),
    Milestone(7, "init_adamw_state", "adamw", (), "step 0, zero moments"),
    Milestone(8, "update_adam_moments", "adamw", (), "exponential moving averages of g and g^2"),
    Milestone(9, "bias_correct_moments", "adamw", (), "m / (1 - b1^t), v / (1 - b2^t)"),
    Milestone(10, "adam_param_step", "adamw", (), "theta - lr m_hat / (sqrt(v_hat) + eps)"),
    Milestone(11, "decoupled_weight_decay", "adamw", (), "theta (1 - lr wd)"),
    Milestone(12, "clone_params", "params", (), "deep copy of a parameter dict"),
    Milestone(13, "scale_params", "params", (), "every array times a scalar"),
    Milestone(14, "subtract_params", "params", (), "a - b per key"),
    Milestone(15, "average_params", "params", (), "(weighted) element-wise mean"),
    Milestone(16, "iid_shard_dataset", "sharding", (), "IID shards from one permutation"),
    Milestone(17, "noniid_shard_dataset", "sharding", (), "label-skewed Dirichlet shards"),
    Milestone(18, "sample_worker_batch", "sharding", (), "random mini-batch of aligned pairs"),
    Milestone(19, "local_train_step", "sharding", (2, 3, 4, 5, 6, 7, 8, 9, 10, 11),
              "forward, loss, backward, one AdamW step"),
    Milestone(20, "inner_train_worker", "sharding", (18, 19), "H local steps, AdamW state carried"),
    Milestone(21, "init_outer_optimizer", "outer", (), "zero outer momentum"),
    Milestone(22, "update_outer_momentum", "outer", (), "m = mu m + delta"),
    Milestone(23, "nesterov_param_update", "outer", (), "theta - lr (delta + mu m)"),
    Milestone(24, "compute_outer_gradient", "outer", (14, 15), "pseudo-gradient, old minus new"),
    Milestone(25, "run_diloco_round", "loop", (1, 7, 14, 15, 20, 21, 22, 23, 24, 30),
              "K workers, one pseudo-gradient, one outer step"),
    Milestone(26, "train_diloco", "loop", (1, 7, 16, 17, 21, 25, 28, 29), "rounds of DiLoCo with evaluation"),
    Milestone(27, "train_synchronous_baseline", "loop", (1, 6, 7, 15, 16, 17, 18, 19, 28, 29, 30),
              "one all-reduce per step, same compute"),
    Milestone(28, "evaluate_loss", "evaluation", (2, 3, 5), "held-out mean cross-entropy"),
    Milestone(29, "classification_accuracy", "evaluation", (2, 3), "fraction of correct arg-max"),
    Milestone(30, "communication_savings", "evaluation", (), "ring all-reduce bytes, sync vs DiLoCo"),
)

_BY_NUMBER = {m.number: m for m in MILESTONES}
_BY_NAME = {m.name: m for m in MILESTONES}


def by_number(number: int) -> Milestone:
    return _BY_NUMBER[number]


def by_name(name: str) -> Milestone:
    return _BY_NAME[name]


def dependencies(number: int) -> tuple[int, ...]:
    """Direct prerequisites of milestone ``number``."""
    return _BY_NUMBER[number].depends_on


def all_dependencies(number: int) -> tuple[int, ...]:
    """Every milestone ``number`` needs, directly or through others, sorted."""
    seen: set[int] = set()
    stack = list(_BY_NUMBER[number].depends_on)
    while stack:
        dep = stack.pop()
        if dep not in seen:
            seen.add(dep)
            stack.extend(_BY_NUMBER[dep].depends_on)
    return tuple(sorted(seen))


# The one definition of a stub's message. The workspace generator writes it, the grader
# parses it (``stub_number``) and the test suite recognises a stubbed function by it.
_STUB_MESSAGE = re.compile(r"^milestone (?P<number>\d\d) (?P<name>\w+): not implemented yet\b")


def stub_message(milestone: Milestone) -> str:
    """The message of the ``NotImplementedError`` a workspace stub raises.

    ``"milestone 07 init_adamw_state: not implemented yet (see docs/milestones/07-init-adamw-state.md)"``
    """
    return f"milestone {milestone.label}: not implemented yet (see {milestone.lesson})"


def stub_number(message: str) -> int | None:
    """The milestone number of a stub's message, or None when ``message`` is not one."""
    match = _STUB_MESSAGE.match(str(message))
    return int(match["number"]) if match else None


def test_command(milestone: Milestone) -> str:
    """The command that runs one milestone's tests in a workspace, as printed to learners."""
    return f"make test M={milestone.marker}"
