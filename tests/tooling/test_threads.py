"""The BLAS thread policy (``diloco.tools.cli.threads``) and ``--threads``."""

from __future__ import annotations

import json
import sys

import pytest

from diloco.tools.cli import threads
from diloco.tools.cli.main import main
from diloco.tools.cli.threads import (
    LARGE_MATMUL_FLOPS,
    MIN_SPEEDUP,
    ThreadsUnavailable,
    blas_threads,
    choose_threads,
    free_cores,
    idle_cores,
    largest_matmul_flops,
    largest_matmul_shape,
    probe_speedup,
)

MODEL_A = (64, 128, 10)  # the demo's model: 2 * 32 * 64 * 128 = 524,288 FLOPs at most per product
MODEL_B = (784, 512, 512, 10)  # 2 * 128 * 784 * 512 = 102,760,448


def test_largest_matmul_flops_and_shape():
    assert largest_matmul_flops(MODEL_A, 32) == 2 * 32 * 64 * 128
    assert largest_matmul_flops(MODEL_B, 128) == 2 * 128 * 784 * 512
    assert largest_matmul_flops((5, 3), 1) == 30
    assert largest_matmul_shape(MODEL_B, 128) == (128, 784, 512)
    assert largest_matmul_shape((3, 4, 50, 2), 7) == (7, 4, 50)


@pytest.mark.parametrize("cores, idle, expected", [(2, 2.0, 2), (2, 1.8, 2), (2, 1.7, 1), (2, 1.0, 1), (2, 0.0, 1),
                                                   (8, 5.9, 6), (8, 8.0, 8), (4, 9.0, 4), (1, 1.0, 1)])
def test_free_cores_never_oversubscribes(cores, idle, expected):
    assert free_cores(cores, idle) == expected


def test_free_cores_is_one_when_the_idle_cores_cannot_be_read(monkeypatch):
    monkeypatch.setattr(threads, "idle_cores", lambda *a, **k: None)
    assert free_cores(8) == 1


def fake_stat(tmp_path, snapshots):
    """A /proc/stat stand-in that moves to the next snapshot when the probe sleeps."""
    path = tmp_path / "stat"

    def write(lines):
        path.write_text("\n".join(["cpu  999 0 999 999 0 0 0 0 0 0", *lines, "intr 5 6", "ctxt 7"]) + "\n")

    write(snapshots[0])
    return path, lambda _seconds: write(snapshots[1])


def test_idle_cores_counts_the_idle_share_of_each_usable_core(tmp_path):
    #            user nice system idle iowait irq softirq steal guest guest_nice
    before = ["cpu0 100 0 50 1000 10 0 0 0 0 0", "cpu1 100 0 50 1000 10 0 0 0 0 0"]
    after = ["cpu0 100 0 50 1090 20 0 0 0 0 0",   # 100 ticks, all idle (iowait counts as idle)
             "cpu1 175 0 75 1000 10 0 0 0 0 0"]   # 100 ticks, all busy
    path, sleep = fake_stat(tmp_path, (before, after))
    assert idle_cores(stat_path=str(path), cpus={0, 1}, sleep=sleep) == pytest.approx(1.0)
    path, sleep = fake_stat(tmp_path, (before, after))
    assert idle_cores(stat_path=str(path), cpus={1}, sleep=sleep) == pytest.approx(0.0)
    half = ["cpu0 150 0 50 1050 10 0 0 0 0 0", "cpu1 100 0 50 1100 10 0 0 0 0 0"]
    path, sleep = fake_stat(tmp_path, (before, half))
    assert idle_cores(stat_path=str(path), cpus={0, 1}, sleep=sleep) == pytest.approx(1.5)
    assert idle_cores(stat_path=str(tmp_path / "missing"), cpus={0}, sleep=lambda _s: None) is None
    path, sleep = fake_stat(tmp_path, (before, after))
    assert idle_cores(stat_path=str(path), cpus={0, 5}, sleep=sleep) is None  # a CPU the file does not list


def test_idle_cores_reads_this_machine():
    idle = idle_cores(0.01)
    assert idle is None or 0.0 <= idle <= threads.usable_cores()


def refuse(*_args):
    raise AssertionError("the probe must not run")


def test_small_models_get_one_thread_without_a_probe():
    assert largest_matmul_flops(MODEL_A, 32) < LARGE_MATMUL_FLOPS < largest_matmul_flops(MODEL_B, 128)
    assert choose_threads(MODEL_A, 32, cores=2, idle=2.0, speedup=refuse) == 1


def test_large_models_get_the_idle_cores_only_when_the_probe_shows_a_gain():
    seen = []

    def speedup(value):
        return lambda shape, count: seen.append((shape, count)) or value

    assert choose_threads(MODEL_B, 128, cores=2, idle=2.0, speedup=speedup(1.6)) == 2
    assert seen == [((128, 784, 512), 2)]  # the step's largest product, at the candidate count
    assert choose_threads(MODEL_B, 128, cores=2, idle=2.0, speedup=speedup(MIN_SPEEDUP - 0.01)) == 1
    assert choose_threads(MODEL_B, 128, cores=8, idle=4.1, speedup=speedup(3.0)) == 4
    # Another process keeps one of the two cores busy: one thread, whatever the probe would say.
    assert choose_threads(MODEL_B, 128, cores=2, idle=1.0, speedup=refuse) == 1
    assert choose_threads(MODEL_B, 128, cores=2, idle=1.6, speedup=refuse) == 1


def test_requested_threads_override_the_rule():
    assert choose_threads(MODEL_A, 32, requested=2, cores=2, idle=0.0, speedup=refuse) == 2
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            choose_threads(MODEL_A, 32, requested=bad)


def test_probe_speedup_times_both_counts():
    pytest.importorskip("threadpoolctl")
    ratio = probe_speedup((16, 32, 24), 2, repeats=1)
    assert 0.0 < ratio < float("inf")


def test_blas_threads_limits_the_pool():
    threadpoolctl = pytest.importorskip("threadpoolctl")
    with blas_threads(1):
        pools = [p for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
        assert pools and all(p["num_threads"] == 1 for p in pools)


def test_without_threadpoolctl_the_policy_is_skipped_and_threads_is_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)  # import fails
    with blas_threads(1):
        pass
    with pytest.raises(ThreadsUnavailable, match="cli"):
        blas_threads(2, required=True)
    assert threads.choose_threads(MODEL_A, 32) == 1  # the rule itself needs nothing
    assert threads.choose_threads(MODEL_B, 128, cores=2, idle=2.0) == 1  # no probe without threadpoolctl


def test_cli_threads_flag(tmp_path, capsys):
    tiny = ["--rounds", "1", "-H", "2", "-K", "2", "--hidden-sizes", "8", "-q", "--no-plots"]
    assert main(["train", *tiny, "--threads", "1", "--runs-dir", str(tmp_path)]) == 0
    saved = json.loads(next(tmp_path.glob("*/config.json")).read_text())
    assert saved["blas_threads"] == 1
    capsys.readouterr()
    assert main(["train", *tiny, "--threads", "0", "--runs-dir", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--threads" in err
    assert not (tmp_path / "bad").exists()
