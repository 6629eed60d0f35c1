"""The family's part of a checkpoint: ``RunState.extra`` as named arrays and a JSON record.

``RunState.extra`` (``diloco.core.driver``) holds what DiLoCo's family carries across
rounds besides the params, optimizer states and generator: each worker's error-feedback
residuals, the fragments received but not yet merged (Streaming DiLoCo with overlap), and
the eager workers' outer copies. ``pack_extra`` turns it into ``(arrays, meta)`` for the
``.npz`` and the manifest; ``unpack_extra`` inverts it.
"""

from __future__ import annotations

from diloco.outer import OuterState

__all__ = ["pack_extra", "unpack_extra"]


def _put(arrays: dict, prefix: str, params: dict) -> None:
    arrays.update({f"{prefix}.{key}": value for key, value in params.items()})


def _take(arrays: dict, prefix: str) -> dict:
    return {name[len(prefix) + 1:]: value for name, value in arrays.items() if name.startswith(prefix + ".")}


def pack_extra(extra: dict) -> tuple[dict, dict]:
    """``(arrays, meta)`` of ``extra`` (arrays named ``extra.*``)."""
    arrays, meta = {}, {"residuals": [], "pending": []}
    for k, residual in sorted(extra.get("residuals", {}).items()):
        if residual:
            meta["residuals"].append(int(k))
            _put(arrays, f"extra.residual{k}", residual)
    for i, (step, received, targets) in enumerate(extra.get("pending", [])):
        meta["pending"].append({"step": int(step), "targets": [int(t) for t in targets]})
        _put(arrays, f"extra.pending{i}", received)
    if extra.get("eager") is not None:
        meta["eager"] = _pack_eager(extra["eager"], arrays)
    if extra.get("async") is not None:  # asynchronous DiLoCo: each worker's start snapshot, the clock, delayed Nesterov
        meta["async"] = _pack_async(extra["async"], arrays)
    return arrays, meta


def _pack_eager(eager: dict, arrays: dict) -> dict:
    """Eager updates: each worker's params and outer state, the previous local and global deltas."""
    meta = {"workers": sorted(int(k) for k in eager["thetas"]),
            "outer_steps": {str(k): int(s.step) for k, s in eager["outer"].items()},
            "second_moment": any(s.second_moment is not None for s in eager["outer"].values()),
            "previous": sorted(int(k) for k in eager["previous_local"]),
            "has_global": eager["previous_global"] is not None}
    for k in eager["thetas"]:
        _put(arrays, f"extra.theta{k}", eager["thetas"][k])
        _put(arrays, f"extra.outer{k}.m", eager["outer"][k].momentum)
        if eager["outer"][k].second_moment is not None:
            _put(arrays, f"extra.outer{k}.v", eager["outer"][k].second_moment)
    for k, delta in eager["previous_local"].items():
        _put(arrays, f"extra.previous{k}", delta)
    if eager["previous_global"] is not None:
        _put(arrays, "extra.previous_global", eager["previous_global"])
    return meta


def _pack_async(clock: dict, arrays: dict) -> dict:
    """Asynchronous DiLoCo: each worker's start snapshot and version, the clock, delayed Nesterov's held deltas."""
    meta = {"versions": {str(k): int(v) for k, (v, _) in clock["starts"].items()},
            "version": int(clock["version"]), "now": float(clock["now"]), "delayed": None}
    for k, (_, start) in clock["starts"].items():
        _put(arrays, f"extra.start{k}", start)
    delayed = clock["delayed"]
    if delayed is not None:
        meta["delayed"] = {"arrivals": int(delayed["arrivals"]), "counts": [int(c) for c, _ in delayed["pending"]]}
        _put(arrays, "extra.anchor", delayed["anchor"])
        for i, (_, delta) in enumerate(delayed["pending"]):
            _put(arrays, f"extra.held{i}", delta)
    return meta


def unpack_extra(arrays: dict, meta: dict | None) -> dict:
    """The ``RunState.extra`` that ``pack_extra`` wrote (``{}`` for a checkpoint without one)."""
    if not meta:
        return {}
    extra = {"residuals": {k: _take(arrays, f"extra.residual{k}") for k in meta.get("residuals", [])},
             "pending": [(item["step"], _take(arrays, f"extra.pending{i}"), tuple(item["targets"]))
                         for i, item in enumerate(meta.get("pending", []))]}
    eager = meta.get("eager")
    if eager is not None:
        outer = {}
        for k in eager["workers"]:
            second = _take(arrays, f"extra.outer{k}.v") if eager["second_moment"] else None
            outer[k] = OuterState(_take(arrays, f"extra.outer{k}.m"), second, eager["outer_steps"][str(k)])
        extra["eager"] = {"thetas": {k: _take(arrays, f"extra.theta{k}") for k in eager["workers"]}, "outer": outer,
                          "previous_local": {k: _take(arrays, f"extra.previous{k}") for k in eager["previous"]},
                          "previous_global": _take(arrays, "extra.previous_global") if eager["has_global"] else None}
    clock = meta.get("async")
    if clock is not None:
        delayed = clock["delayed"]
        if delayed is not None:
            delayed = {"anchor": _take(arrays, "extra.anchor"), "arrivals": delayed["arrivals"],
                       "pending": [(c, _take(arrays, f"extra.held{i}")) for i, c in enumerate(delayed["counts"])]}
        starts = {int(k): (v, _take(arrays, f"extra.start{k}")) for k, v in clock["versions"].items()}
        extra["async"] = {"starts": starts, "version": clock["version"], "now": clock["now"], "delayed": delayed}
    return extra
