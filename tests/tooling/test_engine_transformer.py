"""The fast engine's transformer step (diloco.engine.transformer_step) and its compiled kernels.

Checked against things it does not compute itself: the reference model's loss and gradient
(``diloco.models.transformer``, pure NumPy, no code shared with the kernels) in float64 to
1e-10 and in float32 to float32 rounding, central finite differences of its own loss in
float64, NumPy's ``exp`` for the kernels' float32 ``exp32``, the overflow fallback of the
softmax, the worker-stack's mean over groups, and the absence of allocation per step.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

pytest.importorskip("numba")

from diloco.engine import transformer_kernels as tk  # noqa: E402
from diloco.engine.flat import flat_layout, layer_views  # noqa: E402
from diloco.engine.model_stack import ModelStack  # noqa: E402
from diloco.engine.transformer_step import TransformerStep  # noqa: E402
from diloco.models.seam import TransformerModel  # noqa: E402
from diloco.models.transformer import (  # noqa: E402
    TransformerConfig,
    init_transformer_params,
    sequence_targets,
    transformer_loss_and_grads,
)

SMALL = {"vocab_size": 11, "context": 20, "d_model": 8, "n_heads": 2, "n_layers": 2, "mlp_ratio": 2}


def _problem(seed=0, batch=3, length=20, noise=0.3, **fields):
    """A config, params moved off their initialisation (so LayerNorm gains and biases matter), tokens, targets."""
    cfg = TransformerConfig(**{**SMALL, **fields})
    rng = np.random.default_rng(seed)
    params = {key: (value + noise * rng.standard_normal(value.shape)).astype(cfg.dtype)
              for key, value in init_transformer_params(rng, cfg).items()}
    tokens, targets = rng.integers(0, cfg.vocab_size, (2, batch, length))
    return cfg, params, tokens, targets


def _step(cfg, params, tokens, targets, step=None):
    step = TransformerStep(cfg) if step is None else step
    grads = {key: np.full_like(value, np.nan) for key, value in params.items()}  # every value must be written
    return step.loss_and_grads(params, tokens, targets, grads), grads


@pytest.mark.parametrize("fields", [{}, {"tied": False}, {"n_layers": 1, "n_heads": 1}, {"context": 7}])
def test_equals_reference_in_float64(fields):
    length = min(fields.get("context", 20), 20)
    cfg, params, tokens, targets = _problem(length=length, dtype="float64", **fields)
    want_loss, want = transformer_loss_and_grads(params, tokens, targets, cfg)
    loss, grads = _step(cfg, params, tokens, targets)
    assert loss == pytest.approx(want_loss, rel=1e-12)
    assert list(grads) == list(want)
    for key in want:
        np.testing.assert_allclose(grads[key], want[key], rtol=0, atol=1e-10 * np.abs(want[key]).max(), err_msg=key)


def test_float32_within_rounding_of_float64():
    cfg64, params, tokens, targets = _problem(seed=3, dtype="float64", d_model=16, n_heads=4)
    want_loss, want = transformer_loss_and_grads(params, tokens, targets, cfg64)
    cfg32 = TransformerConfig(**{**SMALL, "d_model": 16, "n_heads": 4, "dtype": "float32"})
    loss, grads = _step(cfg32, {k: v.astype(np.float32) for k, v in params.items()}, tokens, targets)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for key in want:
        assert grads[key].dtype == np.float32
        np.testing.assert_allclose(grads[key], want[key], rtol=0, atol=2e-5 * np.abs(want[key]).max(), err_msg=key)


def test_gradient_matches_finite_differences():
    cfg, params, tokens, targets = _problem(seed=5, batch=2, length=6, dtype="float64", context=6)
    step = TransformerStep(cfg)
    _, grads = _step(cfg, params, tokens, targets, step)
    rng, h = np.random.default_rng(0), 1e-6
    for key, value in params.items():
        for index in [tuple(rng.integers(0, n) for n in value.shape) for _ in range(2)]:
            saved = value[index]
            value[index] = saved + h
            up = step.loss(params, tokens, targets)
            value[index] = saved - h
            down = step.loss(params, tokens, targets)
            value[index] = saved
            assert grads[key][index] == pytest.approx((up - down) / (2 * h), rel=1e-5, abs=1e-9), (key, index)


def test_buffers_follow_the_batch_shape():
    """One step object, batches of two shapes in turn: each answer is the reference's."""
    cfg, params, tokens, targets = _problem(dtype="float64")
    step = TransformerStep(cfg)
    for batch, length in ((3, 20), (2, 9), (3, 20)):
        loss, _ = _step(cfg, params, tokens[:batch, :length], targets[:batch, :length], step)
        want, _ = transformer_loss_and_grads(params, tokens[:batch, :length], targets[:batch, :length], cfg)
        assert loss == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_softmax_falls_back_to_the_row_maximum(dtype):
    """A query whose score for an earlier key lies far above its own diagonal (exp overflows when shifted
    by the diagonal) still gives the reference's loss and gradient, finite."""
    cfg, params, tokens, targets = _problem(seed=2, dtype=dtype, n_layers=1, n_heads=1)
    params["h0.attn.qkv"][:, :16] *= 60.0  # q and k scaled: scores of hundreds of nats
    want_loss, want = transformer_loss_and_grads(params, tokens, targets, cfg)
    loss, grads = _step(cfg, params, tokens, targets)
    assert np.isfinite(loss) and loss == pytest.approx(want_loss, rel=1e-5)
    for key in want:
        assert np.all(np.isfinite(grads[key])), key
        np.testing.assert_allclose(grads[key], want[key], rtol=0, atol=1e-4 * np.abs(want[key]).max(), err_msg=key)


def test_exp32_within_two_ulp_of_numpy():
    import numba

    tk.kernels()  # registers fast_exp's compiled form

    @numba.njit
    def kernel(x, out):
        for i in range(x.size):
            out[i] = tk.fast_exp(x[i])

    x = np.concatenate([np.linspace(-86.5, 88.7, 200_001), [0.0, -0.0, 1e-30, -1e-30]]).astype(np.float32)
    out = np.empty_like(x)
    kernel(x, out)
    want = np.exp(x)
    assert np.all(np.abs(out - want) <= 2 * np.spacing(want)), np.max(np.abs(out - want) / np.spacing(want))
    special = np.array([np.inf, -np.inf, np.nan, 100.0, -100.0, 88.8], dtype=np.float32)
    got = np.empty_like(special)
    kernel(special, got)
    np.testing.assert_array_equal(got, [np.inf, 0.0, np.nan, np.inf, 0.0, np.inf])


def test_model_stack_means_its_groups():
    """The sync baseline's stack: G groups of b windows, the gradient their mean, as the reference path's."""
    cfg, params, tokens, targets = _problem(seed=4, batch=6, dtype="float64")
    model = TransformerModel(cfg)
    layout = flat_layout(params)
    stack = ModelStack(model, layout, 1, 2, 3, np.float64)
    assert stack.step is not None
    for key, view in layer_views(stack.params[0], layout).items():
        view[...] = params[key]
    windows, next_tokens = tokens.astype(np.float32), targets[:, -1]
    stack.x[0], stack.labels[0] = windows, next_tokens
    losses = stack.loss_and_grads()
    want = [model.loss_and_grads(params, windows[g * 3:(g + 1) * 3], next_tokens[g * 3:(g + 1) * 3]) for g in (0, 1)]
    np.testing.assert_allclose(losses[0], [loss for loss, _ in want], rtol=1e-12)
    for key, view in layer_views(stack.grads[0], layout).items():
        mean = (want[0][1][key] + want[1][1][key]) / 2
        np.testing.assert_allclose(view, mean, rtol=0, atol=1e-10 * np.abs(mean).max(), err_msg=key)


def test_model_stack_rejects_ids_outside_the_vocabulary():
    cfg, params, tokens, _ = _problem(dtype="float64")
    stack = ModelStack(TransformerModel(cfg), flat_layout(params), 1, 1, 3, np.float64)
    stack.x[0] = tokens.astype(np.float32)
    stack.x[0, 1, 4] = cfg.vocab_size
    with pytest.raises(ValueError, match="whole-number ids"):
        stack.loss_and_grads()


def test_a_step_allocates_nothing_of_its_size():
    """After the first step of a shape, a step allocates no array (only Python objects: views): NumPy's
    allocations are traced by tracemalloc, and the reference path's step of the same shape allocates megabytes."""
    cfg, params, tokens, targets = _problem(batch=16, length=20, dtype="float32", d_model=32, n_heads=4)
    step = TransformerStep(cfg)
    grads = {key: np.empty_like(value) for key, value in params.items()}
    step.loss_and_grads(params, tokens, targets, grads)
    peaks = []
    for run in (lambda: step.loss_and_grads(params, tokens, targets, grads),
                lambda: transformer_loss_and_grads(params, tokens, targets, cfg)):
        tracemalloc.start()
        run()
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[0] < 100_000 < 1_000_000 < peaks[1], peaks  # Python objects only (views, calls): about 34 kB


def test_sequence_targets_of_the_stack_are_the_models():
    cfg, params, tokens, targets = _problem(dtype="float64")
    stack = ModelStack(TransformerModel(cfg), flat_layout(params), 1, 1, 3, np.float64)
    windows, next_tokens = tokens.astype(np.float32), targets[:, -1]
    stack._tokens(windows, next_tokens)
    want_tokens, want_targets = sequence_targets(windows, next_tokens)
    np.testing.assert_array_equal(stack.tokens, want_tokens)
    np.testing.assert_array_equal(stack.targets, want_targets)


def test_the_step_moves_auto_adamw_to_its_compiled_loop(monkeypatch):
    """numba is loaded for the step, so "auto" AdamW takes its compiled loop (equal to the last bit) at once."""
    from diloco.engine import optim

    monkeypatch.setattr(optim, "KERNEL", "auto")
    monkeypatch.setattr(optim, "_values_updated", 0)
    assert optim.current_kernel() == "numpy"
    TransformerStep(TransformerConfig(**SMALL))
    assert optim.current_kernel() == "numba"


def test_no_step_where_the_kernels_are_refused(monkeypatch):
    """``DILOCO_ADAMW_KERNEL=numpy`` (optim.KERNEL) keeps the model's own loss_and_grads."""
    from diloco.engine import optim

    monkeypatch.setattr(optim, "KERNEL", "numpy")
    cfg, params, *_ = _problem(dtype="float64")
    assert ModelStack(TransformerModel(cfg), flat_layout(params), 1, 1, 3, np.float64).step is None


@pytest.mark.parametrize("dtype,rel", [("float64", 1e-12), ("float32", 1e-5)])
def test_fast_held_out_metrics_equal_the_reference_forward(dtype, rel):
    """The fast engine's evaluation (the forward only, 8 windows a chunk, 37 windows: the last chunk short)
    against the reference forward over all 37 windows at once: the loss to rounding, the accuracy exactly."""
    cfg, params, _, _ = _problem(seed=5, dtype=dtype)
    rng = np.random.default_rng(9)
    x, y = rng.integers(0, cfg.vocab_size, (37, 20)).astype(np.float32), rng.integers(0, cfg.vocab_size, 37)
    want = TransformerModel(cfg, eval_chunk=37).metrics(params, x, y)
    fast = TransformerModel(cfg, eval_chunk=8, engine="fast")
    loss, accuracy = fast.metrics(params, x, y)
    assert loss == pytest.approx(want[0], rel=rel)
    assert accuracy == want[1]
    assert fast.metrics(params, x, y) == (loss, accuracy)  # the kept step's buffers give the same again


def test_model_for_evaluates_on_the_runs_engine():
    from diloco.config import DiLoCoConfig
    from diloco.core.model_seam import model_for

    cfg, params, _, _ = _problem()
    for engine in ("reference", "fast"):
        model = model_for(DiLoCoConfig(model="transformer", engine=engine, dtype="float32"), params)
        assert model.engine == engine
