"""Eager updates (Kale et al., 2025, arXiv 2502.12996): DiLoCo whose all-reduce never blocks.

With a one-outer-step overlap, the all-reduce of round t's outer gradients runs during
round t+1's inner steps, so at the end of round t a worker only has its *own* fresh
outer gradient ``Delta_k^(t)`` and the *previous* average ``Delta^(t-1)``. Instead of
applying the stale average alone (the naive delayed update), worker k applies

    Delta~_k^(t) = Delta_k^(t) / K  +  ( Delta^(t-1) - Delta_k^(t-1) / K )

(with shard-size weights ``w_k`` in place of ``1/K``)
its own share fresh, the other workers' shares one round late: the average's correction
arrives one round later and replaces the local stand-in. Each worker runs the outer
optimizer on its own copy, ``theta_k <- Nesterov(theta_k, Delta~_k)``, and starts its next
inner phase there; its outer gradient is ``Delta_k^(t) = theta_k - theta_k^{local}``.
Because the outer step is linear in its input, the copies never drift: with outer SGD,
``theta_k^(T) = theta^(0) - lr (sum_{t<T} Delta^(t) + Delta_k^(T) / K)``.

What holds exactly (``tests/tooling/test_eager.py``):

* one worker: ``Delta~ = Delta_1^(t)``, so eager training *is* DiLoCo (equal element for
  element);
* tau = 0 (no overlap): the fresh average is available, nothing is eager, and the
  trainer runs DiLoCo's round (bit-identical to ``train_diloco``);
* K > 1 with overlap: *not* DiLoCo (the first round applies only ``Delta_k^(1) / K``);
  the paper claims it comes close in quality while hiding communication.

The model evaluated after each round is the workers' average ``mean_k theta_k`` (what a
final all-reduce of the parameters would give); it is not communicated during training.
"""

from __future__ import annotations

from diloco.adamw import init_adamw_state
from diloco.config import DiLoCoConfig
from diloco.family.comm import exchange, exchange_deltas
from diloco.family.config import FamilyConfig
from diloco.loop import TrainResult, finish_record, prepare_training, round_record
from diloco.mechanisms import normalised_weights, pseudo_grad_weights
from diloco.model import Params
from diloco.outer import init_outer_optimizer, nesterov_param_update, update_outer_momentum
from diloco.params import average_params, scale_params, subtract_params
from diloco.sharding import inner_train_worker

__all__ = ["eager_outer_gradient", "train_eager"]


def eager_outer_gradient(local_now: Params, local_previous: Params | None, global_previous: Params | None,
                         share: float) -> Params:
    """``w_k Delta_k^(t) + (Delta^(t-1) - w_k Delta_k^(t-1))``; the bracket is 0 in round 1.

    Parameters
    ----------
    local_now : dict
        This worker's fresh outer gradient ``Delta_k^(t)``.
    local_previous, global_previous : dict or None
        ``Delta_k^(t-1)`` and the all-reduced ``Delta^(t-1)``; None before round 2.
    share : float in (0, 1]
        ``w_k``, the worker's weight in the average: ``1/K``, or its shard's share with
        shard-size weights (``diloco.mechanisms.normalised_weights``).
    """
    own = scale_params(local_now, share)
    if global_previous is None:
        return own
    others = subtract_params(global_previous, scale_params(local_previous, share))
    return {key: own[key] + others[key] for key in own}


def train_eager(x, y, config: DiLoCoConfig, family: FamilyConfig | None = None, *, x_eval=None, y_eval=None,
                rng=None, on_round=None) -> TrainResult:
    """Train DiLoCo with eager updates (``family.tau(H)`` must be 0 or H).

    Parameters and returns as ``diloco.family.train_streaming``; ``params`` is the
    workers' average. Records carry ``syncs = [[H, bytes, tau]]``: the all-reduce issued
    at the end of a round may take the next round's H inner steps (tau = H).
    """
    family = FamilyConfig(eager=True) if family is None else family
    if not isinstance(family, FamilyConfig):
        raise TypeError(f"family must be a FamilyConfig, got {type(family).__name__}")
    config, rng, shards, params = prepare_training(x, y, config, x_eval, y_eval, rng)
    num_workers, inner_steps = config.num_workers, config.inner_steps
    family.check_against(config)
    tau = family.tau(inner_steps) if family.eager else 0
    weights = pseudo_grad_weights(shards, config)  # None (uniform), or shard sizes as train_diloco uses
    shares = normalised_weights(shards, config)    # w_k, each worker's share of the average
    thetas = [params] * num_workers  # each worker's outer copy (equal when tau = 0)
    outer_states = [init_outer_optimizer(params) for _ in range(num_workers)]
    worker_states = [init_adamw_state(params) for _ in range(num_workers)]
    residuals = [{} for _ in range(num_workers)]
    previous_local, previous_global = [None] * num_workers, None
    history: list = []
    for round_index in range(1, config.rounds + 1):
        worker_rngs = rng.spawn(num_workers)
        locals_, worker_losses = [], []
        for k, ((x_k, y_k), rng_k) in enumerate(zip(shards, worker_rngs, strict=True)):
            theta_k, worker_states[k], losses = inner_train_worker(
                thetas[k], worker_states[k], x_k, y_k, inner_steps, config.batch_size, config.inner, rng_k)
            locals_.append(theta_k)
            worker_losses.append(float(losses.mean()))
        if tau == 0:  # the average arrives before the next round: DiLoCo's round exactly
            result = exchange(thetas[0], locals_, family.comm, residuals, weights)
            applied = [result.delta] * num_workers
            local_deltas = None
        else:
            local_deltas = [subtract_params(theta, local) for theta, local in zip(thetas, locals_, strict=True)]
            result = exchange_deltas(local_deltas, family.comm, residuals, weights)
            applied = [eager_outer_gradient(local_deltas[k], previous_local[k], previous_global, shares[k])
                       for k in range(num_workers)]
        residuals = result.residuals
        new_thetas = []
        for k in range(num_workers):
            outer_states[k] = update_outer_momentum(outer_states[k], applied[k], config.outer_momentum)
            new_thetas.append(nesterov_param_update(thetas[k], applied[k], outer_states[k], config.outer_lr,
                                                    config.outer_momentum, nesterov=config.nesterov))
        thetas = new_thetas
        previous_local, previous_global = local_deltas or previous_local, result.delta
        params = thetas[0] if tau == 0 else average_params(thetas, weights)
        record = round_record(worker_losses, params, config, pseudo_grad=result.delta)
        record["bytes_sent"] = result.bytes_sent
        record["peak_sync_bytes"] = result.bytes_sent
        record["bytes_per_step"] = result.bytes_sent / inner_steps
        record["syncs"] = [[inner_steps, result.bytes_sent, tau]]
        finish_record(record, round_index, config, params, x_eval, y_eval, history)
        if on_round is not None:
            on_round(record)
    return TrainResult(params, history)
