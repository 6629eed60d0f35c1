"""Eager updates (Kale, Douillard and Donchev 2025, arXiv 2502.12996), round by round.

The all-reduce of round t's outer gradients overlaps the whole of round t + 1 (tau = H),
so no worker has ``Delta^(t)`` when round t ends. Every worker k keeps its own copy
``theta_k`` of the outer model and its own outer optimizer, and applies at once its own
fresh outer gradient in place of the missing average, plus the others' from the
round before (the paper's "eager" rule)::

    for round t = 1 .. T:
        every worker k: H inner steps from theta_k^(t-1)  ->  phi_k
                        Delta_k^(t) = theta_k^(t-1) - phi_k            sent, arrives next round
                        g_k = w_k Delta_k^(t) + (Delta^(t-1) - w_k Delta_k^(t-1))
                        theta_k^(t) = OuterOpt_k(theta_k^(t-1), g_k)
        Delta^(t) = sum_k w_k Delta_k^(t)                              the all-reduce, done meanwhile

with ``Delta^(0) = Delta_k^(0) = 0`` (the bracket is 0 in round 1) and ``w_k = 1/K`` (or
the shard's share, with shard-size weights). The bracket is the others' round-(t-1)
outer gradients, ``sum_{j != k} w_j Delta_j^(t-1)``.

Conventions the core takes where the paper leaves a choice: the model a round's record
evaluates is the workers' weighted average of their ``theta_k``, and its
``pseudo_grad_norm`` is that of ``Delta^(t)``; the inner AdamW state is each worker's
own, carried; with sparse outer gradients (``oracles.compression``) the all-reduce
averages the workers' top-k messages (``Delta^(t)`` is that average), while each worker
applies its own fresh ``Delta_k^(t)`` and ``Delta_k^(t-1)`` as computed, uncompressed.
"""

from __future__ import annotations

from oracles.common import (
    OracleResult,
    fresh_inner,
    outer_sgd,
    ring_bytes,
    round_entry,
    start,
    uses_size_weights,
    weighted_mean,
    worker_steps,
)
from oracles.compression import message_bytes, send

__all__ = ["eager_diloco"]


def eager_diloco(x, y, config, x_eval=None, y_eval=None) -> OracleResult:
    """Train DiLoCo with eager updates; one entry per round."""
    family, num_workers = config.family, config.num_workers
    if not family.eager or family.tau(config.inner_steps) != config.inner_steps or config.drop_prob:
        raise NotImplementedError("eager updates with tau = H and no drops only")
    rng, shards, theta0 = start(x, y, config, y_eval)
    sizes = [float(len(y_k)) if uses_size_weights(config) else 1.0 for _, y_k in shards]
    share = [s / sum(sizes) for s in sizes]
    thetas = [dict(theta0) for _ in range(num_workers)]
    momenta = [{key: 0.0 * value for key, value in theta0.items()} for _ in range(num_workers)]
    adam = [fresh_inner(theta0, config) for _ in range(num_workers)]
    zero = {key: 0.0 * value for key, value in theta0.items()}
    residual = [dict(zero) for _ in range(num_workers)]
    size = sum(value.size for value in theta0.values())
    previous_mean, previous_own = zero, [zero] * num_workers
    rounds = []
    for _ in range(config.rounds):
        streams = rng.spawn(num_workers)
        own, losses = [], {}
        for k in range(num_workers):
            phi, adam[k], losses[k] = worker_steps(thetas[k], adam[k], shards[k], config.inner_steps, config,
                                                   streams[k])
            own.append({key: thetas[k][key] - phi[key] for key in theta0})
        for k in range(num_workers):
            g = {key: share[k] * own[k][key] + (previous_mean[key] - share[k] * previous_own[k][key])
                 for key in theta0}
            thetas[k], momenta[k] = outer_sgd(thetas[k], g, momenta[k], config)
        sent, sent_bytes = own, ring_bytes(size, num_workers)
        if family.topk is not None:  # what travels is sparse; each worker's own fresh gradient is not
            sent = [None] * num_workers
            for k in range(num_workers):
                sent[k], residual[k] = send(own[k], residual[k], family)
            sent_bytes = float((num_workers - 1) * message_bytes(theta0, family))
        mean = {key: weighted_mean([sent[k][key] for k in range(num_workers)], sizes) for key in theta0}
        previous_mean, previous_own = mean, own
        consensus = {key: weighted_mean([thetas[k][key] for k in range(num_workers)], sizes) for key in theta0}
        syncs = [[config.inner_steps, sent_bytes, config.inner_steps]]
        rounds.append(round_entry(losses, consensus, mean, x_eval, y_eval, dropped=[], syncs=syncs))
    return OracleResult(consensus, rounds)
