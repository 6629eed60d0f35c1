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
"""

from __future__ import annotations

import numpy as np

from diloco.engine.flat import FlatLayout, layer_views, pack

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

    def loss_and_grads(self) -> np.ndarray:
        """Each group's loss on its batch; ``grads[s]`` is the mean of the G groups' gradients.

        Returns
        -------
        ndarray of shape (S, G), the params' dtype
        """
        S, G, b = self.params.shape[0], self.groups, self.batch_size
        losses = np.empty((S, G), dtype=self.params.dtype)
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
