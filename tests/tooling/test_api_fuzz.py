"""Property-based bad inputs over the public API beyond the milestones.

``test_bad_inputs.py`` drives its catalogue through the 30 milestones; this campaign
covers every other public function of ``diloco.core``, ``diloco.core.mechanisms``,
``diloco.text``, ``diloco.data`` and ``diloco.engine``, plus the state counters of the
milestones' optimizer states. For every function and every argument, Hypothesis draws
values of the wrong type, the wrong dtype, the wrong shape, empty, non-finite, out of
range and absurdly large (``10**400``) while the other arguments stay valid. Each call
must end in one of:

* ``clear``: a ``TypeError`` or ``ValueError`` whose message names the argument (and
  is at most a few hundred characters: a value is never echoed back whole);
* a documented IEEE result (listed in ``IEEE`` with the docstring's words).

Anything else is a finding: ``silent`` (the call returned), ``unclear`` (another
exception, or a message that does not name the argument) or ``hang`` (no answer within
``HANG_SECONDS``, measured with a real-time alarm). ``TALLY`` counts every case;
``DILOCO_FUZZ_REPORT=1`` prints the counts at the end of the module.
"""

from __future__ import annotations

import collections
import math
import os
import signal

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import diloco
from diloco.config import DiLoCoConfig
from diloco.core.comm import native_bytes
from diloco.core.mechanisms import clip_by_global_norm, draw_dropped, global_norm, inner_lr, mean_pairwise_cosine
from diloco.core.netsim import all_reduce_seconds, parse_bandwidth, parse_duration
from diloco.core.quantize import (
    bfloat16_bits,
    bfloat16_values,
    decode,
    encode,
    quantize,
    sign_prune_mask,
    unit_bounds,
)
from diloco.core.schedule import fragment_keys, fragment_layers, sync_offsets, sync_steps
from diloco.core.sync import eager_outer_gradient
from diloco.data import make_synthetic, stratified_split
from diloco.engine import choose_layout
from diloco.text import bits_per_char, char_windows, perplexity

HANG_SECONDS = 5.0
MAX_MESSAGE = 600  # characters: a value is echoed back cut to 200
TALLY: collections.Counter = collections.Counter()


def _params():
    return {"W1": np.linspace(-1, 1, 12).reshape(3, 4), "b1": np.zeros(4), "W2": np.ones((4, 2)), "b2": np.zeros(2)}


def _config(**changes):
    return DiLoCoConfig(num_workers=2, inner_steps=3, rounds=2, hidden_sizes=(4,), **changes)


# --- bad values, by the kind of argument -----------------------------------------------------------

NOT_A_THING = st.sampled_from([None, "text", b"x", object(), 1 + 2j, [1, 2], {"a": 1}])
HUGE = st.sampled_from([10**400, 2**64, -(10**400)])


def _bad_arrays(ndim: int):
    good_shape = (4,) * ndim
    wrong_dtype = st.sampled_from([np.int64, np.int8, np.bool_, np.complex128, np.float16, object, np.str_]).map(
        lambda dtype: np.ones(good_shape).astype(dtype))
    wrong_rank = st.sampled_from([d for d in (0, 1, 2, 3) if d != ndim]).map(lambda d: np.ones((2,) * d))
    empty = st.just(np.ones((0,) * ndim))
    non_finite = st.tuples(st.integers(0, 4**ndim - 1), st.sampled_from([math.nan, math.inf, -math.inf])).map(
        lambda spec: np.put(a := np.ones(good_shape), spec[0], spec[1]) or a)
    return st.one_of(NOT_A_THING, wrong_dtype, wrong_rank, empty, non_finite, st.just(np.ones(good_shape).tolist()))


BAD = {
    "count": st.one_of(NOT_A_THING, st.integers(max_value=0), HUGE, st.floats(), st.just(True), st.just(2.0)),
    "nonneg": st.one_of(NOT_A_THING, st.integers(max_value=-1), HUGE, st.floats(), st.just(True), st.just(2.0)),
    "fraction": st.one_of(NOT_A_THING, st.floats().filter(lambda v: not 0 <= v < 1), st.just(True)),
    "positive": st.one_of(NOT_A_THING, st.floats(max_value=0.0), st.just(math.nan), st.just(math.inf), st.just(True)),
    "positive_or_none": st.one_of(NOT_A_THING.filter(lambda v: v is not None), st.floats(max_value=0.0),
                                  st.just(math.nan), st.just(math.inf), st.just(True)),
    "nonneg_real": st.one_of(NOT_A_THING, st.floats(max_value=-1e-300), st.just(math.nan), st.just(math.inf),
                             st.just(True)),
    "array1": _bad_arrays(1),
    "tensor": _bad_arrays(1).filter(lambda v: not (isinstance(v, np.ndarray) and v.ndim != 1)),  # any shape is one
    "array2": _bad_arrays(2),
    "ids": st.one_of(NOT_A_THING, st.just(np.ones(8)), st.just(-np.ones(8, dtype=np.int64)),
                     st.just(np.ones((2, 4), dtype=np.int64)), st.just(np.ones(0, dtype=np.int64))),
    "labels": st.one_of(NOT_A_THING, st.just(np.ones(12)), st.just(-np.ones(12, dtype=np.int64)),
                        st.just(np.zeros(5, dtype=np.int64)), st.just(np.zeros((12, 1), dtype=np.int64))),
    "params": st.one_of(NOT_A_THING, st.just({}), st.just({"W1": np.array([math.nan])}),
                        st.just({"W1": [1.0, 2.0]}), st.just({"W1": np.ones(3, dtype=np.int64)}),
                        st.just({1: np.ones(3)})),
    "params_list": st.one_of(NOT_A_THING, st.just([{"W1": np.array([math.nan])}]), st.just([1, 2]),
                             st.just([{"x": np.ones(2)}, {"x": np.ones(2)}])),
    "junk_text": st.one_of(NOT_A_THING.filter(lambda v: not isinstance(v, str)), st.text(
        alphabet="abcxyz!?-+ /", min_size=0, max_size=12), st.just("x" * 100_000)),
    "choice": st.one_of(st.sampled_from([None, 3, b"int8", "INT8 ", ""]), st.text(alphabet="qwz", max_size=6),
                        st.just("y" * 100_000)),
    "rng": st.sampled_from([None, 0, "rng", np.random.RandomState(0), object()]),
    "config": st.one_of(NOT_A_THING, st.just({"num_workers": 2})),
    "dtype": st.sampled_from([None, "float16", np.int32, "complex128", object, "nonsense"]),
    "encoded": NOT_A_THING,
    "state_step": st.one_of(HUGE.filter(lambda v: v > 0), st.integers(max_value=-1), st.floats(), st.just(True)),
}

# --- the public functions: a valid call, and the kind of each argument ---------------------------

_X = np.linspace(-1.0, 1.0, 16)


def _adamw_state(step=3):
    params = _params()
    state = diloco.init_adamw_state(params)
    return state._replace(step=step, v={k: np.ones_like(v) for k, v in state.v.items()})


TARGETS = {
    # diloco.core.quantize
    "encode": (encode, lambda: {"x": _X, "fmt": "int8", "block_size": 4}, {"x": "tensor", "fmt": "choice",
                                                                          "block_size": "nonneg"}),
    "quantize": (quantize, lambda: {"x": _X, "fmt": "fp4", "block_size": 4}, {"x": "tensor", "fmt": "choice",
                                                                             "block_size": "nonneg"}),
    "decode": (decode, lambda: {"encoded": encode(_X, "int8"), "dtype": np.float64}, {"encoded": "encoded",
                                                                                     "dtype": "dtype"}),
    "bfloat16_bits": (bfloat16_bits, lambda: {"x": _X.astype(np.float32)}, {"x": "tensor"}),
    "bfloat16_values": (bfloat16_values, lambda: {"codes": bfloat16_bits(_X.astype(np.float32))},
                        {"codes": "encoded"}),
    "sign_prune_mask": (sign_prune_mask, lambda: {"x": _X, "fraction": 0.5}, {"x": "tensor",
                                                                              "fraction": "fraction"}),
    "unit_bounds": (unit_bounds, lambda: {"size": 10, "unit": 4}, {"size": "nonneg", "unit": "count"}),
    # diloco.core.netsim, comm
    "parse_bandwidth": (parse_bandwidth, lambda: {"text": "1Gbit"}, {"text": "junk_text"}),
    "parse_duration": (parse_duration, lambda: {"text": "50ms"}, {"text": "junk_text"}),
    "all_reduce_seconds": (all_reduce_seconds, lambda: {"bytes_sent": 1e6, "num_workers": 4, "bandwidth": 1e9,
                                                        "latency": 0.01},
                           {"bytes_sent": "nonneg_real", "num_workers": "count", "bandwidth": "positive",
                            "latency": "nonneg_real"}),
    "native_bytes": (native_bytes, lambda: {"num_values": 100, "num_workers": 4, "itemsize": 8},
                     {"num_values": "nonneg", "num_workers": "count", "itemsize": "count"}),
    # diloco.core.schedule (streaming), sync (eager)
    "fragment_layers": (fragment_layers, lambda: {"num_layers": 4, "fragments": 2, "pattern": "strided"},
                        {"num_layers": "count", "fragments": "count", "pattern": "choice"}),
    "fragment_keys": (fragment_keys, lambda: {"params": _params(), "fragments": 2, "pattern": "strided"},
                      {"params": "params", "fragments": "count", "pattern": "choice"}),
    "sync_offsets": (sync_offsets, lambda: {"fragments": 2, "inner_steps": 6}, {"fragments": "count",
                                                                              "inner_steps": "count"}),
    "sync_steps": (sync_steps, lambda: {"fragment": 0, "fragments": 2, "inner_steps": 6, "total_steps": 24},
                   {"fragment": "nonneg", "fragments": "count", "inner_steps": "count", "total_steps": "nonneg"}),
    "eager_outer_gradient": (eager_outer_gradient, lambda: {"local_now": _params(), "local_previous": _params(),
                                                            "global_previous": _params(), "share": 0.5},
                             {"local_now": "params", "share": "fraction"}),
    # diloco.core.mechanisms
    "global_norm": (global_norm, lambda: {"params": _params()}, {"params": "params"}),
    "clip_by_global_norm": (clip_by_global_norm, lambda: {"grads": _params(), "max_norm": 1.0},
                            {"grads": "params", "max_norm": "positive_or_none"}),
    "inner_lr": (inner_lr, lambda: {"config": _config(), "step": 2}, {"config": "config", "step": "nonneg"}),
    "draw_dropped": (draw_dropped, lambda: {"rng": np.random.default_rng(0), "config": _config(drop_prob=0.5)},
                     {"rng": "rng", "config": "config"}),
    "mean_pairwise_cosine": (mean_pairwise_cosine, lambda: {"global_params": _params(),
                                                            "worker_params_list": [_params(), _params()]},
                             {"global_params": "params", "worker_params_list": "params_list"}),
    # diloco.text
    "char_windows": (char_windows, lambda: {"ids": np.arange(20) % 5, "context": 3}, {"ids": "ids",
                                                                                    "context": "count"}),
    "perplexity": (perplexity, lambda: {"mean_cross_entropy": 1.5}, {"mean_cross_entropy": "nonneg_real"}),
    "bits_per_char": (bits_per_char, lambda: {"mean_cross_entropy": 1.5}, {"mean_cross_entropy": "nonneg_real"}),
    # diloco.data
    "make_synthetic": (make_synthetic, lambda: {"num_examples": 20, "num_features": 3, "num_classes": 2,
                                                "rng": np.random.default_rng(0), "separation": 3.0},
                       {"num_examples": "count", "num_features": "count", "num_classes": "count", "rng": "rng",
                        "separation": "nonneg_real"}),
    "stratified_split": (stratified_split, lambda: {"x": np.ones((12, 2)), "y": np.arange(12) % 2,
                                                    "test_fraction": 0.25, "rng": np.random.default_rng(0)},
                         {"x": "array2", "y": "labels", "test_fraction": "fraction", "rng": "rng"}),
    # diloco.engine
    "choose_layout": (choose_layout, lambda: {"num_workers": 2, "num_values": 100, "layout": "auto", "itemsize": 8},
                      {"num_workers": "count", "num_values": "count", "layout": "choice", "itemsize": "count"}),
    # the milestones' optimizer state counters (bias correction raises beta to the step)
    "bias_correct_moments": (lambda state, beta1, beta2: diloco.bias_correct_moments(state, beta1, beta2),
                             lambda: {"state": _adamw_state(), "beta1": 0.9, "beta2": 0.999},
                             {"state": "state_step"}),
}

def _is_nan(result) -> bool:
    return isinstance(result, float) and math.isnan(result)


def _empty_in_empty_out(value, result) -> bool:
    arrays = [r for r in (result if isinstance(result, tuple) else (result,)) if isinstance(r, np.ndarray)]
    return isinstance(value, np.ndarray) and value.size == 0 and value.dtype.kind == "f" and (
        not arrays or all(a.size <= 1 for a in arrays))


# Documented results (docs/failure-and-recovery.md, "The bad-input campaign"): IEEE propagation of
# NaN and Inf by the scalar maps of a loss, and a zero-size tensor, which encodes to nothing.
IEEE = {
    ("perplexity", "mean_cross_entropy"): lambda v, r: (math.isnan(v) and _is_nan(r)) or (v == math.inf == r),
    ("bits_per_char", "mean_cross_entropy"): lambda v, r: (math.isnan(v) and _is_nan(r)) or (v == math.inf == r),
    ("global_norm", "params"): lambda v, r: _is_nan(r) or r == math.inf,
    # bfloat16 has Inf and NaN codes: a non-finite float maps to its code (docstring: saturated otherwise)
    ("bfloat16_bits", "x"): lambda v, r: _empty_in_empty_out(v, r) or (
        isinstance(v, np.ndarray) and v.dtype.kind == "f" and not np.all(np.isfinite(v)) and r.dtype == np.uint16),
    **{(target, "x"): _empty_in_empty_out for target in ("encode", "quantize", "sign_prune_mask")},
}

# Words a message may use for an argument, besides its name.
ALIASES = {("bias_correct_moments", "state"): ("state.step",), ("parse_bandwidth", "text"): ("bandwidth",),
           ("parse_duration", "text"): ("duration",)}

CASES = [pytest.param(target, argument, id=f"{target}-{argument}")
         for target, (_, _, kinds) in TARGETS.items() for argument in kinds]


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang


def _verdict(target: str, argument: str, value) -> tuple[str, str]:
    function, good, _ = TARGETS[target]
    kwargs = good()
    if argument == "state" and target == "bias_correct_moments":
        kwargs["state"] = kwargs["state"]._replace(step=value)
    else:
        kwargs[argument] = value
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
    try:
        result = function(**kwargs)
    except Hang:
        return "hang", f"no answer within {HANG_SECONDS} s"
    except (TypeError, ValueError) as exc:
        message = str(exc)
        names = (argument, argument.replace("_", " "), *ALIASES.get((target, argument), ()))
        if not any(name in message for name in names):
            return "unclear", f"{type(exc).__name__} not naming {argument}: {message[:300]}"
        if len(message) > MAX_MESSAGE:
            return "unclear", f"a message of {len(message):,} characters"
        return "clear", ""
    except Exception as exc:  # noqa: BLE001 - any other exception is the finding
        return "unclear", f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    check = IEEE.get((target, argument))
    try:
        documented = check is not None and bool(check(value, result))
    except (TypeError, ValueError):  # a value the documented result is not about
        documented = False
    if documented:
        return "ieee", ""
    return "silent", f"returned {type(result).__name__}"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:80] + "..."


@pytest.mark.parametrize("target, argument", CASES)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True,
          phases=[Phase.explicit, Phase.generate])  # no shrinking: a finding is reported as drawn, fast
@given(data=st.data())
def test_a_bad_argument_is_refused_naming_it(target, argument, data):
    kind = TARGETS[target][2][argument]
    value = data.draw(BAD[kind], label=argument)
    verdict, detail = _verdict(target, argument, value)
    TALLY[verdict] += 1
    assert verdict in ("clear", "ieee"), f"{target}({argument}={_short(value)}): {verdict}: {detail}"


def test_the_valid_calls_work():
    """The calls the campaign starts from are valid: a refusal is the bad value's doing."""
    for function, good, _ in TARGETS.values():
        function(**good())


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if os.environ.get("DILOCO_FUZZ_REPORT"):
        print(f"\napi fuzz: {sum(TALLY.values())} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(TALLY.items())))


# --- edge inputs near the float64 limit (issue 31): each a clear refusal naming the argument, a
# documented result, or, for the legal ones, the right answer. Listed by hand: they are single
# values a random draw would rarely hit. ---------------------------------------------------------

_P = _params()
_M = float(np.finfo(np.float64).max)
_RANDOM_P = diloco.init_model_params((3, 4, 2), np.random.default_rng(0))
_ROWS = np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]])


def _cache_with(part: str, dtype):
    _, cache = diloco.model_forward(_P, np.ones((3, 3)))
    arrays = list(getattr(cache, part))
    arrays[-1 if part == "pre_activations" else 0] = arrays[-1 if part == "pre_activations" else 0].astype(dtype)
    return cache._replace(**{part: tuple(arrays)})


# (name, call, argument it must name) for the refusals.
EDGE_REFUSED = [
    ("model_backward: an int array as the logits in a cache",
     lambda: diloco.model_backward(_P, _cache_with("pre_activations", np.int64), np.array([0, 1, 0])), "cache"),
    ("model_backward: int inputs in a cache",
     lambda: diloco.model_backward(_P, _cache_with("layer_inputs", np.int64), np.array([0, 1, 0])), "cache"),
    ("DiLoCoConfig: seed = 2**64", lambda: DiLoCoConfig(seed=2**64), "seed"),
    ("load_digits_split: seed = 2**64", lambda: diloco.data.load_digits_split(seed=2**64), "seed"),
    ("nesterov_param_update: a NumPy bool as lr",
     lambda: diloco.nesterov_param_update(_P, _P, diloco.init_outer_optimizer(_P), np.bool_(True), 0.9), "lr"),
    ("AdamWConfig: a NumPy bool as lr", lambda: diloco.AdamWConfig(lr=np.bool_(True)), "lr"),
    ("nesterov_param_update: a NumPy bool as momentum",
     lambda: diloco.nesterov_param_update(_P, _P, diloco.init_outer_optimizer(_P), 0.7, np.bool_(True)), "momentum"),
    ("update_outer_momentum: a NumPy bool as momentum",
     lambda: diloco.update_outer_momentum(diloco.init_outer_optimizer(_P), _P, np.bool_(True)), "momentum"),
    ("nesterov_param_update: lr = 1e308 overflowing the params",
     lambda: diloco.nesterov_param_update(_P, {k: 2 * v for k, v in _P.items()}, diloco.init_outer_optimizer(_P),
                                          1e308, 0.9), "lr"),
    ("cross_entropy_loss: one row's loss above the float range",
     lambda: diloco.cross_entropy_loss(np.array([[_M, -_M]]), np.array([1])), "logits"),
    ("scale_params: params x 1e308 overflowing", lambda: diloco.scale_params({"W1": np.full(2, 10.0)}, 1e308),
     "scalar"),
]


def _row_sums_to_one(result):
    return result.dtype == np.float16 and np.allclose(result.astype(np.float64).sum(axis=-1), 1.0, atol=1e-3)


# (name, call, check of the result) for the legal ones and the documented results.
EDGE_ACCEPTED = [
    ("softmax of float16", lambda: diloco.softmax(np.array([[1, 2, 3], [6e4, -6e4, 0]], dtype=np.float16)),
     _row_sums_to_one),
    ("cross_entropy_loss: a batch whose sum of losses overflows, its mean within range",
     lambda: diloco.cross_entropy_loss(np.array([[1e308, -5e307], [1e308, -5e307]]), np.array([1, 1])),
     lambda r: r == 1.5e308),
    ("cross_entropy_loss: logits at +-max, the right class the largest",
     lambda: diloco.cross_entropy_loss(np.array([[_M, -_M], [-_M, _M]]), np.array([0, 1])), lambda r: r == 0.0),
    ("subtract_params: keys in another order",
     lambda: diloco.subtract_params(_P, {k: 2 * _P[k] for k in reversed(list(_P))}),
     lambda r: list(r) == list(_P) and all(np.array_equal(r[k], -_P[k]) for k in _P)),
    ("average_params: weights [1e308, 1e308] overflowing their sum",
     lambda: diloco.average_params([_P, _P], [1e308, 1e308]),
     lambda r: all(np.array_equal(r[k], _P[k]) for k in _P)),
    ("quantize: x of 1e300 saturates at fp4's largest value, as documented",  # 6 x 2**127
     lambda: quantize(np.array([1e300, -1e300, 0.0]), "fp4"), lambda r: r.tolist() == [6 * 2.0**127, -6 * 2.0**127, 0]),
    ("quantize: x of 1e300 saturates at float32's largest value, as documented",
     lambda: quantize(np.array([1e300]), "float32"), lambda r: r[0] == np.finfo(np.float32).max),
    ("adam_param_step: lr = 1e308 with a unit step", lambda: diloco.adam_param_step(
        {"W1": np.zeros(2)}, {"W1": np.ones(2)}, {"W1": np.ones(2)}, 1e308, 1e-300), lambda r: r["W1"][0] == -1e308),
    ("nesterov_param_update: lr = 1e308 whose step fits", lambda: diloco.nesterov_param_update(
        {"W1": np.ones(2)}, {"W1": np.ones(2)}, diloco.init_outer_optimizer({"W1": np.ones(2)}), 1e308, 0.9),
     lambda r: r["W1"][0] == 1 - 1e308),
    ("average_params: weights [max, max] of float64", lambda: diloco.average_params([_P, _P], [_M, _M]),
     lambda r: all(np.array_equal(r[k], _P[k]) for k in _P)),
    # evaluate_loss's docstring: features of 1e300 give the model's true, finite loss of order 1e299 (the
    # MLP is positively homogeneous once the biases are negligible: 1e100 times the loss at 1e200)
    ("evaluate_loss: x of 1e300, the true loss of order 1e299", lambda: (
        diloco.evaluate_loss(_RANDOM_P, _ROWS * 1e300, np.array([0, 1])),
        diloco.evaluate_loss(_RANDOM_P, _ROWS * 1e200, np.array([0, 1]))),
     lambda r: math.isfinite(r[0]) and r[0] > 1e298 and r[0] == pytest.approx(1e100 * r[1], rel=1e-12)),
    # cross_entropy_loss's docstring: a loss below the spacing of the logits' size rounds away
    ("cross_entropy_loss: two equal logits of 1e200 round log 2 away, as documented",
     lambda: (diloco.cross_entropy_loss(np.array([[1e200, 1e200]]), np.array([0])),
              diloco.cross_entropy_loss(np.array([[0.0, 0.0]]), np.array([0]))),
     lambda r: r == (0.0, math.log(2))),
    ("relu: inf, -inf and nan pass through as IEEE max gives them, as documented",
     lambda: diloco.relu(np.array([np.inf, -np.inf, np.nan, -0.0])),
     lambda r: r[0] == np.inf and r[1] == 0 and np.isnan(r[2]) and r[3] == 0),
]


@pytest.mark.parametrize("name, call, argument", EDGE_REFUSED, ids=[e[0] for e in EDGE_REFUSED])
def test_an_edge_input_is_refused_naming_its_argument(name, call, argument):
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    assert argument in str(caught.value) and len(str(caught.value)) <= MAX_MESSAGE, str(caught.value)
    TALLY["clear"] += 1


@pytest.mark.parametrize("name, call, check", EDGE_ACCEPTED, ids=[e[0] for e in EDGE_ACCEPTED])
def test_a_legal_edge_input_gives_the_right_answer(name, call, check):
    with np.errstate(over="ignore"):  # float16's exp of -inf, an overflow the result does not keep
        result = call()
    assert check(result), result
    TALLY["legal"] += 1
