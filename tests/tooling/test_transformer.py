"""The NumPy transformer language model (diloco.models.transformer).

Checked against things it does not compute itself: a plain-loop forward written here
(position by position, head by head, from the module docstring's equations), attention
worked by hand, central finite differences of the loss for every parameter in float64,
causality, the tied head as an untied head equal to ``wte^T``, and one-line config errors.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from diloco.models.layers import BLOCK_ROWS, causal_attention, row_blocks
from diloco.models.seam import TransformerModel
from diloco.models.transformer import (
    TransformerConfig,
    init_transformer_params,
    sequence_targets,
    transformer_backward,
    transformer_blocks,
    transformer_forward,
    transformer_hidden_matrices,
    transformer_loss,
    transformer_loss_and_grads,
    transformer_param_shapes,
)
from helpers import FEW_EXAMPLES, HALF_EXAMPLES, assert_close

# --------------------------------------------------------------------------- an independent forward


def loop_layer_norm(x, gain, bias):
    mean = sum(x) / len(x)
    var = sum((xi - mean) ** 2 for xi in x) / len(x)
    return np.array([(xi - mean) / math.sqrt(var + 1e-5) for xi in x]) * gain + bias


def loop_gelu(u):
    return np.array([0.5 * ui * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (ui + 0.044715 * ui**3))) for ui in u])


def loop_attention_row(q_t, keys, values, head_dim):
    """One head at one position: softmax over the visible positions only, then the weighted values."""
    scores = [float(q_t @ k_s) / math.sqrt(head_dim) for k_s in keys]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return sum(w / total * v_s for w, v_s in zip(weights, values, strict=True))


def loop_logits(params, tokens, n_heads, tied):
    """Logits (B, T, V) one position and one head at a time; position t only ever sees 0..t."""
    vocab, d = params["wte"].shape
    n_layers = sum(1 for key in params if key.endswith(".ln1.gain"))
    head_dim = d // n_heads
    batch, length = tokens.shape
    out = np.zeros((batch, length, vocab))
    for b in range(batch):
        xs = [params["wte"][tokens[b, t]] + params["wpe"][t] for t in range(length)]
        for layer in range(n_layers):
            p = lambda name, layer=layer: params[f"h{layer}.{name}"]  # noqa: E731
            normed = [loop_layer_norm(x, p("ln1.gain"), p("ln1.bias")) for x in xs]
            qkv = [a @ p("attn.qkv") + p("attn.qkv_bias") for a in normed]
            q, k, v = ([row[i * d:(i + 1) * d] for row in qkv] for i in range(3))
            new = []
            for t in range(length):
                heads = [loop_attention_row(q[t][j * head_dim:(j + 1) * head_dim],
                                            [k[s][j * head_dim:(j + 1) * head_dim] for s in range(t + 1)],
                                            [v[s][j * head_dim:(j + 1) * head_dim] for s in range(t + 1)], head_dim)
                         for j in range(n_heads)]
                new.append(xs[t] + np.concatenate(heads) @ p("attn.proj") + p("attn.proj_bias"))
            xs = [x + loop_gelu(loop_layer_norm(x, p("ln2.gain"), p("ln2.bias")) @ p("mlp.fc") + p("mlp.fc_bias"))
                  @ p("mlp.proj") + p("mlp.proj_bias") for x in new]
        head = params["wte"].T if tied else params["head"]
        for t in range(length):
            out[b, t] = loop_layer_norm(xs[t], params["ln_f.gain"], params["ln_f.bias"]) @ head
    return out


# --------------------------------------------------------------------------- strategies


@st.composite
def small_models(draw, dtype="float64"):
    """A small config, parameters of order 1 (so attention is far from uniform), tokens and targets."""
    n_heads = draw(st.integers(1, 2))
    cfg = TransformerConfig(vocab_size=draw(st.integers(2, 5)), context=draw(st.integers(1, 4)),
                            d_model=n_heads * draw(st.integers(1, 3)), n_heads=n_heads,
                            n_layers=draw(st.integers(1, 2)), mlp_ratio=draw(st.integers(1, 2)),
                            tied=draw(st.booleans()), dtype=dtype)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    params = {key: rng.normal(1.0 if key.endswith("gain") else 0.0, 0.7, shape).astype(dtype)
              for key, shape in transformer_param_shapes(cfg).items()}
    batch, length = draw(st.integers(1, 2)), draw(st.integers(1, cfg.context))
    tokens = rng.integers(0, cfg.vocab_size, (batch, length))
    targets = rng.integers(0, cfg.vocab_size, (batch, length))
    return cfg, params, tokens, targets


def finite_difference_grads(params, tokens, targets, cfg, step=1e-6):
    """``(L(theta + h e_i) - L(theta - h e_i)) / 2h`` for every entry of every parameter."""
    grads = {}
    for key, value in params.items():
        grad = np.zeros_like(value)
        for index in np.ndindex(value.shape):
            shifted = {**params, key: value.copy()}
            shifted[key][index] = value[index] + step
            up = transformer_loss(shifted, tokens, targets, cfg)
            shifted[key][index] = value[index] - step
            down = transformer_loss(shifted, tokens, targets, cfg)
            grad[index] = (up - down) / (2 * step)
        grads[key] = grad
    return grads


# --------------------------------------------------------------------------- forward


@HALF_EXAMPLES
@given(small_models())
def test_forward_matches_a_plain_loop_implementation(model):
    cfg, params, tokens, _ = model
    logits, _ = transformer_forward(params, tokens, cfg)
    assert_close(logits, loop_logits(params, tokens, cfg.n_heads, cfg.tied), rtol=1e-10, atol=1e-12,
                 what="logits (mine vs loop)")


def test_forward_in_two_row_blocks_matches_a_plain_loop_implementation():
    """From T = BLOCK_ROWS on, attention makes P in two row blocks (layers.row_blocks); odd T too."""
    cfg = TransformerConfig(vocab_size=7, context=BLOCK_ROWS + 3, d_model=6, n_heads=2, n_layers=2, dtype="float64")
    assert len(row_blocks(cfg.context)) == 2
    rng = np.random.default_rng(5)
    params = {key: rng.normal(1.0 if key.endswith("gain") else 0.0, 0.7, shape)
              for key, shape in transformer_param_shapes(cfg).items()}
    tokens = rng.integers(0, cfg.vocab_size, (2, cfg.context))
    logits, _ = transformer_forward(params, tokens, cfg)
    assert_close(logits, loop_logits(params, tokens, cfg.n_heads, cfg.tied), rtol=1e-10, atol=1e-12,
                 what="logits (mine vs loop)")


def test_attention_worked_by_hand():
    # One sequence of T = 2, d = 4, two heads of width 2 (scale 1/sqrt 2). Columns: [q | k | v],
    # head 0 in the first two of each, head 1 in the last two.
    # Position 0 sees only itself: out_0 = v_0 = [4, 8 | 2, -2], whatever q_0 is.
    # Position 1, head 0: q_1 = [sqrt2, 0], k_0 = [0, 5], k_1 = [ln 3, 7]: scores 0 and ln 3,
    #   P = [1/4, 3/4], out = 1/4 [4, 8] + 3/4 [8, 0] = [7, 2].
    # Position 1, head 1: q_1 = [0, 1], k_0 = k_1 = [0, 0]: P = [1/2, 1/2], out = ([2, -2] + [6, 2]) / 2 = [4, 0].
    qkv = np.array([
        [3.0, 1.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 4.0, 8.0, 2.0, -2.0],
        [math.sqrt(2.0), 0.0, 0.0, 1.0, math.log(3.0), 7.0, 0.0, 0.0, 8.0, 0.0, 6.0, 2.0],
    ])
    out, _, (probs,) = causal_attention(qkv, 1, 2)  # T = 2: one row block
    assert_close(out, np.array([[4.0, 8.0, 2.0, -2.0], [7.0, 2.0, 4.0, 0.0]]), rtol=1e-14, atol=1e-14,
                 what="attention output")
    assert_close(probs[0, 0], np.array([[1.0, 0.0], [0.25, 0.75]]), rtol=1e-14, atol=0.0, what="head 0 P")
    assert_close(probs[0, 1], np.array([[1.0, 0.0], [0.5, 0.5]]), rtol=1e-14, atol=0.0, what="head 1 P")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_attention_scores_far_above_their_rows_diagonal_fall_back_to_the_row_wise_softmax(dtype):
    # One head of width 1, T = 3. Row 2's scores are q_2 k_s = 1000 k_s: 1000 and 2000 beside its
    # diagonal 0, so exp(S - S_tt) overflows in either dtype; the output must still be each row's
    # softmax of its visible scores times v.
    q, k, v = np.array([-3.0, 0.0, 1000.0]), np.array([1.0, 2.0, 0.0]), np.array([5.0, -3.0, 7.0])
    qkv = np.stack([q, k, v], axis=1).astype(dtype)
    out, _, (probs,) = causal_attention(qkv, 1, 1)
    expected_p = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [math.exp(-1000.0), 1.0, math.exp(-2000.0)]])
    assert np.isfinite(out).all()
    assert_close(probs, expected_p[None, None], rtol=1e-6, atol=1e-30, what="P")
    assert_close(out[:, 0], expected_p @ v, rtol=1e-6 if dtype == "float32" else 1e-14, atol=0.0,
                 what="attention output")


@given(small_models())
def test_changing_a_future_token_leaves_earlier_logits_unchanged(model):
    cfg, params, tokens, _ = model
    assume(cfg.d_model >= 2)  # with d = 1 every LayerNorm output is its bias: no logit depends on a token
    position = tokens.shape[1] - 1
    changed = tokens.copy()
    changed[:, position] = (changed[:, position] + 1) % cfg.vocab_size
    before, _ = transformer_forward(params, tokens, cfg)
    after, _ = transformer_forward(params, changed, cfg)
    np.testing.assert_array_equal(after[:, :position], before[:, :position], err_msg="logits before the change moved")
    assert not np.array_equal(after[:, position], before[:, position]), "the changed position's logits did not move"


def test_a_future_token_changes_nothing_on_the_default_model():
    cfg = TransformerConfig()
    params = init_transformer_params(np.random.default_rng(0), cfg)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, cfg.context))
    changed = tokens.copy()
    changed[:, 40] = (changed[:, 40] + 7) % cfg.vocab_size
    before, _ = transformer_forward(params, tokens, cfg)
    after, _ = transformer_forward(params, changed, cfg)
    np.testing.assert_array_equal(after[:, :40], before[:, :40])
    assert np.abs(after[:, 40:] - before[:, 40:]).max(axis=-1).min() > 0, "a later position did not see the change"


# --------------------------------------------------------------------------- backward


@pytest.mark.slow
@FEW_EXAMPLES
@given(small_models())
def test_gradients_match_central_finite_differences(model):
    cfg, params, tokens, targets = model
    loss, grads = transformer_loss_and_grads(params, tokens, targets, cfg)
    assert loss == pytest.approx(transformer_loss(params, tokens, targets, cfg), rel=1e-14)
    expected = finite_difference_grads(params, tokens, targets, cfg)
    assert list(grads) == list(params)
    for key in params:
        assert_close(grads[key], expected[key], rtol=1e-5, atol=1e-7, what=f"d loss / d {key} (mine vs FD)")


@pytest.mark.parametrize("context", [8, 2 * BLOCK_ROWS + 1])  # one row block; two (attention's rows in halves)
def test_gradients_match_finite_differences_on_the_default_shapes_in_float64(context):
    # Every key of a 2-layer, 4-head model at a few entries each (the full check runs on small models above).
    cfg = TransformerConfig(vocab_size=11, context=context, d_model=16, n_heads=4, n_layers=2, tied=False,
                            dtype="float64")
    rng = np.random.default_rng(3)
    params = {key: rng.normal(1.0 if key.endswith("gain") else 0.0, 0.5, shape)
              for key, shape in transformer_param_shapes(cfg).items()}
    tokens, targets = rng.integers(0, 11, (3, context)), rng.integers(0, 11, (3, context))
    _, grads = transformer_loss_and_grads(params, tokens, targets, cfg)
    for key, value in params.items():
        for flat in rng.choice(value.size, size=min(4, value.size), replace=False):
            index = np.unravel_index(flat, value.shape)
            shifted = {k: v.copy() for k, v in params.items()}
            shifted[key][index] += 1e-6
            up = transformer_loss(shifted, tokens, targets, cfg)
            shifted[key][index] -= 2e-6
            down = transformer_loss(shifted, tokens, targets, cfg)
            assert grads[key][index] == pytest.approx((up - down) / 2e-6, rel=1e-5, abs=1e-8), f"{key}{index}"


def test_tied_head_is_an_untied_head_equal_to_the_embedding_transposed():
    tied = TransformerConfig(vocab_size=7, context=5, d_model=8, n_heads=2, n_layers=1, dtype="float64")
    untied = TransformerConfig(vocab_size=7, context=5, d_model=8, n_heads=2, n_layers=1, tied=False, dtype="float64")
    params = init_transformer_params(np.random.default_rng(0), tied)
    assert "head" not in params and "head" in transformer_param_shapes(untied)
    untied_params = {**params, "head": params["wte"].T.copy()}
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    loss_tied, grads_tied = transformer_loss_and_grads(params, tokens, targets, tied)
    loss_untied, grads_untied = transformer_loss_and_grads(untied_params, tokens, targets, untied)
    assert loss_tied == pytest.approx(loss_untied, rel=1e-14)
    # The tied embedding collects both uses: d wte (tied) = d wte (untied) + d head^T (untied).
    assert_close(grads_tied["wte"], grads_untied["wte"] + grads_untied["head"].T, rtol=1e-12, atol=1e-15,
                 what="tied d wte")
    assert np.abs(grads_untied["head"]).max() > 0


def test_float32_by_default_and_pure():
    cfg = TransformerConfig(vocab_size=9, context=6, d_model=8, n_heads=2)
    params = init_transformer_params(np.random.default_rng(0), cfg)
    assert cfg.dtype == "float32" and {v.dtype for v in params.values()} == {np.dtype(np.float32)}
    tokens = np.random.default_rng(1).integers(0, 9, (2, 6))
    saved = {k: v.copy() for k, v in params.items()}
    logits, _ = transformer_forward(params, tokens, cfg)
    loss, grads = transformer_loss_and_grads(params, tokens, tokens, cfg)
    assert logits.dtype == np.float32 and {v.dtype for v in grads.values()} == {np.dtype(np.float32)}
    assert isinstance(loss, float) and np.isfinite(loss)
    for key in params:
        np.testing.assert_array_equal(params[key], saved[key], err_msg=f"params[{key!r}] was modified")
        assert not np.shares_memory(grads[key], params[key]), key


def test_initialisation_follows_gpt2_and_is_reproducible():
    cfg = TransformerConfig(n_layers=8, dtype="float64")
    params = init_transformer_params(np.random.default_rng(5), cfg)
    again = init_transformer_params(np.random.default_rng(5), cfg)
    assert all(np.array_equal(params[k], again[k]) for k in params)
    assert np.std(params["h0.mlp.fc"]) == pytest.approx(0.02, rel=0.05)
    assert np.std(params["h0.mlp.proj"]) == pytest.approx(0.02 / 4.0, rel=0.05)  # 1/sqrt(2 * 8 layers)
    assert np.all(params["h3.ln2.gain"] == 1.0) and np.all(params["h3.attn.qkv_bias"] == 0.0)
    # At initialisation the prediction is close to uniform: loss about ln V.
    tokens, targets = np.random.default_rng(0).integers(0, 65, (2, 4, 64))
    assert transformer_loss(params, tokens, targets, cfg) == pytest.approx(math.log(65), abs=0.05)


# --------------------------------------------------------------------------- key lists and the data seam


@pytest.mark.parametrize("tied", [True, False])
def test_blocks_partition_the_keys_and_hidden_matrices_are_the_blocks_2d_weights(tied):
    cfg = TransformerConfig(n_layers=3, tied=tied)
    shapes = transformer_param_shapes(cfg)
    blocks = transformer_blocks(cfg)
    assert len(blocks) == cfg.n_layers + 2
    flat = [key for block in blocks for key in block]
    assert sorted(flat) == sorted(shapes) and len(flat) == len(set(flat))
    assert blocks[0] == ("wte", "wpe") and all(key.startswith("h1.") for key in blocks[2])
    hidden = transformer_hidden_matrices(cfg)
    assert len(hidden) == 4 * cfg.n_layers and all(len(shapes[key]) == 2 for key in hidden)
    assert not {"wte", "wpe", "head"} & set(hidden)


def test_sequence_targets_shift_the_window_by_one():
    windows = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32)
    tokens, targets = sequence_targets(windows, np.array([9, 8]))
    np.testing.assert_array_equal(tokens, [[1, 2, 3], [4, 5, 6]])
    np.testing.assert_array_equal(targets, [[2, 3, 9], [5, 6, 8]])
    with pytest.raises(ValueError, match="whole-number"):
        sequence_targets(windows + 0.5, np.array([9, 8]))
    with pytest.raises(ValueError, match="must agree"):
        sequence_targets(windows, np.array([9]))


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"vocab_size": 0}, ValueError, r"^TransformerConfig\.vocab_size must be a positive int, got 0$"),
    ({"context": 2.0}, TypeError, r"^TransformerConfig\.context must be a positive int"),
    ({"d_model": -4}, ValueError, r"^TransformerConfig\.d_model must be a positive int"),
    ({"n_heads": 3}, ValueError, r"^TransformerConfig\.n_heads must divide d_model \(64\), got 3$"),
    ({"n_layers": True}, TypeError, r"^TransformerConfig\.n_layers must be a positive int"),
    ({"mlp_ratio": 0}, ValueError, r"^TransformerConfig\.mlp_ratio must be a positive int"),
    ({"tied": 1}, TypeError, r"^TransformerConfig\.tied must be a bool"),
    ({"dtype": "float16"}, ValueError, r"^TransformerConfig\.dtype must be one of"),
])
def test_bad_config_gives_one_line_naming_the_field(fields, error, message):
    with pytest.raises(error, match=message) as info:
        TransformerConfig(**fields)
    assert "\n" not in str(info.value)


def test_config_normalises_numpy_values():
    cfg = TransformerConfig(d_model=np.int64(32), dtype=np.float64)
    assert cfg.d_model == 32 and type(cfg.d_model) is int and cfg.dtype == "float64" and cfg.head_dim == 8


def test_bad_tokens_and_params_are_refused_before_any_work():
    cfg = TransformerConfig(vocab_size=5, context=4, d_model=4, n_heads=2, dtype="float64")
    params = init_transformer_params(np.random.default_rng(0), cfg)
    good = np.zeros((2, 3), dtype=np.int64)
    with pytest.raises(ValueError, match=r"tokens must have shape \(B, T\) .* context \(4\)"):
        transformer_forward(params, np.zeros((2, 5), dtype=np.int64), cfg)
    with pytest.raises(ValueError, match=r"tokens must hold ids in \[0, 5\)"):
        transformer_forward(params, good + 5, cfg)
    with pytest.raises(TypeError, match="tokens must be an integer ndarray"):
        transformer_forward(params, good.astype(float), cfg)
    with pytest.raises(ValueError, match=r"targets must hold ids in \[0, 5\)"):
        transformer_loss_and_grads(params, good, good - 1, cfg)
    with pytest.raises(ValueError, match=r"targets must be an ndarray of shape \(2, 3\)"):
        transformer_loss_and_grads(params, good, good[:, :2], cfg)
    with pytest.raises(ValueError, match=r"missing \['wpe'\]"):
        transformer_forward({k: v for k, v in params.items() if k != "wpe"}, good, cfg)
    with pytest.raises(ValueError, match=r"params\['h0.mlp.fc'\] must be .* shape \(4, 16\) and dtype float64"):
        transformer_forward({**params, "h0.mlp.fc": params["h0.mlp.fc"].astype(np.float32)}, good, cfg)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        init_transformer_params(0, cfg)
    with pytest.raises(TypeError, match="cfg must be a TransformerConfig"):
        transformer_forward(params, good, {"vocab_size": 5})
    with pytest.raises(TypeError, match="cache must be the TransformerCache of transformer_forward"):
        transformer_backward(params, transformer_forward(params, good, cfg)[0], good, cfg)


# --------------------------------------------------------------------------- training


def one_blas_thread():
    """OpenBLAS limited to one thread where threadpoolctl is installed (the ``cli`` extra).

    Its default, a thread per core, costs 10x the CPU on this model's (2048, 64) products when
    the cores are shared (measured: 20 s against 1.5 s for the run below on 2 loaded cores).
    """
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def adamw_and_muon(cfg):
    """``(init, step)`` pairs: the milestones' AdamW, and Muon on the hidden matrices with AdamW on the rest."""
    from diloco.adamw import adamw_step, init_adamw_state
    from diloco.config import AdamWConfig
    from diloco.methods.muon import MuonConfig, init_muon, muon_step

    adam = AdamWConfig(lr=1e-2, weight_decay=0.0)
    muon = MuonConfig(keys=transformer_hidden_matrices(cfg))
    return {"adamw": (init_adamw_state, lambda p, s, g: adamw_step(p, s, g, adam)),
            "muon": (lambda p: init_muon(p, muon), lambda p, s, g: muon_step(p, s, g, muon, adam))}


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_training_on_tiny_shakespeare_learns_more_than_character_frequencies(optimizer):
    # 150 steps of 16 windows of 32 characters; the optimizers' own code, unchanged.
    from diloco.text import load_shakespeare

    cfg = TransformerConfig(context=32, d_model=32, n_heads=2, n_layers=2)
    data = load_shakespeare(cfg.context, eval_windows=256).dataset
    rng = np.random.default_rng(0)
    params = init_transformer_params(rng, cfg)
    init, step = adamw_and_muon(cfg)[optimizer]
    state = init(params)
    if optimizer == "muon":  # Muon's momentum is on the hidden matrices only
        assert sorted(state.momentum) == sorted(transformer_hidden_matrices(cfg))
    held_tokens, held_targets = sequence_targets(data.x_test, data.y_test)
    start = transformer_loss(params, held_tokens, held_targets, cfg)
    with one_blas_thread():
        for _ in range(150):
            rows = rng.choice(len(data.y_train), 16, replace=False)
            _, grads = transformer_loss_and_grads(params, *sequence_targets(data.x_train[rows], data.y_train[rows]),
                                                  cfg)
            params, state = step(params, state, grads)
    end = transformer_loss(params, held_tokens, held_targets, cfg)
    # The held-out cross-entropy of the training set's character frequencies (add-one smoothed):
    # a model below it predicts from the context, not only from how common each character is.
    counts = np.bincount(data.y_train, minlength=cfg.vocab_size) + 1.0
    unigram = float(-np.log(counts / counts.sum())[data.y_test].mean())
    assert start == pytest.approx(math.log(cfg.vocab_size), abs=0.1)
    assert end < unigram - 0.3, f"held-out loss {start:.3f} -> {end:.3f}, character frequencies give {unigram:.3f}"


# --------------------------------------------------------------------------- the core's seam


def test_the_seam_trains_on_the_char_lm_rows_and_evaluates_every_position():
    cfg = TransformerConfig(vocab_size=6, context=5, d_model=8, n_heads=2, n_layers=1, dtype="float64")
    model = TransformerModel(cfg, eval_chunk=3)
    params = model.init_params(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x = rng.integers(0, 6, (7, 5)).astype(np.float32)  # diloco.text's windows: float32 ids
    y = rng.integers(0, 6, 7)
    tokens = x.astype(np.int64)
    targets = np.concatenate([tokens[:, 1:], y[:, None]], axis=1)
    loss, grads = model.loss_and_grads(params, x, y)
    want_loss, want_grads = transformer_loss_and_grads(params, tokens, targets, cfg)
    assert loss == want_loss and all(np.array_equal(grads[k], want_grads[k]) for k in params)
    # Chunks of 3, 3 and 1 windows give the mean over all 35 predictions.
    eval_loss, eval_accuracy = model.metrics(params, x, y)
    logits, _ = transformer_forward(params, tokens, cfg)
    assert eval_loss == pytest.approx(transformer_loss(params, tokens, targets, cfg), rel=1e-12)
    assert eval_accuracy == np.mean(logits.argmax(axis=-1) == targets)
    assert model.muon_keys() == transformer_hidden_matrices(cfg) and model.blocks() == transformer_blocks(cfg)
    with pytest.raises(ValueError, match=r"^TransformerModel\.eval_chunk must be a positive int"):
        TransformerModel(cfg, eval_chunk=0)
    with pytest.raises(ValueError, match="x_eval must be"):
        model.metrics(params, x[:0], y[:0])


def test_float32_gradients_agree_with_float64():
    # The same parameters in both dtypes: float32 must stay float32 all the way through (a float64
    # intermediate would cost speed) and lose no more than float32's rounding.
    cfg64 = TransformerConfig(vocab_size=13, context=16, d_model=16, n_heads=4, dtype="float64")
    cfg32 = TransformerConfig(vocab_size=13, context=16, d_model=16, n_heads=4, dtype="float32")
    params64 = init_transformer_params(np.random.default_rng(0), cfg64)
    params32 = {key: value.astype(np.float32) for key, value in params64.items()}
    tokens, targets = np.random.default_rng(1).integers(0, 13, (2, 4, 16))
    loss64, grads64 = transformer_loss_and_grads(params64, tokens, targets, cfg64)
    loss32, grads32 = transformer_loss_and_grads(params32, tokens, targets, cfg32)
    assert loss32 == pytest.approx(loss64, rel=1e-6)
    for key in params64:
        assert grads32[key].dtype == np.float32, key
        scale = np.abs(grads64[key]).max()
        assert_close(grads32[key], grads64[key], rtol=0.0, atol=1e-4 * scale, what=f"float32 d {key}")
