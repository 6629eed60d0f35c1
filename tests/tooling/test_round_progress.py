"""Progress within a round (``diloco.core.progress``): the executors report their inner steps
while a listener is set, in the same bits as without one, and the command line's round bar
shows them once a round runs long (issue 31: ``-H 1e6`` moved the bar once a round)."""

from __future__ import annotations

import pytest

from diloco import DiLoCoConfig
from diloco.config_sections import AsyncConfig
from diloco.core import progress
from diloco.core.schedule import async_plan
from diloco.data import load_digits_split
from diloco.tools.cli.run_setup import round_progress
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


def test_the_round_bar_shows_a_long_rounds_steps_and_starts_over_each_round():
    bar = _Bar()
    config = DiLoCoConfig(num_workers=2, inner_steps=1000)
    with round_progress(bar, config, after=0.0, every=0.0):
        progress.steps_done(256)
        progress.steps_done(256)
        bar.n = 1  # the round ended
        progress.steps_done(100)
    assert bar.shown == ["round 1: 256/2,000 worker steps", "round 1: 512/2,000 worker steps",
                         "round 2: 100/2,000 worker steps"]
    quiet = _Bar()
    with round_progress(quiet, config):  # a short round shows nothing
        progress.steps_done(256)
    assert quiet.shown == []
