"""Re-exported from ``diloco.core.quantize``, which owns it (this import path stays for existing code)."""

from diloco.core.quantize import (
    BITS,
    E2M1_GRID,
    FORMATS,
    Encoded,
    bfloat16_bits,
    bfloat16_values,
    decode,
    encode,
    quantize,
    sign_prune_mask,
    unit_bounds,
)

__all__ = [
    "FORMATS",
    "BITS",
    "E2M1_GRID",
    "Encoded",
    "encode",
    "decode",
    "quantize",
    "bfloat16_bits",
    "bfloat16_values",
    "sign_prune_mask",
    "unit_bounds",
]
