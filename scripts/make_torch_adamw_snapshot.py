"""Write ``tests/fixtures/torch_adamw.npz``: PyTorch reference values for Parts 1-2.

External evidence, not self-comparison: the tests check that ``diloco`` reproduces what
PyTorch computes on the same float64 inputs. Two things are recorded.

* ``adamw_*``: five steps of ``torch.optim.AdamW`` on two small parameter tensors with
  fixed gradients (``weight_decay > 0``, so the decoupled decay is exercised).
* ``mlp_*``: one forward and backward pass of a 3-4-3 ReLU MLP (two affine layers) on a
  batch of 5: logits, mean cross-entropy and the gradient of every parameter (autograd).

PyTorch is *not* a project dependency. Regenerate in a throw-away environment::

    python -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 numpy
    /tmp/torchvenv/bin/python scripts/make_torch_adamw_snapshot.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "torch_adamw.npz"

LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 0.1, 0.9, 0.999, 1e-8, 0.1
NUM_STEPS = 5


def adamw_trajectory(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Parameters, gradients and optimizer state after each of ``NUM_STEPS`` AdamW steps."""
    init = {"W1": rng.standard_normal((2, 3)), "b1": rng.standard_normal(3)}
    grads = {key: rng.standard_normal((NUM_STEPS,) + value.shape) for key, value in init.items()}
    tensors = {key: torch.tensor(value, dtype=torch.float64, requires_grad=True) for key, value in init.items()}
    optimizer = torch.optim.AdamW(
        list(tensors.values()), lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY,
        foreach=False, fused=False,
    )
    record = {f"adamw_init_{key}": value for key, value in init.items()}
    for key in init:
        record[f"adamw_grads_{key}"] = grads[key]  # (NUM_STEPS, *shape)
        record[f"adamw_params_{key}"] = np.empty_like(grads[key])  # after each step
        record[f"adamw_m_{key}"] = np.empty_like(grads[key])
        record[f"adamw_v_{key}"] = np.empty_like(grads[key])
    for step in range(NUM_STEPS):
        optimizer.zero_grad()
        for key, tensor in tensors.items():
            tensor.grad = torch.tensor(grads[key][step], dtype=torch.float64)
        optimizer.step()
        for key, tensor in tensors.items():
            state = optimizer.state[tensor]
            record[f"adamw_params_{key}"][step] = tensor.detach().numpy()
            record[f"adamw_m_{key}"][step] = state["exp_avg"].numpy()
            record[f"adamw_v_{key}"][step] = state["exp_avg_sq"].numpy()
    record["adamw_hyper"] = np.array([LR, BETA1, BETA2, EPS, WEIGHT_DECAY])
    return record


def mlp_gradients(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Logits, mean cross-entropy and autograd gradients of a 3-4-3 ReLU MLP."""
    sizes = (3, 4, 3)
    params = {}
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True), start=1):
        params[f"W{layer}"] = rng.standard_normal((fan_in, fan_out))
        params[f"b{layer}"] = 0.5 * rng.standard_normal(fan_out)
    x = rng.standard_normal((5, sizes[0]))
    y = np.array([0, 2, 1, 2, 0])
    tensors = {key: torch.tensor(value, requires_grad=True) for key, value in params.items()}
    hidden = torch.relu(torch.tensor(x) @ tensors["W1"] + tensors["b1"])
    logits = hidden @ tensors["W2"] + tensors["b2"]  # no ReLU after the last layer
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(y), reduction="mean")
    loss.backward()
    record = {f"mlp_{key}": value for key, value in params.items()}
    record.update({f"mlp_grad_{key}": tensor.grad.numpy() for key, tensor in tensors.items()})
    record.update(mlp_x=x, mlp_y=y, mlp_logits=logits.detach().numpy(), mlp_loss=np.array(loss.item()))
    return record


def main() -> None:
    rng = np.random.default_rng(2023)
    record = {**adamw_trajectory(rng), **mlp_gradients(rng)}
    record["torch_version"] = np.array(torch.__version__)
    np.savez(OUT, **record)
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, torch {torch.__version__})")


if __name__ == "__main__":
    main()
