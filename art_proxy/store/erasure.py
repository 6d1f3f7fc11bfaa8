"""Erasure with lineage: every record of a user, a tenant or a trajectory deleted, and the training
steps and adapters that learned from them listed first.

What a subject's trajectories leave in the store: their calls (request, response, token ids),
their feedback, the judgments of their groups (the judge's reasoning quotes the conversations, and
a judgment is also the judge's cache: a judgment reused from a deleted one goes with it), and the
opening of their scenarios (the conversation before the first reply, the scenario bank's source):
an opening is whichever conversation opened the scenario first, so every one of the subject's
scenarios loses it, though another user's trajectories may go on in it.
Deleted in batches of `BATCH` trajectories, a transaction each, so recording goes on meanwhile.
What stays: group and step rows (ids, counts and metrics, no text), since a training step's
record of what it consumed is the lineage itself; a group left with no member, read by no step,
goes too, and a scenario nothing names any more.

Lineage: a step that consumed one of the subject's groups learned from it (`trained`) or read it
for validation; every adapter its run saved from that step on continues from weights that did,
so those are the adapters to retrain. A step training on one of them now has claimed it
(`step_claims`) before reading its calls: it is named `training`, with its run.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from art_proxy.records import Erasure, LearnedAt, Lineage, SubjectSelector
from art_proxy.records.erasure import TRAINING
from art_proxy.records.trajectories import BEST_OF, SHADOW_OF
from art_proxy.store import fences, schema
from art_proxy.store.base import StoreBase, utcnow
from art_proxy.store.rows import Batch

T, C, F, J = schema.trajectories, schema.calls, schema.feedback, schema.judgments
G, S, CG, TS = schema.groups, schema.scenarios, schema.consumed_groups, schema.training_steps
SC, TSC, CL = schema.step_claims, schema.teacher_scores, schema.canary_looks

# Trajectories deleted per transaction: a tenant's thousands never hold the writer for long.
BATCH = 200
# Reads of a subject's trajectories an erasure deletes: the second finds what was committed
# just as the fence went up; a third only a writer that ignores fences (an older proxy).
_READS = 3


def _selects(subject: SubjectSelector) -> sa.ColumnElement[bool]:
    if subject.user is not None:
        return T.c.user_id == subject.user
    if subject.tenant is not None:
        return T.c.tenant_id == subject.tenant
    return T.c.id == subject.trajectory


@dataclass(frozen=True)
class Expired:
    """One retention batch: the trajectories deleted, and the rows deleted by table."""

    trajectory_ids: list[str]
    deleted: dict[str, int]


class ErasureRecords(StoreBase):
    async def lineage(self, subject: SubjectSelector) -> Lineage:
        """The subject's trajectories and groups, and what learned from them."""
        rows = await self._all(
            sa.select(T.c.id, T.c.group_id, T.c.scenario_id).where(_selects(subject))
        )
        if subject.trajectory is not None and rows:
            rows += await self._copies(subject.trajectory, rows[0]["scenario_id"])
        trajectories = sorted(row["id"] for row in rows)
        groups = sorted({row["group_id"] for row in rows})
        return await self._learned(trajectories, groups)

    async def _learned(self, trajectories: list[str], groups: list[str]) -> Lineage:
        """The lineage of `trajectories` in `groups`: the steps that read the groups or are
        training on them, and the adapters they led to."""
        steps = await self._steps_reading(groups)
        return Lineage(
            trajectories=trajectories,
            groups=groups,
            steps=steps,
            derived_adapters=await self._derived_adapters(steps),
            training_runs=sorted({step.run for step in steps if step.status == TRAINING}),
        )

    async def _copies(self, trajectory_id: str, scenario_id: str) -> list[dict[str, Any]]:
        """A trajectory's copies: its best-of candidates and shadow samples hold its opening.
        (A user's or tenant's carry its subject and go with it.) Both sit in its scenario."""
        marked = sa.or_(
            T.c.metadata[BEST_OF].as_string() == trajectory_id,
            T.c.metadata[SHADOW_OF].as_string() == trajectory_id,
        )
        return await self._all(
            sa.select(T.c.id, T.c.group_id, T.c.scenario_id).where(
                T.c.scenario_id == scenario_id,
                T.c.finish_reason.in_(("best_of", "shadow")),
                marked,
            )
        )

    async def forget(self, subject: SubjectSelector) -> Erasure:
        """Delete every record of `subject` (see the module), its lineage read first, behind a
        fence that drops the subject's records arriving later (fences.py)."""
        fence = fences.Fence(fences.FENCE_UP, uuid.uuid4().hex)
        await self._fence(fences.subject_keys(subject), fence)
        lineage = found = await self.lineage(subject)
        deleted = dict.fromkeys(
            ("trajectories", "calls", "feedback", "judgments", "groups", "canary_looks"), 0
        )
        scenarios: set[str] = set()
        # Read again after deleting: a record committed between the fence and the first read (on
        # SQLite a writer reads the fences just before it takes the write lock).
        for _ in range(_READS):
            ids = found.trajectories
            for start in range(0, len(ids), BATCH):
                batch = ids[start : start + BATCH]
                async with self._transaction() as connection:
                    await self._put(connection, fences.trajectory_keys(batch), fence)
                    deleted["canary_looks"] += await _delete_canary_looks_after(connection, batch)
                    counts, touched, _ = await _delete_trajectories(connection, batch)
                scenarios |= touched
                for table, count in counts.items():
                    deleted[table] += count
            found = await self.lineage(subject)
            if not found.trajectories:
                break
            lineage = _joined(lineage, found)
        # A step that claimed a group after the lineage was read may have read its calls before
        # they were deleted: its claim is committed by now.
        lineage = _joined(lineage, await self._learned([], lineage.groups))
        async with self._transaction() as connection:
            deleted["groups"] = await _delete_orphan_groups(connection, lineage.groups)
            deleted["scenarios"] = await _clear_openings(connection, sorted(scenarios))
            await connection.run_sync(fences.close, fence.erasure, utcnow())
        if len(lineage.trajectories) >= BATCH:
            await self.refresh_statistics()
        await self.checkpoint_wal()
        return Erasure(subject=subject.describe(), lineage=lineage, deleted=deleted)

    async def of_an_erased_trajectory(self, batch: Batch) -> bool:
        """Whether a batch the store refused records a trajectory an erasure fenced
        (`fences.names_an_erased_trajectory`): to be dropped, not set aside."""
        async with self._transaction() as connection:
            return await connection.run_sync(fences.names_an_erased_trajectory, batch)

    async def _fence(self, keys: list[str], fence: fences.Fence) -> None:
        """The subject's fence put up. On PostgreSQL the fence table is locked first, which
        waits for every writer transaction that read it without seeing the fence (their SELECT
        holds the weakest lock to their commit); SQLite has one writer at a time."""
        async with self._transaction() as connection:
            if connection.dialect.name == "postgresql":
                lock = "LOCK TABLE erasure_fences IN ACCESS EXCLUSIVE MODE"
                await connection.execute(sa.text(lock))
            await self._put(connection, keys, fence)

    @staticmethod
    async def _put(connection: AsyncConnection, keys: list[str], fence: fences.Fence) -> None:
        await connection.run_sync(fences.put, dict.fromkeys(keys, fence), replace=True)

    async def checkpoint_wal(self) -> None:
        """SQLite: the write-ahead log folded into the database and cut to nothing, so the page
        images it held of deleted rows go (the database's own pages are zeroed by secure_delete).
        Best effort: a reader holding an old snapshot keeps the log until it lets go."""
        if self.engine.dialect.name != "sqlite":
            return
        async with self.engine.connect() as connection:
            await connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    async def expire(self, before: datetime, limit: int = BATCH) -> Expired:
        """Retention, one batch: up to `limit` trajectories started before `before` deleted, as
        `forget` deletes (their groups' judgments, their scenarios' openings included); nothing
        deleted when none is left. A transaction of its own: the caller paces the batches."""
        rows = await self._all(
            sa.select(T.c.id)
            .where(T.c.created_at < before)
            .order_by(T.c.created_at, T.c.id)
            .limit(limit)
        )
        ids = [row["id"] for row in rows]
        if not ids:
            return Expired([], {})
        async with self._transaction() as connection:
            deleted, scenarios, groups = await _delete_trajectories(connection, ids)
            deleted["canary_looks"] = await _delete(connection, CL, CL.c.looked_at < before)
            deleted["groups"] = await _delete_orphan_groups(connection, groups)
            deleted["scenarios"] = await _clear_openings(connection, sorted(scenarios))
        return Expired(ids, deleted)

    async def refresh_statistics(self) -> None:
        """After deleting many rows: PostgreSQL's planner statistics brought up to date at once
        (autovacuum would, in its own time). SQLite keeps none, on purpose: every periodic
        read is shaped so its index is the plan without statistics (tests/test_store.py checks
        each plan), and statistics taken while a table was small would mislead it later."""
        if self.engine.dialect.name != "postgresql":
            return
        async with self._transaction() as connection:
            for table in ("trajectories", "calls", "groups", "judgments", "scenarios"):
                await connection.execute(sa.text(f"ANALYZE {table}"))

    async def _steps_reading(self, groups: Sequence[str]) -> list[LearnedAt]:
        """The steps that consumed any of `groups`, and those that have claimed any and are
        training on them (`training`: recorded, a step's claims are gone)."""
        consumed: list[dict[str, Any]] = []
        for start in range(0, len(groups), BATCH):
            chunk = groups[start : start + BATCH]
            consumed += await self._all(
                sa.select(CG.c.run, CG.c.step, CG.c.group_id, CG.c.outcome).where(
                    CG.c.group_id.in_(chunk)
                )
            )
            consumed += await self._all(
                sa.select(SC.c.run, SC.c.step, SC.c.group_id, sa.literal(TRAINING).label("outcome"))
                .where(SC.c.group_id.in_(chunk))
            )  # fmt: skip
        by_step: dict[tuple[str, int], dict[str, Any]] = {}
        for row in consumed:
            by_step.setdefault((row["run"], row["step"]), {})[row["group_id"]] = row["outcome"]
        steps: list[LearnedAt] = []
        for (run, step), outcomes in sorted(by_step.items()):
            found = await self._first(
                sa.select(TS.c.kind, TS.c.status, TS.c.adapter).where(
                    TS.c.run == run, TS.c.step == step
                )
            )
            if found is None:  # claimed by a step that is training now
                found = {"kind": "grpo", "status": TRAINING, "adapter": None}
            steps.append(LearnedAt(run=run, step=step, groups=outcomes, **found))
        return steps

    async def _derived_adapters(self, steps: Sequence[LearnedAt]) -> list[str]:
        """Adapters of each run from its first step that trained on the subject onwards."""
        first_learned: dict[str, int] = {}
        for step in steps:
            if step.status == "applied" and "trained" in step.groups.values():
                first_learned[step.run] = min(first_learned.get(step.run, step.step), step.step)
        adapters: list[str] = []
        for run, first in sorted(first_learned.items()):
            rows = await self._all(
                sa.select(TS.c.adapter)
                .where(TS.c.run == run, TS.c.step >= first, TS.c.adapter.is_not(None))
                .order_by(TS.c.step)
            )
            adapters += [row["adapter"] for row in rows]
        return adapters


def _joined(first: Lineage, late: Lineage) -> Lineage:
    """`first` with what a second read of the subject found."""
    steps = {(step.run, step.step): step for step in [*first.steps, *late.steps]}
    return Lineage(
        trajectories=sorted({*first.trajectories, *late.trajectories}),
        groups=sorted({*first.groups, *late.groups}),
        steps=[steps[key] for key in sorted(steps)],
        derived_adapters=list(dict.fromkeys([*first.derived_adapters, *late.derived_adapters])),
        training_runs=sorted({*first.training_runs, *late.training_runs}),
    )


async def _delete_trajectories(
    connection: AsyncConnection, trajectory_ids: list[str]
) -> tuple[dict[str, int], set[str], list[str]]:
    """Delete the trajectories and what hangs on them; the counts, their scenarios and groups.
    On PostgreSQL the trajectories are locked before their groups' judgments are read: a
    judgment being stored of one of them holds a share lock until it commits, so it is read here
    and deleted, or it waits and finds its member gone (store/judgments.py)."""
    members = sa.select(T.c.group_id, T.c.scenario_id).where(T.c.id.in_(trajectory_ids))
    if connection.dialect.name == "postgresql":
        members = members.with_for_update()
    rows = (await connection.execute(members)).all()
    groups = sorted({row.group_id for row in rows})
    judgments = [
        row.id
        for row in (await connection.execute(sa.select(J.c.id).where(J.c.group_id.in_(groups))))
    ]
    feedback = await _delete(connection, F, F.c.trajectory_id.in_(trajectory_ids))
    await _delete(connection, TSC, TSC.c.trajectory_id.in_(trajectory_ids))  # a teacher's words
    calls = await _delete(connection, C, C.c.trajectory_id.in_(trajectory_ids))
    judged = sa.or_(J.c.id.in_(judgments), J.c.cached_from.in_(judgments))
    judgments_deleted = await _delete(connection, J, judged)
    counts = {
        "trajectories": await _delete(connection, T, T.c.id.in_(trajectory_ids)),
        "calls": calls,
        "feedback": feedback,
        "judgments": judgments_deleted,
    }
    return counts, {row.scenario_id for row in rows}, groups


async def _delete_canary_looks_after(connection: AsyncConnection, trajectory_ids: list[str]) -> int:
    """A canary's looks from the first of these production trajectories on: each look holds
    its arms' counts and means, and two looks in a row differ by about one trajectory's reward,
    so an erased trajectory's would be read back from them. The next look recomputes without it."""
    first = (
        sa.select(sa.func.min(T.c.created_at))
        .where(T.c.id.in_(trajectory_ids), T.c.split == "prod")
        .scalar_subquery()
    )
    return await _delete(connection, CL, CL.c.looked_at >= first)


async def _delete_orphan_groups(connection: AsyncConnection, groups: list[str]) -> int:
    """Groups among `groups` left with no member and read by no step."""
    deleted = 0
    for start in range(0, len(groups), BATCH):
        chunk = groups[start : start + BATCH]
        empty = (
            sa.select(G.c.id)
            .where(G.c.id.in_(chunk))
            .where(~sa.exists().where(T.c.group_id == G.c.id))
            .where(~sa.exists().where(CG.c.group_id == G.c.id))
            .where(~sa.exists().where(J.c.group_id == G.c.id))
        )
        orphans = [row.id for row in await connection.execute(empty)]
        deleted += await _delete(connection, G, G.c.id.in_(orphans))
    return deleted


async def _clear_openings(connection: AsyncConnection, scenarios: list[str]) -> int:
    """The openings of `scenarios` cleared; a scenario nothing names any more, deleted."""
    cleared = 0
    for start in range(0, len(scenarios), BATCH):
        chunk = scenarios[start : start + BATCH]
        named = sa.or_(
            sa.exists().where(T.c.scenario_id == S.c.id),
            sa.exists().where(G.c.scenario_id == S.c.id),
        )
        cleared += await _delete(connection, S, S.c.id.in_(chunk) & ~named)
        result = await connection.execute(sa.update(S).where(S.c.id.in_(chunk)).values(opening=[]))
        cleared += result.rowcount
    return cleared


async def _delete(
    connection: AsyncConnection, table: sa.Table, where: sa.ColumnElement[bool]
) -> int:
    result = await connection.execute(sa.delete(table).where(where))
    return int(result.rowcount)
