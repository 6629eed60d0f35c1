"""The paper's mechanisms around the DiLoCo round, each switched by a ``DiLoCoConfig`` field.

The one training core (``diloco.core``) composes these helpers around the milestone
functions; with every field at its default each helper is the identity (or is not
called), so the driver computes the course's algorithm (milestones 25-27) bit for bit.

=====================  ==========================  ==============================================
mechanism              config field(s)             what this module gives the core
=====================  ==========================  ==============================================
inner lr schedule      ``lr_schedule``,            ``inner_lr``, ``scheduled_adamw_step``
                       ``warmup_steps``
gradient clipping      ``clip_norm``               ``clip_by_global_norm``, ``scheduled_adamw_step``
inner optimizer        ``inner_optimizer``,        ``inner_step``, ``init_inner_state``
                       ``muon``                    (``diloco.core.inner``: AdamW, Muon, SGD)
shard-size weights     ``shard_weighting``         ``pseudo_grad_weights``
outer optimizer        ``outer_optimizer``,        ``diloco.core.outer.OUTER_OPTIMIZERS``: SGD /
                       ``outer_beta2``,            heavy ball / Nesterov through 22-23, Adam
                       ``outer_eps``               through 08-10, Lion
dropped outer grads    ``drop_prob``               ``draw_dropped``
worker similarity      ``record_similarity``       ``mean_pairwise_cosine``
one-hot inputs         (the ``encode`` argument)   ``train_worker``
=====================  ==========================  ==============================================

``train_worker`` is ``inner_train_worker`` (milestone 20) generalised: the same H steps
and random draws, with the scheduled learning rate, clipping and a per-batch encoder.
``tests/tooling/test_mechanisms.py`` proves it equal to milestone 20 at the defaults.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from diloco._validation import api_checks, check_params
from diloco.adamw import AdamWState, adamw_step
from diloco.config import AdamWConfig, DiLoCoConfig
from diloco.core.inner import inner_optimizer
from diloco.core.model_seam import model_for, model_kind
from diloco.model import Params
from diloco.sharding import sample_worker_batch

__all__ = [
    "COSINE_FLOOR", "global_norm", "inner_lr", "scheduled_lr", "scheduled_adamw_step", "clip_by_global_norm",
    "clip_scale",
    "inner_step", "init_inner_state", "train_worker",
    "uses_plain_worker", "pseudo_grad_weights", "normalised_weights",
    "draw_dropped", "mean_pairwise_cosine",
]

# The cosine schedule decays the inner lr from its peak to this fraction of it at the
# last step (Chinchilla-style, as in the paper's setup), so no step is wasted at lr 0.
COSINE_FLOOR = 0.1


def global_norm(params: Params) -> float:
    """The L2 norm of all the arrays of ``params`` taken together, as a Python float.

    Finite for every finite input: if the sum of squares overflows, the norm is taken of
    the arrays divided by their largest magnitude, then scaled back.
    """
    check_params(params, finite=False)
    with np.errstate(over="ignore"):  # an overflow is redone below, scaled
        norm = float(np.sqrt(sum(np.sum(value * value) for value in params.values())))
    if math.isinf(norm) and all(np.isfinite(value).all() for value in params.values()):
        largest = max(float(np.abs(value).max(initial=0.0)) for value in params.values())
        norm = largest * float(np.sqrt(sum(np.sum((value / largest) ** 2) for value in params.values())))
    return norm


def inner_lr(config: DiLoCoConfig, step: int) -> float:
    """The inner learning rate of AdamW step ``step`` (1-based) of a run.

    ``"constant"``: ``lr``. ``"cosine"``: linear warmup ``lr * s / W`` for the first
    ``W = warmup_steps`` steps, then a cosine from ``lr`` down to ``COSINE_FLOOR * lr`` at
    the run's last step ``T = rounds * inner_steps``::

        lr_s = lr (f + (1 - f) (1 + cos(pi (s - W) / (T - W))) / 2),   W < s <= T

    A DiLoCo worker's step count is its AdamW ``state.step`` (carried across rounds), so
    every worker and the baseline follow the same curve over the run.
    """
    api_checks.inner_lr(config, step)
    return scheduled_lr(config.inner.lr, config, step)


def scheduled_lr(peak: float, config: DiLoCoConfig, step: int) -> float:
    """``inner_lr``'s schedule with another peak (Muon's ``config.muon.lr``), unchecked."""
    if config.lr_schedule == "constant":
        return peak
    warmup, total = config.warmup_steps, config.total_steps
    if step <= warmup:
        return peak * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (COSINE_FLOOR + (1.0 - COSINE_FLOOR) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def clip_by_global_norm(grads: Params, max_norm: float | None) -> tuple[Params, float]:
    """Rescale ``grads`` so their global L2 norm is at most ``max_norm``.

    As ``torch.nn.utils.clip_grad_norm_``: ``coef = max_norm / (norm + 1e-6)``; when
    ``coef < 1`` every array is multiplied by it. ``max_norm=None`` returns ``grads``
    itself.

    Returns
    -------
    (grads, norm)
        The (new, if clipped) gradients and their norm before clipping.
    """
    api_checks.clip_by_global_norm(grads, max_norm)
    norm = global_norm(grads)
    if max_norm is None:
        return grads, norm
    coef = clip_scale(norm, max_norm)
    if coef >= 1.0:
        return grads, norm
    return {key: value * coef for key, value in grads.items()}, norm


def clip_scale(norm, max_norm: float):
    """The factor clipping multiplies gradients of global norm ``norm`` by: ``max_norm / (norm + 1e-6)``
    when that is below 1, else 1 (elementwise over an array of norms: the fast executor's rows)."""
    coef = max_norm / (norm + 1e-6)
    return np.where(coef < 1.0, coef, 1.0) if isinstance(coef, np.ndarray) else min(coef, 1.0)


def scheduled_adamw_step(params: Params, state: AdamWState, grads: Params, config: DiLoCoConfig
                         ) -> tuple[Params, AdamWState]:
    """One inner AdamW step with the config's clipping and lr schedule.

    ``grads`` are clipped to ``config.clip_norm`` (when set), then ``adamw_step`` runs
    with ``lr = inner_lr(config, state.step + 1)``. At the defaults this is exactly
    ``adamw_step(params, state, grads, config.inner)``.
    """
    if config.clip_norm is not None:  # the norm costs a pass over the gradients: only when clipping
        grads, _ = clip_by_global_norm(grads, config.clip_norm)
    inner: AdamWConfig = config.inner
    if config.lr_schedule != "constant":
        inner = dataclasses.replace(inner, lr=inner_lr(config, state.step + 1))
    return adamw_step(params, state, grads, inner)


def inner_step(params: Params, state, grads: Params, config: DiLoCoConfig) -> tuple:
    """One inner step of ``config.inner_optimizer``: the core's only call of an inner optimizer.

    The gradients are clipped to ``config.clip_norm`` (when set), then the registry's entry
    (``diloco.core.inner.INNER_OPTIMIZERS``: AdamW, Muon or SGD) steps, each learning rate on
    the run's schedule (``scheduled_lr`` of its own peak at step ``state.step + 1``).
    """
    if config.clip_norm is not None:  # the norm costs a pass over the gradients: only when clipping
        grads, _ = clip_by_global_norm(grads, config.clip_norm)
    return inner_optimizer(config).step(params, state, grads, config,
                                        lambda peak: scheduled_lr(peak, config, state.step + 1))


def init_inner_state(params: Params, config: DiLoCoConfig):
    """A fresh state of ``config.inner_optimizer`` for ``params`` (the registry entry's ``init``)."""
    return inner_optimizer(config).init(params, config)


def uses_plain_worker(config: DiLoCoConfig, encode=None) -> bool:
    """Whether milestone 20 (``inner_train_worker``) runs the workers as they are: the MLP
    and AdamW with a constant lr, no clipping and no input encoder."""
    return (config.lr_schedule == "constant" and config.clip_norm is None and encode is None
            and config.inner_optimizer == "adamw" and model_kind(config).milestone_model)




def train_worker(params: Params, adam_state: AdamWState, x_shard: np.ndarray, y_shard: np.ndarray,
                 config: DiLoCoConfig, rng, *, encode=None, steps: int | None = None, model=None
                 ) -> tuple[Params, AdamWState, np.ndarray]:
    """``steps`` (default ``config.inner_steps``) local steps of one worker with the paper's mechanisms.

    For ``h = 1 .. H``: ``(x_b, y_b) = sample_worker_batch(x_shard, y_shard, B, rng)``,
    ``x_b = encode(x_b)`` when an encoder is given, then forward, loss, backward and
    ``inner_step`` (``scheduled_adamw_step``, or Muon). The random draws are those of
    ``inner_train_worker``.

    Parameters
    ----------
    params : dict of str -> ndarray
        Where the worker starts.
    adam_state : AdamWState or MuonState
        The worker's carried inner-optimizer state.
    x_shard : ndarray of shape (n_k, d_raw)
        Features, or index windows when ``encode`` is given.
    y_shard : ndarray of shape (n_k,)
    config : DiLoCoConfig
    rng : numpy.random.Generator
    encode : callable, keyword-only, optional
        ``encode(x_batch, dtype) -> (b, d_in)`` model inputs (``diloco.text.OneHot``), for the
        default model.
    steps : int, keyword-only, optional
        How many steps (Streaming DiLoCo stops a worker at its fragments' sync steps).
    model : keyword-only, optional
        The run's model (``diloco.core.model_seam.model_for``), whose ``loss_and_grads`` each
        step calls; by default ``model_for(config, params, encode)``.

    Returns
    -------
    (worker_params, adam_state, losses : float64 ndarray of shape (steps,))
    """
    model = model or model_for(config, params, encode)
    steps = config.inner_steps if steps is None else steps
    worker_params = {key: value.copy() for key, value in params.items()}
    losses = np.empty(steps, dtype=np.float64)
    for step in range(steps):
        x_batch, y_batch = sample_worker_batch(x_shard, y_shard, config.batch_size, rng)
        losses[step], grads = model.loss_and_grads(worker_params, x_batch, y_batch)
        worker_params, adam_state = inner_step(worker_params, adam_state, grads, config)
    return worker_params, adam_state, losses


def pseudo_grad_weights(shards, config: DiLoCoConfig) -> list[float] | None:
    """The weights of the workers' pseudo-gradients in the average (milestone 24).

    ``"uniform"``: None (``1/K`` each). ``"size"``: each shard's number of examples, so
    ``delta = sum_k (n_k / n) (theta - theta_k)``, as the paper does for non-IID shards.
    ``"auto"`` (the default): ``"size"`` for non-IID shards, ``"uniform"`` for IID ones
    (whose sizes differ by at most one example).
    """
    mode = config.shard_weighting
    if mode == "uniform" or (mode == "auto" and config.iid):
        return None
    return [float(len(y_k)) for _, y_k in shards]


def normalised_weights(shards, config: DiLoCoConfig) -> list[float]:
    """``pseudo_grad_weights`` as K floats summing to 1, normalised as ``average_params``
    (milestone 15) normalises them (``1/K`` each when uniform)."""
    weights = pseudo_grad_weights(shards, config) or [1.0] * len(shards)
    total = sum(weights)
    return [w / total for w in weights]


def draw_dropped(rng, config: DiLoCoConfig) -> list[int]:
    """The workers whose outer gradient is dropped this round, each with ``drop_prob``.

    ``rng.random(K) < p`` from the round's generator, drawn only when ``p > 0``: at
    ``p = 0`` nothing is drawn and the run's random stream is the course's. Drawing from
    the parent generator after ``rng.spawn(K)`` leaves the workers' batch streams (the
    spawned children) unchanged, so DiLoCo with drops still sees the baseline's batches.
    """
    api_checks.draw_dropped(rng, config)
    if config.drop_prob == 0.0:
        return []
    return np.flatnonzero(rng.random(config.num_workers) < config.drop_prob).tolist()


def mean_pairwise_cosine(global_params: Params, worker_params_list) -> float | None:
    """Mean cosine similarity between the workers' own pseudo-gradients.

    ``delta_k = theta - theta_k`` flattened over every array; the mean of
    ``cos(delta_i, delta_j)`` over the pairs ``i < j`` (the paper's Figs. 10-11 plot this
    kind of agreement between replicas). None for one worker, or when a worker did not
    move.
    """
    api_checks.mean_pairwise_cosine(global_params, worker_params_list)
    if len(worker_params_list) < 2:
        return None
    deltas = np.stack([np.concatenate([(global_params[key] - params[key]).ravel().astype(np.float64)
                                       for key in global_params]) for params in worker_params_list])
    norms = np.linalg.norm(deltas, axis=1)
    if np.any(norms == 0.0):
        return None
    unit = deltas / norms[:, None]
    gram = unit @ unit.T
    upper = np.triu_indices(len(worker_params_list), k=1)
    return float(gram[upper].mean())
