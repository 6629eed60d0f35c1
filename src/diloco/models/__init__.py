"""Model classes beyond the milestone MLP (``diloco.model``).

Every model here keeps its parameters in the same flat ``dict[str, ndarray]`` as the MLP
(``diloco.model.Params``), so the parameter milestones (clone, scale, subtract, average),
AdamW, Muon and the outer optimizers act on it unchanged. A model is a set of pure
functions: ``init(rng, config) -> params`` and ``loss_and_grads(params, inputs, targets,
config) -> (loss, grads)``, plus the key lists that Muon (its hidden matrices) and
Streaming DiLoCo (its blocks) need.

- ``diloco.models.transformer``: a causal pre-LayerNorm transformer language model;
- ``diloco.models.seam``: ``TransformerModel``, the calls the training core makes;
- ``diloco.models.layers``: its pieces (LayerNorm, GELU, causal attention, cross-entropy),
  each a forward and a backward by hand.
"""

from diloco.models.seam import TransformerModel
from diloco.models.transformer import (
    TransformerCache,
    TransformerConfig,
    init_transformer_params,
    sequence_targets,
    transformer_backward,
    transformer_blocks,
    transformer_forward,
    transformer_hidden_matrices,
    transformer_loss,
    transformer_loss_and_grads,
    transformer_param_shapes,
)

__all__ = [
    "TransformerCache",
    "TransformerConfig",
    "TransformerModel",
    "init_transformer_params",
    "sequence_targets",
    "transformer_backward",
    "transformer_blocks",
    "transformer_forward",
    "transformer_hidden_matrices",
    "transformer_loss",
    "transformer_loss_and_grads",
    "transformer_param_shapes",
]
