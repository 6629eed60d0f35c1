"""Inner optimizers as a registry: each entry owns its state, its step, and its stored form.

``INNER_OPTIMIZERS`` maps ``DiLoCoConfig.inner_optimizer`` to an ``InnerOptimizer``, the
inner counterpart of ``diloco.core.outer.OUTER_OPTIMIZERS``. Every executor and the
checkpoints reach an inner optimizer only through it:

* ``init(params, config) -> state`` and ``step(params, state, grads, config, lr_at) ->
  (params, state)``: the reference and MPI executors (``diloco.core.mechanisms.inner_step``,
  after clipping); ``lr_at(peak)`` is this step's learning rate on the run's schedule for
  a peak, so each entry schedules its own rates (Muon has two);
* ``to_moments(state, params) -> AdamWState`` and ``from_moments(moments, config) ->
  state``: the stored form, two arrays per key (``m``, ``v``) and a step count, which the
  fast executor keeps in its ``(K, P)`` buffers and a checkpoint writes; exact copies
  both ways, no arithmetic;
* the fast executor's flat kernel of the same name, in place on those buffers:
  ``diloco.engine.optim.FLAT_UPDATES`` (outside learner workspaces).

Entries:

* ``"adamw"``: milestones 08-11 (``adamw_step``); its state is its stored form.
* ``"muon"``: ``diloco.methods.muon`` (MuLoCo): Muon on the weight matrices, AdamW on the
  rest; stored with the matrices' momentum in ``m`` and zeros in ``v``
  (``as_moments``).
* ``"sgd"``: SGD with heavy-ball momentum, PyTorch's ``SGD(lr, momentum=beta1,
  weight_decay=wd)`` with ``dampening = 0``::

      g' = g + wd theta,   b = beta1 b + g'  (b = g' at the first step),   theta -= lr b

  with ``lr = config.inner.lr`` on the run's schedule and ``beta1``, ``wd`` from
  ``config.inner``; stored with ``b`` in ``m`` and zeros in ``v``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from diloco.adamw import AdamWState, adamw_step, init_adamw_state
from diloco.model import Params

__all__ = ["InnerOptimizer", "INNER_OPTIMIZERS", "inner_optimizer", "SGDState"]


class InnerOptimizer(NamedTuple):
    """An inner optimizer's four pure functions (see the module doc)."""

    init: Callable
    step: Callable
    to_moments: Callable
    from_moments: Callable


# --- AdamW: milestones 08-11 ---------------------------------------------------------------------

def _adamw_init(params: Params, config) -> AdamWState:
    return init_adamw_state(params)


def _adamw_step(params: Params, state: AdamWState, grads: Params, config, lr_at) -> tuple[Params, AdamWState]:
    inner = config.inner
    if config.lr_schedule != "constant":  # no config built per step at a constant lr
        inner = dataclasses.replace(inner, lr=lr_at(inner.lr))
    return adamw_step(params, state, grads, inner)


def _identity(state, *_):
    return state


# --- Muon (MuLoCo): diloco.methods.muon ------------------------------------------------------------

def _muon_init(params: Params, config):
    from diloco.methods.muon import init_muon

    return init_muon(params, config.muon)


def _muon_step(params: Params, state, grads: Params, config, lr_at):
    from diloco.methods.muon import muon_step

    muon, adam = config.muon, config.inner
    if config.lr_schedule != "constant":
        muon = dataclasses.replace(muon, lr=lr_at(muon.lr))
        adam = dataclasses.replace(adam, lr=lr_at(adam.lr))
    return muon_step(params, state, grads, muon, adam)


def _muon_to_moments(state, params: Params) -> AdamWState:
    from diloco.methods.muon import as_moments

    return as_moments(state, params)


def _muon_from_moments(moments: AdamWState, config):
    from diloco.methods.muon import from_moments

    return from_moments(moments, config.muon)


# --- SGD with heavy-ball momentum -------------------------------------------------------------------

class SGDState(NamedTuple):
    """SGD's state: ``step`` taken so far and the momentum ``buffer`` per key (zeros before the first)."""

    step: int
    buffer: dict


def _sgd_init(params: Params, config) -> SGDState:
    return SGDState(0, {key: np.zeros_like(value) for key, value in params.items()})


def _sgd_step(params: Params, state: SGDState, grads: Params, config, lr_at) -> tuple[Params, SGDState]:
    inner, step = config.inner, state.step + 1
    lr = lr_at(inner.lr)
    new_params, buffer = {}, {}
    for key, value in params.items():
        g = grads[key] + inner.weight_decay * value if inner.weight_decay else grads[key]
        buffer[key] = g.copy() if step == 1 else inner.beta1 * state.buffer[key] + g
        new_params[key] = value - lr * buffer[key]
    return new_params, SGDState(step, buffer)


def _sgd_to_moments(state: SGDState, params: Params) -> AdamWState:
    return AdamWState(state.step, dict(state.buffer), {key: np.zeros_like(value) for key, value in params.items()})


def _sgd_from_moments(moments: AdamWState, config) -> SGDState:
    return SGDState(moments.step, {key: value.copy() for key, value in moments.m.items()})


INNER_OPTIMIZERS: dict[str, InnerOptimizer] = {
    "adamw": InnerOptimizer(_adamw_init, _adamw_step, _identity, _identity),
    "muon": InnerOptimizer(_muon_init, _muon_step, _muon_to_moments, _muon_from_moments),
    "sgd": InnerOptimizer(_sgd_init, _sgd_step, _sgd_to_moments, _sgd_from_moments),
}


def inner_optimizer(config) -> InnerOptimizer:
    """The ``InnerOptimizer`` that ``config.inner_optimizer`` names."""
    return INNER_OPTIMIZERS[config.inner_optimizer]
