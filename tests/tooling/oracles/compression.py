"""Sparse outer gradients with error feedback: SparseLoCo's chunked top-k and DeMo's DCT top-k.

From the papers (SparseLoCo, arXiv 2508.15706, Algorithm 1; DeMo, arXiv 2411.19870,
Algorithm 1), per worker and per tensor::

    e <- beta e + Delta                  the error-feedback buffer (DeMo's momentum), beta = decay
    q  = C(e)                            top-k per chunk (of the chunk's DCT-II for DeMo, then back)
    e <- e - q                           what was not sent waits for the next round
    Delta_hat = sum_k w_k q_k            every receiver averages the K decoded messages

Conventions the core takes where the papers leave a choice:

* chunks are runs of ``C`` values of the tensor flattened in C order, the last one
  shorter; each chunk keeps ``k_L = min(L, max(1, ceil(density L)))`` entries, with
  ``density L`` taken as the decimal fraction it is written as (0.1 of 30 is 3, not the
  binary 3.0000000000000004);
* DeMo's transform is the orthonormal DCT-II of each (1-D) chunk, the inverse its
  transpose (DeMo uses 2-D blocks; a chunk of ``C`` values is its 1-D analogue);
* ties in magnitude go to the earlier position in the chunk;
* without error feedback the buffer is ``Delta`` alone, every round;
* a worker whose outer gradient is dropped sends nothing, so its buffer is not touched
  (neither decayed nor fed).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

__all__ = ["dct_ii", "inverse_dct_ii", "kept_in_chunk", "top_positions", "compress", "message_bytes", "random_k",
           "send_random_k"]


def _dct_weight(k: int, i: int, n: int) -> float:
    scale = math.sqrt(2.0 / n) * (1.0 / math.sqrt(2.0) if k == 0 else 1.0)
    return scale * math.cos(math.pi * (2 * i + 1) * k / (2 * n))


def dct_ii(values: np.ndarray) -> np.ndarray:
    """``X_k = sqrt(2/n) c_k sum_i x_i cos(pi (2i + 1) k / 2n)``, ``c_0 = 1/sqrt(2)``, ``c_k = 1`` else."""
    n = len(values)
    return np.array([sum(_dct_weight(k, i, n) * values[i] for i in range(n)) for k in range(n)])


def inverse_dct_ii(coefficients: np.ndarray) -> np.ndarray:
    """``x_i = sum_k sqrt(2/n) c_k X_k cos(pi (2i + 1) k / 2n)`` (the orthonormal DCT-III)."""
    n = len(coefficients)
    return np.array([sum(_dct_weight(k, i, n) * coefficients[k] for k in range(n)) for i in range(n)])


def kept_in_chunk(length: int, density: float) -> int:
    return min(length, max(1, math.ceil(Fraction(str(density)) * length)))


def top_positions(values, count: int) -> list:
    """The ``count`` positions of largest magnitude, ties to the earlier one."""
    return sorted(range(len(values)), key=lambda i: (-abs(values[i]), i))[:count]


def compress(tensor: np.ndarray, spec) -> np.ndarray:
    """``C(e)``: what a receiver decodes from the tensor's message (``spec``: the family config)."""
    flat, chunk = tensor.ravel(), spec.topk_chunk
    out = np.zeros_like(flat)
    for begin in range(0, flat.size, chunk):
        piece = flat[begin:begin + chunk]
        coefficients = dct_ii(piece) if spec.topk_transform == "dct" else piece.copy()
        kept = np.zeros_like(coefficients)
        for i in top_positions(coefficients, kept_in_chunk(len(piece), spec.topk)):
            kept[i] = coefficients[i]
        out[begin:begin + len(piece)] = inverse_dct_ii(kept) if spec.topk_transform == "dct" else kept
    return out.reshape(tensor.shape)


def message_bytes(params: dict, spec) -> int:
    """One worker's message: per tensor, its kept positions (``ceil(log2 C)`` bits each,
    packed) and its kept values (8 bytes each, float64)."""
    index_bits = math.ceil(math.log2(spec.topk_chunk)) if spec.topk_chunk > 1 else 0
    total = 0
    for value in params.values():
        size, chunk = value.size, spec.topk_chunk
        kept = sum(kept_in_chunk(min(chunk, size - begin), spec.topk) for begin in range(0, size, chunk))
        total += math.ceil(kept * index_bits / 8) + 8 * kept
    return total


def send(delta: dict, residual: dict, spec) -> tuple[dict, dict]:
    """One worker's send: ``(decoded message, new buffer)`` from its outer gradient and buffer."""
    sent, left = {}, {}
    for key, d in delta.items():
        buffer = spec.topk_decay * residual[key] + d if spec.error_feedback else d
        sent[key] = compress(buffer, spec)
        left[key] = buffer - sent[key] if spec.error_feedback else residual[key]
    return sent, left


def random_k(compress: str) -> float | None:
    """The kept fraction of ``compress="randk:fraction=F"`` (the plugin codec
    ``tests/tooling/plugins/randk.py``), None for any other codec."""
    name, _, options = (compress or "").partition(":")
    if name != "randk":
        return None
    return float(dict(item.split("=") for item in options.split(",") if item).get("fraction", 0.1))


def send_random_k(delta: dict, residual: dict, fraction: float, error_feedback: bool, seed: int, stamp: tuple,
                  worker: int) -> tuple[dict, dict, int]:
    """Random-k: ``(decoded message, new buffer, message bytes)`` of one worker.

    Per tensor (in order), ``e = Delta`` plus the buffer with error feedback; ``ceil(fraction N)``
    distinct positions drawn with ``Generator.choice(N, m, replace=False)`` from worker k's
    generator of the sync, ``default_rng(SeedSequence(seed, spawn_key=(*stamp, k)))`` with
    ``stamp = (round, step, fragment)`` (the core's convention for a codec's draws); the rest waits in
    the buffer. The message: an int64 position and a float64 value per kept entry."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(*stamp, worker)))
    sent, left, size = {}, dict(residual), 0
    for key, d in delta.items():
        buffer = (d + residual[key] if error_feedback else d).ravel()
        positions = rng.choice(buffer.size, math.ceil(fraction * buffer.size), replace=False)
        kept = np.zeros_like(buffer)
        kept[positions] = buffer[positions]
        sent[key] = kept.reshape(d.shape)
        if error_feedback:
            left[key] = (buffer - kept).reshape(d.shape)
        size += 16 * len(positions)
    return sent, left, size
