"""diloco: DiLoCo (Distributed Low-Communication training) in pure NumPy, in 30 milestones.

The milestone functions live in seven modules, in milestone order: ``model`` (1-6),
``adamw`` (7-11), ``params`` (12-15), ``sharding`` (16-20), ``outer`` (21-24),
``loop`` (25-27) and ``evaluation`` (28-30). They are re-exported here.
"""

# The ``diloco`` command's SIGINT/SIGTERM/SIGHUP handlers, before NumPy is imported; a program
# that merely imports the library is left alone (diloco.runtime.stop_signals.install_if_cli).
import diloco.runtime.stop_signals  # noqa: F401
from diloco.adamw import (
    AdamWState,
    adam_param_step,
    adamw_step,
    bias_correct_moments,
    decoupled_weight_decay,
    init_adamw_state,
    update_adam_moments,
)
from diloco.config import AdamWConfig, DiLoCoConfig
from diloco.evaluation import CommunicationReport, classification_accuracy, communication_savings, evaluate_loss
from diloco.loop import RoundResult, TrainResult, run_diloco_round, train_diloco, train_synchronous_baseline
from diloco.model import (
    ForwardCache,
    cross_entropy_loss,
    init_model_params,
    model_backward,
    model_forward,
    relu,
    softmax,
)
from diloco.outer import (
    OuterState,
    compute_outer_gradient,
    init_outer_optimizer,
    nesterov_param_update,
    update_outer_momentum,
)
from diloco.params import average_params, clone_params, scale_params, subtract_params
from diloco.sharding import (
    iid_shard_dataset,
    inner_train_worker,
    local_train_step,
    noniid_shard_dataset,
    sample_worker_batch,
)

__version__ = "0.1.0"

__all__ = [
    "AdamWConfig", "DiLoCoConfig", "AdamWState", "OuterState", "ForwardCache", "CommunicationReport",
    "RoundResult", "TrainResult",
    "init_model_params", "relu", "model_forward", "softmax", "cross_entropy_loss", "model_backward",
    "init_adamw_state", "update_adam_moments", "bias_correct_moments", "adam_param_step",
    "decoupled_weight_decay", "adamw_step",
    "clone_params", "scale_params", "subtract_params", "average_params",
    "iid_shard_dataset", "noniid_shard_dataset", "sample_worker_batch", "local_train_step", "inner_train_worker",
    "init_outer_optimizer", "update_outer_momentum", "nesterov_param_update", "compute_outer_gradient",
    "run_diloco_round", "train_diloco", "train_synchronous_baseline",
    "evaluate_loss", "classification_accuracy", "communication_savings",
]
