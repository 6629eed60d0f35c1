"""Methods after DiLoCo (issue 20), as pure building blocks for the training core.

* ``muon``: MuLoCo's inner optimizer, Muon (Newton-Schulz orthogonalised momentum) for
  the weight matrices with AdamW for the biases: ``init_muon`` / ``muon_step``.
* ``sparse``: SparseLoCo's chunked top-k (optionally 2-bit) and DeMo's chunked DCT, with
  error feedback and an honest wire format: ``compress_with_feedback``, ``to_bytes``.
* ``asynchrony``: Liu et al.'s asynchronous schedule (worker speeds, the arrival order,
  dynamic local updates) and outer rules (per-arrival and delayed Nesterov).

Nothing here trains: each function is a transform of arrays or of a schedule, so the one
training core can compose them. No results are claimed for them yet.
"""

from diloco.methods.asynchrony import (
    Arrivals,
    AsyncOuterState,
    arrival_schedule,
    delayed_nesterov_step,
    draw_step_times,
    dynamic_local_steps,
    init_async_outer,
    synchronous_round_time,
)
from diloco.methods.muon import NS_COEFFICIENTS, MuonConfig, MuonState, init_muon, muon_step, newton_schulz
from diloco.methods.sparse import (
    ErrorFeedbackState,
    SparseConfig,
    SparsePayload,
    chunked_dct,
    chunked_idct,
    compress_with_feedback,
    decode_sparse,
    encode_sparse,
    encoded_nbytes,
    from_bytes,
    init_error_feedback,
    to_bytes,
    topk_mask,
)

__all__ = [
    "NS_COEFFICIENTS", "MuonConfig", "MuonState", "init_muon", "muon_step", "newton_schulz",
    "ErrorFeedbackState", "SparseConfig", "SparsePayload", "chunked_dct", "chunked_idct", "compress_with_feedback",
    "decode_sparse", "encode_sparse", "encoded_nbytes", "from_bytes", "init_error_feedback", "to_bytes", "topk_mask",
    "Arrivals", "AsyncOuterState", "arrival_schedule", "delayed_nesterov_step",
    "draw_step_times", "dynamic_local_steps", "init_async_outer", "synchronous_round_time",
]
