"""The trajectory store: group-committed writes on the hot path, typed records on the way out.

Rows become records (`art_proxy.records`) here, in `training.py` (aliases and trainer steps), in
`feedback.py` (users' feedback, the scenario bank), in `judgments.py` (RULER's judgments), in
`erasure.py` and `evaluations.py`, which this store inherits with `attribution.py` (what the proxy
reads to attribute a call), and in `dashboard.py` (the dashboard's read-only pages), nowhere else.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from art_proxy.errors import StoreError
from art_proxy.records import (
    CallRecord,
    ExportedTrajectory,
    FinishRequest,
    GroupRecord,
    JsonObject,
    ScenarioRecord,
    TrajectoryRecord,
)
from art_proxy.store import schema
from art_proxy.store.attribution import AttributionReads
from art_proxy.store.base import (
    DATABASE_ERRORS,
    aware,
    counted_page,
    group_record,
    has_member,
    is_split,
    store_unreachable,
    utcnow,
)
from art_proxy.store.engine import (
    TransactionRunner,
    create_engine,
    migrate,
    transaction_runner,
)
from art_proxy.store.erasure import ErasureRecords
from art_proxy.store.evaluations import EvaluationRecords
from art_proxy.store.feedback import FeedbackRecords
from art_proxy.store.judgments import JudgmentRecords
from art_proxy.store.rows import Batch
from art_proxy.store.training import TrainingRecords
from art_proxy.store.writer import GroupCommitWriter

__all__ = ["TrajectoryStore", "final_messages", "utcnow"]

log = logging.getLogger(__name__)

T, C, G, S = schema.trajectories, schema.calls, schema.groups, schema.scenarios


class TrajectoryStore(
    AttributionReads,
    TrainingRecords,
    FeedbackRecords,
    JudgmentRecords,
    ErasureRecords,
    EvaluationRecords,
):
    def __init__(self, engine: AsyncEngine, runner: TransactionRunner) -> None:
        self.engine = engine
        self.writer = GroupCommitWriter(engine.dialect.name, runner)
        self.unreadable_rows = 0
        self.migrated = False

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        writer: bool = True,
        unreachable_ok: bool = False,
        power_safe: bool = False,
        existing: bool = False,
    ) -> TrajectoryStore:
        """Connect, migrate to the newest schema and (for a proxy) start the group-commit writer.
        With `unreachable_ok` a store that cannot be reached now is opened all the same,
        unmigrated: `migrate()` once it answers (a proxy with a journal, which needs no store to
        take calls). `power_safe`: the writer's commits survive power loss once they return.
        `existing`: a SQLite store that is not there is refused, not made (a read command)."""
        engine = create_engine(url, existing=existing)
        store = cls(engine, transaction_runner(url, engine, power_safe=power_safe))
        try:
            await store.migrate()
        except StoreError as exc:
            if not (unreachable_ok and store_unreachable(exc)):
                await store.aclose()
                raise
        if writer:
            store.writer.start()
        return store

    async def migrate(self) -> None:
        """Bring the schema to the newest revision (idempotent); `StoreError` if it cannot be."""
        try:
            await migrate(self.engine)
        except DATABASE_ERRORS as exc:
            raise StoreError(f"cannot open store {self.engine.url!r}: {exc}") from exc
        self.migrated = True

    @classmethod
    @contextlib.asynccontextmanager
    async def opened(
        cls, url: str, *, writer: bool = True, power_safe: bool = False, existing: bool = False
    ) -> AsyncIterator[TrajectoryStore]:
        """`open` for an `async with` block, which closes the store when it ends."""
        store = await cls.open(url, writer=writer, power_safe=power_safe, existing=existing)
        try:
            yield store
        finally:
            await store.aclose()

    async def aclose(self) -> None:
        await self.writer.aclose()
        await self.engine.dispose()

    async def write(self, batch: Batch) -> None:
        await self.writer.write(batch)

    # --- lifecycle -------------------------------------------------------------------------------

    async def finish(self, trajectory_id: str, request: FinishRequest) -> TrajectoryRecord | None:
        now = utcnow()
        async with self._transaction() as connection:
            result = await connection.execute(
                sa.update(T)
                .where(T.c.id == trajectory_id)
                .values(
                    status="finished",
                    finish_reason=sa.case(
                        (T.c.status == "open", "client"), else_=T.c.finish_reason
                    ),
                    finished_at=sa.func.coalesce(T.c.finished_at, now),
                    updated_at=now,
                    reward=request.reward,
                    metrics=request.metrics,
                    metadata=request.metadata,
                )
            )
            if result.rowcount == 0:
                return None
        return await self.trajectory(trajectory_id)

    async def finish_idle(self, idle_since: datetime) -> list[str]:
        """Finish every open trajectory without a call since `idle_since`; returns their ids."""
        async with self._transaction() as connection:
            result = await connection.execute(
                sa.update(T)
                .where(schema.IS_OPEN, T.c.updated_at < idle_since)
                .values(status="finished", finish_reason="idle", finished_at=utcnow())
                .returning(T.c.id)
            )
            return [str(row[0]) for row in result]

    # --- reading back ----------------------------------------------------------------------------

    async def trajectory(
        self, trajectory_id: str, *, with_calls: bool = True
    ) -> TrajectoryRecord | None:
        row = await self._first(sa.select(T).where(T.c.id == trajectory_id))
        if row is None:
            return None
        calls = await self.calls([trajectory_id]) if with_calls else None
        record = self._readable(
            _trajectory_record, row, calls.get(trajectory_id, []) if calls is not None else None
        )
        if record is None:
            raise StoreError(f"trajectory {trajectory_id!r} is stored in a form it cannot be read")
        return record

    async def trajectories(
        self,
        *,
        scenario: str | None = None,
        status: str | None = None,
        split: str | None = None,
        group: str | None = None,
        user: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
        offset: int = 0,
        oldest_first: bool = False,
    ) -> list[TrajectoryRecord]:
        """Newest first (or oldest first: stable pages while new ones arrive, for export)."""
        order = T.c.created_at.asc() if oldest_first else T.c.created_at.desc()
        query = sa.select(T).order_by(order, T.c.id).limit(limit).offset(offset)
        for column, value in (
            (T.c.scenario_id, scenario),
            (T.c.status, status),
            (T.c.group_id, group),
            (T.c.user_id, user),
            (T.c.tenant_id, tenant),
        ):
            if value is not None:
                query = query.where(column == value)
        if split is not None:
            # By the split's index only when no scenario or group narrows it down more.
            narrowed = scenario is not None or group is not None
            query = query.where(is_split(split) if narrowed else T.c.split == split)
        records = (self._readable(_trajectory_record, row, None) for row in await self._all(query))
        return [record for record in records if record is not None]

    async def trajectory_metrics(
        self, trajectory_ids: Sequence[str]
    ) -> dict[str, dict[str, float]]:
        """What each agent reported of its rollout beside the reward (`RolloutOutcome.metrics`),
        by trajectory id; one without any is left out."""
        rows = await self._all(sa.select(T.c.id, T.c.metrics).where(T.c.id.in_(trajectory_ids)))
        return {row["id"]: dict(row["metrics"]) for row in rows if row["metrics"]}

    async def calls(self, trajectory_ids: Sequence[str]) -> dict[str, list[CallRecord]]:
        rows = await self._all(
            sa.select(C)
            .where(C.c.trajectory_id.in_(trajectory_ids))
            .order_by(C.c.seq, C.c.created_at)
        )
        by_trajectory: dict[str, list[CallRecord]] = {}
        for row in rows:
            record = self._readable(_call_record, row)
            if record is not None:
                by_trajectory.setdefault(row["trajectory_id"], []).append(record)
        return by_trajectory

    async def groups(
        self, *, scenario: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[GroupRecord]:
        """Newest first."""
        page = (
            sa.select(G)
            .where(has_member())  # as `counted_page`'s join would
            .order_by(G.c.created_at.desc(), G.c.id)
            .limit(limit)
            .offset(offset)
        )
        if scenario is not None:
            page = page.where(G.c.scenario_id == scenario)
        query = counted_page(page, newest_first=True)
        return [group_record(row) for row in await self._all(query)]

    async def scenarios(self) -> list[ScenarioRecord]:
        rows = await self._all(sa.select(S).order_by(S.c.created_at.desc()))
        return [
            ScenarioRecord.model_validate({**row, "created_at": aware(row["created_at"])})
            for row in rows
        ]

    async def export(
        self,
        *,
        scenario: str | None,
        status: str | None,
        split: str | None,
        user: str | None = None,
        tenant: str | None = None,
        page_size: int = 200,
    ) -> AsyncIterator[ExportedTrajectory]:
        """Every matching trajectory whole, oldest first, read a page at a time."""
        offset = 0
        while True:
            page = await self.trajectories(
                scenario=scenario,
                status=status,
                split=split,
                user=user,
                tenant=tenant,
                limit=page_size,
                offset=offset,
                oldest_first=True,
            )
            if not page:
                return
            calls = await self.calls([t.id for t in page])
            judged = await self._judged_rewards([t.group_id for t in page])
            for trajectory in page:
                own_calls = calls.get(trajectory.id, [])
                yield ExportedTrajectory(
                    trajectory=trajectory.model_copy(update={"calls": own_calls}),
                    messages=final_messages(own_calls),
                    trainable=bool(own_calls) and all(call.trainable for call in own_calls),
                    judged_reward=judged.get(trajectory.id),
                )
            offset += page_size


def final_messages(calls: Sequence[CallRecord]) -> list[JsonObject]:
    """The conversation as it ended: the last chat call's messages plus its first reply."""
    for call in reversed(calls):
        if call.kind != "chat" or call.response is None:
            continue
        messages = list(call.request.get("messages") or [])
        choices = call.response.get("choices") or []
        if choices and isinstance(choices[0].get("message"), dict):
            reply = {k: v for k, v in choices[0]["message"].items() if v is not None}
            messages.append(reply)
        return messages
    return []


def _trajectory_record(row: JsonObject, calls: list[CallRecord] | None) -> TrajectoryRecord:
    return TrajectoryRecord(
        id=row["id"],
        scenario_id=row["scenario_id"],
        group_id=row["group_id"],
        split=row["split"],
        status=row["status"],
        finish_reason=row["finish_reason"],
        created_at=aware(row["created_at"]),
        updated_at=aware(row["updated_at"]),
        finished_at=aware(row["finished_at"]),
        upstream=row["upstream"],
        call_count=row["call_count"],
        reward=row["reward"],
        metrics=row["metrics"] or {},
        metadata=row["metadata"] or {},
        user_id=row["user_id"],
        tenant_id=row["tenant_id"],
        calls=calls,
    )


def _call_record(row: JsonObject) -> CallRecord:
    fields = {name: row[name] for name in CallRecord.model_fields if name in row}
    fields["created_at"] = aware(row["created_at"])
    return CallRecord.model_validate(fields)
