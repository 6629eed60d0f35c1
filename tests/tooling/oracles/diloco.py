"""DiLoCo, Algorithm 1 of Douillard et al. (2023, arXiv 2311.08105), step by step.

The paper's pseudocode::

    for outer step t = 1 .. T:
        for every worker k (in parallel):
            theta_k <- theta^(t-1)
            for inner step h = 1 .. H:  x ~ D_k;  theta_k <- InnerOpt(theta_k, grad f(x, theta_k))
            Delta_k = theta^(t-1) - theta_k                       the outer gradient
        Delta^(t) = (1/K) sum_k Delta_k
        theta^(t) = OuterOpt(theta^(t-1), Delta^(t))              SGD with Nesterov momentum

with each worker's AdamW state carried from round to round. Additions, as the paper's
ablations and the core name them:

* **shard-size weights** (the paper's non-IID runs): ``Delta^(t) = sum_k (n_k / n) Delta_k``;
* **dropped outer gradients** (the paper's Fig. 9 "drop" ablation): each worker's
  ``Delta_k`` is lost with probability ``drop_prob``; the mean is over the kept workers
  (their weights renormalised); if every one is lost, nothing reaches the server and
  ``theta`` and the momentum stay as they were. Where a dropped worker goes on from is
  the rule: ``"carry"``, its own ``theta_k`` (so its next ``Delta_k`` holds the lost
  work too), or ``"restart"``, ``theta^(t)`` like everyone else;
* **sparse outer gradients** (``compression``): each kept worker sends ``C(e_k)`` of its
  error-feedback buffer instead of ``Delta_k``: top-k (of the DCT), or random-k
  (``send_random_k``, a plugin's codec).
"""

from __future__ import annotations

from oracles.common import (
    OracleResult,
    draw_drops,
    fresh_inner,
    outer_sgd,
    ring_bytes,
    round_entry,
    start,
    uses_size_weights,
    weighted_mean,
    worker_steps,
)
from oracles.compression import message_bytes, random_k, send, send_random_k

__all__ = ["diloco"]


def diloco(x, y, config, x_eval=None, y_eval=None, vocab_size=None) -> OracleResult:
    """Train DiLoCo as Algorithm 1 says; return the final ``theta`` and one entry per round.

    ``vocab_size``: the transformer's tokens (``config.model == "transformer"``)."""
    family = config.family
    if family.fragments != 1 or family.tau(config.inner_steps) or family.eager or family.mix != 1 \
            or config.asynchrony.asynchronous:
        raise NotImplementedError("plain DiLoCo only (see oracles.streaming, .eager, .asynchronous)")
    rng, shards, theta = start(x, y, config, y_eval, vocab_size)
    num_workers = config.num_workers
    sizes = [len(y_k) for _, y_k in shards]
    adam = [fresh_inner(theta, config) for _ in range(num_workers)]
    momentum = {key: 0.0 * value for key, value in theta.items()}
    residual = [{key: 0.0 * value for key, value in theta.items()} for _ in range(num_workers)]
    begin = [theta] * num_workers  # where each worker starts its next round
    rounds = []
    for number in range(1, config.rounds + 1):
        streams = rng.spawn(num_workers)
        local, losses = {}, {}
        for k in range(num_workers):
            local[k], adam[k], losses[k] = worker_steps(dict(begin[k]), adam[k], shards[k], config.inner_steps,
                                                        config, streams[k])
        dropped = draw_drops(rng, config)
        kept = [k for k in range(num_workers) if k not in dropped]
        delta = {key: 0.0 * value for key, value in theta.items()}
        sent_bytes = 0.0
        if kept:
            outer = {k: {key: theta[key] - local[k][key] for key in theta} for k in kept}
            sent_bytes = _send(outer, residual, kept, theta, config, (number, config.inner_steps, 0))
            weights = [sizes[k] if uses_size_weights(config) else 1.0 for k in kept]
            delta = {key: weighted_mean([outer[k][key] for k in kept], weights) for key in theta}
            theta, momentum = outer_sgd(theta, delta, momentum, config)
        for k in range(num_workers):
            restarts = k in kept or config.drop_rule == "restart"
            begin[k] = theta if restarts else local[k]
        rounds.append(round_entry(losses, theta, delta, x_eval, y_eval, config, dropped=dropped,
                                  syncs=[[config.inner_steps, sent_bytes, 0]]))
    return OracleResult(theta, rounds)


def _send(outer: dict, residual: list, kept: list, theta: dict, config, stamp: tuple) -> float:
    """Replace each kept worker's ``outer[k]`` by what the server decodes of it, feeding
    ``residual[k]``; return the bytes each worker sends: top-k (of the DCT), random-k (a plugin's
    codec, its draws stamped (round, step, fragment)), or the dense ring all-reduce."""
    spec, fraction = config.family, random_k(config.family.compress)
    if spec.topk is not None:
        for k in kept:
            outer[k], residual[k] = send(outer[k], residual[k], spec)
        return float((len(kept) - 1) * message_bytes(theta, spec))
    if fraction is not None:
        sizes = []
        for k in kept:
            outer[k], residual[k], size = send_random_k(outer[k], residual[k], fraction, spec.error_feedback,
                                                        config.seed, stamp, k)
            sizes.append(size)
        return float((len(kept) - 1) * sum(sizes) / len(kept))
    return ring_bytes(sum(v.size for v in theta.values()), len(kept))
