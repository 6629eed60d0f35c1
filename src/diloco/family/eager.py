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
The rule is ``diloco.core.sync.eager_sync``, run by the one driver.
"""

from __future__ import annotations

from diloco.config import DiLoCoConfig
from diloco.core.driver import train
from diloco.core.hooks import callbacks
from diloco.core.sync import eager_outer_gradient
from diloco.family.config import FamilyConfig
from diloco.loop import TrainResult

__all__ = ["eager_outer_gradient", "train_eager"]


def train_eager(x, y, config: DiLoCoConfig, family: FamilyConfig | None = None, *, x_eval=None, y_eval=None,
                rng=None, on_round=None, executor: str = "reference", encode=None) -> TrainResult:
    """Train DiLoCo with eager updates (``family.tau(H)`` must be 0 or H).

    Parameters and returns as ``diloco.family.train_streaming``; ``params`` is the
    workers' average. Records carry ``syncs = [[H, bytes, tau]]``: the all-reduce issued
    at the end of a round may take the next round's H inner steps (tau = H).
    """
    family = FamilyConfig(eager=True) if family is None else family
    if not isinstance(family, FamilyConfig):
        raise TypeError(f"family must be a FamilyConfig, got {type(family).__name__}")
    return train("diloco", x, y, config.replace(family=family), x_eval=x_eval, y_eval=y_eval, rng=rng,
                 encode=encode, executor=executor, hooks=callbacks(on_round),
                 sync_fields=True)
