"""A network simulator: turn a run's bytes into wall-clock time and compute utilisation.

A model, not a measurement. Every worker computes one inner step in ``c`` seconds
(``step_time``, given or measured); workers are identical, so one timeline serves all.
One all-reduce that makes each worker send ``b`` bytes (the records' ``bytes_sent``,
already ``2 (K-1)/K`` of the payload for a ring) over links of ``B`` bit/s with a latency
of ``L`` seconds per message takes (the alpha-beta model of a ring all-reduce)::

    T(b) = 2 (K - 1) L + 8 b / B            (0 when K = 1: nothing leaves the worker)

The timeline, step by step: compute one inner step (``c``); start the all-reduces the
algorithm issues after this step (each starts when the link is free: one transfer at a
time); then wait, idle, for every all-reduce whose result is due now. An all-reduce
issued after step s with overlap ``tau`` is due after step ``s + tau``:

=================  ==================================  =====
algorithm          all-reduces                          tau
=================  ==================================  =====
sync (baseline)    one per step, of the gradients       0
DiLoCo             one per round, after step H          0
Streaming DiLoCo   one per fragment, every H/P steps    tau
eager updates      one per round, after step H          H
=================  ==================================  =====

The records say which: a record's ``syncs`` list (``[step in round, bytes, tau]``, from
the family trainers), else ``all_reduces`` transfers of ``bytes_sent / all_reduces``
spread evenly over the round with tau = 0 (DiLoCo and the baseline). The wall time of a
round ends when its last step's waits are over; compute utilisation is compute time over
wall time, ``H c / wall``.
"""

from __future__ import annotations

import re

from diloco._validation import api_checks, shown

__all__ = ["parse_bandwidth", "parse_duration", "all_reduce_seconds", "NetworkClock", "simulate"]

_BANDWIDTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kKMGT]?)(bit|b|B|byte)?(?:/s|ps)?\s*$")
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(s|ms|us|ns|min)?\s*$")
_SECONDS = {"s": 1.0, None: 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9, "min": 60.0}


def parse_bandwidth(text: str) -> float:
    """Bits per second from ``"1Gbit"``, ``"100Mbit/s"``, ``"10Mbps"``, ``"125MB/s"`` (bytes) or a number.

    Decimal prefixes (k, M, G, T). ``b``/``bit`` are bits, ``B``/``byte`` bytes.

    Raises
    ------
    ValueError
        Unparseable or not positive.
    """
    api_checks.wire_text(text, "bandwidth")
    match = _BANDWIDTH.match(str(text))
    if not match:
        raise ValueError(f"bandwidth must look like 1Gbit, 100Mbit/s or 125MB/s, got {shown(text)}")
    number, prefix, unit = match.groups()
    value = float(number) * _PREFIX[prefix] * (8.0 if unit in ("B", "byte") else 1.0)
    if not value > 0:
        raise ValueError(f"bandwidth must be positive, got {shown(text)}")
    return value


def parse_duration(text: str) -> float:
    """Seconds from ``"50ms"``, ``"0.2s"``, ``"300us"`` or a bare number of seconds (>= 0)."""
    api_checks.wire_text(text, "duration")
    match = _DURATION.match(str(text))
    if not match:
        raise ValueError(f"duration must look like 50ms, 0.2s or 300us, got {shown(text)}")
    return float(match.group(1)) * _SECONDS[match.group(2)]


def all_reduce_seconds(bytes_sent: float, num_workers: int, bandwidth: float, latency: float) -> float:
    """``T(b) = 2 (K-1) L + 8 b / B``, 0 for one worker or no bytes."""
    api_checks.all_reduce_seconds(bytes_sent, num_workers, bandwidth, latency)
    if num_workers <= 1 or bytes_sent <= 0:
        return 0.0
    return 2.0 * (num_workers - 1) * latency + 8.0 * bytes_sent / bandwidth


def _events(record: dict, inner_steps: int) -> list:
    if record.get("syncs"):
        return [(int(step), float(size), int(tau)) for step, size, tau in record["syncs"]]
    count = int(record.get("all_reduces", 0))
    if count <= 0:
        return []
    size = float(record["bytes_sent"]) / count
    return [(inner_steps * (i + 1) // count, size, 0) for i in range(count)]


class NetworkClock:
    """The simulated timeline of one run, advanced one record (round) at a time."""

    def __init__(self, num_workers: int, inner_steps: int, bandwidth: float, latency: float, step_time: float):
        if not bandwidth > 0 or latency < 0 or not step_time > 0:
            raise ValueError(f"need bandwidth > 0, latency >= 0, step_time > 0; got {bandwidth}, {latency}, "
                             f"{step_time}")
        self.num_workers, self.inner_steps = num_workers, inner_steps
        self.bandwidth, self.latency, self.step_time = bandwidth, latency, step_time
        self.now = 0.0         # simulated seconds
        self.link_free = 0.0   # when the link finishes its current transfer
        self.step = 0          # inner steps done
        self.pending: list = []  # (due step, completion time)

    def advance(self, record: dict) -> dict:
        """Simulate the round of ``record``; return its ``sim_*`` fields."""
        start = self.now
        by_step: dict = {}
        for step, size, tau in _events(record, self.inner_steps):
            by_step.setdefault(step, []).append((size, tau))
        for h in range(1, self.inner_steps + 1):
            self.now += self.step_time
            self.step += 1
            for size, tau in by_step.get(h, []):
                begin = max(self.now, self.link_free)
                self.link_free = begin + all_reduce_seconds(size, self.num_workers, self.bandwidth, self.latency)
                self.pending.append((self.step + tau, self.link_free))
            due = [item for item in self.pending if item[0] <= self.step]
            for item in due:
                self.pending.remove(item)
                self.now = max(self.now, item[1])
        seconds = self.now - start
        return {"sim_seconds": seconds, "sim_cumulative_seconds": self.now,
                "sim_utilization": self.inner_steps * self.step_time / seconds}


def simulate(records: list, num_workers: int, inner_steps: int, bandwidth: float, latency: float,
             step_time: float) -> list:
    """The ``sim_*`` fields of every record of a run, in order (the records are not changed)."""
    clock = NetworkClock(num_workers, inner_steps, bandwidth, latency, step_time)
    return [clock.advance(record) for record in records]
