"""Inner optimizers as values: a per-array rule written once, lifted to the dict and the flat forms.

An ``Optimizer`` is what ``DiLoCoConfig.inner_optimizer`` names in
``diloco.core.registry.INNER_OPTIMIZERS`` (the inner counterpart of
``diloco.core.outer.OUTER_OPTIMIZERS``). Every executor and the checkpoints reach an
inner optimizer only through it:

* ``init(params, config) -> state`` and ``step(params, state, grads, config, lr_at) ->
  (params, state)``: the dict form, for the reference and MPI executors
  (``diloco.core.mechanisms.inner_step``, after clipping); ``lr_at(peak)`` is this step's
  learning rate on the run's schedule for a peak, so each entry schedules its own rates;
* ``flat(config, layout, params, scratch) -> update(p, slots, grads, step, lr_at)``: the
  flat form, in place on the fast executor's ``(S, P)`` rows, one buffer per name in
  ``slots`` (the engine may register a faster kernel under the same name:
  ``diloco.engine.optim.FAST_PATHS``);
* ``to_slots(state, params) -> (step, dicts)`` and ``from_slots(step, dicts, config) ->
  state``: the state as one array per key for each of ``slots``, exact copies both ways;
  ``to_moments`` / ``from_moments`` give the checkpoints' two-array form of them.

``from_rule(State, hyper, rule)`` builds all of it from one per-array rule::

    hp = hyper(config, lr_at)                                  # this step's hyper-parameters
    new_param, new_slots = rule(param, grad, slots, step, hp)  # any array: one key, or (S, P) rows

and a state ``State(step, *slots)``, a NamedTuple whose fields after ``step`` are dicts
by key. An elementwise rule gives the same floats on a key's array as on the ``(S, P)``
rows, so both forms run one piece of maths. Entries:

* ``"adamw"``: milestones 08-11, its rule the milestone ``adamw_step`` on one array
  (its dict form calls it once on the whole dict: the same floats, one validation); its
  state ``AdamWState``. The fast engine keeps its folded kernel
  (``diloco.engine.optim.adamw_update``), which agrees to 1e-10 (``tests/tooling/test_optim.py``).
* ``"sgd"``: SGD with heavy-ball momentum, PyTorch's ``SGD(lr, momentum=beta1,
  weight_decay=wd)`` with ``dampening = 0``::

      g' = g + wd theta,   b = beta1 b + g'  (b = g' at the first step),   theta -= lr b

  with ``lr = config.inner.lr`` on the run's schedule and ``beta1``, ``wd`` from ``config.inner``.
* ``"muon"``: ``diloco.methods.muon`` (MuLoCo): Muon on the weight matrices
  (``muon_matrix_step``, the one rule of both forms), AdamW on the rest; its state
  ``MuonState``, kept as two arrays per key (``as_moments``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from diloco.adamw import AdamWState, adamw_step
from diloco.core.registry import INNER_OPTIMIZERS
from diloco.model import Params

__all__ = ["Optimizer", "from_rule", "lift_dict", "lift_flat", "INNER_OPTIMIZERS", "inner_optimizer", "SGDState",
           "ADAMW", "SGD", "MUON"]


class Optimizer(NamedTuple):
    """An inner optimizer as a value (see the module doc)."""

    init: Callable
    step: Callable
    flat: Callable
    slots: tuple
    to_slots: Callable
    from_slots: Callable

    def to_moments(self, state, params: Params) -> AdamWState:
        """The checkpoints' stored form: the first slot in ``m``, the second (or zeros) in ``v``."""
        step, dicts = self.to_slots(state, params)
        if len(dicts) > 2:
            raise ValueError(f"a checkpoint stores two arrays per key, not the {len(dicts)} slots {self.slots}")
        zeros = {key: np.zeros_like(value) for key, value in params.items()}
        return AdamWState(step, dict(dicts[0]) if dicts else zeros, dict(dicts[1]) if len(dicts) > 1 else zeros)

    def from_moments(self, moments: AdamWState, config):
        """The state ``to_moments`` stored (exact copies)."""
        return self.from_slots(moments.step, (moments.m, moments.v)[:len(self.slots)], config)


def lift_dict(State, hyper: Callable, rule: Callable) -> Callable:
    """The dict form of a per-array ``rule``: ``step(params, state, grads, config, lr_at)``, key by key."""
    def step(params: Params, state, grads: Params, config, lr_at) -> tuple:
        hp, t = hyper(config, lr_at), state.step + 1
        new_params, new_slots = {}, tuple({} for _ in state[1:])
        for key, value in params.items():
            new_params[key], out = rule(value, grads[key], tuple(slot[key] for slot in state[1:]), t, hp)
            for slot, array in zip(new_slots, out, strict=True):
                slot[key] = array
        return new_params, State(t, *new_slots)
    return step


def lift_flat(hyper: Callable, rule: Callable) -> Callable:
    """The flat form of a per-array ``rule``: ``update(p, slots, grads, step, lr_at)`` in place on ``(S, P)`` rows."""
    def factory(config, layout, params, scratch):
        def update(p, slots, grads, step, lr_at) -> None:
            new_p, out = rule(p, grads, tuple(slots), step, hyper(config, lr_at))
            p[...] = new_p
            for buffer, array in zip(slots, out, strict=True):
                buffer[...] = array
        return update
    return factory


def from_rule(State, hyper: Callable, rule: Callable) -> Optimizer:
    """An ``Optimizer`` from a per-array ``rule`` and its state type ``State(step, *slots)`` (module doc)."""
    names = State._fields[1:]

    def init(params: Params, config):
        return State(0, *({key: np.zeros_like(value) for key, value in params.items()} for _ in names))

    def to_slots(state, params: Params) -> tuple:
        return state.step, tuple(dict(slot) for slot in state[1:])

    def from_slots(step: int, dicts: tuple, config):
        return State(step, *({key: value.copy() for key, value in slot.items()} for slot in dicts))

    return Optimizer(init, lift_dict(State, hyper, rule), lift_flat(hyper, rule), names, to_slots, from_slots)


# --- AdamW: milestones 08-11 ---------------------------------------------------------------------

def _adamw_hyper(config, lr_at):
    if config.lr_schedule == "constant":  # no config built per step at a constant lr
        return config.inner
    return dataclasses.replace(config.inner, lr=lr_at(config.inner.lr))


def _adamw_rule(param, grad, slots, step, inner):
    """The milestone's ``adamw_step`` on one array (every AdamW operation is elementwise)."""
    m, v = slots
    new, state = adamw_step({"x": param}, AdamWState(step - 1, {"x": m}, {"x": v}), {"x": grad}, inner)
    return new["x"], (state.m["x"], state.v["x"])


def _adamw_step(params: Params, state: AdamWState, grads: Params, config, lr_at) -> tuple:
    """The dict form: the milestone over the whole dict at once, the rule's lift without a call per key."""
    return adamw_step(params, state, grads, _adamw_hyper(config, lr_at))


ADAMW = from_rule(AdamWState, _adamw_hyper, _adamw_rule)._replace(step=_adamw_step)


# --- SGD with heavy-ball momentum -------------------------------------------------------------------

class SGDState(NamedTuple):
    """SGD's state: ``step`` taken so far and the momentum ``buffer`` per key (zeros before the first)."""

    step: int
    buffer: dict


def _sgd_hyper(config, lr_at):
    return lr_at(config.inner.lr), config.inner.beta1, config.inner.weight_decay


def _sgd_rule(param, grad, slots, step, hp):
    lr, momentum, weight_decay = hp
    g = grad + weight_decay * param if weight_decay else grad
    buffer = g.copy() if step == 1 else momentum * slots[0] + g
    return param - lr * buffer, (buffer,)


SGD = from_rule(SGDState, _sgd_hyper, _sgd_rule)


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


def _muon_to_slots(state, params: Params) -> tuple:
    from diloco.methods.muon import as_moments

    moments = as_moments(state, params)
    return moments.step, (moments.m, moments.v)


def _muon_from_slots(step: int, dicts: tuple, config):
    from diloco.methods.muon import from_moments

    return from_moments(AdamWState(step, *dicts), config.muon)


# The flat form is the engine's batched kernel (diloco.engine.optim.FAST_PATHS["muon"]).
MUON = Optimizer(_muon_init, _muon_step, None, ("m", "v"), _muon_to_slots, _muon_from_slots)


def inner_optimizer(config) -> Optimizer:
    """The ``Optimizer`` that ``config.inner_optimizer`` names."""
    return INNER_OPTIMIZERS[config.inner_optimizer]
