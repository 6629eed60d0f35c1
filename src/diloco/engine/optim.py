"""AdamW and Muon, in place on flat buffers (the outer step is the core's: ``diloco.core.outer``).

The same equations as milestones 08-11 (``diloco.adamw``) and ``diloco.methods.muon``.
AdamW folds both bias corrections into two scalars, computed once per step::

    c1 = 1 - b1^t,  c2 = 1 - b2^t
    lr m_hat / (sqrt(v_hat) + eps)  =  a m / (sqrt(v) + e),   a = lr sqrt(c2) / c1,  e = eps sqrt(c2)

so a step is 12 element-wise NumPy passes (13 with weight decay) instead of the 15 of
the milestone order (two divisions by the corrections and the ``lr`` product folded
away), with one scratch array instead of two. The passes walk the buffers in
chunks of ``CHUNK`` values, so they run in the core's cache instead of streaming the
whole ``(K, P)`` buffers from memory twelve times.

With the ``fast`` extra (numba) the same arithmetic, in the same order, runs as one
compiled loop: one pass, no scratch, equal to the NumPy passes to the last bit. Loading
numba and its cached kernel costs about one CPU-second per process, which the loop wins
back after some 2e8 values updated; so by default (``KERNEL == "auto"``) a process
updates its first ``SWITCH_VALUES`` values with the NumPy passes and the rest with the
compiled loop (a small run never pays for numba, a long one runs at the loop's speed,
and the results are the same either way). ``DILOCO_ADAMW_KERNEL=numpy`` or ``=numba``
in the environment fixes the kernel from the first step (``numba`` only when installed).

Agreement with the milestones: the folded scalars move each value by a few roundings per
step. Measured by ``benchmarks/adamw_agreement.py`` against ``diloco.adamw.adamw_step``
over 1,000 steps on (8, 9,610) and (1, 40,000) float64 buffers, weight decay 0.1,
gradients of random scale: the largest difference is 2.2e-16 of the array's largest
value (the ``max|d| / max|ref|`` of the engine's tests; ``tests/tooling/test_optim.py``
requires <= 1e-10 over 200 steps). Taken value by value it reaches 1.3e-10 of the value
itself, on values 1e-8 of the largest, which pass near zero. The moments ``m`` and ``v``
use the milestone's arithmetic and are equal to the last bit; so are the two kernels'
results.
"""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np

from diloco.config import AdamWConfig
from diloco.core.inner import inner_optimizer

__all__ = ["CHUNK", "KERNEL", "KERNELS", "SWITCH_VALUES", "kernel_for", "current_kernel", "numba_loaded",
           "adamw_scratch", "adamw_update", "adamw_update_numpy", "adamw_update_numba", "adamw_scalars", "muon_update",
           "FAST_PATHS", "flat_updater", "numba_jit"]

# Values per NumPy chunk (256 kB of float64 per array). Smaller chunks fit the L2 cache
# better but pay NumPy's per-call cost more often: 2**13 to 2**15 measured, 2**15 fastest.
CHUNK = 2**15
KERNELS = ("auto", "numpy", "numba")
# Values a process updates with the NumPy passes before "auto" moves to the compiled loop:
# ~1 CPU-second of NumPy AdamW, what loading numba costs (benchmarks/results.md, AdamW).
SWITCH_VALUES = 2**28


def _default_kernel() -> str:
    """``DILOCO_ADAMW_KERNEL`` if it names a kernel, else "auto"; "numpy" whenever numba is missing."""
    chosen = os.environ.get("DILOCO_ADAMW_KERNEL", "").strip().lower()
    if importlib.util.find_spec("numba") is None:
        return "numpy"
    return chosen if chosen in KERNELS else "auto"


# "auto" when the fast extra is installed (unless the environment says otherwise), else "numpy".
KERNEL = _default_kernel()
_values_updated = 0  # by adamw_update in this process, for "auto"


def kernel_for(kernel: str, values_done: int) -> str:
    """The kernel ``adamw_update`` runs: ``kernel`` itself, or for "auto" numpy until ``SWITCH_VALUES`` are done."""
    if kernel == "auto":
        return "numba" if values_done >= SWITCH_VALUES else "numpy"
    return kernel


def numba_loaded() -> None:
    """Say that this process has loaded numba for another compiled loop (the transformer's kernels,
    ``diloco.engine.transformer_step``): "auto" moves to the compiled AdamW loop now, since its one
    CPU-second of loading is paid. The two kernels are equal to the last bit, so no result changes."""
    global _values_updated
    _values_updated = max(_values_updated, SWITCH_VALUES)


def current_kernel() -> str:
    """The kernel this process runs now: ``kernel_for(KERNEL, values updated so far)``. The engine's
    other compiled loops (``diloco.engine.stack``'s one-hot first-layer gradient) follow it too, and
    are equal to their NumPy form to the last bit, so the switch never changes a result."""
    return kernel_for(KERNEL, _values_updated)


def numba_jit(function):
    """``function`` compiled as the engine's loops are (``numba.njit``, cached on disk, no GIL,
    NumPy's float semantics); imports numba, so call it on first use only."""
    import numba

    return numba.njit(cache=True, nogil=True, error_model="numpy")(function)


def adamw_scalars(step: int, config: AdamWConfig, lr: float | None = None) -> tuple:
    """``(a, e, decay)`` of step ``t``: ``a = lr sqrt(c2) / c1``, ``e = eps sqrt(c2)``, ``decay = 1 - lr wd``;
    ``lr`` is ``config.lr`` unless given (a scheduled lr: no new config per step)."""
    beta1, beta2 = config.beta1, config.beta2
    lr = config.lr if lr is None else lr
    root_c2 = math.sqrt(1.0 - beta2**step)
    return lr * root_c2 / (1.0 - beta1**step), config.eps * root_c2, 1.0 - lr * config.weight_decay


def adamw_scratch(size: int, dtype) -> tuple:
    """The scratch ``adamw_update`` needs for buffers of ``size`` values (one chunk-sized array)."""
    return (np.empty(min(size, CHUNK), dtype=dtype),)


def adamw_update(params: np.ndarray, m: np.ndarray, v: np.ndarray, grads: np.ndarray, step: int,
                 config: AdamWConfig, scratch: tuple, *, lr: float | None = None) -> None:
    """One AdamW step (``torch.optim.AdamW`` order) on every row at once, in place.

    ::

        m     = b1 m + (1 - b1) g
        v     = b2 v + (1 - b2) g^2
        theta = theta (1 - lr wd) - a m / (sqrt(v) + e)      (a, e: ``adamw_scalars``)

    which is ``theta (1 - lr wd) - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``
    up to rounding (module docstring). Runs ``kernel_for(KERNEL, values updated so far)``.

    Parameters
    ----------
    params, m, v, grads : C-contiguous ndarrays of one shape and dtype, e.g. (S, P)
        ``params``, ``m`` and ``v`` are overwritten.
    step : int >= 1
        t, the step being taken (all rows share it).
    config : AdamWConfig
    scratch : from ``adamw_scratch(params.size, dtype)``
    lr : float, keyword-only, optional
        This step's learning rate in place of ``config.lr`` (the lr schedule's).
    """
    global _values_updated
    if current_kernel() == "numba":
        adamw_update_numba(params, m, v, grads, step, config, lr=lr)
    else:
        _values_updated += params.size
        adamw_update_numpy(params, m, v, grads, step, config, scratch, lr=lr)


def adamw_update_numpy(params, m, v, grads, step: int, config: AdamWConfig, scratch: tuple, *,
                       lr: float | None = None) -> None:
    """``adamw_update`` as NumPy passes over chunks (the default without the ``fast`` extra)."""
    a, e, decay = adamw_scalars(step, config, lr)
    beta1, beta2 = config.beta1, config.beta2
    flat = [array.reshape(-1) for array in (params, m, v, grads)]  # views: the arrays are contiguous
    p_all, m_all, v_all, g_all = flat
    size = p_all.size
    buffer = scratch[0]
    for start in range(0, size, CHUNK):
        stop = min(start + CHUNK, size)
        p, mc, vc, g, u = p_all[start:stop], m_all[start:stop], v_all[start:stop], g_all[start:stop], \
            buffer[:stop - start]
        mc *= beta1                          # m = b1 m + (1 - b1) g
        mc += np.multiply(g, 1.0 - beta1, out=u)
        np.multiply(g, g, out=u)             # v = b2 v + (1 - b2) g^2
        u *= 1.0 - beta2
        vc *= beta2
        vc += u
        np.sqrt(vc, out=u)                   # a m / (sqrt(v) + e)
        u += e
        np.divide(mc, u, out=u)
        u *= a
        if decay != 1.0:
            p *= decay                       # decay on the pre-step parameters
        p -= u


_NUMBA_KERNEL = None


def _numba_kernel():
    """The compiled loop (built on first use: importing numba costs a few tenths of a second)."""
    global _NUMBA_KERNEL
    if _NUMBA_KERNEL is None:
        @numba_jit  # error_model="numpy": no ZeroDivisionError check, so the loop vectorises
        def kernel(p, m, v, g, beta1, one_minus_beta1, beta2, one_minus_beta2, a, e, decay):
            for i in range(p.shape[0]):
                gi = g[i]
                mi = m[i] * beta1 + gi * one_minus_beta1
                vi = v[i] * beta2 + (gi * gi) * one_minus_beta2
                m[i] = mi
                v[i] = vi
                update = (mi / (np.sqrt(vi) + e)) * a
                p[i] = p[i] * decay - update  # times 1.0 (no decay) is exact, as the NumPy path's skip

        _NUMBA_KERNEL = kernel
    return _NUMBA_KERNEL


def adamw_update_numba(params, m, v, grads, step: int, config: AdamWConfig, scratch: tuple = (), *,
                       lr: float | None = None) -> None:
    """``adamw_update`` as one compiled loop (the ``fast`` extra); the NumPy path's operations in its order.

    Raises
    ------
    ImportError
        numba is not installed (``pip install 'diloco[fast]'``).
    """
    if importlib.util.find_spec("numba") is None:
        raise ImportError("the numba AdamW kernel needs the 'fast' extra: pip install 'diloco[fast]'")
    a, e, decay = adamw_scalars(step, config, lr)
    cast = params.dtype.type  # the scalars in the buffers' dtype, as NumPy uses them with float32 arrays
    flat = [array.reshape(-1) for array in (params, m, v, grads)]
    _numba_kernel()(*flat, cast(config.beta1), cast(1.0 - config.beta1), cast(config.beta2), cast(1.0 - config.beta2),
                    cast(a), cast(e), cast(decay))


def muon_update(params: np.ndarray, m: np.ndarray, v: np.ndarray, grads: np.ndarray, step: int, muon,
                adam: AdamWConfig, layout, matrices: tuple, scratch: tuple, *, adam_lr: float | None = None) -> None:
    """One Muon step (``diloco.methods.muon.muon_step``) on every row of ``(S, P)`` buffers, in place.

    The Muon matrices are views ``(S, fan_in, fan_out)`` of the buffers (``layer_views``),
    stepped by ``muon_matrix_step``, the reference's rule, on the stack at once (one
    batched Newton-Schulz over the S rows) and written back. The other arrays (the
    biases) are gathered into contiguous copies, stepped by ``adamw_update`` with ``adam``
    (``v`` is theirs; its entries of the matrices stay zero) and written back.

    Parameters
    ----------
    params, m, v, grads : C-contiguous ndarrays of shape (S, P)
    step : int >= 1
    muon : MuonConfig (its lr already scheduled)
    adam : AdamWConfig
    layout : FlatLayout of the rows
    matrices : tuple of str, the Muon keys (``muon_keys``)
    scratch : from ``adamw_scratch(params.size, dtype)``
    adam_lr : float, keyword-only, optional
        The biases' scheduled AdamW lr in place of ``adam.lr`` (``adamw_update``'s ``lr``).
    """
    from diloco.engine.flat import layer_views
    from diloco.methods.muon import muon_matrix_step

    p_views, m_views, g_views = (layer_views(a, layout) for a in (params, m, grads))
    for key in matrices:
        p_views[key][...], m_views[key][...] = muon_matrix_step(p_views[key], g_views[key], m_views[key], muon)
    others = [i for i, key in enumerate(layout.keys) if key not in matrices]
    if others:
        idx = np.concatenate([np.arange(layout.offsets[i], layout.offsets[i] + int(np.prod(layout.shapes[i])))
                              for i in others])
        rows = [np.ascontiguousarray(a[:, idx]) for a in (params, m, v, grads)]
        adamw_update(*rows, step, adam, scratch, lr=adam_lr)
        params[:, idx], m[:, idx], v[:, idx] = rows[0], rows[1], rows[2]


def _adamw_flat(config, layout, params, scratch):
    def update(p, slots, grads, step, lr_at):
        adamw_update(p, *slots, grads, step, config.inner, scratch, lr=_scheduled(config, lr_at, config.inner.lr))
    return update


def _scheduled(config, lr_at, peak: float) -> float | None:
    """``lr_at(peak)``, or None (the config's own lr: no config built per step) at a constant lr."""
    return None if config.lr_schedule == "constant" else lr_at(peak)


def _muon_flat(config, layout, params, scratch):
    import dataclasses

    from diloco.methods.muon import muon_keys

    matrices = muon_keys(params, config.muon)

    def update(p, slots, grads, step, lr_at):
        muon = config.muon
        if config.lr_schedule != "constant":  # the matrices' lr on the run's schedule, as the biases' AdamW lr
            muon = dataclasses.replace(muon, lr=lr_at(muon.lr))
        muon_update(p, *slots, grads, step, muon, config.inner, layout, matrices, scratch,
                    adam_lr=_scheduled(config, lr_at, config.inner.lr))
    return update


# The engine's own kernels of registry entries (diloco.core.registry.INNER_OPTIMIZERS): AdamW's folded
# kernel, which agrees with the entry's lifted rule to 1e-10 (tests/tooling/test_inner_optimizers.py), and
# Muon's batched one. Every other entry runs its rule lifted to the rows (diloco.core.inner.lift_flat).
FAST_PATHS = {"adamw": _adamw_flat, "muon": _muon_flat}


def flat_updater(config, layout, params, scratch: tuple):
    """``update(params, slots, grads, step, lr_at)``: ``config.inner_optimizer``'s step on ``(S, P)`` rows, in place.

    ``slots`` are the rows of the optimizer's state buffers (``Optimizer.slots``: AdamW's
    ``m`` and ``v``); ``lr_at(peak)`` is the step's lr on the run's schedule; ``params``
    (one model's dict) tells the factory the arrays' shapes (Muon's matrices).
    """
    factory = FAST_PATHS.get(config.inner_optimizer) or inner_optimizer(config).flat
    return factory(config, layout, params, scratch)
