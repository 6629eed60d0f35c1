"""The kinds of model a run can train, as data: ``MODEL_KINDS`` (``DiLoCoConfig.model`` -> ``ModelKind``).

What differs between the MLP and the transformer outside their classes and the calls of
``diloco.core.model_seam`` is a field here: the config section each owns (the config checks
that another model's stays at its default), Streaming DiLoCo's units, how a study sets a
width, the flags that size it, ``--context``'s default and what ``--model`` sets. Code
outside ``src/diloco/models/`` asks a ``ModelKind``, never compares a model's name
(``tests/tooling/test_model_seam_branches.py``). This module imports nothing of ``diloco``,
so the config, below the models, can read it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

__all__ = ["ModelKind", "MODEL_KINDS", "model_kind", "other_kinds", "section_owner", "TRANSFORMER_CONTEXT",
           "TRANSFORMER_DTYPE"]

TRANSFORMER_CONTEXT = 64  # the transformer's default window (docs/transformer.md); the MLP's is 6
TRANSFORMER_DTYPE = "float32"  # the dtype --model transformer sets: float32 for speed (float64 for the checks)


class ModelKind(NamedTuple):
    """What code outside the model classes may ask of a kind of model: what it does, not its name.

    Attributes
    ----------
    name : str
        ``DiLoCoConfig.model``.
    sequence_model : bool
        True where the model reads index windows of characters and is trained and scored at
        every position of a window (the transformer); False where each input has one label
        (the MLP, which reads a character window's one-hot columns and predicts the next one).
    milestone_model : bool
        True where the learner's milestone functions are the model (the MLP): milestone 20
        can run its workers as they are, and the fast engine steps it with its batched kernel.
    section : str
        The ``DiLoCoConfig`` field that shapes it (``hidden_sizes``, ``transformer``); with
        another model it must keep its default.
    section_error : str
        The config's error when ``section`` is set while another model is chosen.
    layers : callable
        ``layers(config) -> (count, source)``: Streaming DiLoCo's fragment units and the
        setting they come from, for ``FamilyConfig.check_against``'s message.
    width : callable
        ``width(w) -> changes``: the ``DiLoCoConfig.replace`` changes of a study's width ``w``.
    size_flags : str
        The flags that size the model, as a memory refusal names them.
    text_size_flags : str
        Those a ``--data shakespeare`` memory refusal names (the windows' ``--context`` first).
    default_context : int
        ``--context``'s default with ``--data shakespeare``.
    flag_dtype : str or None
        The dtype ``--model NAME`` sets unless ``--dtype`` is given (None: the config's).
    flag_resets : tuple of str
        Fields ``--model NAME`` sets back to their defaults unless a flag gives them, when it
        changes the config's model (a study's MLP widths are not the transformer's).
    """

    name: str
    sequence_model: bool
    milestone_model: bool
    section: str
    section_error: str
    layers: Callable
    width: Callable
    size_flags: str
    text_size_flags: str
    default_context: int
    flag_dtype: str | None = None
    flag_resets: tuple = ()


MODEL_KINDS = {
    "mlp": ModelKind(
        "mlp", sequence_model=False, milestone_model=True, section="hidden_sizes",
        section_error="hidden_sizes configure the MLP: the transformer's shape is the transformer section "
                      "(d_model, n_heads, n_layers, mlp_ratio, tied)",
        layers=lambda config: (len(config.hidden_sizes) + 1, f"hidden_sizes {config.hidden_sizes}"),
        width=lambda width: {"hidden_sizes": (width,)},
        size_flags="--hidden-sizes", text_size_flags="--context", default_context=6),
    "transformer": ModelKind(
        "transformer", sequence_model=True, milestone_model=False, section="transformer",
        section_error="transformer settings need model='transformer' (the MLP would ignore them)",
        layers=lambda config: (config.transformer.blocks(), f"n_layers {config.transformer.n_layers} + 2"),
        width=lambda width: {"transformer": {"d_model": width}},  # its heads kept
        size_flags="--d-model or --n-layers", text_size_flags="--context, --d-model or --n-layers",
        default_context=TRANSFORMER_CONTEXT, flag_dtype=TRANSFORMER_DTYPE, flag_resets=("hidden_sizes",)),
}


def model_kind(config) -> ModelKind:
    """The ``ModelKind`` of ``config.model``."""
    return MODEL_KINDS[config.model]


def other_kinds(config) -> list[ModelKind]:
    """The kinds of the models ``config`` does not train (whose sections it must leave at their defaults)."""
    return [kind for kind in MODEL_KINDS.values() if kind is not MODEL_KINDS[config.model]]


def section_owner(section: str) -> ModelKind:
    """The kind whose ``section`` (a ``DiLoCoConfig`` field) is ``section``."""
    return next(kind for kind in MODEL_KINDS.values() if kind.section == section)
