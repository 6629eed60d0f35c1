"""Lion (Chen et al., 2023, arXiv 2302.06675) as an inner optimizer, from outside the package.

One per-array rule; ``from_rule`` lifts it to the reference executor's dicts and the fast
executor's ``(K, P)`` rows. Per array, with ``beta1``, ``beta2``, ``wd`` and the scheduled
``lr`` from ``config.inner``::

    c     = beta1 m + (1 - beta1) g
    theta = theta (1 - lr wd) - lr sign(c)
    m     = beta2 m + (1 - beta2) g
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from diloco.core.inner import from_rule


class LionState(NamedTuple):
    step: int
    momentum: dict


def hyper(config, lr_at):
    inner = config.inner
    return lr_at(inner.lr), inner.beta1, inner.beta2, inner.weight_decay


def rule(param, grad, slots, step, hp):
    lr, beta1, beta2, weight_decay = hp
    (m,) = slots
    direction = np.sign(beta1 * m + (1.0 - beta1) * grad)
    return param * (1.0 - lr * weight_decay) - lr * direction, (beta2 * m + (1.0 - beta2) * grad,)


LION = from_rule(LionState, hyper, rule)
