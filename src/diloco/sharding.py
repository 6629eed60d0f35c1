"""Part 4 - splitting the data across workers, and one worker's local training.

Milestones 16-20. Each of the K workers owns a shard ``(x_k, y_k)`` and trains on it
alone for H AdamW steps between two synchronisations.
"""

from __future__ import annotations

import numpy as np

from diloco._validation import check_args, milestone
from diloco.adamw import AdamWState, adamw_step
from diloco.config import AdamWConfig
from diloco.model import Params, cross_entropy_loss, model_backward, model_forward

__all__ = [
    "Shard",
    "iid_shard_dataset",
    "noniid_shard_dataset",
    "sample_worker_batch",
    "local_train_step",
    "inner_train_worker",
]

Shard = tuple[np.ndarray, np.ndarray]


@milestone
def iid_shard_dataset(x: np.ndarray, y: np.ndarray, num_workers: int, rng) -> list[Shard]:
    """Milestone 16: split a dataset into IID shards with one random permutation.

    Draw ``perm = rng.permutation(n)`` and cut it into ``num_workers`` contiguous pieces
    whose sizes differ by at most one (the first ``n mod K`` get one extra), as
    ``np.array_split`` does. Shard ``k`` is ``(x[perm_k], y[perm_k])``.

    Parameters
    ----------
    x : ndarray of shape (n, d), floating
    y : ndarray of shape (n,), integer
    num_workers : int, 1 <= K <= n
    rng : numpy.random.Generator

    Returns
    -------
    list of K tuples (x_k of shape (n_k, d), y_k of shape (n_k,))
        Disjoint, together exactly the dataset, pairs kept aligned, new arrays.

    Raises
    ------
    ValueError
        ``num_workers`` < 1 or > n, mismatched lengths, non-finite x.
    TypeError
        ``rng`` is not a Generator, wrong dtypes.
    """
    num_workers = check_args.iid_shard_dataset(x, y, num_workers, rng)
    # BEGIN SOLUTION
    perm = rng.permutation(x.shape[0])
    return [(x[idx], y[idx]) for idx in np.array_split(perm, num_workers)]
    # END SOLUTION


@milestone
def noniid_shard_dataset(x: np.ndarray, y: np.ndarray, num_workers: int, rng, *, alpha: float = 0.5) -> list[Shard]:
    """Milestone 17: label-skewed shards from a Dirichlet draw per class.

    For each class ``c`` (in increasing order): shuffle its indices with
    ``rng.permutation``, draw proportions ``p ~ Dirichlet(alpha * 1_K)`` with
    ``rng.dirichlet``, and give worker ``k`` the slice between the cut points
    ``floor(cumsum(p) * n_c)``. A worker left empty then takes one example from the
    currently largest shard, so every shard is non-empty. Small ``alpha`` puts most of
    a class on one worker (few classes per worker); large ``alpha`` approaches IID.

    Parameters
    ----------
    x : ndarray of shape (n, d), floating
    y : ndarray of shape (n,), integer
    num_workers : int, 1 <= K <= n
    rng : numpy.random.Generator
    alpha : float > 0, keyword-only
        Dirichlet concentration.

    Returns
    -------
    list of K tuples (x_k, y_k)
        Disjoint, covering, non-empty, pairs aligned, new arrays.

    Raises
    ------
    ValueError
        ``alpha <= 0``, ``num_workers`` < 1 or > n, mismatched lengths.
    TypeError
        ``rng`` is not a Generator, wrong dtypes.
    """
    num_workers, alpha = check_args.noniid_shard_dataset(x, y, num_workers, rng, alpha)
    # BEGIN SOLUTION
    assigned: list[list[int]] = [[] for _ in range(num_workers)]
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        proportions = rng.dirichlet(np.full(num_workers, alpha))
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(int)
        for worker, piece in enumerate(np.split(members, cuts)):
            assigned[worker].extend(piece.tolist())
    for worker in range(num_workers):
        if not assigned[worker]:  # every worker must hold at least one example
            donor = max(range(num_workers), key=lambda k: len(assigned[k]))
            assigned[worker].append(assigned[donor].pop())
    return [(x[np.array(idx)], y[np.array(idx)]) for idx in assigned]
    # END SOLUTION


@milestone
def sample_worker_batch(x_shard: np.ndarray, y_shard: np.ndarray, batch_size: int, rng) -> Shard:
    """Milestone 18: a random mini-batch of aligned pairs from one shard.

    ``batch_size <= n``: ``idx = rng.choice(n, batch_size, replace=False)``;
    otherwise with replacement, ``idx = rng.integers(0, n, batch_size)``.

    Parameters
    ----------
    x_shard : ndarray of shape (n, d), floating, n >= 1
    y_shard : ndarray of shape (n,), integer
    batch_size : int >= 1
    rng : numpy.random.Generator

    Returns
    -------
    (x_batch of shape (batch_size, d), y_batch of shape (batch_size,))
        New arrays; row ``i`` of both comes from the same shard example.

    Raises
    ------
    ValueError
        Empty shard, ``batch_size < 1``, mismatched lengths.
    TypeError
        ``rng`` is not a Generator, wrong dtypes.
    """
    batch_size = check_args.sample_worker_batch(x_shard, y_shard, batch_size, rng)
    # BEGIN SOLUTION
    n = x_shard.shape[0]
    if batch_size <= n:
        idx = rng.choice(n, size=batch_size, replace=False)
    else:
        idx = rng.integers(0, n, size=batch_size)
    return x_shard[idx], y_shard[idx]
    # END SOLUTION


@milestone
def local_train_step(params: Params, adam_state: AdamWState, x_batch: np.ndarray, y_batch: np.ndarray,
                     config: AdamWConfig) -> tuple[Params, AdamWState, float]:
    """Milestone 19: one local training step of a worker.

    Forward, loss, backward, then one AdamW step (``adamw.adamw_step``, decay on the
    pre-step parameters)::

        logits, cache = model_forward(theta, x)
        loss          = cross_entropy_loss(logits, y)        # before the step
        g             = model_backward(theta, cache, y)
        theta', state' = adamw_step(theta, state, g, config)

    Parameters
    ----------
    params : dict of str -> ndarray (MLP)
    adam_state : AdamWState shaped like ``params``
    x_batch : ndarray of shape (b, d_in), floating, b >= 1
    y_batch : ndarray of shape (b,), integer in [0, C)
    config : AdamWConfig

    Returns
    -------
    (new_params, new_state, loss_before_step : float)

    Raises
    ------
    TypeError, ValueError
        From the functions it composes, or a ``config`` that is not an AdamWConfig.
    """
    check_args.local_train_step(params, adam_state, x_batch, y_batch, config)
    # BEGIN SOLUTION
    logits, cache = model_forward(params, x_batch)
    loss = cross_entropy_loss(logits, y_batch)
    grads = model_backward(params, cache, y_batch)
    new_params, new_state = adamw_step(params, adam_state, grads, config)
    return new_params, new_state, loss
    # END SOLUTION


@milestone
def inner_train_worker(params: Params, adam_state: AdamWState, x_shard: np.ndarray, y_shard: np.ndarray,
                       num_inner_steps: int, batch_size: int, config: AdamWConfig,
                       rng) -> tuple[Params, AdamWState, np.ndarray]:
    """Milestone 20: H local AdamW steps of one worker, starting from ``params``.

    For ``h = 1 .. H``: ``(x_b, y_b) = sample_worker_batch(x_shard, y_shard, batch_size, rng)``
    then ``theta, state, loss_h = local_train_step(theta, state, x_b, y_b, config)``.
    The returned state is this worker's to keep: DiLoCo carries it into the worker's
    next round, never resetting or averaging it.

    Parameters
    ----------
    params : dict of str -> ndarray
        Starting point (the global parameters of this round).
    adam_state : AdamWState
        This worker's optimizer state from its previous round.
    x_shard : ndarray of shape (n_k, d_in)
    y_shard : ndarray of shape (n_k,)
    num_inner_steps : int >= 0
        H. With 0 the worker returns a copy of ``params`` and its state unchanged.
    batch_size : int >= 1
    config : AdamWConfig
    rng : numpy.random.Generator
        The worker's own random stream.

    Returns
    -------
    (worker_params, adam_state, losses : float64 ndarray of shape (H,))
        ``losses[h]`` is the mini-batch loss before step ``h + 1``.

    Raises
    ------
    TypeError, ValueError
        Bad sizes, a non-Generator ``rng``, or the errors of the composed functions.
    """
    num_inner_steps, batch_size = check_args.inner_train_worker(
        params, adam_state, x_shard, y_shard, num_inner_steps, batch_size, config, rng)
    # BEGIN SOLUTION
    worker_params = {key: value.copy() for key, value in params.items()}
    losses = np.empty(num_inner_steps, dtype=np.float64)
    for step in range(num_inner_steps):
        x_batch, y_batch = sample_worker_batch(x_shard, y_shard, batch_size, rng)
        worker_params, adam_state, losses[step] = local_train_step(
            worker_params, adam_state, x_batch, y_batch, config
        )
    return worker_params, adam_state, losses
    # END SOLUTION
