"""Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512), one inner step at a time.

The paper's Algorithm 2, with P fragments of the L layers, overlap tau and the merge's
alpha (``mix`` here is the weight of the *global* side, ``mix = 1 - alpha_paper``)::

    for step t = 1 .. T (every worker, in parallel): theta_k <- InnerOpt(theta_k, grad)
        for fragment p with (t - t_p) mod H == 0, t_p = floor(p H / P):   sync of p
            Delta_p = mean_k (theta_p - theta_{k,p})          theta_p: the global fragment
            theta_p <- OuterOpt_p(theta_p, Delta_p)            one momentum per fragment
        for fragment p synced at step t - tau:                 merge of p
            theta_{k,p} <- mix theta_p^(sync) + (1 - mix) theta_{k,p}

So fragment p syncs after step ``t_p`` of every round (after step H for p = 0), and
what it received is merged ``tau`` steps later, in the next round when
``t_p + tau > H``: until then the workers go on training their own copy. With P = 1 and
tau = 0 it is DiLoCo, Algorithm 1.

Conventions the core takes where the paper leaves a choice:

* fragments: ``strided`` puts layer l in fragment ``(l - 1) mod P``; ``sequential`` cuts
  the layers into P contiguous runs, the first ``L mod P`` runs one layer longer;
* at one step the syncs come first (in fragment order), then the merges due;
* the drops, weights and drop rules of ``oracles.diloco`` apply to every fragment's
  sync, one draw of K uniforms per sync; a dropped worker (``carry``) keeps its own
  fragment (it is not merged); if every worker is dropped the fragment's global value
  and momentum stay, and under ``restart`` every worker is still merged with it;
* the merge writes the value received at the sync, even if the fragment's global
  value has moved on since (it cannot, as tau < H);
* with sparse outer gradients (``oracles.compression``) each fragment's sync sends the
  top-k messages of its own tensors; a worker's error-feedback buffer is per tensor, so
  each fragment's part of it is touched only at that fragment's syncs.
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
from oracles.compression import message_bytes, send

__all__ = ["fragment_layers", "sync_offset", "fragment_schedule", "streaming_diloco"]


def fragment_layers(num_layers: int, fragments: int, pattern: str) -> list:
    """The 1-based layers of each fragment."""
    if pattern == "strided":
        return [[layer for layer in range(1, num_layers + 1) if (layer - 1) % fragments == p]
                for p in range(fragments)]
    longer, base = num_layers % fragments, num_layers // fragments
    out, layer = [], 1
    for p in range(fragments):
        count = base + (1 if p < longer else 0)
        out.append(list(range(layer, layer + count)))
        layer += count
    return out


def sync_offset(p: int, fragments: int, inner_steps: int) -> int:
    """``t_p = floor(p H / P)``."""
    return (p * inner_steps) // fragments


def fragment_schedule(fragments: int, inner_steps: int, tau: int, rounds: int) -> list:
    """``(step, "sync" or "merge", p)`` for every event of the run (steps 1-based over the run),
    syncs before merges at one step; merges past the last step are left out."""
    events = []
    total = rounds * inner_steps
    for t in range(1, total + 1):
        for p in range(fragments):
            if (t - sync_offset(p, fragments, inner_steps)) % inner_steps == 0:
                events.append((t, "sync", p))
        for p in range(fragments):
            synced = t - tau
            if synced >= 1 and (synced - sync_offset(p, fragments, inner_steps)) % inner_steps == 0:
                events.append((t, "merge", p))
    return events


def streaming_diloco(x, y, config, x_eval=None, y_eval=None) -> OracleResult:
    """Train Streaming DiLoCo step by step; one entry per round (H steps)."""
    family, num_workers, inner_steps = config.family, config.num_workers, config.inner_steps
    if family.eager or config.asynchrony.asynchronous:
        raise NotImplementedError("Streaming DiLoCo (see oracles.eager, .asynchronous)")
    tau, mix = family.tau(inner_steps), family.mix
    rng, shards, theta = start(x, y, config, y_eval)
    layers = fragment_layers(len(theta) // 2, family.fragments, family.pattern)
    keys = [[f"{kind}{layer}" for layer in group for kind in "Wb"] for group in layers]
    sizes = [len(y_k) for _, y_k in shards]
    local = [dict(theta) for _ in range(num_workers)]
    adam = [fresh_inner(theta, config) for _ in range(num_workers)]
    momentum = {key: 0.0 * value for key, value in theta.items()}
    residual = [{key: 0.0 * value for key, value in theta.items()} for _ in range(num_workers)]
    received = {}  # p -> (the fragment's value at its last sync, the workers to merge it into)
    events = fragment_schedule(family.fragments, inner_steps, tau, config.rounds)
    rounds = []
    for r in range(config.rounds):
        streams = rng.spawn(num_workers)
        losses = {k: [] for k in range(num_workers)}
        delta, dropped, syncs = {}, [], []
        for h in range(1, inner_steps + 1):
            t = r * inner_steps + h
            for k in range(num_workers):
                local[k], adam[k], step_loss = worker_steps(local[k], adam[k], shards[k], 1, config, streams[k])
                losses[k] += step_loss
            for _, kind, p in (e for e in events if e[0] == t):
                if kind == "sync":
                    out = draw_drops(rng, config)
                    dropped += out
                    kept = [k for k in range(num_workers) if k not in out]
                    sent = _sync(theta, momentum, local, keys[p], kept, (sizes, residual), config)
                    theta, momentum, fragment_delta, sent_bytes = sent
                    delta.update(fragment_delta)
                    targets = list(range(num_workers)) if config.drop_rule == "restart" else kept
                    received[p] = ({key: theta[key] for key in keys[p]}, targets)
                    syncs.append([h, sent_bytes, tau])
                else:
                    values, targets = received.pop(p)
                    for k in targets:
                        for key, value in values.items():
                            local[k][key] = mix * value + (1.0 - mix) * local[k][key]
        shown = sorted(set(dropped)) if family.fragments > 1 else dropped
        ordered = {key: delta[key] for key in theta if key in delta}
        rounds.append(round_entry(losses, theta, ordered, x_eval, y_eval, dropped=shown, syncs=syncs))
    return OracleResult(theta, rounds)


def _sync(theta, momentum, local, keys, kept, shared, config):
    """One fragment's outer step from the kept workers (none kept: nothing moves), with each
    kept worker's sparse message when ``topk`` is set (its buffers of these keys only):
    ``(theta, momentum, delta, bytes each worker sent)``."""
    sizes, residual = shared
    if not kept:
        return theta, momentum, {key: 0.0 * theta[key] for key in keys}, 0.0
    outer = {k: {key: theta[key] - local[k][key] for key in keys} for k in kept}
    fragment = {key: theta[key] for key in keys}
    sent_bytes = ring_bytes(sum(value.size for value in fragment.values()), len(kept))
    if config.family.topk is not None:
        for k in kept:
            outer[k], left = send(outer[k], {key: residual[k][key] for key in keys}, config.family)
            residual[k].update(left)
        sent_bytes = float((len(kept) - 1) * message_bytes(fragment, config.family))
    weights = [sizes[k] if uses_size_weights(config) else 1.0 for k in kept]
    delta = {key: weighted_mean([outer[k][key] for k in kept], weights) for key in keys}
    theta, momentum = outer_sgd(theta, delta, momentum, config)
    return theta, momentum, delta, sent_bytes
