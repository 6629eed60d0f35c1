"""DiLoCo in PyTorch eager mode, the comparison point of the benchmark (not a dependency).

The same work as ``diloco.train_diloco`` on one process: K workers, each with its own
``torch.optim.AdamW`` (``foreach=True`` or ``fused=True``) carried across rounds, H
steps of ``addmm`` / ``relu`` / ``cross_entropy`` / ``backward`` on mini-batches drawn
like ``sample_worker_batch`` (``Generator.choice`` without replacement), then the
pseudo-gradient ``global - mean_k worker_k`` and one step of ``torch.optim.SGD`` with
Nesterov momentum. One intra-op thread, as for NumPy.
"""

from __future__ import annotations

import numpy as np
import torch


def train_diloco_torch(x: np.ndarray, y: np.ndarray, fields: dict, *, fused: bool, seed: int = 0,
                       on_round=None) -> dict:
    """Train and return the global params as ``{"W1": ndarray, "b1": ..., ...}``.

    ``on_round()``, if given, is called at the end of every round (for timing).
    """
    torch.set_num_threads(1)
    dtype = torch.float64 if fields["dtype"] == "float64" else torch.float32
    K, H, b = fields["num_workers"], fields["inner_steps"], fields["batch_size"]
    rng = np.random.default_rng(seed)
    shards = [(torch.from_numpy(x[idx]), torch.from_numpy(y[idx]))
              for idx in np.array_split(rng.permutation(len(y)), K)]
    sizes = (x.shape[1], *fields["hidden_sizes"], int(y.max()) + 1)
    global_params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        weight = torch.from_numpy(rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).to(dtype)
        global_params += [weight, torch.zeros(fan_out, dtype=dtype)]
    workers = [[p.clone().requires_grad_(True) for p in global_params] for _ in range(K)]
    options = {"fused": True} if fused else {"foreach": True}
    inner = [torch.optim.AdamW(w, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, **options)
             for w in workers]
    global_params = [p.requires_grad_(True) for p in global_params]
    outer = torch.optim.SGD(global_params, lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(fields.get("rounds", 1)):
        worker_rngs = rng.spawn(K)
        for params, optimizer, (x_k, y_k), rng_k in zip(workers, inner, shards, worker_rngs, strict=True):
            with torch.no_grad():
                for p, g in zip(params, global_params, strict=True):
                    p.copy_(g)
            for _ in range(H):
                idx = torch.from_numpy(rng_k.choice(len(y_k), size=b, replace=False))
                activation, labels = x_k[idx], y_k[idx]
                for layer in range(0, len(params), 2):
                    activation = torch.addmm(params[layer + 1], activation, params[layer])
                    if layer + 2 < len(params):
                        activation = torch.relu(activation)
                loss = torch.nn.functional.cross_entropy(activation, labels)
                optimizer.zero_grad(set_to_none=False)
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            for index, g in enumerate(global_params):
                g.grad = g - torch.stack([w[index] for w in workers]).mean(dim=0)
        outer.step()
        if on_round is not None:
            on_round()
    return {f"{'W' if i % 2 == 0 else 'b'}{i // 2 + 1}": p.detach().numpy() for i, p in enumerate(global_params)}
