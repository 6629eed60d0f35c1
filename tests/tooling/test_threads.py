"""The BLAS thread policy (``diloco.tools.threads``) and ``--threads``."""

from __future__ import annotations

import json
import sys

import pytest

from diloco.tools import threads
from diloco.tools.cli import main
from diloco.tools.threads import (
    LARGE_MATMUL_FLOPS,
    ThreadsUnavailable,
    blas_threads,
    choose_threads,
    free_cores,
    largest_matmul_flops,
)

MODEL_A = (64, 128, 10)  # the demo's model: 2 * 32 * 64 * 128 = 524,288 FLOPs at most per product
MODEL_B = (784, 512, 512, 10)  # 2 * 128 * 784 * 512 = 102,760,448


def test_largest_matmul_flops():
    assert largest_matmul_flops(MODEL_A, 32) == 2 * 32 * 64 * 128
    assert largest_matmul_flops(MODEL_B, 128) == 2 * 128 * 784 * 512
    assert largest_matmul_flops((5, 3), 1) == 30


@pytest.mark.parametrize("cores, load, expected", [(2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.2, 1), (2, 7.0, 1),
                                                   (8, 2.2, 6), (1, 0.0, 1)])
def test_free_cores_never_oversubscribes(cores, load, expected):
    assert free_cores(cores, load) == expected


def test_small_models_get_one_thread_large_ones_the_free_cores():
    assert largest_matmul_flops(MODEL_A, 32) < LARGE_MATMUL_FLOPS < largest_matmul_flops(MODEL_B, 128)
    assert choose_threads(MODEL_A, 32, cores=2, load=0.0) == 1
    assert choose_threads(MODEL_B, 128, cores=2, load=0.0) == 2
    assert choose_threads(MODEL_B, 128, cores=2, load=1.0) == 1  # another process holds a core
    assert choose_threads(MODEL_A, 32, requested=2, cores=2, load=5.0) == 2  # --threads overrides
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            choose_threads(MODEL_A, 32, requested=bad)


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
