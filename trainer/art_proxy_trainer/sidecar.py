"""The sidecar loop: step after step until a stop condition, fed its groups by the store.

The proxy records whatever agents do, `art-proxy judge --watch` (or agents' own rewards)
scores the groups, and the trainer takes them from the store, oldest first, once at least
`groups_per_step` of them carry a signal; groups without one and validation groups ride along.
With a teacher of every ended group (`--reward-source teacher`), any ended group is one to train
on: the teacher scores every token, rewarded or not.
While it waits, it watches the production alias's live reward (rollback).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from art_proxy.config import RewardSource, TrainSettings
from art_proxy.errors import ConfigError
from art_proxy.records import TrainableGroup
from art_proxy.rewards import has_signal
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy_trainer.loop import Events, run_warm_start, stop_reason
from art_proxy_trainer.trainer import Trainer
from art_proxy_trainer.warm_start import WarmStart


def _trainable(group: TrainableGroup, settings: TrainSettings) -> bool:
    """Whether `group` can teach: a reward spread, or, for a teacher of every ended group
    (`--reward-source teacher`), any member at all."""
    return settings.reward_source is RewardSource.teacher or has_signal(group.rewards.values())


def waiting_line(settings: TrainSettings, with_signal: int, unconsumed: int) -> str:
    """What the sidecar waits for, and, with nothing to train on, how to feed it."""
    if settings.reward_source is RewardSource.teacher:
        line = (
            f"waiting for ended groups: {with_signal} of {settings.groups_per_step} for the "
            f"teacher to score"
        )
    else:
        line = (
            f"waiting for scored groups: {with_signal} of {settings.groups_per_step} with a "
            f"reward spread ({unconsumed} unconsumed in the store)"
        )
    if unconsumed:
        return line
    if settings.reward_source is RewardSource.judgment:
        feed = "run your agent through the proxy, then art-proxy judge scores its groups"
    elif settings.reward_source is RewardSource.teacher:
        feed = "run your agent through the proxy; a group is taken once its members have ended"
    else:
        feed = "run your agent through the proxy; it reports rewards at POST .../finish"
    scope = f" of scenario {', '.join(settings.scenario)}" if settings.scenario else ""
    return f"{line}: no group{scope} to train on yet ({feed})"


async def run_sidecar(
    trainer: Trainer,
    settings: TrainSettings,
    events: Events,
    warm_start: WarmStart | None = None,
) -> str:
    """Train on the store's scored groups until a stop condition (after the warm start, if
    any); returns why it stopped."""
    if warm_start is not None:
        await run_warm_start(trainer, warm_start, events)
    poll = JudgedSince()
    judges = CheckedJudges(trainer.store, settings, events)
    while (reason := stop_reason(trainer, settings)) is None:
        started = utcnow()
        since = poll.since() if settings.reward_source is RewardSource.judgment else None
        groups = await trainer.store.trainable_groups(
            settings.run_name,
            source=settings.reward_source.value,
            limit=1000,
            full_size=settings.group_size,
            settled_before=utcnow() - timedelta(seconds=settings.group_wait),
            scenarios=settings.scenario,
            judged_since=since,
        )
        poll.read(started, groups, full=since is None)
        with_signal = [g for g in groups if g.split != "val" and _trainable(g, settings)]
        if len(with_signal) < settings.groups_per_step:
            await trainer.watch_production()  # production traffic goes on while we wait
            events.status(waiting_line(settings, len(with_signal), len(groups)))
            await asyncio.sleep(settings.poll)
            continue
        chosen = (
            with_signal[-settings.groups_per_step :]
            if settings.newest_first
            else with_signal[: settings.groups_per_step]
        )
        newest = chosen[-1].created_at
        # A validation group with no reward measures nothing: it waits for one (a judge's).
        riders = [
            g
            for g in groups
            if g not in with_signal and g.created_at <= newest and (g.split != "val" or g.rewards)
        ]
        await judges.vet(chosen)
        await _say_trained_before(trainer, settings, chosen, events)
        events.status(f"training step {trainer.state.step + 1}")
        events.step(await trainer.train(chosen + riders))
        poll.consumed(chosen + riders)
    return reason


async def _say_trained_before(
    trainer: Trainer, settings: TrainSettings, groups: Sequence[TrainableGroup], events: Events
) -> None:
    """A run trains each group once; another run on the same store starts from the base model
    and trains the groups again. Said, with those runs, where the user reads the steps."""
    before = await trainer.store.trained_by_other_runs(
        settings.run_name, [g.group_id for g in groups]
    )
    if before:
        runs = sorted({run for named in before.values() for run in named})
        events.warning(
            f"step {trainer.state.step + 1}: {len(before)} of its {len(groups)} groups were "
            f"trained before by run {', '.join(runs)} (each run trains a group once, from its "
            "own weights)"
        )


class CheckedJudges:
    """Whether the judges of the groups a step takes can be trained on, by what `art-proxy judge
    --check` last found of each (judge model and rubric): one whose newest check failed stops
    the run (`--no-judge-check`: said once, and trained on); one never checked is said once."""

    def __init__(self, store: TrajectoryStore, settings: TrainSettings, events: Events) -> None:
        self._store, self._settings, self._events = store, settings, events
        self._said: set[tuple[str, str]] = set()

    async def vet(self, groups: Sequence[TrainableGroup]) -> None:
        judges = {group.judged_by for group in groups if group.judged_by is not None}
        checks = await self._store.newest_judge_checks(judges)
        for judge in sorted(judges - self._said):
            check = checks.get(judge)
            if check is not None and check.failed and self._settings.judge_check:
                raise ConfigError(
                    f"judge {judge[0]}'s scores failed their check ({check.line}); train on "
                    "them anyway with --no-judge-check"
                )
            self._said.add(judge)
            if check is None:
                self._events.warning(
                    f"judge {judge[0]}'s scores were never checked: `art-proxy judge --check` "
                    "says whether they follow quality or noise before a run trains on them"
                )
            elif check.failed:
                self._events.warning(
                    f"training on judge {judge[0]}'s scores although they failed their check "
                    "(--no-judge-check)"
                )


class JudgedSince:
    """Where the sidecar's next poll of judged groups starts, so that it reads what was judged
    lately rather than every group the run ever consumed (a million, in production).

    A poll reads the groups judged since the cursor; the cursor then moves to the oldest
    judgment among the groups it read and left for later (too few to train on yet), or, with
    none left, to the poll's start less `MARGIN_S` (a judgment is dated by the judge's clock
    before its commit). Every `FULL_POLL_S` a poll reads all groups again, which also brings
    back a group judged long ago and never taken (its judgment kept from an earlier run)."""

    MARGIN_S = 60.0
    FULL_POLL_S = 600.0

    def __init__(self) -> None:
        self._cursor: datetime | None = None
        self._full_at = -math.inf
        self._left: dict[str, datetime] = {}  # group id -> judged at, read but not consumed
        self._started: datetime | None = None  # the last poll's start

    def since(self) -> datetime | None:
        """The poll's cursor; None: read every group."""
        if time.monotonic() - self._full_at >= self.FULL_POLL_S:
            return None
        return self._cursor

    def read(self, started: datetime, groups: Sequence[TrainableGroup], *, full: bool) -> None:
        if full:
            self._full_at = time.monotonic()
            self._left = {}
        for group in groups:
            if group.judged_at is not None:
                self._left[group.group_id] = group.judged_at
        self._started = started
        self._move()

    def consumed(self, groups: Sequence[TrainableGroup]) -> None:
        for group in groups:
            self._left.pop(group.group_id, None)
        self._move()

    def _move(self) -> None:
        """Never past the last poll's start: what was judged since, it has not read."""
        assert self._started is not None, "moved before a poll"
        floor = self._started - timedelta(seconds=self.MARGIN_S)
        self._cursor = min([floor, *self._left.values()])
