"""The model seam: which model a run trains, and the calls the core makes of it.

Every model is an object with the same calls: ``diloco.models.mlp.MLPModel`` (the
learner's MLP, its milestone functions wrapped) and ``diloco.models.TransformerModel``
(shaped by ``config.transformer``, with the vocabulary and the window length of the
character-level data and the run's dtype). ``model_for(config, params, encode)`` gives a
run's model; the tables below pick it by ``config.model``, so no code outside the model
classes branches on the model's name. Everything else (sharding, batches, inner and
outer optimizers, codecs, synchronisers, executors, checkpoints) sees only a parameter
dict, so it runs either model unchanged.

The calls::

    model.init_params(rng)                          # prepare_training, in the MLP's rng order
    model.loss_and_grads(params, x_batch, y_batch)  # every inner step, every executor
    model.parameter_shapes(), model.parameter_count()
    model.muon_keys()                               # Muon's matrices (None: Muon's default)
    model.fragments(params, P, pattern)             # Streaming DiLoCo's fragments
    model.metrics(params, x_eval, y_eval)           # the transformer's held-out record fields

``model_of`` and ``data_model`` give None for the MLP: the form the run records and the
tools still read (their MLP path is the milestones' held-out metrics, 28-29).
"""

from __future__ import annotations

from typing import NamedTuple

from diloco.model import Params
from diloco.models.mlp import MLPModel

__all__ = ["ModelKind", "MODEL_KINDS", "model_kind", "model_for", "model_of", "data_model", "fragment_units",
           "with_model_defaults", "parameter_count", "parameter_keys", "parameter_shapes", "TRANSFORMER_CONTEXT"]

TRANSFORMER_CONTEXT = 64  # the transformer's default window (docs/transformer.md); the MLP's is 6


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
    """

    name: str
    sequence_model: bool
    milestone_model: bool


MODEL_KINDS = {"mlp": ModelKind("mlp", sequence_model=False, milestone_model=True),
               "transformer": ModelKind("transformer", sequence_model=True, milestone_model=False)}


def model_kind(config) -> ModelKind:
    """The ``ModelKind`` of ``config.model``."""
    return MODEL_KINDS[config.model]


def _transformer(config, vocab_size: int, context: int):
    from diloco.models import TransformerConfig, TransformerModel  # the MLP's runs never import it

    shape = config.transformer
    return TransformerModel(TransformerConfig(
        vocab_size=vocab_size, context=context, d_model=shape.d_model, n_heads=shape.n_heads,
        n_layers=shape.n_layers, mlp_ratio=shape.mlp_ratio, tied=shape.tied, dtype=config.dtype),
        engine=_evaluation_engine(config))


def _evaluation_engine(config) -> str:
    """``"fast"`` where the run's engine is the fast one and its compiled transformer step is
    installed (the held-out metrics then run the forward only in reused buffers), else ``"reference"``."""
    if config.engine != "fast":
        return "reference"
    from diloco.engine.transformer_step import fast_transformer_available  # absent from learner workspaces

    return "fast" if fast_transformer_available() else "reference"


def _data_transformer(config, x, encode):
    vocab_size = getattr(encode, "vocab_size", None)
    if vocab_size is None or getattr(encode, "input_width", None) != x.shape[1]:
        raise ValueError("model='transformer' trains on character windows: give the character-level data "
                         "(--data shakespeare, or diloco.text's windows with their OneHot as encode= of "
                         "diloco.core.driver.train; the milestone loops train the MLP)")
    return _transformer(config, vocab_size, x.shape[1])


def _no_object(config, x, encode):
    return None


# config.model -> the model a run builds: from its data (None: the MLP, see data_model), from its
# parameters, and with the shapes alone (for the parameter keys).
_FROM_DATA = {"mlp": _no_object, "transformer": _data_transformer}
_FROM_PARAMS = {"mlp": lambda config, params, encode: MLPModel.of(params, encode),
                "transformer": lambda config, params, encode: _transformer(config, params["wte"].shape[0],
                                                                           params["wpe"].shape[0])}
_SHAPED = {"mlp": lambda config: MLPModel((1, *config.hidden_sizes, 1)),  # the keys do not depend on the widths
           "transformer": lambda config: _transformer(config, 1, 1)}        # nor on V or T


def data_model(config, x, encode):
    """The model a run of ``config`` on windows ``x`` (with ``encode``) trains, for the tools and the run
    records: None for the MLP (their milestone path), else the ``TransformerModel``.

    The transformer reads index windows of a ``diloco.text.OneHot`` encoder's vocabulary:
    its context is their width, its vocabulary the encoder's.
    """
    return _FROM_DATA[config.model](config, x, encode)


def parameter_keys(config) -> list[str]:
    """The keys of a ``config`` run's parameters, in order (what a checkpoint must hold)."""
    return list(_SHAPED[config.model](config).parameter_shapes())


def parameter_shapes(model) -> dict[str, tuple[int, ...]]:
    """``model.parameter_shapes()``: the shape of every parameter, in order."""
    return model.parameter_shapes()


def parameter_count(model) -> int:
    """``model.parameter_count()``: the model's number of parameters."""
    return model.parameter_count()


def model_for(config, params: Params, encode=None):
    """The model of ``params`` (after initialisation): an ``MLPModel`` (reading its inputs through
    ``encode``) or a ``TransformerModel``, whose vocabulary and context are read from the embeddings'
    shapes, so every caller that holds the params (executors, records, synchronisers) rebuilds the same model."""
    return _FROM_PARAMS[config.model](config, params, encode)


def model_of(config, params: Params):
    """``model_for`` in the form the run records and the tools read: None for the MLP."""
    return None if model_kind(config).milestone_model else model_for(config, params)


def fragment_units(config, params: Params) -> list[tuple[str, ...]]:
    """Streaming DiLoCo's ``config.family.fragments`` fragments of ``params`` (``model.fragments``)."""
    return model_for(config, params).fragments(params, config.family.fragments, config.family.pattern)


def with_model_defaults(config, params: Params):
    """``config`` with what the model fixes: Muon's matrices are the transformer's hidden ones.

    Muon's default (every 2-D array) suits the MLP (its ``muon_keys()`` is None); a
    transformer's embeddings and head are 2-D too but stay with AdamW (Jordan et al., 2024;
    MuLoCo), so unless the user named ``muon.keys``, the model's ``muon_keys()`` fill them.
    """
    if config.inner_optimizer != "muon" or config.muon.keys is not None:
        return config
    keys = model_for(config, params).muon_keys()
    return config if keys is None else config.replace(muon={"keys": keys})
