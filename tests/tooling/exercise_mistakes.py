"""The mistakes learners make in the transformer exercises x04-x07, one text edit each.

Each is an edit of the reference source of one exercise module (``old`` occurs exactly
once, inside that exercise's region): the slips issue 39 lists, planted one at a time into
a workspace whose x04-x07 are otherwise the reference. The grader must fail exactly that
exercise, and its hint (the lesson's common mistake the failing tests catch) must name the
slip: ``hint`` is a phrase of that bullet. Like ``core_mistakes``, the table lives under
``tests/tooling`` (never copied into a workspace), since every ``old`` is solution text.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["ExerciseMistake", "EXERCISE_MISTAKES"]


class ExerciseMistake(NamedTuple):
    name: str
    exercise: str  # the exercise that must fail, alone
    module: str  # under diloco, as in diloco.exercises
    old: str
    new: str
    hint: str  # a phrase of the lesson's common-mistake bullet the grader must show


EXERCISE_MISTAKES = (
    ExerciseMistake("mask-hides-the-diagonal", "x04", "models.layers", "k=cols - rows + 1)", "k=cols - rows)",
                    "The mask off by one"),
    ExerciseMistake("mask-shows-the-next-position", "x04", "models.layers", "k=cols - rows + 1)",
                    "k=cols - rows + 2)", "The mask off by one"),
    ExerciseMistake("sqrt-d-model", "x04", "models.layers", "scores *= 1.0 / math.sqrt(q.shape[-1])",
                    "scores *= 1.0 / math.sqrt(q.shape[-1] * q.shape[1])", "instead of"),
    ExerciseMistake("heads-in-the-wrong-order", "x04", "models.layers",
                    "qkv_flat.reshape(batch, length, 3, n_heads, head_dim).transpose(2, 0, 3, 1, 4)",
                    "qkv_flat.reshape(batch, length, 3, head_dim, n_heads).transpose(2, 0, 4, 1, 3)",
                    "Heads split or concatenated in the wrong order"),
    ExerciseMistake("softmax-backward-without-row-sum", "x05", "models.layers",
                    "        dscores -= row_dot(dscores, block)\n", "", "without its row-sum term"),
    ExerciseMistake("unbiased-variance", "x06", "models.layers", "* (1.0 / x.shape[-1]) + LN_EPS)",
                    "* (1.0 / (x.shape[-1] - 1)) + LN_EPS)", "The unbiased variance"),
    ExerciseMistake("eps-outside-the-root", "x06", "models.layers",
                    "1.0 / np.sqrt(row_dot(x_hat, x_hat) * (1.0 / x.shape[-1]) + LN_EPS)",
                    "1.0 / (np.sqrt(row_dot(x_hat, x_hat) * (1.0 / x.shape[-1])) + LN_EPS)", "outside the root"),
    ExerciseMistake("repeated-token-overwritten", "x07", "models.layers",
                    "    return onehot @ dx.reshape(flat.size, dx.shape[-1])\n",
                    "    grad = np.zeros((vocab_size, dx.shape[-1]), dtype=dx.dtype)\n"
                    "    grad[flat] = dx.reshape(flat.size, dx.shape[-1])\n"
                    "    return grad\n", "A repeated token's gradient overwritten"),
    ExerciseMistake("tied-head-gradient-dropped", "x07", "models.transformer", 'grads["wte"] += head_grad.T',
                    "pass", "The tied head's gradient dropped"),
    ExerciseMistake("residual-gradient-dropped", "x07", "models.transformer", "    dln1 += dx\n", "",
                    "A residual gradient dropped"),
    ExerciseMistake("cross-entropy-not-divided-by-n", "x07", "models.layers", "    exp *= 1.0 / n\n", "",
                    "not divided by"),
)
