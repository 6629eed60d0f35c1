"""The MLP of the milestones as a model object, with the transformer's calls (``diloco.models.seam``).

The learner's functions stay where the course puts them (``diloco.model``: milestones
01-10; ``diloco.core.schedule.fragment_keys``: exercise x02); ``MLPModel`` only wraps
them, so the core asks both models the same things and has no branch on which one it
holds::

    model = MLPModel(widths=(d_in, *hidden_sizes, C), dtype="float64", encode=None)
    params = model.init_params(rng)                        # milestone 01, in its rng order
    loss, grads = model.loss_and_grads(params, x_b, y_b)   # encode, milestones 03-10
    model.parameter_shapes(), model.parameter_count()
    model.muon_keys()                                      # None: Muon's default, every W
    model.fragments(params, P, pattern)                    # Streaming DiLoCo: the layers (x02)
    loss, accuracy = model.metrics(params, x_eval, y_eval) # milestones 28-29, EVAL_CHUNK rows at a time
    model.describe(), model.activation_values(b, batches, n_eval)  # the memory checks' words and sizes
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diloco.evaluation import classification_accuracy, evaluate_loss
from diloco.model import Params, cross_entropy_loss, init_model_params, model_backward, model_forward, relu

__all__ = ["MLPModel", "EVAL_CHUNK"]

# Held-out windows encoded at a time by ``MLPModel.metrics`` (one (2048, c V) block).
EVAL_CHUNK = 2048


@dataclass(frozen=True)
class MLPModel:
    """The milestones' MLP of layer widths ``widths`` (input, hidden..., classes).

    Attributes
    ----------
    widths : tuple of int
        ``(d_in, h_1, ..., C)``; ``d_in`` is the encoded width when ``encode`` is given.
    dtype : str
        The parameters' dtype.
    encode : callable or None
        ``encode(x_batch, dtype) -> (b, d_in)`` model inputs (``diloco.text.OneHot``), applied
        to each batch before the forward.
    """

    widths: tuple
    dtype: str = "float64"
    encode: object = None

    @classmethod
    def of(cls, params: Params, encode=None) -> MLPModel:
        """The MLP whose parameters ``params`` are (``W1, b1, ..., WL, bL``)."""
        layers = len(params) // 2
        widths = (params["W1"].shape[0], *(params[f"W{layer}"].shape[1] for layer in range(1, layers + 1)))
        return cls(widths, np.dtype(params["W1"].dtype).name, encode)

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for layer, (fan_in, fan_out) in enumerate(zip(self.widths[:-1], self.widths[1:], strict=True), start=1):
            shapes[f"W{layer}"], shapes[f"b{layer}"] = (fan_in, fan_out), (fan_out,)
        return shapes

    def parameter_count(self) -> int:
        return sum(int(np.prod(shape)) for shape in self.parameter_shapes().values())

    def init_params(self, rng: np.random.Generator) -> Params:
        """Milestone 01 (``init_model_params``)."""
        return init_model_params(self.widths, rng, dtype=np.dtype(self.dtype))

    def loss_and_grads(self, params: Params, x_batch: np.ndarray, y_batch: np.ndarray) -> tuple[float, Params]:
        """One batch's loss and gradient: ``encode``, then milestones 03-10."""
        if self.encode is not None:
            x_batch = self.encode(x_batch, next(iter(params.values())).dtype)
        logits, cache = model_forward(params, x_batch)
        return cross_entropy_loss(logits, y_batch), model_backward(params, cache, y_batch)

    def muon_keys(self):
        """None: Muon's own default (every 2-D array, ``diloco.methods.muon.muon_keys``) suits the MLP."""
        return None

    def fragments(self, params: Params, count: int, pattern: str) -> list[tuple[str, ...]]:
        """Streaming DiLoCo's fragments of ``params``: the layers, grouped by the learner's ``fragment_keys`` (x02)."""
        from diloco.core.schedule import fragment_keys

        return fragment_keys(params, count, pattern)

    def metrics(self, params: Params, x_eval: np.ndarray, y_eval: np.ndarray) -> tuple[float, float]:
        """``(evaluate_loss, classification_accuracy)`` of ``params`` on held-out data.

        Without ``encode`` these are milestones 28 and 29 on the whole array. With an encoder
        that has ``first_layer`` (``diloco.text.OneHot``) and a model with a hidden layer, the
        first layer's pre-activation is gathered from the index windows (no one-hot matrix),
        ``relu`` (milestone 02) applied once, and milestones 28 and 29 run on the remaining
        layers. With another encoder, the windows are encoded ``EVAL_CHUNK`` rows at a time.
        Either way the chunks' means are combined, weighted by their sizes, so no dense
        ``(n, c V)`` matrix is ever built.
        """
        if self.encode is None:
            return evaluate_loss(params, x_eval, y_eval), classification_accuracy(params, x_eval, y_eval)
        rest, inputs = self._encoded_inputs(params)
        loss_sum = correct = 0.0
        for start in range(0, len(y_eval), EVAL_CHUNK):
            x_chunk, y_chunk = inputs(x_eval[start:start + EVAL_CHUNK]), y_eval[start:start + EVAL_CHUNK]
            loss_sum += evaluate_loss(rest, x_chunk, y_chunk) * len(y_chunk)
            correct += classification_accuracy(rest, x_chunk, y_chunk) * len(y_chunk)
        return loss_sum / len(y_eval), correct / len(y_eval)

    def _encoded_inputs(self, params: Params):
        """``(rest, inputs)``: the layers milestones 28-29 run on, and what turns index windows into
        their inputs (the first layer gathered and ``relu`` applied, or ``encode``)."""
        encode, dtype = self.encode, next(iter(params.values())).dtype
        gather, layers = getattr(encode, "first_layer", None), len(params) // 2
        if gather is not None and layers >= 2:  # a hidden layer to apply relu to
            rest = {f"{kind}{layer - 1}": params[f"{kind}{layer}"] for layer in range(2, layers + 1) for kind in "Wb"}
            return rest, lambda x_chunk: relu(gather(x_chunk, params["W1"]) + params["b1"])
        return params, lambda x_chunk: encode(x_chunk, dtype)

    def describe(self) -> str:
        """The model as the memory check names it: its layer sizes."""
        return f"layer sizes {self.widths} (C = largest label in y or y_eval + 1)"

    def activation_values(self, batch_size: int, batches: int, num_eval: int) -> int:
        """Values held by activations at once, roughly (``diloco.tools.cli.preflight.estimate_memory``):
        ``batches`` batches through the widest layers (4 arrays of ``batch_size * sum(widths)``) and the
        held-out set through the model at once (3 arrays of ``num_eval * max(widths)``)."""
        return 4 * batches * batch_size * sum(self.widths) + 3 * num_eval * max(self.widths)
