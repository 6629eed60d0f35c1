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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from diloco.model import Params, cross_entropy_loss, init_model_params, model_backward, model_forward

__all__ = ["MLPModel"]


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
