"""The transformer as the training core's model seam: the calls the core makes, nothing more.

The core trains the char-LM MLP on ``(x, y)`` rows: ``x`` a window of ``T`` character ids
(``diloco.text`` stores them as float32), ``y`` the character after it. ``TransformerModel``
takes the same rows, so sharding, batch sampling (milestones 16-18), the outer step and
the wire formats see nothing new; it turns each batch into tokens and shifted targets
(``sequence_targets``), and every position of a window is a prediction.

What a core executor calls, per worker-step and per evaluation::

    model = TransformerModel(TransformerConfig(context=T, dtype=config.dtype))
    params = model.init_params(rng)                          # dict[str, ndarray]
    loss, grads = model.loss_and_grads(params, x_batch, y_batch)
    eval_loss, eval_accuracy = model.metrics(params, x_eval, y_eval)
    MuonConfig(keys=model.muon_keys())                       # Muon on the hidden matrices
    model.blocks(), model.fragments(params, P, pattern)      # Streaming's fragment units, fragments
    model.parameter_shapes(), model.parameter_count()
    model.describe(), model.activation_values(b, batches, n_eval)  # the memory checks' words and sizes
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from diloco._validation import check_positive_int
from diloco.model import Params
from diloco.models.layers import cross_entropy
from diloco.models.transformer import (
    TransformerConfig,
    init_transformer_params,
    sequence_targets,
    transformer_blocks,
    transformer_forward,
    transformer_hidden_matrices,
    transformer_loss_and_grads,
    transformer_param_shapes,
)

__all__ = ["TransformerModel"]


@dataclass(frozen=True)
class TransformerModel:
    """A ``TransformerConfig`` with the four calls the core makes.

    Attributes
    ----------
    config : TransformerConfig
        Its ``context`` must equal the data's window length ``T``; its ``dtype`` the run's.
    eval_chunk : int >= 1
        Windows per forward pass in ``metrics`` (32 windows of 64: one chunk's activations
        stay in the CPU's cache).
    engine : "reference" or "fast"
        Which forward ``metrics`` runs: the reference functions, or the fast engine's
        ``TransformerStep`` (``diloco.engine.transformer_step.step_metrics``: the forward only,
        in reused buffers; equal to float rounding). ``model_of`` sets it from the run's
        ``config.engine``.
    """

    config: TransformerConfig = field(default_factory=TransformerConfig)
    eval_chunk: int = 32
    engine: str = "reference"

    def __post_init__(self) -> None:
        if not isinstance(self.config, TransformerConfig):
            raise TypeError(f"TransformerModel.config must be a TransformerConfig, got {type(self.config).__name__}")
        try:
            object.__setattr__(self, "eval_chunk", check_positive_int(self.eval_chunk, "eval_chunk"))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"TransformerModel.{exc}") from None
        if self.engine not in ("reference", "fast"):
            raise ValueError(f"TransformerModel.engine must be 'reference' or 'fast', got {self.engine!r}")

    def init_params(self, rng: np.random.Generator) -> Params:
        """``init_transformer_params(rng, config)``."""
        return init_transformer_params(rng, self.config)

    def loss_and_grads(self, params: Params, x_batch: np.ndarray, y_batch: np.ndarray) -> tuple[float, Params]:
        """Mean next-token cross-entropy over every position of the batch's windows, and its gradient.

        Parameters
        ----------
        params : dict of str -> ndarray
        x_batch : ndarray of shape (b, T), integer-valued token ids
        y_batch : ndarray of shape (b,), integer: the token after each window

        Returns
        -------
        loss : float
        grads : dict of str -> ndarray, shaped like ``params``
        """
        tokens, targets = sequence_targets(x_batch, y_batch)
        return transformer_loss_and_grads(params, tokens, targets, self.config)

    def metrics(self, params: Params, x_eval: np.ndarray, y_eval: np.ndarray) -> tuple[float, float]:
        """Held-out mean cross-entropy and next-token accuracy over every position of every window.

        ``eval_chunk`` windows at a time; the chunks' sums are added, so the result is the
        mean over all ``n T`` predictions whatever the chunk size.

        Returns
        -------
        (loss, accuracy) : tuple of float
            ``accuracy`` is the fraction of positions whose largest logit is the target.
        """
        if len(y_eval) == 0 or np.ndim(x_eval) != 2:
            raise ValueError(f"x_eval must be (n, T) windows with n >= 1, got shape {np.shape(x_eval)}")
        if self.engine == "fast":
            from diloco.engine.transformer_step import step_metrics  # absent from learner workspaces

            return step_metrics(self.config, params, *sequence_targets(x_eval, y_eval), chunk=self.eval_chunk)
        loss_sum = correct = 0.0
        for start in range(0, len(y_eval), self.eval_chunk):
            tokens, targets = sequence_targets(x_eval[start:start + self.eval_chunk],
                                               y_eval[start:start + self.eval_chunk])
            logits, _ = transformer_forward(params, tokens, self.config)
            logits, targets = logits.reshape(-1, self.config.vocab_size), targets.reshape(-1)
            loss, _ = cross_entropy(logits, targets, grad=False)
            loss_sum += loss * targets.size
            correct += float(np.count_nonzero(logits.argmax(axis=1) == targets))
        predictions = len(y_eval) * x_eval.shape[1]
        return loss_sum / predictions, correct / predictions

    def position_losses(self, params: Params, x_eval: np.ndarray, y_eval: np.ndarray) -> np.ndarray:
        """Held-out mean cross-entropy at each position ``t`` of the windows (``(T,)``): the loss of
        predicting character ``t + 1`` from the ``t + 1`` characters before it. A model that uses its
        context has a loss that falls with ``t``; one that reads only the last character, a flat one.
        The reference forward, ``eval_chunk`` windows at a time; ``metrics``' loss is its mean.
        """
        if len(y_eval) == 0 or np.ndim(x_eval) != 2:
            raise ValueError(f"x_eval must be (n, T) windows with n >= 1, got shape {np.shape(x_eval)}")
        sums = np.zeros(x_eval.shape[1])
        for start in range(0, len(y_eval), self.eval_chunk):
            tokens, targets = sequence_targets(x_eval[start:start + self.eval_chunk],
                                               y_eval[start:start + self.eval_chunk])
            logits, _ = transformer_forward(params, tokens, self.config)
            shifted = logits - logits.max(axis=-1, keepdims=True)
            log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
            picked = np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
            sums -= picked.sum(axis=0, dtype=np.float64)
        return sums / len(y_eval)

    def muon_keys(self) -> tuple[str, ...]:
        """``transformer_hidden_matrices(config)``: for ``MuonConfig(keys=...)``."""
        return transformer_hidden_matrices(self.config)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """``transformer_param_shapes(config)``, the one table of the parameters' shapes."""
        return transformer_param_shapes(self.config)

    def parameter_count(self) -> int:
        """The number of parameters, without listing every block (``--n-layers 1000000000``): a one-block
        model's table, plus each further block's share (two blocks' table minus one's)."""
        one, two = (sum(int(np.prod(shape)) for shape in
                        transformer_param_shapes(replace(self.config, n_layers=n)).values()) for n in (1, 2))
        return one + (self.config.n_layers - 1) * (two - one)

    def describe(self) -> str:
        """The model as the memory check names it."""
        return f"the transformer {self.config}"

    def activation_values(self, batch_size: int, batches: int, num_eval: int) -> int:
        """Values held by activations at once, roughly (``diloco.tools.cli.preflight.estimate_memory``): one
        batch and one held-out chunk of windows (``batches``, the workers stepped at once, not counted), per
        token and block its cache (about 16 d) and attention probabilities (2 h T), and the logits (3 V)."""
        cfg = self.config
        per_token = cfg.n_layers * (16 * cfg.d_model + 2 * cfg.n_heads * cfg.context) + 3 * cfg.vocab_size
        return (batch_size + min(num_eval, self.eval_chunk)) * cfg.context * per_token

    def fragments(self, params: Params, count: int, pattern: str) -> list[tuple[str, ...]]:
        """Streaming DiLoCo's fragments: unions of ``blocks()`` (``block_fragment_keys``)."""
        from diloco.core.schedule import block_fragment_keys

        return block_fragment_keys(self.blocks(), count, pattern)

    def blocks(self) -> list[tuple[str, ...]]:
        """``transformer_blocks(config)``: embeddings, each layer, head; Streaming's fragments are unions."""
        return transformer_blocks(self.config)
