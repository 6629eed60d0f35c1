"""The fast engine: the K workers in flat in-place buffers, stepped with batched products.

``diloco.loop`` runs the algorithm through the milestone functions, one worker and one
pure function at a time: the reference, and the code a learner writes. This package is
the storage and stepping of a second executor of exactly the same algorithm, the *stacked*
executor behind ``DiLoCoConfig.engine = "fast"`` (``--engine fast``), for when many runs are
needed (studies, notebooks, benchmarks); its entry points are the core's
(``diloco.core.trainers.train_diloco_fast``), and the milestone functions never call it.

* ``flat``: parameter dicts as views of one ``(S, P)`` buffer.
* ``stack``: forward, loss and backward of S models at once, with batched ``np.matmul``.
* ``optim``: the inner optimizers' flat kernels (``FLAT_UPDATES``), in the milestones' order.
* ``fast``: the executor; ``layout``: its stacked or per-worker layout, by size.

With the same seed the engine draws the same mini-batches as the loop and ends within
rounding of it (``tests/tooling/test_engine.py``). It is instructor-side code: learner
workspaces do not receive it, since it implements every milestone.
"""

from diloco.engine.layout import LAYOUTS, STACKED_MAX_BYTES, choose_layout

__all__ = ["LAYOUTS", "STACKED_MAX_BYTES", "choose_layout"]
