"""Read-only queries the dashboard needs beyond `TrajectoryStore`'s: a filtered page of groups with
the status a person watches (running, waiting for the judge, scored...), the trainer runs, and
which steps consumed a group. Nothing here writes.

A group's status is its newest judgment's (`scored`, `judge_failed`, `skipped`) once it has one,
else `open` while a member runs and `finished` when all are done and the judge has not spoken yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from art_proxy.records import GroupOutcome, JsonObject, Split, TrajectoryScore
from art_proxy.store import schema
from art_proxy.store.base import StoreBase, counted_page, group_split, has_member, is_split

T, G, S, J = schema.trajectories, schema.groups, schema.scenarios, schema.judgments
CG, TS = schema.consumed_groups, schema.training_steps

GroupStatus = Literal["open", "finished", "scored", "judge_failed", "skipped"]
GROUP_STATUSES: tuple[GroupStatus, ...] = get_args(GroupStatus)


@dataclass(frozen=True)
class GroupFilter:
    split: Split | None = None
    status: GroupStatus | None = None
    scenario: str | None = None
    user: str | None = None
    tenant: str | None = None
    limit: int = 50
    offset: int = 0


@dataclass(frozen=True)
class GroupSummary:
    id: str
    scenario_id: str
    created_at: datetime
    size: int
    open_count: int
    split: str
    status: GroupStatus
    opening: list[JsonObject]
    programmatic_mean: float | None  # mean of the rewards the agent reported at finish
    judge_model: str | None
    judge_reason: str | None
    scores: list[TrajectoryScore]  # the newest judgment's

    @property
    def reward_mean(self) -> float | None:
        if not self.scores:
            return None
        return sum(score.reward for score in self.scores) / len(self.scores)


@dataclass(frozen=True)
class Consumption:
    run: str
    step: int
    outcome: GroupOutcome


class DashboardQueries(StoreBase):
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def group_page(self, where: GroupFilter) -> list[GroupSummary]:
        """Groups matching `where`, newest first.

        The page is chosen first, walking the groups newest first and testing each against
        `where` (its newest judgment, an open member, a member of the split: lookups by the group's
        id), and only its groups' members are counted: counting every group's members for each
        page took 200 ms beside 100,000 groups, and grew with the store."""
        newest_judgment = _newest_judgment(J.c.id)
        page = (
            sa.select(G.c.id, G.c.scenario_id, G.c.created_at, newest_judgment.label("judgment_id"))
            .where(has_member())  # as `counted_page`'s join would
            .order_by(G.c.created_at.desc(), G.c.id)
            .limit(where.limit)
            .offset(where.offset)
        )
        if where.scenario is not None:
            page = page.where(G.c.scenario_id == where.scenario)
        if where.split is not None:
            page = page.where(has_member(is_split(where.split)))
        for column, subject in ((T.c.user_id, where.user), (T.c.tenant_id, where.tenant)):
            if subject is not None:  # the subject's groups, found by its index
                page = page.where(G.c.id.in_(sa.select(T.c.group_id).where(column == subject)))
        if where.status in ("scored", "judge_failed", "skipped"):
            page = page.where(_newest_judgment(J.c.status) == where.status)
        elif where.status is not None:
            open_member = has_member(T.c.status == "open")
            page = page.where(
                newest_judgment.is_(None), open_member if where.status == "open" else ~open_member
            )
        per_group = counted_page(
            page,
            group_split().label("split"),
            sa.func.avg(T.c.reward).label("programmatic_mean"),
            newest_first=True,
        ).subquery("counted")
        query = (
            sa.select(
                per_group,
                S.c.opening,
                J.c.status.label("judgment_status"),
                J.c.reason.label("judge_reason"),
                J.c.judge_model,
                J.c.scores,
            )
            .join(S, S.c.id == per_group.c.scenario_id)
            .outerjoin(J, J.c.id == per_group.c.judgment_id)
            .order_by(per_group.c.created_at.desc(), per_group.c.id)
        )
        return [_group_summary(row) for row in await self._all(query)]

    async def runs(self) -> list[str]:
        """Trainer runs, the one with the newest step first."""
        newest = sa.func.max(TS.c.created_at)
        rows = await self._all(sa.select(TS.c.run).group_by(TS.c.run).order_by(newest.desc()))
        return [row["run"] for row in rows]

    async def consumptions(self, group_id: str) -> list[Consumption]:
        """Which trainer runs consumed the group, at which step, and what the step did with it."""
        query = sa.select(CG).where(CG.c.group_id == group_id).order_by(CG.c.consumed_at)
        return [
            Consumption(run=row["run"], step=row["step"], outcome=row["outcome"])
            for row in await self._all(query)
        ]


def _newest_judgment(column: sa.Column[Any]) -> sa.ScalarSelect[Any]:
    """`column` of the newest judgment of the group (`groups`) that the query reads."""
    return (
        sa.select(column)
        .where(J.c.group_id == G.c.id)
        .order_by(J.c.created_at.desc(), J.c.id.desc())
        .limit(1)
        .correlate(G)
        .scalar_subquery()
    )


def _group_summary(row: JsonObject) -> GroupSummary:
    open_count = int(row["open_count"] or 0)
    status: GroupStatus = row["judgment_status"] or ("open" if open_count else "finished")
    return GroupSummary(
        id=row["id"],
        scenario_id=row["scenario_id"],
        created_at=row["created_at"],  # naive from SQLite: the pages read it as UTC
        size=int(row["size"]),
        open_count=open_count,
        split=row["split"],
        status=status,
        opening=row["opening"] or [],
        programmatic_mean=row["programmatic_mean"],
        judge_model=row["judge_model"],
        judge_reason=row["judge_reason"],
        scores=[TrajectoryScore.model_validate(score) for score in row["scores"] or []],
    )
