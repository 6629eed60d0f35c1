"""``FamilyConfig``: the post-2023 DiLoCo family's settings, a nested section of ``DiLoCoConfig``.

``DiLoCoConfig.family`` holds one (default: every field at its default, which is plain
DiLoCo), so a run's ``config.json`` records every setting and ``--config`` / ``--resume``
restore them. It lives here, below ``diloco.config``, which re-exports it, so the core's
modules (which import the milestone modules) can import it without a circle.

``CommSpec`` (how outer gradients travel) and the wire ``FORMATS`` live here too, for
the same reason; ``diloco.core.comm`` and ``diloco.core.quantize`` import them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from dataclasses import dataclass
from typing import Any

from diloco._validation import check_nonneg_int, check_positive_int, check_real
from diloco.core.model_kinds import MODEL_KINDS, model_kind
from diloco.core.registry import CODECS

__all__ = ["FamilyConfig", "CommSpec", "WIRE_FIELDS", "FORMATS", "PATTERNS", "TRANSFORMS", "SPARSE_BITS",
           "MAX_DCT_CHUNK", "BUILTIN_CODECS", "parse_compress",
           "check_known_fields", "AsyncConfig", "MODELS", "TransformerShape"]

# Wire formats of outer gradients (diloco.core.quantize).
FORMATS = ("float64", "float32", "float16", "bfloat16", "int8", "fp4")
# Sparse outer gradients (diloco.methods.sparse): the transforms before top-k, the value
# widths besides the dtype's own (None), and the largest DCT chunk (a C x C matrix product).
TRANSFORMS = ("none", "dct")
SPARSE_BITS = (None, 2)
MAX_DCT_CHUNK = 1024
# The codecs the wire-format fields choose (diloco.core.codecs); CODECS holds them and any a plugin registers.
BUILTIN_CODECS = ("native", "dense", "topk")


def check_known_fields(cls, data, what: str) -> None:
    """Refuse ``data`` (for ``cls.from_dict``) unless it is a dict of ``cls``'s field names only."""
    if not isinstance(data, dict):
        raise TypeError(f"{what} must be a JSON object, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        guesses = {name: difflib.get_close_matches(str(name), sorted(known), n=1, cutoff=0.6) for name in unknown}
        hints = [f"{guess[0]!r} for {name!r}" for name, guess in guesses.items() if guess]
        if hints:  # a typo: the nearest field, not the whole list
            raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; did you mean {', '.join(hints)}?")
        raise ValueError(f"{cls.__name__}: unknown field(s) {unknown}; known fields are {sorted(known)}")


PATTERNS = ("strided", "sequential")


def _field_error(exc: Exception, owner) -> Exception:
    return type(exc)(f"{type(owner).__name__}.{exc}")


@dataclass(frozen=True)
class CommSpec:
    """How outer gradients travel: the wire-format fields, declared once.

    ``FamilyConfig`` inherits them (``DiLoCoConfig.family.comm_dtype``, ...), the flags and
    the baseline's refusal take their names from ``dataclasses.fields(CommSpec)``, and the
    codecs (``diloco.core.codecs``) read them.

    Attributes
    ----------
    comm_dtype : str or None
        Wire format of outer gradients (``quantize.FORMATS``); None = the params' dtype.
    comm_block : int >= 0
        Values per scale block of int8/fp4 (and per unit of a payload); 0 = per tensor.
    sign_prune : float in [0, 1)
        Fraction of each outer gradient's smallest entries dropped (DiLoCo, Table 6).
    error_feedback : bool
        Carry each worker's encoding error into its next outer gradient.
    topk : float in (0, 1] or None
        Sparse outer gradients (SparseLoCo, DeMo; ``diloco.methods.sparse``): the fraction
        of every chunk of each outer gradient a worker sends; None = dense. Not with
        ``comm_dtype`` or ``sign_prune`` (the payload has its own widths).
    topk_chunk : int >= 1
        C, values per chunk of the flattened tensor (4096; at most 1024 with the DCT).
    topk_bits : None or 2
        The kept values' width: the params' dtype (None), or 2-bit codes with one scale
        per chunk.
    topk_transform : "none" or "dct"
        Top-k of the values (SparseLoCo) or of their chunked orthonormal DCT-II (DeMo).
    topk_decay : float in [0, 1]
        beta, the error-feedback buffer's decay, ``e <- beta e + Delta`` (1; needs
        ``error_feedback``).
    compress : str or None
        A codec by name, ``"NAME"`` or ``"NAME:key=value,key=value"`` with the options that
        codec owns (``parse_compress``): an entry of ``diloco.core.registry.CODECS``, built
        in (``native``, ``dense``, ``topk``: their settings are the fields above) or
        registered by a plugin (then the fields above stay at their defaults). None: the
        fields above choose the built-in codec.
    """

    comm_dtype: str | None = None
    comm_block: int = 32
    sign_prune: float = 0.0
    error_feedback: bool = False
    topk: float | None = None
    topk_chunk: int = 4096
    topk_bits: int | None = None
    topk_transform: str = "none"
    topk_decay: float = 1.0
    compress: str | None = None

    def __post_init__(self) -> None:
        try:
            if self.comm_dtype is not None and self.comm_dtype not in FORMATS:
                raise ValueError(f"comm_dtype must be None or one of {FORMATS}, got {self.comm_dtype!r}")
            check_nonneg_int(self.comm_block, "comm_block")
            prune = check_real(self.sign_prune, "sign_prune", low=0.0, high=1.0, high_open=True)
            if not isinstance(self.error_feedback, bool):
                raise TypeError(f"error_feedback must be a bool, got {self.error_feedback!r}")
            topk, topk_decay = self._check_topk()
            self._check_compress()
        except (TypeError, ValueError) as exc:
            raise _field_error(exc, self) from None
        for name, value in (("sign_prune", prune), ("topk", topk), ("topk_decay", topk_decay)):
            object.__setattr__(self, name, value)

    def _check_topk(self) -> tuple:
        """The sparse fields, checked (each error names its field); returns ``(topk, topk_decay)``."""
        chunk = check_positive_int(self.topk_chunk, "topk_chunk")
        if self.topk_bits not in SPARSE_BITS or isinstance(self.topk_bits, bool):
            raise ValueError(f"topk_bits must be one of {SPARSE_BITS}, got {self.topk_bits!r}")
        if self.topk_transform not in TRANSFORMS:
            raise ValueError(f"topk_transform must be one of {TRANSFORMS}, got {self.topk_transform!r}")
        decay = check_real(self.topk_decay, "topk_decay", low=0.0, high=1.0)
        if self.topk is None:
            changed = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(CommSpec)
                       if f.name.startswith("topk_") and getattr(self, f.name) != f.default]
            if changed:
                raise ValueError(f"{', '.join(changed)} configure(s) sparse outer gradients: set topk too")
            return None, decay
        topk = check_real(self.topk, "topk", low=0.0, low_open=True, high=1.0)
        if self.topk_transform == "dct" and chunk > MAX_DCT_CHUNK:
            raise ValueError(f"topk_chunk must be <= {MAX_DCT_CHUNK} with topk_transform='dct' (the DCT of a chunk is "
                             f"a C x C matrix product), got {chunk}")
        if self.comm_dtype is not None or self.sign_prune:
            raise ValueError("topk (sparse outer gradients) cannot be combined with comm_dtype or sign_prune: the "
                             "sparse payload has its own value widths (topk_bits)")
        if decay != 1.0 and not self.error_feedback:
            raise ValueError(f"topk_decay={decay!r} decays the error-feedback buffer: it needs error_feedback=True")
        return topk, decay


    def _check_compress(self) -> None:
        """``compress`` names a registered codec; a built-in one takes its settings from the other fields,
        another one its own options only."""
        if self.compress is None:
            return
        name, options = parse_compress(self.compress)
        CODECS.check(name, "compress")
        legacy = [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(CommSpec)
                  if f.name in ("comm_dtype", "sign_prune", "topk") and getattr(self, f.name) != f.default]
        if name not in BUILTIN_CODECS:
            if legacy:
                raise ValueError(f"{', '.join(legacy)} configure(s) the built-in codecs, not compress={name!r}: "
                                 f"give that codec its own options, compress='{name}:key=value'")
            return
        if options:
            raise ValueError(f"compress={self.compress!r}: the built-in codec {name!r} takes no options; its "
                             f"settings are comm_dtype, sign_prune and topk (and their flags)")
        wanted = "topk" if self.topk is not None else "dense" if legacy else "native"
        if name != wanted:
            chosen_by = ", ".join(legacy) or "no comm_dtype, sign_prune or topk"
            raise ValueError(f"compress={name!r} disagrees with the other wire fields ({chosen_by}), which choose "
                             f"the {wanted!r} codec")


def parse_compress(text: str) -> tuple[str, dict]:
    """``"randk:fraction=0.1,seed=3"`` -> ``("randk", {"fraction": 0.1, "seed": 3})``: a codec's name and
    its options, each value a JSON number, true/false/null or else the text itself."""
    if not isinstance(text, str) or not text:
        raise TypeError(f"compress must be a codec's name such as 'randk' or 'randk:fraction=0.1', got {text!r}")
    name, _, rest = text.partition(":")
    options = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"compress options are key=value pairs separated by commas, got {item!r} in {text!r}")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value.strip()
    return name.strip(), options


WIRE_FIELDS = tuple(f.name for f in dataclasses.fields(CommSpec))  # the wire format's fields, in order


@dataclass(frozen=True)
class FamilyConfig(CommSpec):
    """Compression (the ``CommSpec`` fields it inherits), Streaming DiLoCo, eager updates and
    the simulated network.

    Attributes
    ----------
    comm_dtype, comm_block, sign_prune, error_feedback, topk, topk_chunk, topk_bits, topk_transform, topk_decay,
    compress
        The wire format (``CommSpec``).
    fragments : int >= 1
        P, fragments of Streaming DiLoCo (1 = the whole model at once).
    pattern : "strided" or "sequential"
        Which layers form a fragment (Streaming DiLoCo's two patterns).
    overlap : int >= 0 or None
        tau, inner steps a fragment's communication overlaps with compute. For eager
        updates: 0 (no overlap, = DiLoCo) or the default, one whole outer step (H).
    mix : float in (0, 1]
        Weight of the received global fragment: ``mix * global + (1 - mix) * local``
        (the paper's alpha weights the local side: ``alpha_paper = 1 - mix``).
    eager : bool
        Eager updates (Kale et al., 2025).
    bandwidth : float or None
        Simulated link bandwidth in bit/s (None: no network simulation).
    latency : float >= 0
        Simulated latency of one message, seconds.
    step_time : float > 0 or None
        Compute seconds per inner step for the simulation; None = measured.
    """

    fragments: int = 1
    pattern: str = "strided"
    overlap: int | None = None
    mix: float = 1.0
    eager: bool = False
    bandwidth: float | None = None
    latency: float = 0.0
    step_time: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            if not isinstance(self.eager, bool):
                raise TypeError(f"eager must be a bool, got {self.eager!r}")
            check_positive_int(self.fragments, "fragments")
            if self.pattern not in PATTERNS:
                raise ValueError(f"pattern must be one of {PATTERNS}, got {self.pattern!r}")
            if self.overlap is not None:
                check_nonneg_int(self.overlap, "overlap")
            mix = check_real(self.mix, "mix", low=0.0, high=1.0, low_open=True)
            if self.eager and self.fragments != 1:
                raise ValueError("eager updates run on whole-model DiLoCo here: fragments must be 1 with eager")
            bandwidth = None if self.bandwidth is None else check_real(self.bandwidth, "bandwidth", low=0.0,
                                                                        low_open=True)
            latency = check_real(self.latency, "latency", low=0.0)
            step_time = None if self.step_time is None else check_real(self.step_time, "step_time", low=0.0,
                                                                        low_open=True)
        except (TypeError, ValueError) as exc:
            raise _field_error(exc, self) from None
        for name, value in (("mix", mix), ("bandwidth", bandwidth), ("latency", latency), ("step_time", step_time)):
            object.__setattr__(self, name, value)

    @property
    def comm(self) -> CommSpec:
        """The ``CommSpec`` of the wire-format fields."""
        return CommSpec(**{name: getattr(self, name) for name in WIRE_FIELDS})

    @property
    def simulates_network(self) -> bool:
        return self.bandwidth is not None

    def tau(self, inner_steps: int) -> int:
        """The overlap in inner steps: ``overlap``, or by default 0 (H for eager updates)."""
        if self.overlap is not None:
            return self.overlap
        return inner_steps if self.eager else 0

    def check_against(self, config) -> None:
        """Raise ``ValueError`` unless these settings fit ``config`` (a ``DiLoCoConfig``).

        P must not exceed the model's layers (the MLP's ``len(hidden_sizes) + 1``, the
        transformer's ``n_layers + 2`` blocks) nor H; tau < H for
        Streaming DiLoCo; tau in {0, H} for eager updates. Every other mechanism of
        ``DiLoCoConfig`` composes with these settings (``diloco.core``).
        """
        inner_steps = config.inner_steps
        layers, source = model_kind(config).layers(config)
        if self.fragments > layers:
            raise ValueError(f"fragments ({self.fragments}) must not exceed the model's layers ({layers}, "
                             f"from {source})")
        if self.fragments > inner_steps:
            raise ValueError(f"fragments ({self.fragments}) must not exceed inner_steps ({inner_steps})")
        tau = self.tau(inner_steps)
        if self.eager and tau not in (0, inner_steps):
            raise ValueError(f"eager updates overlap one whole outer step: overlap must be 0 or H={inner_steps}, "
                             f"got {tau}")
        if not self.eager and tau >= inner_steps:
            raise ValueError(f"overlap tau ({tau}) must be smaller than inner_steps ({inner_steps})")

    def algorithm_is_diloco(self) -> bool:
        """True when training is plain DiLoCo (the network fields only annotate records)."""
        plain = FamilyConfig(bandwidth=self.bandwidth, latency=self.latency, step_time=self.step_time)
        return dataclasses.replace(self, overlap=self.overlap or None) == plain

    def replace(self, **changes: Any) -> FamilyConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FamilyConfig:
        """Build from a dict (``DiLoCoConfig.to_dict()["family"]``); unknown keys raise ``ValueError``."""
        check_known_fields(cls, data, "DiLoCoConfig.family")
        return cls(**data)


# --- Asynchronous DiLoCo with heterogeneous workers (Liu et al. 2024): the `asynchrony` section ---

def _async_error(exc: Exception) -> Exception:
    return type(exc)(f"AsyncConfig.{exc}")


def _check_step_times(times) -> tuple | None:
    """``step_times`` as a non-empty tuple of positive floats, or None."""
    if times is None:
        return None
    if isinstance(times, (str, bytes, dict)) or not hasattr(times, "__iter__"):
        raise TypeError(f"step_times must be a tuple of seconds per step, got {times!r}")
    times = tuple(check_real(t, f"step_times[{i}]", low=0.0, low_open=True) for i, t in enumerate(times))
    if not times:
        raise ValueError("step_times must hold one time per worker, got none")
    return times


@dataclass(frozen=True)
class AsyncConfig:
    """The workers' speeds and the asynchronous schedule (``diloco.methods.asynchrony``).

    The default (every field at its default) is synchronous DiLoCo with equal workers and
    no simulated clock. Speeds alone (``step_times``, ``speed_spread`` or a straggler)
    keep DiLoCo synchronous and add its simulated time to every record, each round
    waiting for the slowest worker; ``asynchronous`` applies each worker's
    pseudo-gradient when it arrives.

    Attributes
    ----------
    asynchronous : bool
        Apply every group of arrivals to the current global model (Liu et al. 2024).
    step_times : tuple of float > 0, or None
        Seconds per inner step of each worker (one per worker); None: 1 s each, or drawn.
    speed_spread : float >= 0
        Draw ``c_k = exp(spread z_k)`` (``draw_step_times``) from a generator seeded by the
        run's ``seed`` alone (never the run's own stream); 0: equal workers.
    straggler : int >= 0 or None
        The index of a worker ``straggler_factor`` times slower.
    straggler_factor : float > 0
    delayed_nesterov : int >= 0
        N, delayed Nesterov momentum: the outer momentum step every N arrivals (0: off,
        plain asynchronous outer steps).
    dynamic_local_steps : bool
        DyLU: worker k takes ``H_k = floor(H v_k / max v)`` inner steps.
    """

    asynchronous: bool = False
    step_times: tuple[float, ...] | None = None
    speed_spread: float = 0.0
    straggler: int | None = None
    straggler_factor: float = 4.0
    delayed_nesterov: int = 0
    dynamic_local_steps: bool = False

    def __post_init__(self) -> None:
        try:
            for name in ("asynchronous", "dynamic_local_steps"):
                if not isinstance(getattr(self, name), bool):
                    raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
            times = _check_step_times(self.step_times)
            spread = check_real(self.speed_spread, "speed_spread", low=0.0)
            if self.straggler is not None:
                check_nonneg_int(self.straggler, "straggler")
            factor = check_real(self.straggler_factor, "straggler_factor", low=0.0, low_open=True)
            check_nonneg_int(self.delayed_nesterov, "delayed_nesterov")
            self._check_combinations(times, spread, factor)
        except (TypeError, ValueError) as exc:
            raise _async_error(exc) from None
        for name, value in (("step_times", times), ("speed_spread", spread), ("straggler_factor", factor)):
            object.__setattr__(self, name, value)

    def _check_combinations(self, times, spread: float, factor: float) -> None:
        """The fields that only mean something together."""
        if self.straggler is None and factor != 4.0:
            raise ValueError("straggler_factor needs straggler (the worker it slows down)")
        if times is not None and spread > 0:
            raise ValueError("give step_times or speed_spread, not both")
        if not self.asynchronous and (self.delayed_nesterov or self.dynamic_local_steps):
            raise ValueError("delayed_nesterov and dynamic_local_steps are rules of the asynchronous schedule: "
                             "set asynchronous=True")

    @property
    def simulates_speeds(self) -> bool:
        """True when the workers have speeds (so the records carry the simulated clock)."""
        return self.asynchronous or self.step_times is not None or self.speed_spread > 0 or self.straggler is not None

    def check_against(self, config) -> None:
        """Raise ``ValueError`` unless these settings fit ``config`` (a ``DiLoCoConfig``), in one line."""
        if self.step_times is not None and len(self.step_times) != config.num_workers:
            raise ValueError(f"asynchrony.step_times has {len(self.step_times)} times for {config.num_workers} "
                             f"workers: give one per worker")
        if self.straggler is not None and self.straggler >= config.num_workers:
            raise ValueError(f"asynchrony.straggler must be a worker index in [0, {config.num_workers}), "
                             f"got {self.straggler}")
        if not self.asynchronous:
            return
        family = config.family
        for name, bad in (("fragments", family.fragments != 1), ("overlap", bool(family.overlap)),
                          ("eager", family.eager)):
            if bad:
                raise ValueError(f"asynchronous DiLoCo with {name} is not defined here (each arrival updates the "
                                 f"whole model at once): use {name} at its default with asynchronous")
        if self.delayed_nesterov and config.drop_prob > 0:
            raise ValueError("delayed Nesterov with drop_prob > 0 is not defined here (it counts arrivals, and a "
                             "dropped one carries nothing): use drop_prob=0 with delayed_nesterov")
        if self.delayed_nesterov and config.outer_optimizer != "sgd":
            raise ValueError(f"delayed Nesterov is a rule of the SGD/Nesterov outer optimizer, not of "
                             f"outer_optimizer={config.outer_optimizer!r}: use --outer-optimizer sgd")

    def replace(self, **changes: Any) -> AsyncConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["step_times"] = None if self.step_times is None else list(self.step_times)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AsyncConfig:
        """Build from a dict (``DiLoCoConfig.to_dict()["asynchrony"]``); unknown keys raise ``ValueError``."""
        check_known_fields(cls, data, "DiLoCoConfig.asynchrony")
        data = dict(data)
        if isinstance(data.get("step_times"), list):
            data["step_times"] = tuple(data["step_times"])
        return cls(**data)


# --- The model: the MLP (milestones 01-10) or a causal transformer LM (diloco.models) ---

MODELS = tuple(MODEL_KINDS)


@dataclass(frozen=True)
class TransformerShape:
    """The transformer's shape: ``DiLoCoConfig.transformer``, read only with ``model="transformer"``.

    The vocabulary and the context come from the data (the text's characters and its
    window length ``--context``) and the dtype is the run's, so they are not repeated
    here (``diloco.core.model_seam`` builds the ``TransformerConfig``). The default is
    the smallest faithful model of ``docs/transformer.md``: 2 pre-LayerNorm blocks,
    d = 64, 4 heads of 16, an MLP of 4 d, the output head tied to the token embedding.
    """

    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    mlp_ratio: int = 4
    tied: bool = True

    def __post_init__(self) -> None:
        try:
            sizes = {name: check_positive_int(getattr(self, name), name)
                     for name in ("d_model", "n_heads", "n_layers", "mlp_ratio")}
            if sizes["d_model"] % sizes["n_heads"]:
                raise ValueError(f"n_heads must divide d_model ({sizes['d_model']}), got {sizes['n_heads']}")
            if not isinstance(self.tied, bool):
                raise TypeError(f"tied must be a bool, got {self.tied!r}")
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"TransformerShape.{exc}") from None
        for name, value in sizes.items():
            object.__setattr__(self, name, value)

    def blocks(self) -> int:
        """Streaming DiLoCo's fragment units: the embeddings, each block, the head (``n_layers + 2``)."""
        return self.n_layers + 2

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerShape:
        """Build from a dict (``DiLoCoConfig.to_dict()["transformer"]``); unknown keys raise ``ValueError``."""
        check_known_fields(cls, data, "DiLoCoConfig.transformer")
        return cls(**data)
