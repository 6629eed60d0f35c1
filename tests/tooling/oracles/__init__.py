"""Independent oracles of every algorithm ``diloco.core`` trains (issue 27, item 1).

Each oracle is a plain, slow, step-by-step version of one paper's pseudocode, written
for the tests and sharing nothing with ``diloco.core``, ``diloco.engine``,
``diloco.methods`` or ``diloco.core.mechanisms``. They call only the
learner's milestone functions (``diloco.model``, ``diloco.adamw``, ``diloco.sharding``,
``diloco.evaluation``) and numpy, so a mistake in the core's schedule, aggregation,
compression or bookkeeping is not copied here; ``tests/tooling/test_oracles*.py`` compare
``diloco.core.driver.train`` with them on every executor.

* ``diloco``: DiLoCo, Algorithm 1 (Douillard et al. 2023, arXiv 2311.08105), with
  shard-size weights, dropped outer gradients (``carry`` and ``restart``) and sparse
  outer gradients with error feedback (``compression``);
* ``streaming``: Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512);
* ``eager``: eager updates (Kale et al. 2025, arXiv 2502.12996);
* ``asynchronous``: asynchronous DiLoCo with delayed Nesterov and dynamic local steps
  (Liu et al. 2024, arXiv 2401.09135);
* ``compression``: chunked top-k (SparseLoCo, arXiv 2508.15706) and top-k of a chunked
  DCT (DeMo, arXiv 2411.19870), with error feedback and its decay.

Where the core follows a convention the papers leave open (which random draws come
from which generator, the order of events inside one step, who keeps a residual), the
oracle's docstring says which one it takes and why; everything else is the paper's.
The oracles live under ``tests/tooling`` because ``tests/`` outside it is copied into
learner workspaces, and an oracle of Algorithm 1 would hand learners milestone 25.

Only the settings the tests draw are supported: AdamW or SGD with heavy-ball momentum (the inner
optimizer, ``common.inner_sgd``) at a constant lr without clipping,
the SGD outer optimizer (Nesterov or heavy ball), float64, no input encoder. Any other
setting raises ``NotImplementedError`` rather than being silently ignored.
"""

from oracles.asynchronous import async_diloco, async_schedule
from oracles.common import OracleResult
from oracles.diloco import diloco
from oracles.eager import eager_diloco
from oracles.streaming import fragment_schedule, streaming_diloco

__all__ = ["OracleResult", "diloco", "streaming_diloco", "fragment_schedule", "eager_diloco", "async_diloco",
           "async_schedule"]
