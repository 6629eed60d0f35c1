"""The optional graded exercises beyond the 30 milestones, declared once.

An exercise is graded like a milestone (its tests carry its pytest marker, ``x01`` ..), but
sits outside the course's numbering: ``diloco grade`` reports the exercises in a section of
their own and they never change the milestone score ("N/30"). Each exercise stubs some of
the library's *own* functions (beyond the 30 milestone modules): in the reference source
their bodies sit between ``# BEGIN EXERCISE xNN`` and ``# END EXERCISE xNN`` comments, and
``diloco workspace create`` replaces them with stubs that raise
``NotImplementedError(stub_message(exercise, function))``.

``depends_on`` lists the milestones an exercise's tests need (none so far): the grader
locks an exercise until they pass, as it locks a milestone.

Only the standard library is imported: the grader reads this table from a workspace
whose own package may not import.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Exercise", "EXERCISES", "by_code", "exercise_functions", "stub_message", "stub_code", "test_command"]


class Exercise(NamedTuple):
    number: int
    name: str
    functions: tuple[tuple[str, str], ...]  # (module under diloco, function): the stubbed bodies
    depends_on: tuple[int, ...]
    summary: str

    @property
    def code(self) -> str:
        """``x01``: the exercise's number, and its pytest marker."""
        return f"x{self.number:02d}"

    @property
    def marker(self) -> str:
        return self.code

    @property
    def lesson(self) -> str:
        """Path of the lesson, relative to the repository root."""
        return f"docs/exercises/{self.code}-{self.name.replace('_', '-')}.md"

    @property
    def label(self) -> str:
        """``x01 fp4_quantiser``."""
        return f"{self.code} {self.name}"

    @property
    def function_names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.functions)


EXERCISES: tuple[Exercise, ...] = (
    Exercise(1, "fp4_quantiser", (("core.quantize", "scale_exponents"), ("core.quantize", "fp4_codes")), (),
             "fp4 (E2M1) codes with one power-of-two scale per block"),
    Exercise(2, "streaming_schedule", (("core.schedule", "fragment_layers"), ("core.schedule", "fragment_keys"),
                                       ("core.schedule", "sync_offsets"), ("core.schedule", "sync_steps")), (),
             "Streaming DiLoCo: which fragment syncs after which inner step"),
    Exercise(3, "topk_error_feedback", (("methods.sparse", "_topk_flat"), ("methods.sparse", "compress_with_feedback")),
             (), "SparseLoCo: top-k per chunk, with what was not sent fed back"),
    Exercise(4, "causal_attention", (("models.layers", "causal_mask"), ("models.layers", "softmax"),
                                     ("models.layers", "causal_softmax"), ("models.layers", "masked_scores"),
                                     ("models.layers", "causal_attention")), (),
             "the transformer's causal multi-head self-attention, forward"),
    Exercise(5, "attention_backward", (("models.layers", "attention_backward"),), (),
             "attention's backward: dq, dk, dv through the softmax"),
    Exercise(6, "layer_norm_gelu", (("models.layers", "layer_norm"), ("models.layers", "layer_norm_backward"),
                                    ("models.layers", "gelu"), ("models.layers", "gelu_backward")), (),
             "LayerNorm and GELU, forward and backward"),
    Exercise(7, "lm_head", (("models.layers", "cross_entropy"), ("models.layers", "embedding_grad"),
                            ("models.transformer", "embedding_backward"), ("models.transformer", "block_backward")),
             (), "the language-model head: cross-entropy, the embeddings' gradients, the residual stream's"),
)

_BY_CODE = {e.code: e for e in EXERCISES}


def by_code(code: str) -> Exercise:
    return _BY_CODE[code]


def exercise_functions() -> dict[tuple[str, str], Exercise]:
    """``{(module, function): exercise}`` for every stubbed function."""
    return {function: e for e in EXERCISES for function in e.functions}


# The one definition of an exercise stub's message; the grader parses it (``stub_code``).
_STUB_MESSAGE = re.compile(r"^exercise (?P<code>x\d\d) (?P<name>\w+): (?P<function>\w+) is not implemented yet\b")


def stub_message(exercise: Exercise, function: str) -> str:
    """``"exercise x01 fp4_quantiser: fp4_codes is not implemented yet (see docs/exercises/x01-fp4-quantiser.md)"``."""
    return f"exercise {exercise.label}: {function} is not implemented yet (see {exercise.lesson})"


def stub_code(message: str) -> tuple[str, str] | None:
    """``(code, function)`` of an exercise stub's message, or None when ``message`` is not one."""
    match = _STUB_MESSAGE.match(str(message))
    return (match["code"], match["function"]) if match else None


def test_command(exercise: Exercise) -> str:
    """The command that runs one exercise's tests in a workspace, as printed to learners."""
    return f"make test M={exercise.marker}"
