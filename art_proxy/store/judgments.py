"""RULER's judgments: the groups a judge has yet to score, and what it said of each."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import sqlalchemy as sa

from art_proxy.records import (
    BEST_OF_JUDGE_PREFIX,
    GroupRecord,
    JsonObject,
    JudgeCheckRecord,
    JudgeMode,
    Judgment,
)
from art_proxy.store import schema
from art_proxy.store.base import (
    GroupPosition,
    StoreBase,
    after_position,
    aware,
    counted_page,
    group_record,
    has_member,
    not_an_evaluation,
)
from art_proxy.store.rows import JudgmentRow

G, J, T = schema.groups, schema.judgments, schema.trajectories
JC = schema.judge_checks


class JudgmentRecords(StoreBase):
    async def unjudged_groups(
        self,
        *,
        judge_model: str,
        mode: JudgeMode,
        rubric_hash: str,
        reward_rule: str = "ruler",
        retry_failed: bool = False,
        limit: int = 1000,
        after: GroupPosition | GroupRecord | None = None,
    ) -> list[GroupRecord]:
        """Groups without a judgment by this judge, mode, rubric and reward rule, oldest first,
        from the one `after` (the last of the previous page); with `retry_failed`, groups whose
        judgments all failed count as unjudged too. An evaluation's groups are never among them
        (`art-proxy eval` judges its own).

        A page starts where the last one ended (`counted_page` counts only its members): pages by
        offset, each counting every group's members again, made a judge's look over 100,000
        unjudged groups (production traffic's groups of one, say) quadratic: 25.8 s, now 1.4-1.6."""
        judged = sa.select(J.c.id).where(
            J.c.group_id == G.c.id,
            J.c.judge_model == judge_model,
            J.c.mode == mode,
            J.c.rubric_hash == rubric_hash,
            J.c.reward_rule == reward_rule,
        )
        if retry_failed:
            judged = judged.where(J.c.status != "judge_failed")
        # A best-of group was judged as it was served (proxy/best_of.py): that ranking chose the
        # user's answer, and is what the group trains on. One whose judge failed then is open to
        # judging as any other.
        served = sa.select(J.c.id).where(
            J.c.group_id == G.c.id,
            J.c.judge_model.startswith(BEST_OF_JUDGE_PREFIX),
            J.c.status == "scored",
        )
        page = (
            sa.select(G)
            .where(~sa.exists(judged), ~sa.exists(served), has_member(), not_an_evaluation())
            .order_by(G.c.created_at, G.c.id)
            .limit(limit)
        )
        query = counted_page(after_position(page, after), newest_first=False)
        return [group_record(row) for row in await self._all(query)]

    async def newest_group(self) -> GroupPosition | None:
        """Where the groups end now (read from the end of their index)."""
        row = await self._first(
            sa.select(G.c.created_at, G.c.id)
            .order_by(G.c.created_at.desc(), G.c.id.desc())
            .limit(1)
        )
        if row is None:
            return None
        created = aware(row["created_at"])
        assert created is not None  # groups.created_at is NOT NULL
        return GroupPosition(created, row["id"])

    async def add_judgment(self, judgment: Judgment) -> bool:
        """Store a judgment; False (nothing written) when a trajectory it judged is no longer
        in the store: erased while it was judged, whose words its reason and explanations
        quote."""
        judged = set(judgment.trajectory_ids)
        present = sa.select(T.c.id).where(T.c.id.in_(judged))
        if len(await self._all(present)) < len(judged):
            return False  # gone already: its group may be too, which the insert would not find
        try:
            async with self._transaction() as connection:
                # Written first: on SQLite the insert takes the one writer's lock, so an erasure
                # either committed before it (its members are gone below) or waits for it and
                # then reads it among the group's judgments; on PostgreSQL the members' share
                # locks wait for an erasure that locked them (store/erasure.py).
                await connection.execute(sa.insert(J).values(judgment_row(judgment)))
                if connection.dialect.name == "postgresql":
                    present = present.with_for_update(read=True)
                if len((await connection.execute(present)).all()) < len(judged):
                    raise _MemberErased
        except _MemberErased:
            return False  # rolled back
        return True

    async def record_judge_check(self, check: JudgeCheckRecord) -> None:
        async with self._transaction() as connection:
            await connection.execute(sa.insert(JC).values(check.model_dump()))

    async def judge_checks(self, *, limit: int = 20) -> list[JudgeCheckRecord]:
        """What `judge --check` found, newest first."""
        query = sa.select(JC).order_by(JC.c.created_at.desc(), JC.c.id.desc()).limit(limit)
        return [_judge_check(row) for row in await self._all(query)]

    async def newest_judge_checks(
        self, judges: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], JudgeCheckRecord]:
        """The newest check of each (judge model, rubric hash) of `judges` that has one."""
        found: dict[tuple[str, str], JudgeCheckRecord] = {}
        for judge_model, rubric_hash in set(judges):
            rows = await self._all(
                sa.select(JC)
                .where(JC.c.judge_model == judge_model, JC.c.rubric_hash == rubric_hash)
                .order_by(JC.c.created_at.desc(), JC.c.id.desc())
                .limit(1)
            )
            for row in rows:
                found[judge_model, rubric_hash] = _judge_check(row)
        return found

    async def judgments(self, *, group: str | None = None, limit: int = 100) -> list[Judgment]:
        """Newest first."""
        query = sa.select(J).order_by(J.c.created_at.desc(), J.c.id).limit(limit)
        if group is not None:
            query = query.where(J.c.group_id == group)
        return [_judgment(row) for row in await self._all(query)]

    async def cached_judgment(self, cache_key: str) -> Judgment | None:
        """The newest scored judgment of exactly this prompt to this judge (see ruler/cache.py)."""
        row = await self._first(
            sa.select(J)
            .where(J.c.cache_key == cache_key, J.c.status == "scored")
            .order_by(J.c.created_at.desc())
            .limit(1)
        )
        return None if row is None else _judgment(row)


def _judge_check(row: JsonObject) -> JudgeCheckRecord:
    fields = {name: row[name] for name in JudgeCheckRecord.model_fields}
    return JudgeCheckRecord.model_validate({**fields, "created_at": aware(row["created_at"])})


class _MemberErased(Exception):
    """A judged trajectory is gone: the judgment's transaction rolls back."""


def judgment_row(judgment: Judgment) -> JudgmentRow:
    """`judgment` as its table row (and a journaled record's: store/rows.py)."""
    row = judgment.model_dump(exclude={"scores", "members"})
    row["scores"] = [score.model_dump() for score in judgment.scores]
    row["members"] = [member.model_dump() for member in judgment.members]
    return cast(JudgmentRow, row)


def _judgment(row: JsonObject) -> Judgment:
    # Judgments stored before ensembles (migration 0003) have no members.
    members = row["members"] or []
    return Judgment.model_validate(
        {**row, "members": members, "created_at": aware(row["created_at"])}
    )
