"""Random-k sparsification of outer gradients as a codec, from outside the package.

Each worker sends ``ceil(fraction N)`` entries of each tensor's outer gradient at indices
drawn from the generator the round hands ``encode`` (with error feedback, what it did not
send is added to its next outer gradient); the server averages the decoded tensors.
``--compress randk:fraction=0.25``.
"""

from __future__ import annotations

import math

import numpy as np

from diloco.params import average_params, subtract_params


class RandomK:
    summable = False
    lossy = True

    def __init__(self, spec, dtype, fraction: float = 0.1) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        self.spec, self.dtype, self.fraction = spec, np.dtype(dtype), float(fraction)

    def encode(self, item, base, residual, rng=None):
        if rng is None:
            raise ValueError("random-k draws its indices from the round's generator; none was given")
        delta = subtract_params(base, item) if base is not None else item
        message, residual = {}, dict(residual)
        for key, value in delta.items():
            if self.spec.error_feedback and key in residual:
                value = value + residual[key]
            flat = value.reshape(-1)
            index = np.sort(rng.choice(flat.size, math.ceil(self.fraction * flat.size), replace=False))
            message[key] = (index.astype(np.int64), flat[index].copy())
            if self.spec.error_feedback:
                kept = np.zeros_like(flat)
                kept[index] = flat[index]
                residual[key] = (flat - kept).reshape(value.shape)
        return message, residual

    def decode(self, message, like):
        out = {}
        for key, (index, values) in message.items():
            dense = np.zeros(like[key].size, dtype=self.dtype)
            dense[index] = values
            out[key] = dense.reshape(like[key].shape)
        return out

    def reduce(self, decoded, weights, base):
        return average_params(decoded, weights), 0

    def bytes_sent(self, messages, reduced_bytes):
        sizes = [sum(i.nbytes + v.nbytes for i, v in message.values()) for message in messages]
        mean = sum(sizes) / len(sizes)
        return float((len(messages) - 1) * mean), int(round(mean))

    def to_wire(self, message) -> bytes:
        return b"".join(np.int64(index.size).tobytes() + index.tobytes() + values.tobytes()
                        for index, values in message.values())

    def from_wire(self, buffer: bytes, like):
        message, offset = {}, 0
        for key in like:
            count = int(np.frombuffer(buffer, np.int64, 1, offset)[0])
            index = np.frombuffer(buffer, np.int64, count, offset + 8)
            values = np.frombuffer(buffer, self.dtype, count, offset + 8 + 8 * count)
            message[key], offset = (index, values), offset + 8 + (8 + self.dtype.itemsize) * count
        return message
