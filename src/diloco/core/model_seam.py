"""The model seam: which model a run trains, and the four calls the core makes of it.

``config.model == "mlp"`` (the default) is the learner's MLP: ``model_of`` returns None
and every caller keeps the milestone path (``model_forward``, ``cross_entropy_loss``,
``model_backward``, milestones 28-29 for the held-out metrics, the fast engine's
batched MLP kernel). ``config.model == "transformer"`` is ``diloco.models``'
``TransformerModel``, shaped by ``config.transformer`` (``TransformerShape``), with the
vocabulary and the window length of the character-level data and the run's dtype.
Everything else (sharding, batches, inner and outer optimizers, codecs, synchronisers,
executors, checkpoints) sees only a parameter dict, so it runs either model unchanged.

The calls::

    model.init_params(rng)                          # prepare_training, in the MLP's rng order
    model.loss_and_grads(params, x_batch, y_batch)  # every inner step, every executor
    model.metrics(params, x_eval, y_eval)           # the held-out record fields
    model.muon_keys(), model.blocks()               # Muon's matrices, Streaming's fragment units
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco.model import Params

__all__ = ["ModelKind", "MODEL_KINDS", "model_kind", "model_of", "data_model", "fragment_units", "with_model_defaults",
           "parameter_count", "parameter_keys",
           "parameter_shapes",
           "TRANSFORMER_CONTEXT"]

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
    """

    name: str
    sequence_model: bool


MODEL_KINDS = {"mlp": ModelKind("mlp", sequence_model=False),
               "transformer": ModelKind("transformer", sequence_model=True)}


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


def data_model(config, x, encode):
    """The model a run of ``config`` on windows ``x`` (with ``encode``) trains: None for the MLP.

    The transformer reads index windows of a ``diloco.text.OneHot`` encoder's vocabulary:
    its context is their width, its vocabulary the encoder's.
    """
    if config.model == "mlp":
        return None
    vocab_size = getattr(encode, "vocab_size", None)
    if vocab_size is None or getattr(encode, "input_width", None) != x.shape[1]:
        raise ValueError("model='transformer' trains on character windows: give the character-level data "
                         "(--data shakespeare, or diloco.text's windows with their OneHot as encode= of "
                         "diloco.core.driver.train; the milestone loops train the MLP)")
    return _transformer(config, vocab_size, x.shape[1])


def parameter_keys(config) -> list[str]:
    """The keys of a ``config`` run's parameters, in order (what a checkpoint must hold)."""
    if config.model == "mlp":
        return [key for layer in range(1, len(config.hidden_sizes) + 2) for key in (f"W{layer}", f"b{layer}")]
    return list(parameter_shapes(_transformer(config, 1, 1)))  # the keys do not depend on V or T


def parameter_shapes(model) -> dict[str, tuple[int, ...]]:
    """The transformer's parameters' shapes (its one table: ``transformer_param_shapes``)."""
    from diloco.models.transformer import transformer_param_shapes

    return transformer_param_shapes(model.config)


def parameter_count(model) -> int:
    """The transformer's number of parameters."""
    return sum(int(np.prod(shape)) for shape in parameter_shapes(model).values())


def model_of(config, params: Params):
    """The model of ``params`` (after initialisation): None for the MLP, else its ``TransformerModel``.

    The vocabulary and the context are read from the embeddings' shapes, so every caller
    that holds the params (executors, records, synchronisers) rebuilds the same model.
    """
    if config.model == "mlp":
        return None
    return _transformer(config, params["wte"].shape[0], params["wpe"].shape[0])


def fragment_units(config, params: Params) -> list[tuple[str, ...]] | None:
    """Streaming DiLoCo's fragment units of ``params``: the transformer's blocks, or None (the MLP's layers)."""
    model = model_of(config, params)
    return None if model is None else model.blocks()


def with_model_defaults(config, params: Params):
    """``config`` with what the model fixes: Muon's matrices are the transformer's hidden ones.

    Muon's default (every 2-D array) suits the MLP; a transformer's embeddings and head
    are 2-D too but stay with AdamW (Jordan et al., 2024; MuLoCo), so unless the user named
    ``muon.keys``, the transformer's ``muon_keys()`` fill them.
    """
    model = model_of(config, params)
    if model is None or config.inner_optimizer != "muon" or config.muon.keys is not None:
        return config
    return config.replace(muon={"keys": model.muon_keys()})
