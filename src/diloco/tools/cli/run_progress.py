"""A training command's progress while it trains: steps within a long round, the time left, and
a warning first when the run is long.

The executors report their finished inner steps (``diloco.core.progress``); ``RunProgress``,
the listener, turns them into words for one algorithm's run:

* on a terminal, the round bar's postfix once a round has run ``after`` seconds (1), at most
  every ``every`` seconds (0.5): ``2 h 10 min left, round 1: 51.2k/8M steps``, the time left
  first and the counts short, for an 80-column bar keeps about 38 characters of its postfix;
* elsewhere (a pipe, a log file), the same words as a line on stderr, prefixed by the
  algorithm's name, once a round has run ``LINE_AFTER`` seconds, then every ``LINE_EVERY``;
* once, as soon as ``ESTIMATE_AFTER`` seconds of steps give a speed, a line saying how long
  the run will take, if that is more than ``LONG_RUN`` seconds (the algorithms still to come
  after this one, ``compare``'s baseline, counted as taking as long).

The time left is the steps left at the speed so far (the held-out evaluations are not
counted, so it is a little short). An asynchronous run's rounds differ in steps: they are
read from its arrival plan, except on a simulated network (the trips move the arrivals),
where its words give the steps only. The clock is an argument, so tests need no waiting.
"""

from __future__ import annotations

import time

from diloco.core import progress

__all__ = ["RunProgress", "LONG_RUN", "ESTIMATE_AFTER", "LINE_AFTER", "LINE_EVERY", "count", "duration", "round_steps"]

LONG_RUN = 600.0  # seconds: a run estimated longer than this says so as it starts
ESTIMATE_AFTER = 2.0  # seconds of steps before the speed is trusted
LINE_AFTER, LINE_EVERY = 5.0, 30.0  # progress lines without a terminal


def round_steps(config) -> list[int] | None:
    """The worker steps of each round: K H, or an asynchronous run's arrivals' steps
    (``diloco.core.schedule.async_plan``); None where the simulated network moves the arrivals."""
    if not config.asynchrony.asynchronous:
        return [config.num_workers * config.inner_steps] * config.rounds
    if config.family.simulates_network:
        return None
    from diloco.core.schedule import async_plan

    try:
        return [sum(sum(group.steps) for group in groups) for groups in async_plan(config)]
    except (ValueError, RuntimeError):  # the run refuses it in one line of its own
        return None


def count(steps: int) -> str:
    """``steps`` in short past 9,999, three digits and a unit: ``1,792``, ``51.2k``, ``8M``, ``1.25G``."""
    if steps < 10_000:
        return f"{steps:,}"
    unit, size = next((unit, size) for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)) if steps >= 0.9995 * size)
    value = steps / size
    return f"{value:.3g}{unit}" if value < 999.5 else f"{value:,.0f}{unit}"


def duration(seconds: float) -> str:
    """``seconds`` in words: ``45 s``, ``11 min``, ``2 h 10 min``, ``3 days 4 h``."""
    seconds = max(float(seconds), 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days:,} days {hours} h" if hours else f"{days:,} days"


class RunProgress:
    """The listener of one algorithm's run (see the module doc).

    Parameters
    ----------
    label : str
        The algorithm's name as the bar shows it (``DiLoCo``).
    config : DiLoCoConfig
        Its config (K, H, rounds; asynchronous or not).
    done : int
        Rounds finished before this process started (a resumed run).
    bar : tqdm bar, optional
        The round bar: its postfix shows the words. Without one they are printed lines.
    write : callable(str)
        Prints a line (``tqdm.write`` beside a bar, else to stderr).
    following : int
        Algorithms still to run after this one, each counted as taking as long.
    """

    def __init__(self, label: str, config, done: int, *, write, bar=None, following: int = 0,
                 clock=time.monotonic, after: float = 1.0, every: float = 0.5) -> None:
        self.label, self.bar, self.write, self.clock, self.following = label, bar, write, clock, following
        self.totals = round_steps(config)
        self.per_round = None if self.totals is None else self.totals[done] if done < len(self.totals) else 0
        self.steps_left = None if self.totals is None else sum(self.totals[done:])
        self.after, self.every = (after, every) if bar is not None else (LINE_AFTER, LINE_EVERY)
        self.start = self.round_start = clock()
        self.round, self.steps, self.round_steps = done + 1, 0, 0
        self.shown, self.estimated = None, False

    def round_ended(self, record=None) -> None:
        """The round finished (its history line is written): the next one starts its count."""
        self.round, self.round_steps, self.round_start = self.round + 1, 0, self.clock()
        if self.totals is not None:
            self.per_round = self.totals[self.round - 1] if self.round <= len(self.totals) else 0

    def __call__(self, steps: int) -> None:
        now = self.clock()
        self.steps += steps
        self.round_steps += steps
        if not self.estimated and now - self.start >= ESTIMATE_AFTER:
            self.estimated = True
            self._estimate(now)
        if now - self.round_start >= self.after and (self.shown is None or now - self.shown >= self.every):
            self.shown = now
            self._show(now)

    def left(self, now: float) -> float | None:
        """Seconds this algorithm still needs at its speed so far (None: unknown)."""
        if self.steps_left is None or self.steps == 0 or now <= self.start:
            return None
        return max(self.steps_left - self.steps, 0) * (now - self.start) / self.steps

    def _show(self, now: float) -> None:
        left = self.left(now)
        if self.bar is not None:  # the time left first and the counts short: an 80-column bar cuts its end
            of = f"/{count(self.per_round)}" if self.per_round else ""
            words = (f"{duration(left)} left, " if left is not None else "") + \
                f"round {self.round}: {count(self.round_steps)}{of} steps"
            self.bar.set_postfix_str(words, refresh=True)
            return
        of = f"/{self.per_round:,}" if self.per_round else ""
        self.write(f"{self.label}: round {self.round}: {self.round_steps:,}{of} worker steps" + (
            f", about {duration(left)} left" if left is not None else ""))

    def _estimate(self, now: float) -> None:
        left = self.left(now)
        if left is None or left * (1 + self.following) <= LONG_RUN:
            return
        then = f", then about {duration(left * self.following)} for the rest of the command" if self.following else ""
        self.write(f"{self.label}: this run will take about {duration(left)} more at the speed of its first "
                   f"{now - self.start:.0f} s{then} (Ctrl-C keeps every finished round; --resume goes on)")

    def listening(self):
        """The context in which the executors' reports reach this listener."""
        return progress.reporting(self)
