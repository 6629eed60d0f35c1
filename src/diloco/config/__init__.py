"""Frozen, validated configuration records.

``AdamWConfig`` holds the inner optimizer's hyper-parameters (the ``config`` argument of
milestones 19-20). ``DiLoCoConfig`` holds a whole experiment: workers, inner steps,
rounds, batch size, model width, outer optimizer and data split. Both are immutable and
validate themselves at construction, so a bad value fails at once with a message that
names the field, never half-way through a run.

Defaults follow the DiLoCo paper (Douillard et al., 2023) where they transfer: K = 8
workers, H = 500 inner steps in the paper (50 here, the small-scale setting), outer
Nesterov momentum with lr 0.7 and momentum 0.9.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diloco._validation import (
    check_bool,
    check_nonneg_int,
    check_positive_int,
    check_probability,
    check_real,
    check_seed,
)
from diloco.config.sections import MODELS, AsyncConfig, FamilyConfig, TransformerShape, check_known_fields
from diloco.core.model_kinds import other_kinds
from diloco.core.registry import INNER_OPTIMIZERS

__all__ = ["AdamWConfig", "MuonConfig", "DiLoCoConfig", "FamilyConfig", "AsyncConfig", "TransformerShape",
           "OUTER_OPTIMIZER_NAMES",
           "INNER_OPTIMIZER_NAMES",
           "MUON_SCALES"]

_DTYPES = ("float32", "float64")
_ENGINES = ("reference", "fast")
_LR_SCHEDULES = ("constant", "cosine")
_SHARD_WEIGHTINGS = ("auto", "uniform", "size")
DROP_RULES = ("carry", "restart")
NONIID_SPLITS = ("label", "topic", "speaker")
# The outer optimizers diloco.core.outer.OUTER_OPTIMIZERS implements (a test checks the two agree).
OUTER_OPTIMIZER_NAMES = ("sgd", "adam", "lion")
# The built-in inner optimizers; DiLoCoConfig checks inner_optimizer against the registry
# (diloco.core.registry.INNER_OPTIMIZERS), which holds these and any a plugin registers.
INNER_OPTIMIZER_NAMES = ("adamw", "muon", "sgd")
# Muon's shape scales (diloco.methods.muon.shape_scale).
MUON_SCALES = ("muon", "moonlight")


def _dtype_name(dtype) -> str:
    """``"float32"`` or ``"float64"`` from a name, a NumPy dtype or a scalar type; ValueError otherwise."""
    try:
        name = np.dtype(dtype).name if dtype is not None else None
    except TypeError:
        name = None
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    return name


def _field_default(name: str):
    """The default of ``DiLoCoConfig``'s field ``name``."""
    spec = DiLoCoConfig.__dataclass_fields__[name]
    return spec.default_factory() if spec.default is dataclasses.MISSING else spec.default


def _field_error(cls_name: str, exc: Exception) -> Exception:
    return type(exc)(f"{cls_name}.{exc}")


@dataclass(frozen=True)
class AdamWConfig:
    """Hyper-parameters of the inner AdamW optimizer (``torch.optim.AdamW`` semantics).

    Attributes
    ----------
    lr : float > 0
        Inner learning rate.
    beta1, beta2 : float in [0, 1)
        Decay rates of the first and second moment estimates.
    eps : float > 0
        Added to ``sqrt(v_hat)`` in the denominator.
    weight_decay : float >= 0
        Decoupled weight decay coefficient; the step multiplies the parameters by
        ``1 - lr * weight_decay`` before the Adam update.
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        try:
            lr = check_real(self.lr, "lr", low=0.0, low_open=True)
            beta1 = check_probability(self.beta1, "beta1")
            beta2 = check_probability(self.beta2, "beta2")
            eps = check_real(self.eps, "eps", low=0.0, low_open=True)
            weight_decay = check_real(self.weight_decay, "weight_decay", low=0.0)
        except (TypeError, ValueError) as exc:
            raise _field_error("AdamWConfig", exc) from None
        if lr * weight_decay >= 1.0:
            raise ValueError(
                f"AdamWConfig.weight_decay: lr * weight_decay must be < 1 so the decay factor stays "
                f"positive, got {lr} * {weight_decay}"
            )
        for name, value in (("lr", lr), ("beta1", beta1), ("beta2", beta2), ("eps", eps),
                            ("weight_decay", weight_decay)):
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class MuonConfig:
    """Hyper-parameters of the Muon inner optimizer (``diloco.methods.muon``, MuLoCo).

    Muon updates the 2-D weight matrices; every other array (the biases) gets AdamW
    with the run's ``DiLoCoConfig.inner`` (``muon_step``'s ``adam`` argument).

    Attributes
    ----------
    lr : float > 0
        Learning rate of the orthogonalised step (Muon's default 0.02).
    momentum : float in [0, 1)
        mu, the momentum of the weight matrices (Muon's default 0.95).
    nesterov : bool
        Orthogonalise ``G + mu B`` (True, the default) or ``B``.
    weight_decay : float >= 0
        Decoupled decay of the weight matrices, ``W (1 - lr wd)``; ``lr * wd < 1``.
    ns_steps : int >= 1
        Newton-Schulz steps (5).
    scale : one of ``MUON_SCALES``
        ``"muon"``: ``sqrt(max(1, fan_out / fan_in))``; ``"moonlight"``: ``0.2 sqrt(max(fan_in, fan_out))``.
    keys : tuple of str, or None
        The arrays Muon updates; None means every 2-D array.
    """

    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    weight_decay: float = 0.0
    ns_steps: int = 5
    scale: str = "muon"
    keys: tuple | None = None

    def __post_init__(self) -> None:
        try:
            lr = check_real(self.lr, "lr", low=0.0, low_open=True)
            momentum = check_real(self.momentum, "momentum", low=0.0, high=1.0, high_open=True)
            nesterov = check_bool(self.nesterov, "nesterov")
            weight_decay = check_real(self.weight_decay, "weight_decay", low=0.0)
            ns_steps = check_positive_int(self.ns_steps, "ns_steps")
            if lr * weight_decay >= 1.0:
                raise ValueError(f"weight_decay: lr * weight_decay must be < 1, got {lr} * {weight_decay}")
            if self.scale not in MUON_SCALES:
                raise ValueError(f"scale must be one of {MUON_SCALES}, got {self.scale!r}")
            keys = self.keys
            if keys is not None:
                if (isinstance(keys, (str, bytes, Mapping)) or not hasattr(keys, "__iter__")
                        or not all(isinstance(k, str) for k in keys)):
                    raise TypeError(f"keys must be a tuple of str or None, got {keys!r}")
                keys = tuple(keys)
        except (TypeError, ValueError) as exc:
            raise _field_error("MuonConfig", exc) from None
        for name, value in (("lr", lr), ("momentum", momentum), ("nesterov", nesterov),
                            ("weight_decay", weight_decay), ("ns_steps", ns_steps), ("keys", keys)):
            object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["keys"] = None if self.keys is None else list(self.keys)
        return out


@dataclass(frozen=True)
class DiLoCoConfig:
    """One DiLoCo (or synchronous-baseline) experiment.

    Attributes
    ----------
    num_workers : int >= 1
        K, the number of simulated workers (data shards).
    inner_steps : int >= 1
        H, the AdamW steps each worker takes between two synchronisations.
    rounds : int >= 1
        Outer rounds (synchronisations). Total steps per worker = ``rounds * inner_steps``.
    batch_size : int >= 1
        Examples per worker per inner step.
    hidden_sizes : tuple of int
        Widths of the hidden layers; the input and output widths come from the data.
        ``()`` gives a linear (softmax-regression) model.
    outer_lr : float > 0
        Outer learning rate (0.7 in the paper). ``outer_lr=1, outer_momentum=0`` is FedAvg.
    outer_momentum : float in [0, 1)
        Outer momentum mu (0.9 in the paper).
    nesterov : bool
        Nesterov momentum (the paper) or plain heavy-ball momentum.
    iid : bool
        IID shards (random split) or non-IID shards (``noniid_split``).
    alpha : float > 0
        Dirichlet concentration for non-IID shards; ignored when ``iid``.
    noniid_split : "label", "topic" or "speaker"
        What non-IID shards skew: ``"label"`` (default, milestone 17: Dirichlet label
        skew), ``"topic"``: the training rows cut into contiguous segments (for the
        char-LM, stretches of the play text), each segment spread over the workers by
        Dirichlet(``alpha``) proportions (``diloco.text.topic_shard_dataset``), or
        ``"speaker"``: each worker the whole speeches of its own speakers of Tiny
        Shakespeare, balanced by characters (``diloco.corpus.speakers``; ``alpha`` unused).
        Needs ``iid=False``.
    seed : int >= 0
        Seeds sharding, initialisation and batch sampling.
    dtype : "float64" or "float32"
        Floating dtype of the parameters (and of the arithmetic).
    inner : AdamWConfig
        The inner optimizer.
    engine : "reference" or "fast"
        Which executor the tools run (``diloco.tools.studies.ablations.trainer``): the milestone
        functions of ``diloco.loop`` (``"reference"``), or ``diloco.engine``, the same
        algorithm with the K workers in flat in-place buffers (``"fast"``). The milestone
        functions themselves ignore it.

    The paper's mechanisms (``diloco.core.mechanisms``); the defaults are the course's
    algorithm, unchanged:

    lr_schedule : "constant" or "cosine"
        Inner lr: constant (default), or linear warmup over ``warmup_steps`` then a cosine
        decay to a tenth of ``inner.lr`` at the last step, as in the paper.
    warmup_steps : int >= 0
        Warmup steps of the cosine schedule (0).
    clip_norm : float > 0 or None
        Clip each inner gradient to this global L2 norm (None: no clipping).
    shard_weighting : "auto", "uniform" or "size"
        Weights of the workers' pseudo-gradients: ``"size"`` weighs each by its shard's
        number of examples, as the paper does for non-IID data; ``"auto"`` (default) is
        ``"size"`` for non-IID shards and ``"uniform"`` for IID ones.
    outer_optimizer : "sgd", "adam" or "lion"
        ``"sgd"`` (default): SGD with ``outer_momentum`` and ``nesterov`` (Nesterov, heavy
        ball, or plain SGD at momentum 0). ``"adam"``: Adam with ``beta1 =
        outer_momentum``, ``outer_beta2`` and ``outer_eps``. ``"lion"``: Lion with ``beta1
        = outer_momentum`` and ``beta2 = outer_beta2`` (``diloco.core.outer``).
    outer_beta2 : float in [0, 1)
        Outer Adam's second-moment decay (0.999).
    outer_eps : float > 0
        Outer Adam's epsilon, large as the paper uses it (0.1).
    drop_prob : float in [0, 1)
        Each round, each worker's outer gradient is dropped with this probability: it is
        left out of the average (0); ``drop_rule`` says where the worker goes on from.
    drop_rule : "carry" or "restart"
        A dropped worker's next round starts from its own parameters (``"carry"``, the
        default: its next pseudo-gradient includes the work the server missed) or from
        the new global model, like the workers that got through (``"restart"``: its
        round's work is lost). Needs ``drop_prob > 0`` for ``"restart"``.
    record_similarity : bool
        Add ``pseudo_grad_cosine`` (mean pairwise cosine between the workers' own
        pseudo-gradients) to every DiLoCo record (False).
    inner_optimizer : "adamw", "muon", "sgd" or a registered name
        The workers' (and the baseline's) optimizer, a name in
        ``diloco.core.registry.INNER_OPTIMIZERS`` (``diloco.core.inner``): AdamW with
        ``inner`` (default, the milestones), Muon with ``muon`` on the weight matrices and
        AdamW with ``inner`` on the biases (MuLoCo; ``diloco.methods.muon``), or SGD with
        heavy-ball momentum ``inner.beta1``, lr ``inner.lr`` and L2 weight decay
        ``inner.weight_decay``. Muon and SGD run through ``diloco.core``, never the
        milestone functions; so does an optimizer a plugin registers (it reads its
        hyper-parameters from ``inner``).
    muon : MuonConfig
        Muon's hyper-parameters; off their defaults only with ``inner_optimizer="muon"``.
    family : FamilyConfig
        The nested section of the post-2023 family (``diloco.config.sections``): wire
        format and error feedback, Streaming DiLoCo's fragments, overlap and mixing, eager
        updates, the simulated network. The default is plain DiLoCo. The milestone
        functions ignore it; ``diloco.core`` runs it.
    asynchrony : AsyncConfig
        The workers' speeds and asynchronous DiLoCo (``diloco.config.sections.AsyncConfig``,
        Liu et al. 2024); the default is synchronous DiLoCo with equal workers.
    model : "mlp" or "transformer"
        The MLP of milestones 01-10 with ``hidden_sizes`` (default), or a causal
        transformer language model (``diloco.models``) with ``transformer``'s shape, for
        the character-level task only (index windows and a ``diloco.text.OneHot``
        encoder, whose vocabulary and window length it takes). The transformer runs
        through ``diloco.core`` (``diloco.core.model_seam``), never the milestone model.
    transformer : TransformerShape
        The transformer's width, heads, blocks, MLP ratio and output tying; off its
        defaults only with ``model="transformer"``.
    """

    num_workers: int = 8
    inner_steps: int = 50
    rounds: int = 10
    batch_size: int = 32
    hidden_sizes: tuple[int, ...] = (128,)
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    nesterov: bool = True
    iid: bool = True
    alpha: float = 0.5
    seed: int = 0
    dtype: str = "float64"
    inner: AdamWConfig = field(default_factory=AdamWConfig)
    engine: str = "reference"
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    clip_norm: float | None = None
    shard_weighting: str = "auto"
    outer_optimizer: str = "sgd"
    outer_beta2: float = 0.999
    outer_eps: float = 0.1
    drop_prob: float = 0.0
    drop_rule: str = "carry"
    noniid_split: str = "label"
    record_similarity: bool = False
    inner_optimizer: str = "adamw"
    muon: MuonConfig = field(default_factory=MuonConfig)
    family: FamilyConfig = field(default_factory=FamilyConfig)
    asynchrony: AsyncConfig = field(default_factory=AsyncConfig)
    model: str = "mlp"
    transformer: TransformerShape = field(default_factory=TransformerShape)

    def __post_init__(self) -> None:
        try:
            sizes = {name: check_positive_int(getattr(self, name), name)
                     for name in ("num_workers", "inner_steps", "rounds", "batch_size")}
            if isinstance(self.hidden_sizes, (str, bytes, Mapping, Set)) or not hasattr(self.hidden_sizes, "__iter__"):
                raise TypeError(f"hidden_sizes must be a tuple of positive ints, got {self.hidden_sizes!r}")
            hidden = tuple(self.hidden_sizes)
            for i, width in enumerate(hidden):
                if check_positive_int(width, f"hidden_sizes[{i}]") > 2**40:
                    raise ValueError(f"hidden_sizes[{i}] must be at most 2**40 (no layer that wide fits in memory), "
                                     f"got {width}")
            object.__setattr__(self, "hidden_sizes", tuple(int(w) for w in hidden))  # before _check_model reads it
            outer_lr = check_real(self.outer_lr, "outer_lr", low=0.0, low_open=True)
            outer_momentum = check_probability(self.outer_momentum, "outer_momentum")
            flags = {"nesterov": check_bool(self.nesterov, "nesterov"), "iid": check_bool(self.iid, "iid")}
            alpha = check_real(self.alpha, "alpha", low=0.0, low_open=True)
            seed = check_seed(self.seed, "seed")
            dtype = _dtype_name(self.dtype)
            if self.engine not in _ENGINES:
                raise ValueError(f"engine must be one of {_ENGINES}, got {self.engine!r}")
            if not isinstance(self.inner, AdamWConfig):
                raise TypeError(f"inner must be an AdamWConfig, got {type(self.inner).__name__}")
            if not isinstance(self.family, FamilyConfig):
                raise TypeError(f"family must be a FamilyConfig, got {type(self.family).__name__}")
            if not isinstance(self.asynchrony, AsyncConfig):
                raise TypeError(f"asynchrony must be an AsyncConfig, got {type(self.asynchrony).__name__}")
            mechanisms = self._check_mechanisms()
        except (TypeError, ValueError) as exc:
            raise _field_error("DiLoCoConfig", exc) from None
        for name, value in {**mechanisms, **sizes, **flags, "seed": seed, "dtype": dtype}.items():
            object.__setattr__(self, name, value)  # NumPy ints and dtypes become plain ints and names
        object.__setattr__(self, "outer_lr", outer_lr)
        object.__setattr__(self, "outer_momentum", outer_momentum)
        object.__setattr__(self, "alpha", alpha)

    def _check_mechanisms(self) -> dict[str, Any]:
        """Validate the mechanism fields; return the normalised values."""
        if self.lr_schedule not in _LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {_LR_SCHEDULES}, got {self.lr_schedule!r}")
        warmup_steps = check_nonneg_int(self.warmup_steps, "warmup_steps")
        if self.warmup_steps and self.lr_schedule == "constant":
            raise ValueError("warmup_steps needs lr_schedule='cosine' (the constant schedule has no warmup)")
        clip = None if self.clip_norm is None else check_real(self.clip_norm, "clip_norm", low=0.0, low_open=True)
        if self.shard_weighting not in _SHARD_WEIGHTINGS:
            raise ValueError(f"shard_weighting must be one of {_SHARD_WEIGHTINGS}, got {self.shard_weighting!r}")
        record_similarity = check_bool(self.record_similarity, "record_similarity")
        self._check_optimizers()
        drop_prob = self._check_drops()
        self._check_model()
        if self.noniid_split not in NONIID_SPLITS:
            raise ValueError(f"noniid_split must be one of {NONIID_SPLITS}, got {self.noniid_split!r}")
        if self.noniid_split != "label" and self.iid:
            raise ValueError(f"noniid_split={self.noniid_split!r} needs iid=False (IID shards are a random split)")
        return {
            "warmup_steps": warmup_steps,
            "record_similarity": record_similarity,
            "clip_norm": clip,
            "outer_beta2": check_probability(self.outer_beta2, "outer_beta2"),
            "outer_eps": check_real(self.outer_eps, "outer_eps", low=0.0, low_open=True),
            "drop_prob": drop_prob,
        }

    def _check_optimizers(self) -> None:
        """The outer and inner optimizers' names (the inner one against ``diloco.core.registry``), and Muon's
        settings only with Muon."""
        if self.outer_optimizer not in OUTER_OPTIMIZER_NAMES:
            raise ValueError(f"outer_optimizer must be one of {OUTER_OPTIMIZER_NAMES}, got {self.outer_optimizer!r}")
        INNER_OPTIMIZERS.check(self.inner_optimizer, "inner_optimizer")
        if not isinstance(self.muon, MuonConfig):
            raise TypeError(f"muon must be a MuonConfig, got {type(self.muon).__name__}")
        if self.inner_optimizer != "muon" and self.muon != MuonConfig():
            raise ValueError(f"muon settings need inner_optimizer='muon' ({self.inner_optimizer} would ignore them)")

    def _check_drops(self) -> float:
        """``drop_prob`` and ``drop_rule``; returns the probability as a float."""
        drop_prob = check_probability(self.drop_prob, "drop_prob")
        if self.drop_rule not in DROP_RULES:
            raise ValueError(f"drop_rule must be one of {DROP_RULES}, got {self.drop_rule!r}")
        if self.drop_rule != "carry" and drop_prob == 0:
            raise ValueError(f"drop_rule={self.drop_rule!r} needs drop_prob > 0 (no worker is ever dropped)")
        return drop_prob

    def _check_model(self) -> None:
        """The model's name, and no setting of another model's (``diloco.core.model_kinds.MODEL_KINDS``:
        the section each owns)."""
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if not isinstance(self.transformer, TransformerShape):
            raise TypeError(f"transformer must be a TransformerShape, got {type(self.transformer).__name__}")
        for kind in other_kinds(self):  # another model's section stays at its default
            if getattr(self, kind.section) != _field_default(kind.section):
                raise ValueError(kind.section_error)

    @property
    def total_steps(self) -> int:
        """Inner steps per worker over the whole run, ``rounds * inner_steps``."""
        return self.rounds * self.inner_steps

    def replace(self, **changes: Any) -> DiLoCoConfig:
        """A copy with some fields changed (validated again).

        Its sections (``inner``, ``muon``, ``family``, ``asynchrony``, ``transformer``) may be dicts.
        """
        if isinstance(changes.get("inner"), dict):
            changes["inner"] = dataclasses.replace(self.inner, **changes["inner"])
        if isinstance(changes.get("muon"), dict):
            changes["muon"] = dataclasses.replace(self.muon, **changes["muon"])
        if isinstance(changes.get("family"), dict):
            changes["family"] = dataclasses.replace(self.family, **changes["family"])
        if isinstance(changes.get("asynchrony"), dict):
            changes["asynchrony"] = dataclasses.replace(self.asynchrony, **changes["asynchrony"])
        if isinstance(changes.get("transformer"), dict):
            changes["transformer"] = dataclasses.replace(self.transformer, **changes["transformer"])
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; ``DiLoCoConfig.from_dict`` inverts it."""
        out = dataclasses.asdict(self)
        out["hidden_sizes"] = list(self.hidden_sizes)
        out["asynchrony"] = self.asynchrony.to_dict()
        out["muon"] = self.muon.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiLoCoConfig:
        """Build from a dict such as a parsed ``config.json``; unknown keys raise ``ValueError``."""
        check_known_fields(cls, data, "config")
        data = dict(data)
        if "inner" in data:
            inner = data["inner"]
            check_known_fields(AdamWConfig, inner, "DiLoCoConfig.inner")
            data["inner"] = AdamWConfig(**inner)
        if "muon" in data:
            check_known_fields(MuonConfig, data["muon"], "DiLoCoConfig.muon")
            data["muon"] = MuonConfig(**data["muon"])
        if "family" in data:
            data["family"] = FamilyConfig.from_dict(data["family"])
        if "asynchrony" in data:
            data["asynchrony"] = AsyncConfig.from_dict(data["asynchrony"])
        if "transformer" in data:
            data["transformer"] = TransformerShape.from_dict(data["transformer"])
        if "hidden_sizes" in data and isinstance(data["hidden_sizes"], list):
            data["hidden_sizes"] = tuple(data["hidden_sizes"])
        return cls(**data)
