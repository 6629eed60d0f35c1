"""Beyond the 2023 paper: the DiLoCo family, built on the 30 milestone functions.

Why a subpackage: these algorithms are not part of the course's 30 milestones, and the
milestone modules keep their contract. Everything here *composes* the public milestone
functions and ``diloco.loop``'s helpers (``prepare_training``, ``round_record``,
``finish_record``), so a learner's own functions run inside it too, and the plain
settings reduce to DiLoCo bit for bit.

* ``quantize`` / ``wire``: outer gradients as float32, float16, bfloat16, int8 or fp4
  (E2M1), with power-of-two block scales, sign pruning and their byte layout.
* ``comm``: how K workers average encoded outer gradients (reduce-scatter then
  all-gather of payloads, accumulated in the params' dtype), error feedback.
* ``streaming``: Streaming DiLoCo (fragments, overlap tau, mixing).
* ``eager``: eager updates (one-outer-step overlap).
* ``netsim``: a network simulator, bytes to wall-clock time and compute utilisation.
* ``trainers``: one entry point per algorithm for the tools; ``mpi_family``: the same
  on real MPI ranks.
"""

from diloco.core.comm import CommSpec, exchange, exchange_deltas
from diloco.core.netsim import NetworkClock, all_reduce_seconds, parse_bandwidth, parse_duration, simulate
from diloco.core.quantize import FORMATS, Encoded, decode, encode, quantize, sign_prune_mask
from diloco.family.config import FamilyConfig
from diloco.family.eager import eager_outer_gradient, train_eager
from diloco.family.streaming import fragment_keys, fragment_layers, sync_offsets, sync_steps, train_streaming
from diloco.family.trainers import communication_report, family_trainer, train_family
from diloco.family.wire import from_bytes, to_bytes

__all__ = [
    "FamilyConfig", "CommSpec", "exchange", "exchange_deltas",
    "FORMATS", "Encoded", "encode", "decode", "quantize", "sign_prune_mask", "to_bytes", "from_bytes",
    "train_streaming", "fragment_layers", "fragment_keys", "sync_offsets", "sync_steps",
    "train_eager", "eager_outer_gradient",
    "parse_bandwidth", "parse_duration", "all_reduce_seconds", "NetworkClock", "simulate",
    "train_family", "family_trainer", "communication_report",
]
