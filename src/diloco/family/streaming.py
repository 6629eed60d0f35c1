"""Streaming DiLoCo (Douillard et al., 2025, arXiv 2501.18512), on the milestone functions.

The model's L layers are split into P fragments. Fragment p synchronises every H inner
steps, offset by ``t_p = floor(p H / P)`` steps, i.e. at the steps ``t`` with
``(t - t_p) mod H == 0`` (so one fragment syncs every H/P steps and a round of H steps
holds one sync of each). At its sync step t, fragment p's outer gradient

    Delta_p = theta_p - mean_k theta_{k,p}^{(t)}              (theta_p: its global copy)

is all-reduced (possibly encoded, ``diloco.core.comm``) and the outer Nesterov step
updates ``theta_p``. The workers keep training meanwhile; ``tau`` steps later the result
arrives and each worker merges it into its local copy:

    theta_{k,p}^{(t + tau)} <- mix * theta_p + (1 - mix) * theta_{k,p}^{(t + tau)}

With P = 1, tau = 0 and mix = 1 this is DiLoCo, bit for bit
(``tests/tooling/test_streaming.py``). Each worker's AdamW state is carried throughout.
The schedule is ``diloco.core.schedule`` and the sync ``diloco.core.sync``; this module
gives ``train_streaming``, the family's entry point, run by the one driver.

Fragments follow the paper's two patterns over layers ``l = 1..L`` (``W_l``, ``b_l``
together): *strided* (fragment p holds layers p+1, p+1+P, ...; the paper's choice) or
*sequential* (contiguous blocks of layers).
"""

from __future__ import annotations

import numpy as np

from diloco.config import DiLoCoConfig
from diloco.core.driver import train
from diloco.core.hooks import callbacks
from diloco.core.schedule import fragment_keys, fragment_layers, sync_offsets, sync_steps
from diloco.family.config import FamilyConfig
from diloco.loop import TrainResult

__all__ = ["fragment_layers", "fragment_keys", "sync_offsets", "sync_steps", "train_streaming"]


def train_streaming(x: np.ndarray, y: np.ndarray, config: DiLoCoConfig, family: FamilyConfig | None = None, *,
                    x_eval=None, y_eval=None, rng=None, on_round=None, executor: str = "reference",
                    encode=None) -> TrainResult:
    """Train with Streaming DiLoCo (and any wire format of ``family``).

    Parameters
    ----------
    x, y, config, x_eval, y_eval, rng, on_round, encode
        As for ``diloco.loop.train_diloco``.
    family : FamilyConfig, optional
        ``fragments`` (P), ``pattern``, ``overlap`` (tau < H), ``mix`` and the wire format;
        default ``config.family``.
    executor : "reference" or "stacked", keyword-only

    Returns
    -------
    TrainResult(params, history)
        ``params`` are the global (outer) parameters. A record per H inner steps; besides
        the DiLoCo fields, ``all_reduces`` (fragment syncs in the round), ``bytes_sent``,
        ``peak_sync_bytes`` (largest single sync), ``bytes_per_step`` and ``syncs``
        (``[step in round, bytes, tau]`` per sync, read by ``diloco.core.netsim``).

    Raises
    ------
    TypeError, ValueError
        The errors of ``train_diloco``; P above the number of layers or above H;
        ``tau >= H``; eager updates (use ``train_eager``).
    """
    family = _family(config, family)
    if family.eager:
        raise ValueError("train_streaming does not do eager updates: use diloco.family.train_eager")
    return train("diloco", x, y, config.replace(family=family), x_eval=x_eval, y_eval=y_eval, rng=rng,
                 encode=encode, executor=executor, hooks=callbacks(on_round),
                 sync_fields=True)


def _family(config, family) -> FamilyConfig:
    """``family``, or the config's own section."""
    if family is None:
        return config.family if isinstance(config, DiLoCoConfig) else FamilyConfig()
    if not isinstance(family, FamilyConfig):
        raise TypeError(f"family must be a FamilyConfig, got {type(family).__name__}")
    return family
