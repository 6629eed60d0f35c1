"""``ModelStack``: ``WorkerStack``'s interface over a model of ``diloco.core.model_seam`` (the transformer).

The fast executor keeps the K workers' parameters and optimizer moments in flat ``(K, P)``
buffers and steps them with its flat optimizer kernels whatever the model; only the
loss and gradient come from the model. ``WorkerStack`` computes them with batched
matmuls of an MLP; ``ModelStack`` calls ``model.loss_and_grads`` on views of the flat
buffers (``layer_views``: no copy in), one model (row ``s``) and one group of ``b``
rows at a time, and writes the gradient into the flat ``grads`` row.

The transformer is not batched across workers here: its step is dominated by
``(b h, T, T)`` attention and ``(b T, d)`` matmuls that already fill a core, so the
fast executor runs it in the per-worker layout (``docs/transformer.md``).

With the ``fast`` extra (numba; not under ``DILOCO_ADAMW_KERNEL=numpy``) a transformer's loss
and gradient come from ``diloco.engine.transformer_step.TransformerStep`` instead: the same
equations in reused buffers with fused element-wise loops, the gradient written straight into
the flat row, nothing allocated per step. It equals ``model.loss_and_grads`` to float rounding;
the choice is made once per run, so a run's digits do not depend on how long it ran.
"""

from __future__ import annotations

import numpy as np

from diloco.engine.flat import FlatLayout, layer_views, pack
from diloco.engine.transformer_step import TransformerStep, fast_transformer_available

__all__ = ["ModelStack"]


class ModelStack:
    """S models' params and grads as ``(S, P)`` buffers; each of G groups of ``b`` rows is one batch.

    Attributes
    ----------
    params, grads : ndarray of shape (S, P)
    x : ndarray of shape (S, G b, T)
        The batches' index windows (``draw_batch`` fills them).
    labels : ndarray of shape (S, G b), intp
    columns : None
        (``WorkerStack``'s one-hot columns: the transformer reads the windows.)
    """

    def __init__(self, model, layout: FlatLayout, num_models: int, groups: int, batch_size: int, dtype) -> None:
        S, R = num_models, groups * batch_size
        self.model, self.layout, self.groups, self.batch_size = model, layout, groups, batch_size
        self.params = np.zeros((S, layout.size), dtype=dtype)
        self.grads = np.zeros((S, layout.size), dtype=dtype)
        self.x = np.zeros((S, R, model.config.context), dtype=np.float32)
        self.labels = np.zeros((S, R), dtype=np.intp)
        self.columns = None
        self.step = TransformerStep(model.config) if fast_transformer_available() else None
        self.tokens = np.zeros((batch_size, model.config.context), dtype=np.intp)
        self.targets = np.zeros_like(self.tokens)
        self.scratch = np.zeros(layout.size, dtype=dtype) if groups > 1 and self.step is not None else None
        self.views = [(layer_views(self.params[s], layout), layer_views(self.grads[s], layout)) for s in range(S)]
        self.scratch_views = None if self.scratch is None else layer_views(self.scratch, layout)

    def loss_and_grads(self) -> np.ndarray:
        """Each group's loss on its batch; ``grads[s]`` is the mean of the G groups' gradients.

        Returns
        -------
        ndarray of shape (S, G), the params' dtype
        """
        S, G, b = self.params.shape[0], self.groups, self.batch_size
        losses = np.empty((S, G), dtype=self.params.dtype)
        if self.step is not None:
            return self._fast_loss_and_grads(losses)
        for s in range(S):
            params = layer_views(self.params[s], self.layout)
            total = None
            for g in range(G):
                rows = slice(g * b, (g + 1) * b)
                losses[s, g], grads = self.model.loss_and_grads(params, self.x[s, rows], self.labels[s, rows])
                total = grads if total is None else {key: total[key] + grads[key] for key in total}
            pack(total, self.grads[s], self.layout)
            if G > 1:
                self.grads[s] *= 1.0 / G  # the mean of the groups' gradients, as WorkerStack's
        return losses

    def _fast_loss_and_grads(self, losses: np.ndarray) -> np.ndarray:
        """``loss_and_grads`` by ``TransformerStep``: group 0's gradient into the flat row, the others' added."""
        b = self.batch_size
        for s, (params, grads) in enumerate(self.views):
            for g in range(self.groups):
                rows = slice(g * b, (g + 1) * b)
                self._tokens(self.x[s, rows], self.labels[s, rows])
                out = grads if g == 0 else self.scratch_views
                losses[s, g] = self.step.loss_and_grads(params, self.tokens, self.targets, out)
                if g > 0:
                    self.grads[s] += self.scratch
            if self.groups > 1:
                self.grads[s] *= 1.0 / self.groups
        return losses

    def _tokens(self, windows: np.ndarray, next_tokens: np.ndarray) -> None:
        """``sequence_targets(windows, next_tokens)`` into ``self.tokens`` and ``self.targets``, ids checked."""
        tokens, targets = self.tokens, self.targets
        np.copyto(tokens, windows, casting="unsafe")
        targets[:, :-1] = tokens[:, 1:]
        targets[:, -1] = next_tokens
        vocab = self.model.config.vocab_size
        if not (np.array_equal(tokens, windows) and 0 <= min(tokens.min(), targets.min())
                and max(tokens.max(), targets.max()) < vocab):
            raise ValueError(f"transformer windows must hold whole-number ids in [0, {vocab})")
