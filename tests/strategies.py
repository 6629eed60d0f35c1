"""Shared Hypothesis strategies: parameter dicts, data sets, hyper-parameters."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import DTYPES

dtypes = st.sampled_from(DTYPES)


def finite_floats(dtype=np.float64, magnitude=10.0):
    width = 32 if np.dtype(dtype) == np.float32 else 64
    return st.floats(-magnitude, magnitude, allow_nan=False, allow_infinity=False, width=width)


SMALL_SHAPES = hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5)


def arrays(dtype=np.float64, shape=SMALL_SHAPES, magnitude=10.0):
    return hnp.arrays(dtype, shape, elements=finite_floats(dtype, magnitude))


@st.composite
def layer_sizes(draw, min_layers=1, max_layers=3, max_width=6):
    """``(d_in, h_1, ..., C)`` with 1..3 affine layers and C >= 2."""
    num_layers = draw(st.integers(min_layers, max_layers))
    sizes = [draw(st.integers(1, max_width)) for _ in range(num_layers)]
    return tuple(sizes) + (draw(st.integers(2, max_width)),)


@st.composite
def mlp_params(draw, sizes=None, dtype=None, magnitude=2.0):
    """A random MLP parameter dict ``W1, b1, ..., WL, bL``."""
    sizes = draw(layer_sizes()) if sizes is None else sizes
    dtype = draw(dtypes) if dtype is None else dtype
    params = {}
    for layer, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True), start=1):
        params[f"W{layer}"] = draw(arrays(dtype, (fan_in, fan_out), magnitude))
        params[f"b{layer}"] = draw(arrays(dtype, (fan_out,), magnitude))
    return params


@st.composite
def param_dicts(draw, dtype=None, magnitude=10.0):
    """A generic parameter dict (any keys, 1..3 arrays of small shapes)."""
    dtype = draw(dtypes) if dtype is None else dtype
    num = draw(st.integers(1, 3))
    shapes = [draw(hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=4)) for _ in range(num)]
    return {f"p{i}": draw(arrays(dtype, shape, magnitude)) for i, shape in enumerate(shapes)}


@st.composite
def arrays_like(draw, params, magnitude=10.0, nonneg=False):
    """A dict with ``params``' keys, shapes and dtypes and new finite values (``>= 0`` if ``nonneg``)."""
    drawn = {k: draw(arrays(v.dtype.type, v.shape, magnitude)) for k, v in params.items()}
    return {k: np.abs(a) for k, a in drawn.items()} if nonneg else drawn


@st.composite
def param_dict_family(draw, count=None, dtype=None, magnitude=10.0):
    """``count`` dicts (2..5 by default) sharing keys, shapes and dtype."""
    first = draw(param_dicts(dtype=dtype, magnitude=magnitude))
    count = draw(st.integers(2, 5)) if count is None else count
    return [first] + [draw(arrays_like(first, magnitude)) for _ in range(count - 1)]


@st.composite
def labelled_data(draw, min_n=1, max_n=40, max_d=4, max_classes=5, dtype=np.float64):
    """``(x (n, d), y (n,))`` with integer labels in [0, C)."""
    n = draw(st.integers(min_n, max_n))
    d = draw(st.integers(1, max_d))
    num_classes = draw(st.integers(1, max_classes))
    x = draw(arrays(dtype, (n, d), 5.0))
    y = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, num_classes - 1)))
    return x, y


def seeds():
    return st.integers(0, 2**32 - 1)


def generators():
    return seeds().map(np.random.default_rng)


betas = st.floats(0.0, 0.999, allow_nan=False)
learning_rates = st.floats(1e-5, 1.0, allow_nan=False)
momenta = st.floats(0.0, 0.99, allow_nan=False)


# --- Part 6-7 strategies ---


@st.composite
def mlp_and_batch(draw, dtype=None, min_n=1, max_n=12, magnitude=2.0):
    """``(params, x (n, d_in), y (n,))``: a random MLP and a batch it can score, labels in [0, C)."""
    sizes = draw(layer_sizes())
    dtype = draw(dtypes) if dtype is None else dtype
    params = draw(mlp_params(sizes=sizes, dtype=dtype, magnitude=magnitude))
    n = draw(st.integers(min_n, max_n))
    x = draw(arrays(dtype, (n, sizes[0]), 5.0))
    y = draw(hnp.arrays(np.int64, (n,), elements=st.integers(0, sizes[-1] - 1)))
    return params, x, y
