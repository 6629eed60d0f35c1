"""``benchmarks/bench.py --only fixed-cost`` rewrites its one section of the report and nothing else.

The measurements here are made up (no timing: speed is reported by ``make bench``, never
asserted in tests); what is checked is where the section goes and the arithmetic of its
"rounds to catch up" column.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench_modules(monkeypatch):
    pytest.importorskip("threadpoolctl")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    for name in ("charlm", "report", "workloads", "suite"):
        sys.modules.pop(name, None)
    import charlm
    import report

    monkeypatch.setattr(report, "datetime", FixedClock)  # two writes in different minutes compare equal
    return charlm, report


class FixedClock:
    """Stands in for the ``datetime`` module in ``report``: its "measured ..." line names one fixed minute."""

    class datetime:
        @staticmethod
        def now():
            return dt.datetime(2026, 1, 2, 3, 4)


def fake_result(charlm, fast_fixed: float) -> dict:
    """Reference: 0.5 s fixed, 2 s a round (4 rounds timed); fast: ``fast_fixed`` s, 0.5 s a round."""
    training = {}
    for dtype, impl in charlm.TRAINING_CASES:
        fixed, per_round = (0.5, 2.0) if impl == "charlm-reference" else (fast_fixed, 0.5)
        training[(dtype, impl)] = [{"fixed_cpu": fixed, "cpu": per_round * charlm.CHARLM["rounds"], "load": [0.5, 0.6]}]
    short = {"fast": [{"cpu": 6.0, "wall": 6.5, "load": [0.5, 0.6]}],
             "reference": [{"cpu": 9.0, "wall": 9.5, "load": [0.5, 0.6]}]}
    return {"training": training, "short": short}


REPORT = """# Benchmarks

## The char-LM, one BLAS thread

the char-LM table

## The fast engine's layouts

the layouts
"""


def write(report, path, result):
    report.write_fixed_cost(path, result, repeats=1, seconds=1.0, load=((0.5, 0, 0), (0.6, 0, 0)),
                            main_commit="e7f3c6c")
    return path.read_text(encoding="utf-8")


def test_the_section_goes_after_the_char_lm_section_then_is_replaced_in_place(bench_modules, tmp_path):
    charlm, report = bench_modules
    path = tmp_path / "results.md"
    path.write_text(REPORT, encoding="utf-8")
    first = write(report, path, fake_result(charlm, fast_fixed=2.0))
    assert first.count(charlm.FIXED_START) == 1 and first.count(charlm.FIXED_END) == 1
    layouts = first.index("## The fast engine's layouts")
    assert first.index("the char-LM table") < first.index(charlm.FIXED_START) < layouts
    assert "| float64 | fast | 2.00 (2.00-2.00) | 0.50 (0.50-0.50) | 1.0 |" in first  # (2 - 0.5) / (2 - 0.5)
    assert "6.0 s against 9.0 s (1.50x), met." in first
    second = write(report, path, fake_result(charlm, fast_fixed=3.5))
    assert second.count(charlm.FIXED_START) == 1
    assert "| float64 | fast | 3.50 (3.50-3.50) | 0.50 (0.50-0.50) | 2.0 |" in second
    assert second.replace("3.50 (3.50-3.50)", "2.00 (2.00-2.00)").replace("| 2.0 |", "| 1.0 |") == first
    assert second.startswith("# Benchmarks\n\n## The char-LM") and second.endswith("the layouts\n")


def test_a_report_without_a_char_lm_section_gets_it_at_the_end(bench_modules, tmp_path):
    charlm, report = bench_modules
    path = tmp_path / "results.md"
    path.write_text("# Benchmarks\n\nnothing yet\n\n## Machine\n\nan AMD EPYC\n", encoding="utf-8")
    text = write(report, path, fake_result(charlm, fast_fixed=2.0))
    assert text.startswith("# Benchmarks\n\nnothing yet\n\n## Machine\n\nan AMD EPYC\n\n" + charlm.FIXED_START)
    assert text.endswith(charlm.FIXED_END + "\n")


def test_the_suite_section_judges_make_test_alone_and_a_failure_is_missed_not_dropped(bench_modules):
    """``--only suite``: ``make test`` against 240 s wall and 150 s CPU, ``make test-all`` shown beside it
    with no target; each row carries the date; a failed command is a missed target, a load at the
    start marks the row."""
    _, report = bench_modules
    import suite

    timed = {"date": "2026-01-02 03:04", "test": {"wall": 239.6, "cpu": 150.4, "load": [0.1, 2.0]},
             "test-all": {"wall": 900.0, "cpu": 1500.0, "load": [0.2, 2.0]}}
    lines, rows = report.EXTRA_SECTIONS["suite"](timed)
    assert rows == [("make test in at most 240 s of wall time", "240 s (`make test`, 2026-01-02 03:04)", "met"),
                    ("make test in at most 150 s of CPU time", "150 s (`make test`, 2026-01-02 03:04)", "**missed**")]
    assert "| `make test-all` (every test, as CI runs it; no target) | 900 | 1500 | 0.20 |" in lines
    assert "## The test suite" in lines and "Measured on 2026-01-02 03:04" in " ".join(lines)
    loaded = dict(timed, test=dict(timed["test"], load=[report.IDLE_LOAD + 0.5, 2.0]))
    assert all(verdict.endswith(" (loaded machine)") for _, _, verdict in suite.section(loaded, report.IDLE_LOAD)[1])
    failed_lines, failed_rows = suite.section({"test": {"failed": True}}, 1.0)
    assert [verdict for _, _, verdict in failed_rows] == ["**missed**", "**missed**"]
    assert sum("| failed | failed |" in line for line in failed_lines) == 2  # test-all absent: failed too


def test_each_suite_command_waits_for_the_load_to_settle_and_no_longer_than_its_limit(bench_modules, monkeypatch):
    """``suite.measure`` starts a command once the load average is below the idle mark (made-up loads,
    no real waiting), or once the limit has passed."""
    import suite

    loads = iter([3.0, 2.0, 1.2, 1.2] + [5.0] * 6)  # the one after each wait is the logged one
    clock = {"now": 0.0}
    monkeypatch.setattr(suite.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr(suite.time, "sleep", lambda s: clock.__setitem__("now", clock["now"] + s))
    monkeypatch.setattr(suite.time, "monotonic", lambda: clock["now"])
    started = []

    def timed(argv, env):
        started.append((argv[-1], clock["now"]))
        return {"wall": 1.0, "cpu": 1.0, "load": [0.0, 0.0]}

    out = suite.measure(lambda text: None, timed, idle_load=1.5, settle=12.0)
    assert started == [("test", 10.0), ("test-all", 25.0)]  # 3.0, 2.0, then 1.2: two polls; then 5.0 past 12 s
    assert set(out) == {"date", "test", "test-all"}
