"""The model seam: which model a run trains, and the calls the core makes of it.

Every model is an object with the same calls: ``diloco.models.mlp.MLPModel`` (the
learner's MLP, its milestone functions wrapped) and ``diloco.models.TransformerModel``
(shaped by ``config.transformer``, with the vocabulary and the window length of the
character-level data and the run's dtype). ``model_for(config, params, encode)`` gives a
run's model from its parameters, ``data_model(config, x, encode, num_classes)`` from its
data; the tables below pick it by ``config.model``. What else differs between the models
(the config section each owns, the flags that size it, its default context, how a study
sets its width) is a ``ModelKind`` field in ``MODEL_KINDS`` (``diloco.core.model_kinds``,
re-exported here), so no code outside the model classes and these tables compares a
model's name (``tests/tooling/test_model_seam_branches.py``).
Everything else (sharding, batches, inner and outer optimizers, codecs, synchronisers,
executors, checkpoints) sees only a parameter dict, so it runs either model unchanged.

The calls::

    model.init_params(rng)                          # prepare_training, in the MLP's rng order
    model.loss_and_grads(params, x_batch, y_batch)  # every inner step, every executor
    model.parameter_shapes(), model.parameter_count()
    model.muon_keys()                               # Muon's matrices (None: Muon's default)
    model.fragments(params, P, pattern)             # Streaming DiLoCo's fragments
    model.metrics(params, x_eval, y_eval)           # the held-out record fields (the MLP's: milestones 28-29)
    model.describe(), model.activation_values(b, batches, n_eval)  # the memory checks
"""

from __future__ import annotations

from diloco.core.model_kinds import (
    MODEL_KINDS,
    TRANSFORMER_CONTEXT,
    TRANSFORMER_DTYPE,
    ModelKind,
    model_kind,
    other_kinds,
    section_owner,
)
from diloco.model import Params
from diloco.models.mlp import MLPModel

__all__ = ["ModelKind", "MODEL_KINDS", "model_kind", "other_kinds", "section_owner", "model_for", "data_model",
           "fragment_units", "with_model_defaults", "parameter_count", "parameter_keys", "parameter_shapes",
           "TRANSFORMER_CONTEXT", "TRANSFORMER_DTYPE"]


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


def _data_transformer(config, x, encode, num_classes):
    vocab_size = getattr(encode, "vocab_size", None)
    if vocab_size is None or getattr(encode, "input_width", None) != x.shape[1]:
        raise ValueError("model='transformer' trains on character windows: give the character-level data "
                         "(--data shakespeare, or diloco.text's windows with their OneHot as encode= of "
                         "diloco.core.driver.train; the milestone loops train the MLP)")
    return _transformer(config, vocab_size, x.shape[1])


def _data_mlp(config, x, encode, num_classes):
    if num_classes is None:
        raise TypeError("the MLP's output width needs num_classes (the largest label + 1)")
    num_features = x.shape[1] if encode is None else encode.num_features  # the one-hot columns of the windows
    return MLPModel((int(num_features), *config.hidden_sizes, int(num_classes)), config.dtype, encode)


# config.model -> the model a run builds: from its data, from its parameters, and with the shapes
# alone (for the parameter keys).
_FROM_DATA = {"mlp": _data_mlp, "transformer": _data_transformer}
_FROM_PARAMS = {"mlp": lambda config, params, encode: MLPModel.of(params, encode),
                "transformer": lambda config, params, encode: _transformer(config, params["wte"].shape[0],
                                                                           params["wpe"].shape[0])}
_SHAPED = {"mlp": lambda config: MLPModel((1, *config.hidden_sizes, 1)),  # the keys do not depend on the widths
           "transformer": lambda config: _transformer(config, 1, 1)}        # nor on V or T


def data_model(config, x, encode, num_classes: int | None = None):
    """The model a run of ``config`` on windows ``x`` (with ``encode``) trains, before it has parameters:
    an ``MLPModel`` of widths ``(d_in, *hidden_sizes, num_classes)`` (``d_in`` the columns of ``x``, or
    ``encode.num_features``; ``num_classes`` is needed for it alone), or a ``TransformerModel``.

    The transformer reads index windows of a ``diloco.text.OneHot`` encoder's vocabulary:
    its context is their width, its vocabulary the encoder's.
    """
    return _FROM_DATA[config.model](config, x, encode, num_classes)


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
    shapes, so every caller that holds the params (executors, records, synchronisers, tools) rebuilds the
    same model."""
    return _FROM_PARAMS[config.model](config, params, encode)


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
