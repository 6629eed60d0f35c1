"""Exercise x07 (optional, outside the 30): the language-model head and the residual stream's gradient.

``cross_entropy`` and ``embedding_grad`` in ``diloco.models.layers``, and ``embedding_backward``
and ``block_backward`` in ``diloco.models.transformer``, are the transformer's own
(``transformer_backward`` calls them). Expected values are hand-worked
(``tests/fixtures/x07.json``), central finite differences in float64, or sums written out
here, never from the package. ``block_backward``'s cache is built by the oracles of
``tests/transformer_oracles.py``, and its test zeroes both branches' output projections,
so its result does not depend on how exercises x04-x06 are done, only that they run.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import transformer_oracles as oracle
from diloco.models.layers import cross_entropy, embedding_grad, row_blocks
from diloco.models.transformer import LayerCache, TransformerConfig, block_backward, embedding_backward
from helpers import DTYPES, assert_close, load_fixture

pytestmark = pytest.mark.x07


def tol(dtype):
    return dict(rtol=1e-6, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-14)


def ce_oracle(logits, targets):
    """Mean over rows of ``log sum_j exp(l_j) - l_target``, by Python floats."""
    losses = []
    for row, target in zip(np.asarray(logits, dtype=np.float64).tolist(), targets, strict=True):
        top = max(row)
        losses.append(top + math.log(sum(math.exp(v - top) for v in row)) - row[target])
    return sum(losses) / len(losses)


# --------------------------------------------------------------------------- cross-entropy


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_matches_hand_worked_fixture(dtype):
    fixture = load_fixture("x07")
    inputs, expected = fixture["inputs"], fixture["expected"]
    loss, dlogits = cross_entropy(np.array(inputs["logits"], dtype=dtype), np.array(inputs["targets"]))
    assert isinstance(loss, float), f"the loss must be a Python float, got {type(loss).__name__}"
    assert_close(loss, expected["loss"], **tol(dtype), what="mean cross-entropy")
    assert_close(dlogits, np.array(expected["dlogits"]), **tol(dtype), what="d loss / d logits = (p - Y) / N")
    assert dlogits.dtype == dtype


@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 6), vocab=st.integers(2, 7))
def test_cross_entropy_gradient_matches_finite_differences(seed, n, vocab):
    rng = np.random.default_rng(seed)
    logits, targets = rng.standard_normal((n, vocab)) * 3, rng.integers(0, vocab, n)
    loss, dlogits = cross_entropy(logits, targets)
    assert_close(loss, ce_oracle(logits, targets), rtol=1e-12, what="mean cross-entropy")
    assert_close(dlogits, oracle.numeric_grad(lambda v: ce_oracle(v, targets), logits), rtol=1e-6, atol=1e-9,
                 what="dlogits against finite differences")


def test_cross_entropy_gradient_is_divided_by_the_number_of_rows():
    """The same rows twice: the mean loss is unchanged and every row's share of the gradient halves."""
    logits, targets = np.array([[0.5, -1.0, 2.0], [1.0, 0.0, 0.0]]), np.array([2, 0])
    loss, dlogits = cross_entropy(logits, targets)
    loss2, dlogits2 = cross_entropy(np.vstack([logits, logits]), np.concatenate([targets, targets]))
    assert_close(loss2, loss, rtol=1e-12, what="loss of the rows repeated")
    assert_close(dlogits2, np.vstack([dlogits, dlogits]) / 2, rtol=1e-12, what="dlogits of the rows repeated")
    assert_close(np.abs(dlogits).sum(), sum(2 * (1 - p) for p in [
        math.exp(2) / (math.exp(0.5) + math.exp(-1) + math.exp(2)), math.e / (math.e + 2)]) / 2, rtol=1e-12,
        what="sum |dlogits| = sum_i 2 (1 - p_target) / N")


@given(seed=st.integers(0, 2**32 - 1), shift=st.floats(-500, 500))
def test_cross_entropy_ignores_a_row_shift_and_is_stable(seed, shift):
    rng = np.random.default_rng(seed)
    logits, targets = rng.standard_normal((4, 5)), rng.integers(0, 5, 4)
    loss, dlogits = cross_entropy(logits, targets)
    with np.errstate(over="raise", invalid="raise"):
        shifted, dshifted = cross_entropy(logits + 1000.0 + shift * np.arange(4)[:, None], targets)
    assert_close(shifted, loss, rtol=1e-9, what="loss of logits + c_row")
    assert_close(dshifted, dlogits, rtol=1e-7, atol=1e-12, what="dlogits of logits + c_row")


def test_cross_entropy_permuting_rows_permutes_the_gradient_and_keeps_its_input():
    rng = np.random.default_rng(2)
    logits, targets = rng.standard_normal((5, 4)).astype(np.float32), np.array([0, 3, 1, 1, 2])
    before = logits.copy()
    loss, dlogits = cross_entropy(logits, targets)
    assert np.array_equal(logits, before), "cross_entropy must not change the logits"
    order = np.array([4, 2, 0, 1, 3])
    loss_p, dlogits_p = cross_entropy(logits[order], targets[order])
    assert_close(loss_p, loss, rtol=1e-6, what="loss of permuted rows")
    assert_close(dlogits_p, dlogits[order], rtol=1e-6, atol=1e-8, what="dlogits of permuted rows")
    no_grad = cross_entropy(logits, targets, grad=False)
    assert no_grad[1] is None and abs(no_grad[0] - loss) <= 1e-6, f"grad=False gives (loss, None), got {no_grad}"


# --------------------------------------------------------------------------- the embeddings


def embedding_case(dtype=np.float64, tied=True):
    inputs = load_fixture("x07")["inputs"]
    cfg = TransformerConfig(vocab_size=inputs["vocab_size"], context=inputs["context"], d_model=inputs["d_model"],
                            n_heads=1, n_layers=1, tied=tied, dtype=np.dtype(dtype).name)
    return (cfg, np.array(inputs["tokens"]), np.array(inputs["dx"], dtype=dtype),
            np.array(inputs["head_grad"], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_grad_sums_repeated_tokens(dtype):
    cfg, tokens, dx, _ = embedding_case(dtype)
    grad = embedding_grad(tokens, dx.reshape(2, 3, 2), cfg.vocab_size)
    assert_close(grad, np.array(load_fixture("x07")["expected"]["embedding_grad"]), **tol(dtype),
                 what="d wte (token 0 three times, token 1 twice)")
    assert grad.dtype == dtype


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_backward_matches_hand_worked_fixture(dtype):
    expected = load_fixture("x07")["expected"]
    cfg, tokens, dx, head_grad = embedding_case(dtype, tied=True)
    grads = embedding_backward(tokens, dx, head_grad, cfg)
    assert list(grads) == ["wte", "wpe"], f"tied: the keys wte, wpe in that order, got {list(grads)}"
    assert_close(grads["wte"], np.array(expected["wte_tied"]), **tol(dtype), what="d wte (tied)")
    assert_close(grads["wpe"], np.array(expected["wpe"]), **tol(dtype), what="d wpe (context 4, T = 3)")
    assert grads["wte"].dtype == grads["wpe"].dtype == dtype


def test_the_tied_head_gradient_is_added_to_the_embedding_gradient():
    """Tied, wte is used twice (input and output): d wte = embedding rows + dW_head^T; untied, they stay apart."""
    cfg, tokens, dx, head_grad = embedding_case(tied=False)
    untied = embedding_backward(tokens, dx, head_grad, cfg)
    assert list(untied) == ["wte", "wpe", "head"], f"untied: wte, wpe, head, got {list(untied)}"
    assert_close(untied["head"], head_grad, rtol=0, what="d head (untied) = dW_head")
    tied_cfg, *_ = embedding_case(tied=True)
    tied = embedding_backward(tokens, dx, head_grad, tied_cfg)
    assert_close(tied["wte"] - untied["wte"], head_grad.T, rtol=1e-12, what="d wte (tied) - d wte (untied)")


@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4), length=st.integers(1, 6))
def test_the_position_gradient_sums_over_the_batch(seed, batch, length):
    rng = np.random.default_rng(seed)
    cfg = TransformerConfig(vocab_size=4, context=6, d_model=3, n_heads=1, n_layers=1, dtype="float64")
    tokens, dx = rng.integers(0, 4, (batch, length)), rng.standard_normal((batch * length, 3))
    grads = embedding_backward(tokens, dx, np.zeros((3, 4)), cfg)
    expected_wpe = np.zeros((6, 3))
    for b in range(batch):
        for t in range(length):
            expected_wpe[t] += dx[b * length + t]
    assert_close(grads["wpe"], expected_wpe, rtol=1e-12, atol=1e-15, what="d wpe[t] = sum over b of dx[b, t]")
    order = rng.permutation(batch)
    permuted = embedding_backward(tokens[order], dx.reshape(batch, length, 3)[order].reshape(-1, 3),
                                  np.zeros((3, 4)), cfg)
    assert_close(permuted["wpe"], grads["wpe"], rtol=1e-12, atol=1e-15, what="d wpe of the permuted batch")


@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 4), length=st.integers(1, 6), vocab=st.integers(1, 5))
def test_embedding_grad_sums_every_occurrence(seed, batch, length, vocab):
    """Random tokens from a small vocabulary repeat often: each occurrence adds its row."""
    rng = np.random.default_rng(seed)
    tokens, dx = rng.integers(0, vocab, (batch, length)), rng.standard_normal((batch, length, 3))
    expected = np.zeros((vocab, 3))
    for b in range(batch):
        for t in range(length):
            expected[tokens[b, t]] += dx[b, t]
    assert_close(embedding_grad(tokens, dx, vocab), expected, rtol=1e-12, atol=1e-15,
                 what="d wte[v] = sum of dx where token = v")


# --------------------------------------------------------------------------- block_backward


KEYS = ("ln1.gain", "ln1.bias", "attn.qkv", "attn.qkv_bias", "attn.proj", "attn.proj_bias", "ln2.gain", "ln2.bias",
        "mlp.fc", "mlp.fc_bias", "mlp.proj", "mlp.proj_bias")


def block_case(seed, dtype=np.float64, zero_projections=True, batch=2, length=5):
    """A block's params (d = 4, 2 heads, MLP 8), the forward's cache by the oracles, and an upstream dx."""
    rng = np.random.default_rng(seed)
    d, m = 4, 8
    cfg = TransformerConfig(vocab_size=5, context=8, d_model=d, n_heads=2, n_layers=1, mlp_ratio=2,
                            dtype=np.dtype(dtype).name)
    shapes = dict(zip(KEYS, [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, m), (m,), (m, d), (d,)],
                      strict=True))
    params = {"h0." + key: rng.standard_normal(shape) * 0.5 for key, shape in shapes.items()}
    if zero_projections:
        params["h0.attn.proj"][:] = 0.0
        params["h0.mlp.proj"][:] = 0.0
    x = rng.standard_normal((batch * length, d))
    attn_in, hat1, inv1 = oracle.layer_norm(x, params["h0.ln1.gain"], params["h0.ln1.bias"])
    qkv_flat = attn_in @ params["h0.attn.qkv"] + params["h0.attn.qkv_bias"]
    attn_out, probs = oracle.attention(qkv_flat, batch, 2)
    mid = x + attn_out @ params["h0.attn.proj"] + params["h0.attn.proj_bias"]
    mlp_in, hat2, inv2 = oracle.layer_norm(mid, params["h0.ln2.gain"], params["h0.ln2.bias"])
    fc_out = mlp_in @ params["h0.mlp.fc"] + params["h0.mlp.fc_bias"]
    gelu_out, s = oracle.gelu(fc_out)
    cast = lambda a: np.asarray(a, dtype=dtype)  # noqa: E731
    cache = LayerCache((cast(hat1), cast(inv1)), cast(attn_in), cast(oracle.heads_of(qkv_flat, batch, 2)),
                       tuple(cast(p) for p in oracle.in_blocks(probs, row_blocks(length))), cast(attn_out),
                       (cast(hat2), cast(inv2)), cast(mlp_in), cast(fc_out), cast(s), cast(gelu_out))
    params = {key: cast(value) for key, value in params.items()}
    return cfg, params, cache, cast(rng.standard_normal((batch * length, d)))


@pytest.mark.parametrize("seed", [0, 1])
def test_block_backward_passes_the_residual_gradient_through(seed):
    """With both output projections zero, neither branch moves the output: ``dx_in = dx_out`` exactly,
    ``d attn.proj = attn_out^T dx`` and ``d mlp.proj = GELU^T dx``, every other gradient 0."""
    cfg, params, cache, dx = block_case(seed)
    grads = {}
    dx_in = block_backward(params, "h0.", dx, cache, grads, cfg)
    assert_close(dx_in, dx, rtol=1e-12, atol=1e-14, what="dx_in (both branches silent: the residual alone)")
    expected = {"attn.proj": cache.attn_out.T @ dx, "attn.proj_bias": dx.sum(axis=0),
                "mlp.proj": cache.gelu_out.T @ dx, "mlp.proj_bias": dx.sum(axis=0)}
    for key in KEYS:
        want = expected.get(key, np.zeros_like(params["h0." + key]))
        assert_close(grads.get("h0." + key), want, rtol=1e-12, atol=1e-14, what=f"grads['h0.{key}']")


def test_block_backward_writes_every_gradient_of_the_block_in_float32():
    cfg, params, cache, dx = block_case(3, dtype=np.float32, zero_projections=False, length=17)
    grads = {}
    dx_in = block_backward(params, "h0.", dx, cache, grads, cfg)
    assert dx_in.dtype == np.float32 and dx_in.shape == dx.shape and np.all(np.isfinite(dx_in))
    assert sorted(grads) == sorted("h0." + key for key in KEYS), f"the block's 12 gradients, got {sorted(grads)}"
    for key, value in grads.items():
        assert value.shape == params[key].shape and value.dtype == np.float32, (
            f"grads[{key!r}]: expected float32 {params[key].shape}, got {value.dtype} {value.shape}")
    assert_close(grads["h0.mlp.proj"], cache.gelu_out.T @ dx, rtol=1e-5, atol=1e-6, what="d mlp.proj = GELU^T dx")
    assert_close(grads["h0.mlp.proj_bias"], dx.sum(axis=0), rtol=1e-5, atol=1e-6, what="d mlp.proj_bias")
