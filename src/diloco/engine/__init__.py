"""The fast engine: the same DiLoCo and baseline, executed with flat in-place buffers.

``diloco.loop`` runs the algorithm through the milestone functions, one worker and one
pure function at a time: the reference, and the code a learner writes. This package is a
second executor of exactly the same algorithm for when many runs are needed (studies,
notebooks, benchmarks), selected by ``DiLoCoConfig.engine = "fast"`` in the tools
(``diloco.tools.studies.ablations.trainer``); the milestone functions never call it.

* ``flat``: parameter dicts as views of one ``(S, P)`` buffer.
* ``stack``: forward, loss and backward of S models at once, with batched ``np.matmul``.
* ``optim``: AdamW and the outer Nesterov step in place, in the milestones' order.
* ``trainers``: ``train_diloco_fast`` and ``train_synchronous_fast``.

With the same seed the engine draws the same mini-batches as the loop and ends within
rounding of it (``tests/tooling/test_engine.py``). It is instructor-side code: learner
workspaces do not receive it, since it implements every milestone.
"""

from diloco.engine.trainers import (
    LAYOUTS,
    STACKED_MAX_BYTES,
    choose_layout,
    train_diloco_fast,
    train_synchronous_fast,
)

__all__ = ["TRAINERS", "LAYOUTS", "STACKED_MAX_BYTES", "choose_layout", "train_diloco_fast",
           "train_synchronous_fast"]

TRAINERS = {"diloco": train_diloco_fast, "sync": train_synchronous_fast}
