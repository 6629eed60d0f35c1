"""What every oracle shares: the run's start, a worker's inner steps, the outer step, the record.

Conventions the core follows and the papers leave open, taken here as well:

* **the start**: ``rng = default_rng(config.seed)`` shards the data (milestone 16, or 17
  for non-IID shards) and then initialises the MLP (milestone 01; or the transformer,
  ``config.model``) from the same generator, in that order;
* **the batches**: at the start of every round (DiLoCo, Streaming, eager) or of every
  group of arrivals (asynchronous DiLoCo) the run's generator spawns K children,
  ``rng.spawn(K)``; worker k draws every mini-batch of that round from child k, with
  milestone 18 (``sample_worker_batch``);
* **the weights**: shard sizes ``n_k`` when ``shard_weighting == "size"`` (or ``"auto"``
  with non-IID shards), else uniform; normalised over the workers whose outer gradient
  is averaged (the kept ones).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from diloco.adamw import adamw_step, init_adamw_state
from diloco.evaluation import evaluate_loss
from diloco.model import cross_entropy_loss, init_model_params, model_backward, model_forward
from diloco.sharding import iid_shard_dataset, noniid_shard_dataset, sample_worker_batch

__all__ = ["OracleResult", "check_supported", "start", "worker_steps", "transformer", "model_of", "loss_and_grads",
           "held_out_loss", "uses_size_weights", "weighted_mean",
           "outer_sgd", "draw_drops", "fresh_inner", "inner_sgd", "inner_lion", "norm", "round_entry", "ring_bytes"]


class OracleResult(NamedTuple):
    """The oracle's final global params and one entry per round (``round_entry``)."""

    params: dict
    rounds: list


def check_supported(config) -> None:
    """Refuse what the oracles do not model, rather than ignore it."""
    unsupported = {
        "lr_schedule": config.lr_schedule != "constant", "clip_norm": config.clip_norm is not None,
        "inner_optimizer": config.inner_optimizer not in ("adamw", "sgd", "lion"),
        "outer_optimizer": config.outer_optimizer != "sgd",
        "dtype": config.dtype != "float64", "noniid_split": config.noniid_split != "label",
        "comm_dtype": config.family.comm_dtype is not None, "sign_prune": config.family.sign_prune != 0,
        "topk_bits": config.family.topk_bits is not None,
        "compress": (config.family.compress or "").partition(":")[0] not in ("", "native", "dense", "topk", "randk"),
    }
    named = [name for name, bad in unsupported.items() if bad]
    if named:
        raise NotImplementedError(f"the oracles do not model {named}")


def transformer(config, vocab_size: int, context: int):
    """The transformer of ``config.transformer``'s shape (``diloco.models``, checked on its own by finite
    differences and against PyTorch), built here from the shape's fields, not by the core's seam."""
    from diloco.models import TransformerConfig, TransformerModel

    shape = config.transformer
    return TransformerModel(TransformerConfig(vocab_size=vocab_size, context=context, d_model=shape.d_model,
                                              n_heads=shape.n_heads, n_layers=shape.n_layers,
                                              mlp_ratio=shape.mlp_ratio, tied=shape.tied, dtype="float64"))


def model_of(config, params: dict):
    """None for the MLP; the transformer whose embeddings ``params`` holds."""
    return None if config.model == "mlp" else transformer(config, params["wte"].shape[0], params["wpe"].shape[0])


def start(x, y, config, y_eval=None, vocab_size=None):
    """``(rng, shards, params)``: the shards, then the model, from ``default_rng(seed)``.

    The MLP is He-initialised (milestone 01) for the data's classes; the transformer
    (``config.model``) draws its own initialisation for ``vocab_size`` tokens and the
    windows' context.
    """
    check_supported(config)
    rng = np.random.default_rng(config.seed)
    if config.iid:
        shards = iid_shard_dataset(x, y, config.num_workers, rng)
    else:
        shards = noniid_shard_dataset(x, y, config.num_workers, rng, alpha=config.alpha)
    if config.model == "transformer":
        return rng, shards, transformer(config, vocab_size, x.shape[1]).init_params(rng)
    classes = int(y.max()) + 1 if y_eval is None else max(int(y.max()), int(y_eval.max())) + 1
    params = init_model_params((x.shape[1], *config.hidden_sizes, classes), rng, dtype=np.float64)
    return rng, shards, params


def loss_and_grads(params: dict, x_b, y_b, config) -> tuple[float, dict]:
    """The batch's loss and gradient: the MLP's forward, loss and backward, or the transformer's."""
    model = model_of(config, params)
    if model is not None:
        return model.loss_and_grads(params, x_b, y_b)
    logits, cache = model_forward(params, x_b)
    return cross_entropy_loss(logits, y_b), model_backward(params, cache, y_b)


def held_out_loss(params: dict, x_eval, y_eval, config=None) -> float | None:
    """The held-out loss of ``params`` (None without held-out data); ``config`` None is the MLP."""
    if x_eval is None:
        return None
    model = None if config is None else model_of(config, params)
    return evaluate_loss(params, x_eval, y_eval) if model is None else model.metrics(params, x_eval, y_eval)[0]


def worker_steps(params: dict, state, shard, steps: int, config, rng) -> tuple[dict, object, list]:
    """``steps`` inner steps of one worker from ``params``: the batch, forward, loss, backward, then
    AdamW (milestone 11), SGD (``inner_sgd``) or Lion (``inner_lion``, the plugin's name for it), as
    ``config.inner_optimizer`` says."""
    x_k, y_k = shard
    losses = []
    for _ in range(steps):
        x_b, y_b = sample_worker_batch(x_k, y_k, config.batch_size, rng)
        loss, grads = loss_and_grads(params, x_b, y_b, config)
        losses.append(loss)
        if config.inner_optimizer == "sgd":
            params, state = inner_sgd(params, state, grads, config.inner)
        elif config.inner_optimizer == "lion":
            params, state = inner_lion(params, state, grads, config.inner)
        else:
            params, state = adamw_step(params, state, grads, config.inner)
    return params, state, losses


def fresh_inner(params: dict, config):
    """A worker's first inner state: AdamW's zero moments, SGD's ``(0 steps, no momentum yet)`` or
    Lion's zero momentum."""
    if config.inner_optimizer == "lion":
        return {key: np.zeros_like(value) for key, value in params.items()}
    return (0, None) if config.inner_optimizer == "sgd" else init_adamw_state(params)


def inner_sgd(params: dict, state: tuple, grads: dict, inner) -> tuple[dict, tuple]:
    """PyTorch's ``SGD(lr, momentum=beta1, weight_decay=wd)`` (dampening 0, no Nesterov), written
    out from its documentation: ``g <- g + wd theta``; the momentum ``b <- g`` at the first step,
    else ``b <- beta1 b + g``; ``theta <- theta - lr b``. ``state`` is ``(steps taken, {key: b})``."""
    steps, momentum = state
    new_params, new_momentum = {}, {}
    for key, theta in params.items():
        g = grads[key] + inner.weight_decay * theta
        b = g if steps == 0 else inner.beta1 * momentum[key] + g
        new_params[key], new_momentum[key] = theta - inner.lr * b, b
    return new_params, (steps + 1, new_momentum)


def inner_lion(params: dict, momentum: dict, grads: dict, inner) -> tuple[dict, dict]:
    """Lion, Algorithm 2 of Chen et al. (2023, arXiv 2302.06675), with ``beta1``, ``beta2``, the
    decoupled weight decay ``wd`` and ``lr`` of ``inner`` (the plugin ``tests/tooling/plugins/lion.py``
    registers it as ``lion``): ``c = beta1 m + (1 - beta1) g``; ``theta <- theta - lr (sign(c) +
    wd theta)``; ``m <- beta2 m + (1 - beta2) g``. ``momentum`` is ``{key: m}``."""
    new_params, new_momentum = {}, {}
    for key, theta in params.items():
        c = inner.beta1 * momentum[key] + (1 - inner.beta1) * grads[key]
        new_params[key] = theta - inner.lr * (np.sign(c) + inner.weight_decay * theta)
        new_momentum[key] = inner.beta2 * momentum[key] + (1 - inner.beta2) * grads[key]
    return new_params, new_momentum


def draw_drops(rng, config) -> list:
    """The workers whose outer gradient is lost at this sync: ``rng.random(K) < p`` from the
    run's generator (K uniforms per sync, drawn only when ``p > 0``; the core's convention,
    after the round's ``spawn``, so the batches do not depend on the drops)."""
    if config.drop_prob == 0:
        return []
    return [k for k, u in enumerate(rng.random(config.num_workers)) if u < config.drop_prob]


def uses_size_weights(config) -> bool:
    return config.shard_weighting == "size" or (config.shard_weighting == "auto" and not config.iid)


def weighted_mean(tensors: list, weights: list) -> np.ndarray:
    """``sum_i (w_i / sum_j w_j) t_i``, in a plain loop."""
    total = float(sum(weights))
    out = np.zeros_like(tensors[0])
    for w, t in zip(weights, tensors, strict=True):
        out = out + (w / total) * t
    return out


def outer_sgd(theta: dict, delta: dict, momentum: dict, config) -> tuple[dict, dict]:
    """PyTorch's ``SGD(lr, momentum=mu, nesterov=...)`` on the outer gradient (DiLoCo's outer step).

    ``m <- mu m + delta``; Nesterov: ``theta <- theta - lr (delta + mu m)``; heavy ball:
    ``theta <- theta - lr m``. Only the keys of ``delta`` move.
    """
    mu, lr = config.outer_momentum, config.outer_lr
    new_theta, new_m = dict(theta), dict(momentum)
    for key, d in delta.items():
        new_m[key] = mu * momentum[key] + d
        step = d + mu * new_m[key] if config.nesterov else new_m[key]
        new_theta[key] = theta[key] - lr * step
    return new_theta, new_m


def norm(tensors: dict) -> float:
    """The global L2 norm of a dict of arrays."""
    return math.sqrt(sum(float(np.sum(v * v)) for v in tensors.values()))


def ring_bytes(num_values: int, workers: int) -> float:
    """A ring all-reduce of float64 values: each of ``workers`` sends ``2 (n-1)/n`` of them."""
    return 2.0 * (workers - 1) / workers * num_values * 8 if workers else 0.0


def round_entry(losses: dict, theta: dict, delta: dict, x_eval, y_eval, config=None, **fields) -> dict:
    """One round: each worker's mean loss, the outer gradient's norm, the held-out loss, extra fields.

    ``config`` names the model (the MLP when None)."""
    entry = {"worker_losses": [float(np.mean(losses[k])) for k in sorted(losses)], "pseudo_grad_norm": norm(delta),
             "eval_loss": held_out_loss(theta, x_eval, y_eval, config)}
    entry.update(fields)
    return entry
