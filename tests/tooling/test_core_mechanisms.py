"""The paper's mechanisms in the one driver (``diloco.core``), against loops written out here.

They used to be keyword plumbing of milestones 25-27 (``encode=``, ``worker_starts=``,
shard-size weights, the baseline's lr schedule and clipping); milestones 25-27 are now the
course's Algorithm 1, and the driver runs the mechanisms on every executor. The expected
values come from the earlier milestones, composed here by hand.
"""

from __future__ import annotations

import math

import numpy as np

from diloco.adamw import adamw_step, init_adamw_state
from diloco.config import AdamWConfig
from diloco.core.driver import train
from diloco.loop import prepare_training
from diloco.model import init_model_params, model_backward, model_forward
from diloco.outer import compute_outer_gradient, init_outer_optimizer, nesterov_param_update, update_outer_momentum
from diloco.sharding import iid_shard_dataset, inner_train_worker, sample_worker_batch
from helpers import assert_close, assert_params_close
from test_loop import layer_sizes_for, numpy_mean, tiny_config, tiny_data


class OneHotOracle:
    """The encoder contract of ``diloco.text.OneHot`` in plain NumPy: windows (b, c) -> (b, c V)."""

    def __init__(self, vocab_size, context):
        self.vocab_size, self.context = vocab_size, context
        self.input_width, self.num_features = context, context * vocab_size

    def __call__(self, windows, dtype=np.float64):
        out = np.zeros((len(windows), self.num_features), dtype=dtype)
        for j in range(self.context):
            out[np.arange(len(windows)), j * self.vocab_size + windows[:, j].astype(int)] = 1.0
        return out


def text_like_data(seed, num_examples=30, context=3, vocab_size=4):
    """Index windows (float32, as diloco.text stores them) and a next 'character' for each."""
    rng = np.random.default_rng(seed)
    windows = rng.integers(0, vocab_size, (num_examples, context))
    labels = (windows.sum(axis=1) + rng.integers(0, 2, num_examples)) % vocab_size
    labels[:vocab_size] = np.arange(vocab_size)  # every class present
    return windows.astype(np.float32), labels.astype(np.int64)


def _one_round_of_workers(x, y, config, starts=None):
    """(shards, initial params, each worker's params after one round, the run rng after the spawn)."""
    config, rng, shards, params = prepare_training(x, y, config)
    children = rng.spawn(config.num_workers)
    states = [init_adamw_state(params) for _ in shards]
    starts = starts or [params] * config.num_workers
    workers = [inner_train_worker(start, state, x_k, y_k, config.inner_steps, config.batch_size, config.inner,
                                  child)[0]
               for start, state, (x_k, y_k), child in zip(starts, states, shards, children, strict=True)]
    return shards, params, workers, rng


def test_non_iid_pseudo_gradients_are_weighted_by_shard_size():
    x, y = tiny_data(4, num_examples=31)
    fedavg = dict(num_workers=3, outer_lr=1.0, outer_momentum=0.0, rounds=1)  # the new model: the average
    config = tiny_config(iid=False, alpha=0.5, **fedavg)
    shards, _, workers, _ = _one_round_of_workers(x, y, config)
    sizes = [len(y_k) for _, y_k in shards]
    assert len(set(sizes)) > 1, "this seed must give unequal shards"
    weighted = {key: sum(n * w[key] for n, w in zip(sizes, workers, strict=True)) / sum(sizes) for key in workers[0]}
    got = train("diloco", x, y, config)
    assert_params_close(got.params, weighted, rtol=1e-10, atol=1e-13,
                        what="non-IID shards (shard_weighting 'auto'): the average weighted by shard size")
    uniform = train("diloco", x, y, config.replace(shard_weighting="uniform"))
    assert_params_close(uniform.params, numpy_mean(workers), rtol=1e-10, atol=1e-13, what="uniform: the plain mean")


def test_dropped_outer_gradients_are_left_out_and_renormalised_over_the_kept_workers():
    """Drops with non-IID shards: the kept workers' size weights are renormalised over the kept."""
    x, y = tiny_data(7, num_examples=37)
    for seed in range(50):
        config = tiny_config(num_workers=4, iid=False, drop_prob=0.5, outer_lr=1.0, outer_momentum=0.0, rounds=1,
                             seed=seed)
        shards, _, workers, rng = _one_round_of_workers(x, y, config)
        dropped = np.flatnonzero(rng.random(4) < 0.5).tolist()  # drawn after the spawn, from the run rng
        if 0 < len(dropped) < 3 and len({len(s[1]) for s in shards}) > 1:
            break
    kept = [k for k in range(4) if k not in dropped]
    sizes = {k: len(shards[k][1]) for k in kept}
    want = {key: sum(sizes[k] * workers[k][key] for k in kept) / sum(sizes.values()) for key in workers[0]}
    got = train("diloco", x, y, config)
    assert got.history[0]["dropped_workers"] == dropped
    assert_params_close(got.params, want, rtol=1e-10, atol=1e-13, what="the kept workers' size-weighted average")


def test_dropped_workers_carry_on_from_their_own_params_next_round():
    x, y = tiny_data(5, num_examples=30)
    config = tiny_config(num_workers=3, rounds=3, drop_prob=0.5, seed=2)
    result = train("diloco", x, y, config)
    rng = np.random.default_rng(config.seed)
    shards = iid_shard_dataset(x, y, 3, rng)
    params = init_model_params(layer_sizes_for(x, y, config), rng)
    states, outer, starts = [init_adamw_state(params) for _ in range(3)], init_outer_optimizer(params), [params] * 3
    for _ in range(config.rounds):
        children = rng.spawn(3)
        trained = [inner_train_worker(start, state, x_k, y_k, config.inner_steps, config.batch_size, config.inner,
                                      child) for start, state, (x_k, y_k), child in zip(starts, states, shards,
                                                                                        children, strict=True)]
        states = [t[1] for t in trained]
        dropped = np.flatnonzero(rng.random(3) < config.drop_prob).tolist()
        kept = [k for k in range(3) if k not in dropped]
        if kept:
            delta = compute_outer_gradient(params, [trained[k][0] for k in kept])
            outer = update_outer_momentum(outer, delta, config.outer_momentum)
            params = nesterov_param_update(params, delta, outer, config.outer_lr, config.outer_momentum)
        starts = [trained[k][0] if k in dropped else params for k in range(3)]
    assert any(record["dropped_workers"] for record in result.history), "this seed drops an outer gradient"
    assert_params_close(result.params, params, rtol=1e-12, atol=1e-15,
                        what="the driver vs rounds that carry each dropped worker's own params")


def test_both_algorithms_train_on_the_encoded_inputs():
    windows, labels = text_like_data(2)
    eval_windows, eval_labels = text_like_data(3, num_examples=10)
    encode = OneHotOracle(4, 3)
    for algo in ("diloco", "sync"):
        config = tiny_config(num_workers=3, rounds=2)
        got = train(algo, windows, labels, config, x_eval=eval_windows, y_eval=eval_labels, encode=encode)
        want = train(algo, encode(windows), labels, config, x_eval=encode(eval_windows), y_eval=eval_labels)
        assert_params_close(got.params, want.params, rtol=1e-12, atol=1e-15, what=f"{algo}: windows + encode")
        for mine, gold in zip(got.history, want.history, strict=True):
            assert_close(mine["eval_loss"], gold["eval_loss"], rtol=1e-12, what="held-out loss, evaluated encoded")


def test_the_baseline_clips_and_follows_the_inner_lr_schedule():
    x, y = tiny_data(6, num_examples=20)
    config = tiny_config(num_workers=2, inner_steps=3, rounds=2, lr_schedule="cosine", warmup_steps=2, clip_norm=0.5)
    result = train("sync", x, y, config)
    rng = np.random.default_rng(config.seed)
    shards = iid_shard_dataset(x, y, 2, rng)
    params = init_model_params(layer_sizes_for(x, y, config), rng)
    state, step, total, peak = init_adamw_state(params), 0, 6, config.inner.lr
    for _ in range(config.rounds):
        children = rng.spawn(2)
        for _ in range(config.inner_steps):
            grads = []
            for (x_k, y_k), child in zip(shards, children, strict=True):
                x_batch, y_batch = sample_worker_batch(x_k, y_k, config.batch_size, child)
                _, cache = model_forward(params, x_batch)
                grads.append(model_backward(params, cache, y_batch))
            mean = {key: (grads[0][key] + grads[1][key]) / 2 for key in params}
            norm = math.sqrt(sum(float(np.sum(g * g)) for g in mean.values()))
            coef = 0.5 / (norm + 1e-6)  # torch.nn.utils.clip_grad_norm_
            if coef < 1:
                mean = {key: g * coef for key, g in mean.items()}
            step += 1
            cosine = 0.5 * (1 + math.cos(math.pi * (step - 2) / (total - 2)))
            lr = peak * step / 2 if step <= 2 else peak * (0.1 + 0.9 * cosine)
            params, state = adamw_step(params, state, mean, AdamWConfig(lr=lr, weight_decay=config.inner.weight_decay))
    assert_params_close(result.params, params, rtol=1e-10, atol=1e-13,
                        what="baseline with warmup + cosine lr and gradient clipping")
