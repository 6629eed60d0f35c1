"""Progress within a round (``diloco.core.progress``): the executors report their inner steps
while a listener is set, in the same bits as without one, and the command line's round bar
shows them once a round runs long (issue 31: ``-H 1e6`` moved the bar once a round), with the
time left; without a terminal they are lines now and then, and a long run says so first
(issue 41). A fake clock: no test waits."""

from __future__ import annotations

import pytest

from diloco import DiLoCoConfig
from diloco.config.sections import AsyncConfig
from diloco.core import progress
from diloco.core.schedule import async_plan
from diloco.data import load_digits_split
from diloco.tools.cli.run_progress import ESTIMATE_AFTER, RunProgress, count, duration
from diloco.tools.runs.training import train_resumable

H = progress.CHUNK * 2 + 37  # three chunks per worker: two whole, one cut


def _run(algo, config, listener=None):
    data = load_digits_split(seed=0)
    x, y, x_eval, y_eval = data.x_train[:200], data.y_train[:200], data.x_test[:50], data.y_test[:50]

    def train():
        return train_resumable(algo, x, y, config, x_eval=x_eval, y_eval=y_eval)

    if listener is None:
        return train()
    with progress.reporting(listener):
        return train()


@pytest.mark.parametrize("algo, changes", [
    ("diloco", {}), ("sync", {}), ("diloco", {"engine": "fast"}), ("sync", {"engine": "fast"}),
    ("diloco", {"inner_optimizer": "muon"}),
    ("diloco", {"asynchrony": AsyncConfig(asynchronous=True, step_times=(1.0, 2.0))}),
])
def test_every_inner_step_is_reported_and_the_bits_do_not_change(algo, changes):
    config = DiLoCoConfig(num_workers=2, inner_steps=H, rounds=2, hidden_sizes=(4,), batch_size=4, seed=3,
                          **changes)
    reports = []
    heard = _run(algo, config, reports.append)
    alone = _run(algo, config)
    assert all(heard.params[k].tobytes() == alone.params[k].tobytes() for k in alone.params)
    assert [r["worker_losses"] for r in heard.history] == [r["worker_losses"] for r in alone.history]
    if "asynchrony" in changes:  # every arrival's steps: the schedule's
        expected = sum(sum(group.steps) for groups in async_plan(config) for group in groups)
    else:
        expected = 2 * 2 * H
    assert sum(reports) == expected
    assert len(reports) >= 6 and max(reports) <= max(progress.CHUNK, 2)  # many small reports, not one per round


def test_nothing_listens_outside_and_steps_are_one_piece():
    assert progress.chunks(10_000) == [10_000]
    with progress.reporting(lambda steps: None):
        assert progress.chunks(2 * progress.CHUNK + 1) == [progress.CHUNK, progress.CHUNK, 1]
        assert progress.chunks(3) == [3]


class _Bar:
    def __init__(self):
        self.n, self.shown = 0, []

    def set_postfix_str(self, text, refresh=True):
        self.shown.append(text)


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _watch(config, bar=None, done=0, following=0, **kwargs):
    clock, lines = _Clock(), []
    return RunProgress("DiLoCo", config, done, write=lines.append, bar=bar, following=following, clock=clock,
                       **kwargs), clock, lines


def test_the_round_bar_shows_a_long_rounds_steps_and_time_left_and_starts_over_each_round():
    bar = _Bar()
    config = DiLoCoConfig(num_workers=2, inner_steps=1000, rounds=3)
    watch, clock, lines = _watch(config, bar, after=0.0, every=0.0)
    with watch.listening():
        clock.now += 1.0
        progress.steps_done(250)  # 250 steps a second; 6,000 in the run
        clock.now += 1.0
        progress.steps_done(250)
        watch.round_ended()
        clock.now += 0.5
        progress.steps_done(100)
    assert bar.shown == ["23 s left, round 1: 250/2,000 steps",
                         "22 s left, round 1: 500/2,000 steps",
                         "22 s left, round 2: 100/2,000 steps"]
    assert lines == []  # 26 s in all: no warning
    quiet = _Bar()
    watch, clock, lines = _watch(config, quiet)
    with watch.listening():  # a short round shows nothing
        clock.now += 0.5
        progress.steps_done(256)
    assert quiet.shown == []


def test_without_a_terminal_a_long_round_prints_a_line_now_and_then():
    config = DiLoCoConfig(num_workers=8, inner_steps=1_000_000, rounds=1)
    watch, clock, lines = _watch(config)
    for _ in range(100):  # 100 reports of 256 steps, a second apart
        clock.now += 1.0
        watch(256)
    shown = [line for line in lines if "worker steps" in line]
    assert len(shown) == 4  # at 5 s into the round, then every 30 s: 5, 35, 65, 95
    assert shown[0] == "DiLoCo: round 1: 1,280/8,000,000 worker steps, about 8 h 40 min left"  # 7,998,720 / 256
    assert lines[0].startswith("DiLoCo: this run will take about 8 h 40 min more at the speed of its first 2 s")


def test_a_run_estimated_past_the_threshold_says_so_once_and_counts_what_follows():
    config = DiLoCoConfig(num_workers=2, inner_steps=1000, rounds=100)  # 200,000 steps
    watch, clock, lines = _watch(config, _Bar(), following=1)
    clock.now += ESTIMATE_AFTER
    watch(200)  # 100 steps a second: 1,998 s left
    clock.now += 1.0
    watch(100)
    assert lines == ["DiLoCo: this run will take about 33 min more at the speed of its first 2 s, then about 33 min "
                     "for the rest of the command (Ctrl-C keeps every finished round; --resume goes on)"]
    short, clock, lines = _watch(config.replace(rounds=2), _Bar())  # 4,000 steps: 38 s
    clock.now += ESTIMATE_AFTER
    short(200)
    assert lines == []
    asynchronous, clock, lines = _watch(config.replace(asynchrony=AsyncConfig(asynchronous=True,
                                                                               step_times=(1.0, 2.0))))
    clock.now += 10.0
    asynchronous(200)  # its rounds' steps from its arrival plan: 3,000 each (worker 0 arrives twice), 300,000
    assert lines == ["DiLoCo: this run will take about 4 h 9 min more at the speed of its first 10 s (Ctrl-C keeps "
                     "every finished round; --resume goes on)",
                     "DiLoCo: round 1: 200/3,000 worker steps, about 4 h 9 min left"]
    networked = config.replace(asynchrony=AsyncConfig(asynchronous=True, step_times=(1.0, 2.0)),
                               family=config.family.replace(bandwidth=1e9))
    unknown, clock, lines = _watch(networked)  # the trips move the arrivals: the steps only, no estimate
    clock.now += 10.0
    unknown(200)
    assert lines == ["DiLoCo: round 1: 200 worker steps"]


@pytest.mark.parametrize("seconds, words", [(0, "0 s"), (59.4, "59 s"), (60, "1 min"), (3599, "59 min"),
                                            (3600, "1 h"), (7800, "2 h 10 min"), (48 * 3600, "2 days"),
                                            (49 * 3600 + 60, "2 days 1 h"), (1e9, "11,574 days 1 h")])
def test_durations_in_words(seconds, words):
    assert duration(seconds) == words


@pytest.mark.parametrize("steps, words", [(0, "0"), (9_999, "9,999"), (10_000, "10k"), (51_200, "51.2k"),
                                          (999_400, "999k"), (999_999, "1M"), (8_000_000, "8M"),
                                          (1_250_000_000, "1.25G"), (12_345_678_901_234, "12,346G")])
def test_step_counts_in_short(steps, words):
    assert count(steps) == words


@pytest.mark.parametrize("inner_steps, workers", [(1_000_000, 8), (10**9, 1000), (500, 2)])
def test_an_80_column_bar_keeps_the_time_left_in_sight(inner_steps, workers):
    """tqdm cuts a bar at the terminal's width: at 80 columns the postfix keeps about 38
    characters, and ``round 1: 51,200/8,000,000 worker steps, about 2 h 10 min left`` lost its
    time left (measured on ``-H 1000000`` in an 80-column terminal)."""
    import io

    from tqdm import tqdm

    config = DiLoCoConfig(num_workers=workers, inner_steps=inner_steps, rounds=1)
    screen = io.StringIO()
    bar = tqdm(total=config.rounds, desc="DiLoCo ", unit="round", file=screen, ncols=80)
    watch, clock, _ = _watch(config, bar, after=0.0, every=0.0)
    clock.now += 3.0
    watch(inner_steps * workers // 3)
    shown = screen.getvalue().rsplit("\r", 1)[-1]
    bar.close()
    assert len(shown) <= 80 and " left, round 1: " in shown, shown
