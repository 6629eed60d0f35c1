"""Re-exported from ``diloco.core.comm``, which owns it (this import path stays for existing code)."""

from diloco.core.comm import (
    CommSpec,
    Exchange,
    all_reduce,
    encode_delta,
    exchange,
    exchange_deltas,
    is_native,
    native_bytes,
    reduce_decoded,
)

__all__ = [
    "CommSpec",
    "Exchange",
    "is_native",
    "encode_delta",
    "reduce_decoded",
    "all_reduce",
    "exchange",
    "exchange_deltas",
    "native_bytes",
]
