"""The network simulator (diloco.core.netsim): parsing, the timeline model by hand, overlap."""

from __future__ import annotations

import pytest

from diloco import DiLoCoConfig
from diloco.config.sections import FamilyConfig
from diloco.core.netsim import all_reduce_seconds, parse_bandwidth, parse_duration, simulate
from diloco.core.trainers import train_family
from diloco.data import load_digits_split


@pytest.mark.parametrize("text, bits", [("1Gbit", 1e9), ("100Mbit/s", 1e8), ("10Mbps", 1e7), ("125MB/s", 1e9),
                                        ("2.5kbit", 2500.0), ("1e6", 1e6), ("1Gbyte", 8e9)])
def test_bandwidths_parse_to_bits_per_second(text, bits):
    assert parse_bandwidth(text) == pytest.approx(bits)


@pytest.mark.parametrize("text, seconds", [("50ms", 0.05), ("0.2s", 0.2), ("300us", 3e-4), ("2", 2.0), ("1min", 60)])
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["fast", "0Gbit", "-1Mbit", ""])
def test_bad_bandwidths_are_refused(bad):
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth(bad)


def test_the_ring_all_reduce_time_model():
    # 2 (K-1) latencies + 8 b / B: K = 4, L = 10 ms, 1 MB at 100 Mbit/s
    assert all_reduce_seconds(1e6, 4, 1e8, 0.01) == pytest.approx(6 * 0.01 + 0.08)
    assert all_reduce_seconds(1e6, 1, 1e8, 0.01) == 0.0


def _record(all_reduces, bytes_sent, syncs=None):
    record = {"all_reduces": all_reduces, "bytes_sent": bytes_sent}
    if syncs is not None:
        record["syncs"] = syncs
    return record


def test_diloco_blocks_once_per_round():
    # H = 10 steps of 0.1 s, one all-reduce of 8 Mbit at 4 Mbit/s (2 s), K = 2, no latency
    sim = simulate([_record(1, 1e6)] * 2, 2, 10, 4e6, 0.0, 0.1)
    assert [round(s["sim_seconds"], 9) for s in sim] == [3.0, 3.0]
    assert sim[1]["sim_cumulative_seconds"] == pytest.approx(6.0)
    assert sim[0]["sim_utilization"] == pytest.approx(1.0 / 3.0)


def test_the_baseline_blocks_every_step():
    sim = simulate([_record(10, 10 * 1e5)], 2, 10, 4e6, 0.0, 0.1)  # 10 x (0.1 s compute + 0.2 s transfer)
    assert sim[0]["sim_seconds"] == pytest.approx(3.0)


def test_eager_hides_an_all_reduce_shorter_than_a_round():
    # issued after step H with tau = H: due at the end of the next round
    sim = simulate([_record(1, 2.5e5, [[10, 2.5e5, 10]])] * 3, 2, 10, 4e6, 0.0, 0.1)  # 0.5 s < 1 s of compute
    assert [round(s["sim_seconds"], 9) for s in sim] == [1.0, 1.0, 1.0]
    slow = simulate([_record(1, 1e6, [[10, 1e6, 10]])] * 3, 2, 10, 4e6, 0.0, 0.1)  # 2 s > 1 s: 1 s stall
    assert [round(s["sim_seconds"], 9) for s in slow] == [1.0, 2.0, 2.0]


def test_streaming_overlaps_each_fragment_for_tau_steps_and_shares_the_link():
    # P = 2 fragments of 0.5 MB (1 s each at 4 Mbit/s), synced at steps 5 and 10, tau = 2 steps (0.2 s)
    syncs = [[5, 5e5, 2], [10, 5e5, 2]]
    sim = simulate([_record(2, 1e6, syncs)] * 2, 2, 10, 4e6, 0.0, 0.1)
    # round 1: step 5 at 0.5 s, transfer until 1.5 s, due after step 7 (0.7 s): wait to 1.5 s;
    # steps 8-10 end at 1.8 s; second transfer until 2.8 s, due after step 2 of round 2 (2.0 s):
    # wait to 2.8 s; steps 3-5 end at 3.1 s, transfer until 4.1 s, due after step 7 (3.3 s): wait
    # to 4.1 s; steps 8-10 end at 4.4 s.
    assert sim[0]["sim_seconds"] == pytest.approx(1.8)
    assert sim[1]["sim_cumulative_seconds"] == pytest.approx(4.4)
    blocking = simulate([_record(2, 1e6, [[5, 5e5, 0], [10, 5e5, 0]])], 2, 10, 4e6, 0.0, 0.1)
    assert blocking[0]["sim_seconds"] == pytest.approx(3.0)  # the same bytes, no overlap


def test_the_trainers_annotate_their_records():
    data = load_digits_split(seed=0)
    config = DiLoCoConfig(num_workers=2, inner_steps=4, rounds=2, hidden_sizes=(8, 8))
    family = FamilyConfig(fragments=2, overlap=1, bandwidth=1e6, latency=0.001, step_time=0.01)
    history = train_family(data.x_train, data.y_train, config, family).history
    expected = simulate(history, 2, 4, 1e6, 0.001, 0.01)
    assert [r["sim_seconds"] for r in history] == [e["sim_seconds"] for e in expected]
    assert all(0 < r["sim_utilization"] <= 1 for r in history)
