"""The one training core: every algorithm, on every executor, through one driver.

* ``outer``: outer optimizers as ``init``/``update`` transforms (``OUTER_OPTIMIZERS``).
* ``schedule``: when what synchronises: every H steps (DiLoCo), every step (the
  synchronous baseline), P fragments with offsets and overlap tau (Streaming DiLoCo),
  eager updates.
* ``sync``: one synchronisation: drop, weights, compress with error feedback, aggregate
  through the executor's collective, outer step, merge back into the workers.
* ``executors``: how the K workers are stored and stepped, and how they all-reduce:
  ``reference`` (the learner's milestone functions), ``mpi`` (one rank per worker);
  the ``fast`` executor (flat buffers, batched matmul) is ``diloco.engine.fast``.
* ``driver``: the single loop over rounds and steps; history, progress, the divergence
  guard, checkpoints and the network clock are hooks on it.

This package imports nothing at its top, so the milestone modules can use ``outer``
without importing the driver (which imports them).
"""
