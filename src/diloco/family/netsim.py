"""Re-exported from ``diloco.core.netsim``, which owns it (this import path stays for existing code)."""

from diloco.core.netsim import (
    NetworkClock,
    all_reduce_seconds,
    parse_bandwidth,
    parse_duration,
    simulate,
)

__all__ = [
    "parse_bandwidth",
    "parse_duration",
    "all_reduce_seconds",
    "NetworkClock",
    "simulate",
]
