"""Judging what the store holds: find the ready groups, score each, keep count.

A group is ready when it has `group_size` finished members, or when `wait` seconds have passed
since its newest member started and at least two have finished; a group whose members all finished
with fewer than two is ready too, and is recorded `skipped`. Each pass takes the groups with no
judgment by this judge (or ensemble), mode, rubric and reward rule; a group is scored at most once
per run, so a judge that keeps failing costs one `judge_failed` record per group, never a loop.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from art_proxy.records import ROLLOUT_ERROR, GroupRecord, Judgment
from art_proxy.ruler.prompt import Member
from art_proxy.ruler.scorer import Ruler
from art_proxy.store.base import GroupPosition
from art_proxy.store.trajectory_store import TrajectoryStore, final_messages, utcnow

# Groups with more members than this are judged with their first ones only.
_MAX_MEMBERS = 1000
_PAGE = 1000
# How often a watching judge's pass starts from the first group again (see `ready_groups`).
FULL_PASS_S = 600.0


@dataclass(frozen=True)
class Readiness:
    group_size: int = 0  # 0 = unknown
    wait: float = 600.0  # seconds after the newest member started

    def ready(self, group: GroupRecord, now: datetime) -> bool:
        return self.waiting_for(group, now) is None

    def waiting_for(self, group: GroupRecord, now: datetime) -> str | None:
        """What the group waits for before it is judged (None: ready), as a reason a user can act
        on."""
        finished = group.size - group.open_count
        if self.group_size and finished >= self.group_size:
            return None
        newest = group.newest_started_at
        if newest is not None and (age := (now - newest).total_seconds()) < self.wait:
            if self.group_size:
                still = f", {group.open_count} still open" if group.open_count else ""
                return f"{finished} of --group-size {self.group_size} runs finished{still}"
            return (
                f"its newest run started {age:.0f}s ago (--wait {self.wait:.0f}s; "
                "--group-size judges a full group at once)"
            )
        if finished >= 2 or group.open_count == 0:
            return None
        return f"{group.open_count} of its runs still open, {finished} finished"


@dataclass
class Totals:
    """What a run did, for the summary."""

    scored: int = 0
    judge_failed: int = 0
    skipped: int = 0
    cache_hits: int = 0
    failed_members: int = 0  # ensemble members that failed, their group scored or not
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    failures: list[Judgment] = field(default_factory=list)

    def add(self, judgment: Judgment) -> None:
        if judgment.status == "scored":
            self.scored += 1
        elif judgment.status == "skipped":
            self.skipped += 1
        else:
            self.judge_failed += 1
        if judgment.status != "scored":
            self.failures.append(judgment)
        self.cache_hits += judgment.cached_from is not None
        self.failed_members += sum(m.status == "judge_failed" for m in judgment.members)
        self.calls += judgment.attempts
        self.prompt_tokens += judgment.prompt_tokens
        self.completion_tokens += judgment.completion_tokens
        self.cost_usd += judgment.cost_usd

    @property
    def judged(self) -> int:
        return self.scored + self.judge_failed + self.skipped

    def metrics(self) -> dict[str, float]:
        """The run so far as a tracker's figures."""
        return {
            "groups_scored": self.scored,
            "groups_judge_failed": self.judge_failed,
            "groups_skipped": self.skipped,
            "cache_hits": self.cache_hits,
            "failed_members": self.failed_members,
            "judge_calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_usd": self.cost_usd,
        }


async def finished_members(store: TrajectoryStore, group_id: str) -> list[Member]:
    """The group's finished trajectories, oldest first, each with its conversation as it ended,
    the reward the agent reported and users' feedback. Rollouts whose agent failed
    (`rollout_error`) are left out, and so are runs none of whose calls was answered (every call
    a 404 or an upstream error): there is nothing of the agent's to compare."""
    found = await store.trajectories(group=group_id, status="finished", limit=_MAX_MEMBERS)
    found = [trajectory for trajectory in found if ROLLOUT_ERROR not in trajectory.metadata]
    found.sort(key=lambda trajectory: (trajectory.created_at, trajectory.id))
    ids = [trajectory.id for trajectory in found]
    calls, feedback = await store.calls(ids), await store.feedback(ids)
    members = [
        Member(t.id, final_messages(calls.get(t.id, [])), t.reward, feedback.get(t.id, ()))
        for t in found
    ]
    return [member for member in members if answered(member)]


def answered(member: Member) -> bool:
    """The run has a reply of the model's: its conversation ends with the assistant."""
    return bool(member.messages) and member.messages[-1].get("role") == "assistant"


class GroupJudge:
    """Scores the ready groups of a store, pass after pass."""

    def __init__(
        self,
        ruler: Ruler,
        readiness: Readiness,
        *,
        concurrency: int = 4,
        retry_failed: bool = False,
    ) -> None:
        self.ruler = ruler
        self.readiness = readiness
        self.totals = Totals()
        self._semaphore = asyncio.Semaphore(concurrency)
        self._retry_failed = retry_failed
        self._seen: set[str] = set()
        # Why each unjudged group the last pass found is not ready yet, by group id.
        self.waiting: dict[str, str] = {}
        # Every group up to here is judged, or was sent to the judge: a pass starts after it.
        self._floor: GroupPosition | None = None
        self._full_pass_at = -math.inf  # time.monotonic() of the last pass from the beginning

    async def ready_groups(self) -> list[GroupRecord]:
        """The unjudged groups ready to be judged (`waiting` says why the others are not).

        A pass reads what is new: it starts after the floor, the point up to which every group
        was judged in an earlier pass (a watching judge's round over a store of a million
        judged groups reads none of them). Every `FULL_PASS_S` a pass starts from the beginning
        again: a proxy's journal may bring in, late, groups that started before the floor."""
        now = utcnow()
        full = time.monotonic() - self._full_pass_at >= FULL_PASS_S
        newest = await self.ruler.store.newest_group()
        ready: list[GroupRecord] = []
        self.waiting = {}
        unresolved: GroupRecord | None = None  # the oldest group this pass leaves unjudged
        last: GroupPosition | GroupRecord | None = None if full else self._floor
        while True:  # page by page: groups still filling must not hide the ready ones behind them
            page = await self.ruler.store.unjudged_groups(
                judge_model=self.ruler.judge_model,
                mode=self.ruler.settings.mode,
                rubric_hash=self.ruler.rubric_hash,
                reward_rule=self.ruler.settings.reward.name,
                retry_failed=self._retry_failed,
                limit=_PAGE,
                after=last,
            )
            # A group a trainer consumed is done with: judging it anew (a new rubric, a new
            # judge) would cost calls no step reads.
            consumed = await self.ruler.store.consumed_among([group.id for group in page])
            self._seen |= consumed
            for group in page:
                if group.id in self._seen:
                    continue
                reason = self.readiness.waiting_for(group, now)
                if reason is None:
                    ready.append(group)
                else:
                    self.waiting[group.id] = reason
                    unresolved = unresolved or group
            if len(page) < _PAGE:
                break
            last = page[-1]
        if full:
            self._full_pass_at = time.monotonic()
        if unresolved is not None:  # the next pass starts at it (ids sort after "")
            self._floor = GroupPosition(unresolved.created_at, "")
        elif newest is not None:  # the ready ones are sent to the judge now
            self._floor = newest
        return ready

    async def judge(
        self, groups: Sequence[GroupRecord], on_judgment: Callable[[Judgment], None]
    ) -> None:
        async def one(group: GroupRecord) -> None:
            async with self._semaphore:
                members = await finished_members(self.ruler.store, group.id)
                judgment = await self.ruler.score_group(group.id, members)
            self.totals.add(judgment)
            on_judgment(judgment)

        self._seen.update(group.id for group in groups)
        await asyncio.gather(*(one(group) for group in groups))
