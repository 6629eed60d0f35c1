"""Forward, loss and backward of S copies of the MLP at once, into preallocated buffers.

``WorkerStack`` holds S models side by side (``params`` of shape ``(S, P)``, see
``diloco.engine.flat``) and every buffer one training step needs: the mini-batches,
the activations, the softmax, the gradients. Nothing is allocated per step. Each of the
S models sees ``G`` groups of ``b`` rows (``G`` workers' mini-batches):

* DiLoCo, stacked layout: ``S = K`` models (one per worker), ``G = 1``.
* DiLoCo, per-worker layout: ``S = 1``, ``G = 1``, the workers one after another.
* The synchronous baseline: ``S = 1`` shared model, ``G = K`` workers' batches, whose
  gradients are averaged: ``g = (1/K) sum_k g_k``.

The arithmetic is the milestones' (``diloco.model``), written with ``np.matmul`` on 3-D
arrays (one BLAS call per model; ``einsum`` is several times slower here)::

    z_l = a_{l-1} @ W_l + b_l,   a_l = max(z_l, 0)                   (forward)
    loss_g = mean_i [ m_i + log sum_j exp(z_ij - m_i) - z_{i, y_i} ]  (m_i = max_j z_ij)
    dz_L = (softmax(z_L) - onehot(y)) / b       (/ G as well when G groups are averaged)
    dW_l = a_{l-1}^T dz_l,  db_l = sum_i dz_l,  dz_{l-1} = (dz_l W_l^T) * [z_{l-1} > 0]

One-hot inputs (the character-level task, ``context=c``): the executor writes each row's
``c`` one-hot columns into ``columns`` and no ``(b, c V)`` one-hot matrix is ever built.
The forward pass gathers ``z_1 = sum_p W_1[column_p] + b_1`` (``c`` rows of ``W_1`` per
row of the batch instead of a ``c V``-wide product whose other terms are exact zeros) and
the backward pass scatters ``dW_1[column_p] += dz_1[row]``, row after row (the same sums
as ``x^T dz_1``, to rounding). The scatter runs as the numba loop when the engine's
kernel is numba (``diloco.engine.optim.current_kernel``), else as NumPy passes that add
the same terms in the same order, so the two are equal to the last bit. Measured on the
char-LM's first layer (K = 8, b = 32, 390 x 128, real windows, one thread, CPU time;
``python benchmarks/_case.py '{"impl": "charlm-first-layer", "dtype": "float64"}'``, and
``make bench``'s char-LM section, 2026-12-02), against the dense ``x^T dz_1``: the numba
scatter is 3.0x (float32) to 4.6x (float64) faster, the NumPy scatter 1.2x and 1.8x.
"""

from __future__ import annotations

import numpy as np

from diloco.engine.flat import FlatLayout, layer_views
from diloco.engine.optim import current_kernel, numba_jit

__all__ = ["WorkerStack"]

_SCATTER = None


def _scatter_kernel():
    """The compiled first-layer gradient of one-hot inputs (built on first use)."""
    global _SCATTER
    if _SCATTER is None:
        @numba_jit
        def scatter(dW, columns, dz):  # into a zeroed dW (NumPy's fill: 2x faster than this loop's on a view)
            for s in range(columns.shape[0]):
                for r in range(columns.shape[1]):
                    for p in range(columns.shape[2]):
                        column = columns[s, r, p]
                        for j in range(dz.shape[2]):
                            dW[s, column, j] += dz[s, r, j]

        _SCATTER = scatter
    return _SCATTER


class WorkerStack:
    """S MLPs of layer widths ``sizes`` trained in lockstep on ``G * b`` rows each.

    Parameters
    ----------
    layout : FlatLayout
        The parameter layout (keys ``W1, b1, ..., WL, bL``).
    num_models : int
        S, models side by side.
    groups : int
        G, mini-batches per model; their gradients are averaged.
    batch_size : int
        b, rows per mini-batch.
    dtype : numpy dtype
        float32 or float64.

    Attributes
    ----------
    params, grads : ndarray of shape (S, P)
        The models and, after ``loss_and_grads``, their gradients.
    x : ndarray of shape (S, G * b, d_in)
        The mini-batches; fill group g of model s with ``x[s, g*b:(g+1)*b]``.
    labels : ndarray of shape (S, G * b), intp
    columns : ndarray of shape (S, G * b, c), int32, or None
        With ``context=c``: each row's one-hot columns (``OneHot.columns``), in place of
        ``x`` (which is then None).
    """

    def __init__(self, layout: FlatLayout, num_models: int, groups: int, batch_size: int, dtype,
                 context: int | None = None) -> None:
        dtype = np.dtype(dtype)
        self.layout, self.groups, self.batch_size = layout, groups, batch_size
        self.num_layers = len(layout.keys) // 2
        S, R = num_models, groups * batch_size  # models, rows per model
        widths = [layout.shapes[0][0]] + [layout.shapes[2 * i][1] for i in range(self.num_layers)]
        self.params = np.zeros((S, layout.size), dtype=dtype)
        self.grads = np.zeros((S, layout.size), dtype=dtype)
        views, grad_views = layer_views(self.params, layout), layer_views(self.grads, layout)
        self.W = [views[f"W{i}"] for i in range(1, self.num_layers + 1)]  # (S, d_{l-1}, d_l)
        self.b = [views[f"b{i}"][:, None, :] for i in range(1, self.num_layers + 1)]  # (S, 1, d_l)
        self.dW = [grad_views[f"W{i}"] for i in range(1, self.num_layers + 1)]
        self.db = [grad_views[f"b{i}"] for i in range(1, self.num_layers + 1)]  # (S, d_l)
        self.x = np.zeros((S, R, widths[0]), dtype=dtype) if context is None else None
        self.labels = np.zeros((S, R), dtype=np.intp)
        # z_l for every layer; a_l = relu(z_l) and its gradient for the hidden layers.
        self.z = [np.zeros((S, R, d), dtype=dtype) for d in widths[1:]]
        self.a = [self.x] + [np.zeros((S, R, d), dtype=dtype) for d in widths[1:-1]]
        self.da = [None] + [np.zeros((S, R, d), dtype=dtype) for d in widths[1:-1]]
        self.mask = [None] + [np.zeros((S, R, d), dtype=bool) for d in widths[1:-1]]
        num_classes = widths[-1]
        self.exp = np.zeros((S, R, num_classes), dtype=dtype)  # exp(z - max), then the softmax
        self.row_max = np.zeros((S, R, 1), dtype=dtype)
        self.row_sum = np.zeros((S, R, 1), dtype=dtype)
        self.row_loss = np.zeros((S, R), dtype=dtype)
        # Flat positions of row r's first logit, to pick z[s, r, y] and subtract onehot(y).
        self._row_start = np.arange(S * R, dtype=np.intp) * num_classes
        self._picked = np.zeros(S * R, dtype=np.intp)
        self.columns = None
        if context is not None:  # one-hot inputs: c columns per row, gathered forward, scattered backward
            self.columns = np.zeros((S, R, context), dtype=np.int32)
            self._models = np.arange(S, dtype=np.intp)[:, None]
            self._model_of = np.repeat(np.arange(S, dtype=np.intp), R * context)  # of each (s, r, p) entry
            self._row_of = np.repeat(np.arange(S * R, dtype=np.intp), context)  # its row of the S R batch rows

    def _first_layer(self) -> None:
        """``x @ W_1`` into ``z[0]`` for one-hot inputs: the rows of ``W_1`` the columns pick, added."""
        z, W = self.z[0], self.W[0]
        np.copyto(z, W[self._models, self.columns[:, :, 0]])  # sum_p W_1[s, column_p], position by position
        for position in range(1, self.columns.shape[2]):
            z += W[self._models, self.columns[:, :, position]]

    def _first_layer_grads(self, dz: np.ndarray) -> None:
        """``dW_1 = x^T dz`` for one-hot ``x``: every row's ``dz`` added into its ``c`` columns' rows
        of ``dW_1``, in the order of the rows (the numba loop, or NumPy passes: the same bits)."""
        dW = self.dW[0]
        dW.fill(0)
        if current_kernel() == "numba":
            _scatter_kernel()(dW, self.columns, dz)
            return
        # NumPy: sort the (model, column) entries stably (rows keep their order within a column), rank each
        # within its column's run; pass j adds the j-th row of every column at once (no column twice in a pass).
        columns = self.columns.reshape(-1)
        keys = self._model_of * dW.shape[1] + columns
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        starts = np.empty(ordered.size, dtype=bool)
        starts[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
        index = np.arange(ordered.size)
        rank = index - np.maximum.accumulate(np.where(starts, index, 0))
        entries = order[np.argsort(rank, kind="stable")]  # pass by pass
        models, columns = self._model_of[entries], columns[entries]
        rows = dz.reshape(-1, dz.shape[2])[self._row_of[entries]]
        start = 0
        for end in np.cumsum(np.bincount(rank)):
            dW[models[start:end], columns[start:end]] += rows[start:end]
            start = end

    def loss_and_grads(self) -> np.ndarray:
        """Forward, loss and backward on the current batches; gradients land in ``grads``.

        Returns
        -------
        ndarray of shape (S, G), the params' dtype
            Each group's mean cross-entropy before the step (a fresh array).
        """
        L, b = self.num_layers, self.batch_size
        activation = self.x
        for layer in range(L):  # forward; layer i of the lists is the paper's layer i + 1
            if layer == 0 and self.columns is not None:
                self._first_layer()
            else:
                np.matmul(activation, self.W[layer], out=self.z[layer])
            self.z[layer] += self.b[layer]
            if layer < L - 1:
                activation = np.maximum(self.z[layer], 0, out=self.a[layer + 1])
        logits = self.z[-1]  # (S, R, C)
        np.max(logits, axis=2, keepdims=True, out=self.row_max)
        np.subtract(logits, self.row_max, out=self.exp)
        np.exp(self.exp, out=self.exp)
        np.sum(self.exp, axis=2, keepdims=True, out=self.row_sum)
        np.log(self.row_sum[..., 0], out=self.row_loss)
        self.row_loss += self.row_max[..., 0]  # log-sum-exp
        np.add(self._row_start, self.labels.reshape(-1), out=self._picked)
        self.row_loss -= logits.reshape(-1)[self._picked].reshape(self.row_loss.shape)
        losses = self.row_loss.reshape(self.row_loss.shape[0], self.groups, b).mean(axis=2)
        dz = np.divide(self.exp, self.row_sum, out=self.exp)  # softmax
        dz.reshape(-1)[self._picked] -= 1.0
        dz /= b
        if self.groups > 1:
            dz *= 1.0 / self.groups  # the mean of the groups' gradients
        for layer in range(L - 1, -1, -1):  # backward
            if layer == 0 and self.columns is not None:
                self._first_layer_grads(dz)
            else:
                np.matmul(self.a[layer].transpose(0, 2, 1), dz, out=self.dW[layer])
            np.sum(dz, axis=1, out=self.db[layer])
            if layer > 0:
                np.matmul(dz, self.W[layer].transpose(0, 2, 1), out=self.da[layer])
                np.greater(self.z[layer - 1], 0, out=self.mask[layer])
                dz = np.multiply(self.da[layer], self.mask[layer], out=self.da[layer])
        return losses
