"""Training records: model aliases and their moves, trainer steps, and what each run consumed.

An alias and the move that records it are written in one transaction, so the history never misses
a move. A run consumes each group at exactly one step: `consumed_groups` has (run, group) as its
primary key, and a step that names a group its run already consumed is refused whole. Recording a
step is idempotent (a resumed trainer rolls a checkpointed step forward): a recorded step is left
as it is.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from art_proxy.errors import Conflict, GroupAlreadyConsumed, NotFound
from art_proxy.records import (
    AliasMove,
    AliasRecord,
    AliasRequest,
    CanaryLook,
    JsonObject,
    Lease,
    SwapStatus,
    TeacherScore,
    TrainableGroup,
    TrainingStep,
    TrajectoryScore,
)
from art_proxy.rewards import rewards_by_trajectory
from art_proxy.store import schema
from art_proxy.store.base import StoreBase, aware, group_split, not_an_evaluation, utcnow

A, M, TS, CG = schema.aliases, schema.alias_moves, schema.training_steps, schema.consumed_groups
SC, TSC = schema.step_claims, schema.teacher_scores
PL, CL = schema.proxy_leases, schema.canary_looks
G, T, J, C = schema.groups, schema.trajectories, schema.judgments, schema.calls

# Where a trainable group's rewards come from: RULER's judgment, or what the agent reported at finish.
TrainableSource = Literal["judgment", "finish", "teacher"]


class TrainingRecords(StoreBase):
    # --- model aliases ---------------------------------------------------------------------------

    async def set_alias(self, alias: str, request: AliasRequest) -> AliasMove:
        """Point `alias` at `request.model` and record the move, in one transaction. A move ends
        the alias's canary (it was measured against the target that moves); reason `canary`
        instead starts one for `request.model`, or changes its share, the alias unmoved."""
        now = utcnow()
        async with self._transaction() as connection:
            current = (
                (await connection.execute(sa.select(A).where(A.c.alias == alias).with_for_update()))
                .mappings()
                .first()
            )
            previous = current["model"] if current is not None else None
            running = current["canary_since"] if current is not None else None
            if request.canary_since is not None and (
                running is None or aware(running) != request.canary_since
            ):
                raise Conflict(
                    f"alias {alias!r}: the canary that began {request.canary_since.isoformat()} "
                    "is no longer running; nothing moved"
                )
            if request.reason == "canary":
                if current is not None and current["model"] == request.model:
                    raise Conflict(
                        f"alias {alias!r} serves {request.model!r} already: a canary runs "
                        "another model beside it"
                    )
                if current is None:
                    raise NotFound(
                        f"alias {alias!r} does not exist: a canary runs beside an alias's target"
                    )
                assert request.fraction is not None  # AliasRequest checks a canary has its share
                same = current["canary"] == request.model and current["canary_since"] is not None
                canary = {
                    "canary": request.model if request.fraction > 0 else None,
                    "canary_fraction": request.fraction,
                    # A new candidate's evidence starts now; a share changed keeps it.
                    "canary_since": (current["canary_since"] if same else now)
                    if request.fraction > 0
                    else None,
                }
                await connection.execute(sa.update(A).where(A.c.alias == alias).values(**canary))
            else:
                row = {"alias": alias, "model": request.model, "step": request.step}
                cleared = {"canary": None, "canary_fraction": 0.0, "canary_since": None}
                await connection.execute(
                    self._upsert(A, {**row, "updated_at": now, **cleared}, key="alias")
                )
            move = AliasMove(
                alias=alias,
                model=request.model,
                previous=previous,
                step=request.step,
                reason=request.reason,
                note=request.note,
                moved_at=now,
                fraction=request.fraction if request.reason == "canary" else None,
            )
            await connection.execute(sa.insert(M).values(id=uuid.uuid4().hex, **move.model_dump()))
        return move

    async def aliases(self) -> list[AliasRecord]:
        rows = await self._all(sa.select(A).order_by(A.c.alias))
        return [
            AliasRecord.model_validate(
                {
                    **row,
                    "updated_at": aware(row["updated_at"]),
                    "canary_since": row["canary_since"] and aware(row["canary_since"]),
                }
            )
            for row in rows
        ]

    async def leases(
        self, published_since: datetime | None = None, but_proxy: str | None = None
    ) -> list[Lease]:
        """The models open trajectories hold, with how many hold each: what the trainer keeps
        loaded (proxy/leases.py). Every proxy's: those that served their recorded calls and, with
        `published_since`, those proxies published since then of their memory's leases (a first
        call still running or journaled), the larger count where both name a model; `but_proxy`'s
        publication left out (the proxy asking knows its own better)."""
        trajectories = sa.func.count(sa.distinct(T.c.id)).label("trajectories")
        query = (
            sa.select(C.c.model, trajectories)
            .select_from(T.join(C, C.c.trajectory_id == T.c.id))
            .where(schema.IS_OPEN, C.c.model.is_not(None))
            .group_by(C.c.model)
        )
        held = {row["model"]: int(row["trajectories"]) for row in await self._all(query)}
        if published_since is not None:
            published = (
                sa.select(PL.c.model, sa.func.sum(PL.c.trajectories).label("trajectories"))
                .where(PL.c.updated_at >= published_since, PL.c.proxy_id != (but_proxy or ""))
                .group_by(PL.c.model)
            )
            for row in await self._all(published):
                held[row["model"]] = max(held.get(row["model"], 0), int(row["trajectories"]))
        return [Lease(model=model, trajectories=n) for model, n in sorted(held.items())]

    async def publish_leases(self, proxy_id: str, held: dict[str, int]) -> None:
        """Replace what proxy `proxy_id` holds (its memory's leases) with `held`."""
        now = utcnow()
        async with self._transaction() as connection:
            await connection.execute(sa.delete(PL).where(PL.c.proxy_id == proxy_id))
            if held:
                await connection.execute(
                    sa.insert(PL),
                    [
                        {"proxy_id": proxy_id, "model": m, "trajectories": n, "updated_at": now}
                        for m, n in held.items()
                    ],
                )

    async def withdraw_leases(self, proxy_id: str, stale_before: datetime) -> None:
        """Forget proxy `proxy_id`'s published leases (it stops), and any other proxy's not
        published since `stale_before` (a proxy that was killed)."""
        async with self._transaction() as connection:
            await connection.execute(
                sa.delete(PL).where(
                    sa.or_(PL.c.proxy_id == proxy_id, PL.c.updated_at < stale_before)
                )
            )

    async def alias_moves(self, alias: str | None = None, limit: int = 100) -> list[AliasMove]:
        """Newest first."""
        query = sa.select(M).order_by(M.c.moved_at.desc(), M.c.id).limit(limit)
        if alias is not None:
            query = query.where(M.c.alias == alias)
        return [_alias_move(row) for row in await self._all(query)]

    async def add_canary_look(self, look: CanaryLook) -> None:
        row = look.model_dump(mode="json")
        row["looked_at"] = look.looked_at
        async with self._transaction() as connection:
            await connection.execute(sa.insert(CL).values(id=uuid.uuid4().hex, **row))

    async def canary_looks(
        self, alias: str | None = None, since: datetime | None = None, limit: int = 500
    ) -> list[CanaryLook]:
        """Newest first; `since`: the looks of the canary that began then (its evidence)."""
        query = sa.select(CL).order_by(CL.c.looked_at.desc(), CL.c.id).limit(limit)
        if alias is not None:
            query = query.where(CL.c.alias == alias)
        if since is not None:
            query = query.where(CL.c.looked_at >= since)
        looks = (self._readable(_canary_look, row) for row in await self._all(query))
        return [look for look in looks if isinstance(look, CanaryLook)]

    # --- trainer steps ---------------------------------------------------------------------------

    async def claim_step(self, run: str, step: int, group_ids: Sequence[str]) -> None:
        """Step `step` of `run` is about to read the calls of `group_ids` and train on them: an
        erasure from now until it is recorded names it in the subject's lineage (`training`).
        Claimed before the read, so that an erasure either deleted the calls before the step
        read them or finds the claim. A step claimed again (after a kill) takes the groups over."""
        if not group_ids:
            return
        rows = [
            {"run": run, "group_id": group_id, "step": step, "claimed_at": utcnow()}
            for group_id in dict.fromkeys(group_ids)
        ]
        async with self._transaction() as connection:
            await connection.execute(
                sa.delete(SC).where(SC.c.run == run, SC.c.group_id.in_(list(group_ids)))
            )
            await connection.execute(sa.insert(SC), rows)

    async def record_teacher_scores(self, scores: Sequence[TeacherScore]) -> None:
        """Keep what a teacher said of a step's trained choices (a choice scored again by the
        same run, after a kill, keeps its first). Those of a trajectory erased meanwhile are
        dropped: on PostgreSQL the trajectories are share-locked, so an erasure either deleted
        them before (and they are dropped) or waits for this commit (and deletes the scores)."""
        if not scores:
            return
        async with self._transaction() as connection:
            wanted = sorted({score.trajectory_id for score in scores})
            alive = sa.select(T.c.id).where(T.c.id.in_(wanted))
            if connection.dialect.name == "postgresql":
                alive = alive.with_for_update(read=True)
            kept = {row.id for row in await connection.execute(alive)}
            for score in scores:
                if score.trajectory_id in kept:
                    await connection.execute(self._insert_new(TSC, score.model_dump()))

    async def teacher_scores(self, trajectory_id: str) -> list[TeacherScore]:
        """What teachers said of the trajectory's calls, in run and call order."""
        rows = await self._all(
            sa.select(TSC)
            .where(TSC.c.trajectory_id == trajectory_id)
            .order_by(TSC.c.run, TSC.c.created_at, TSC.c.call_id, TSC.c.choice)
        )
        return [
            TeacherScore.model_validate({**row, "created_at": aware(row["created_at"])})
            for row in rows
        ]

    async def record_step(self, step: TrainingStep) -> bool:
        """Record a step and the groups it consumed, letting its claims go; False (nothing
        written) when the run has this step already. Raises `GroupAlreadyConsumed` (nothing
        written) when one of its groups was consumed by another step of the run."""
        now = utcnow()
        async with self._transaction() as connection:
            await connection.execute(
                sa.delete(SC).where(SC.c.run == step.run, SC.c.step == step.step)
            )
            inserted = await connection.execute(
                self._insert_new(TS, step.model_dump()).returning(TS.c.step)
            )
            if inserted.first() is None:
                return False
            if not step.groups:
                return True
            consumed = await connection.execute(
                sa.select(CG.c.group_id, CG.c.step).where(
                    CG.c.run == step.run, CG.c.group_id.in_(list(step.groups))
                )
            )
            clashes = {str(group_id): int(at) for group_id, at in consumed}
            if clashes:
                raise GroupAlreadyConsumed(step.run, step.step, clashes)  # rolls the step back
            # A group every member of which was erased while the step trained is gone: its row
            # would fail the foreign key, the step would never be recorded and a resume would
            # replay it for ever. The step's own record still names it.
            existing = await connection.execute(
                sa.select(G.c.id).where(G.c.id.in_(list(step.groups)))
            )
            present = {str(group_id) for (group_id,) in existing}
            rows = [
                {
                    "run": step.run,
                    "group_id": group_id,
                    "step": step.step,
                    "outcome": outcome,
                    "consumed_at": now,
                }
                for group_id, outcome in step.groups.items()
                if group_id in present
            ]
            if rows:
                await connection.execute(sa.insert(CG), rows)
        return True

    async def set_step_swap(
        self, run: str, step: int, swap: SwapStatus, swap_error: str | None
    ) -> None:
        """Record how the step's adapter swap went (it happens after the step is recorded)."""
        async with self._transaction() as connection:
            await connection.execute(
                sa.update(TS)
                .where(TS.c.run == run, TS.c.step == step)
                .values(swap=swap, swap_error=swap_error)
            )

    async def training_steps(self, run: str | None = None, limit: int = 1000) -> list[TrainingStep]:
        """The last `limit` steps, oldest first (by creation, then step)."""
        query = sa.select(TS).order_by(TS.c.created_at.desc(), TS.c.step.desc()).limit(limit)
        if run is not None:
            query = query.where(TS.c.run == run)
        return [_training_step(row) for row in reversed(await self._all(query))]

    async def last_step(self, run: str) -> TrainingStep | None:
        row = await self._first(
            sa.select(TS).where(TS.c.run == run).order_by(TS.c.step.desc()).limit(1)
        )
        return None if row is None else _training_step(row)

    async def consumed_among(self, group_ids: Sequence[str]) -> set[str]:
        """Those of `group_ids` some run's step has consumed (trained, validated or passed)."""
        if not group_ids:
            return set()
        rows = await self._all(
            sa.select(CG.c.group_id).where(CG.c.group_id.in_(list(group_ids))).distinct()
        )
        return {str(row["group_id"]) for row in rows}

    async def trained_by_other_runs(
        self, run: str, group_ids: Sequence[str]
    ) -> dict[str, list[str]]:
        """Those of `group_ids` another run than `run` trained on: group id -> those runs."""
        if not group_ids:
            return {}
        rows = await self._all(
            sa.select(CG.c.group_id, CG.c.run)
            .where(CG.c.group_id.in_(list(group_ids)), CG.c.run != run, CG.c.outcome == "trained")
            .order_by(CG.c.run)
        )
        found: dict[str, list[str]] = {}
        for row in rows:
            found.setdefault(str(row["group_id"]), []).append(str(row["run"]))
        return found

    async def consumed_group_ids(self, run: str) -> set[str]:
        rows = await self._all(sa.select(CG.c.group_id).where(CG.c.run == run))
        return {str(row["group_id"]) for row in rows}

    # --- what a run can train on next ------------------------------------------------------------

    async def trainable_groups(
        self,
        run: str,
        *,
        source: TrainableSource,
        limit: int = 100,
        full_size: int = 0,
        settled_before: datetime | None = None,
        scenarios: Sequence[str] = (),
        judged_since: datetime | None = None,
        groups: Sequence[str] = (),
    ) -> list[TrainableGroup]:
        """Groups `run` has not consumed, oldest first, with their members' rewards; only those
        of `scenarios`, and only `groups`, when some are given.

        judgment: groups with a scored judgment; rewards from the newest one, cost summed over all
        of the group's judgments. finish: groups with no open member and at least two finished
        members that reported a reward (`POST .../finish`), and, as the judge waits for a group
        (ruler/run.py), either `full_size` finished members or a newest member that started before
        `settled_before`: rollouts run one after another leave a group with no open member between
        them, and a group taken then would lose every later member (neither given: no wait).

        teacher: groups with no open member, settled as for finish, whether or not their
        members reported a reward: the unrewarded ones in `unrewarded`, for a teacher to score.

        `judged_since` (judgment only): only groups judged since then, found through the
        judgments' time index: a poll that costs what was judged lately, not every group ever
        consumed (the trainer's loop keeps the cursor, trainer/art_proxy_trainer/sidecar.py).
        """
        not_consumed = sa.and_(
            ~sa.exists(sa.select(CG.c.group_id).where(CG.c.run == run, CG.c.group_id == G.c.id)),
            not_an_evaluation(),  # an evaluation is never trained on
        )
        if scenarios:
            not_consumed = sa.and_(not_consumed, G.c.scenario_id.in_(list(scenarios)))
        if groups:
            not_consumed = sa.and_(not_consumed, G.c.id.in_(list(groups)))
        if source == "judgment":
            if judged_since is not None:
                lately = sa.select(J.c.group_id).where(J.c.created_at >= judged_since)
                not_consumed = sa.and_(not_consumed, G.c.id.in_(lately))
            return await self._judged_groups(not_consumed, limit)
        return await self._finished_groups(
            not_consumed, limit, full_size, settled_before, rewarded_only=source == "finish"
        )

    async def _judged_groups(
        self, not_consumed: sa.ColumnElement[bool], limit: int
    ) -> list[TrainableGroup]:
        split = sa.select(group_split()).where(T.c.group_id == G.c.id).scalar_subquery()
        scored = sa.exists(sa.select(J.c.id).where(J.c.group_id == G.c.id, J.c.status == "scored"))
        groups = await self._all(
            sa.select(G, split.label("split"))
            .where(scored, not_consumed)
            .order_by(G.c.created_at, G.c.id)
            .limit(limit)
        )
        judgments = await self._all(
            sa.select(
                J.c.group_id,
                J.c.status,
                J.c.scores,
                J.c.cost_usd,
                J.c.created_at,
                J.c.judge_model,
                J.c.rubric_hash,
            )
            .where(J.c.group_id.in_([group["id"] for group in groups]))
            .order_by(J.c.created_at, J.c.id)
        )
        rewards: dict[str, dict[str, float]] = {}
        costs: dict[str, float] = {}
        judged_at: dict[str, datetime | None] = {}
        judged_by: dict[str, tuple[str, str]] = {}
        for judgment in judgments:  # oldest first: the newest scored one is written last
            group_id = judgment["group_id"]
            costs[group_id] = costs.get(group_id, 0.0) + float(judgment["cost_usd"])
            if judgment["status"] == "scored":
                rewards[group_id] = rewards_by_trajectory(
                    TrajectoryScore.model_validate(score) for score in judgment["scores"]
                )
                judged_at[group_id] = aware(judgment["created_at"])
                judged_by[group_id] = (judgment["judge_model"], judgment["rubric_hash"])
        return [
            _trainable(
                group,
                rewards.get(group["id"], {}),
                costs.get(group["id"], 0.0),
                judged_at.get(group["id"]),
                judged_by=judged_by.get(group["id"]),
            )
            for group in groups
        ]

    async def _finished_groups(
        self,
        not_consumed: sa.ColumnElement[bool],
        limit: int,
        full_size: int,
        settled_before: datetime | None,
        *,
        rewarded_only: bool,
    ) -> list[TrainableGroup]:
        rewarded = sa.and_(T.c.status == "finished", T.c.reward.is_not(None))
        # A teacher scores any ended member; a reward alone needs two to compare.
        enough = rewarded if rewarded_only else T.c.status == "finished"
        ready: list[sa.ColumnElement[bool]] = []
        if full_size:
            ready.append(sa.func.count(T.c.id) >= full_size)
        if settled_before is not None:
            ready.append(sa.func.max(T.c.created_at) < settled_before)
        groups = await self._all(
            sa.select(G, group_split().label("split"))
            .join(T, T.c.group_id == G.c.id)
            .where(not_consumed)
            .group_by(G.c.id, G.c.scenario_id, G.c.created_at)
            .having(
                sa.func.sum(sa.case((T.c.status == "open", 1), else_=0)) == 0,
                sa.func.sum(sa.case((enough, 1), else_=0)) >= (2 if rewarded_only else 1),
                sa.or_(*ready) if ready else sa.true(),
            )
            .order_by(G.c.created_at, G.c.id)
            .limit(limit)
        )
        members = await self._all(
            sa.select(T.c.group_id, T.c.id, T.c.reward)
            .where(T.c.group_id.in_([group["id"] for group in groups]), enough)
            .order_by(T.c.created_at, T.c.id)
        )
        rewards: dict[str, dict[str, float]] = {}
        unrewarded: dict[str, list[str]] = {}
        for member in members:
            if member["reward"] is None:
                unrewarded.setdefault(member["group_id"], []).append(member["id"])
            else:
                rewards.setdefault(member["group_id"], {})[member["id"]] = float(member["reward"])
        return [
            _trainable(
                group, rewards.get(group["id"], {}), 0.0, unrewarded=unrewarded.get(group["id"], [])
            )
            for group in groups
        ]

    # --- plumbing --------------------------------------------------------------------------------

    def _upsert(self, table: sa.Table, row: JsonObject, *, key: str) -> sa.Insert:
        update = {name: value for name, value in row.items() if name != key}
        if self.engine.dialect.name == "postgresql":
            return (
                postgresql.insert(table)
                .values(row)
                .on_conflict_do_update(index_elements=[key], set_=update)
            )
        return (
            sqlite.insert(table)
            .values(row)
            .on_conflict_do_update(index_elements=[key], set_=update)
        )

    def _insert_new(self, table: sa.Table, row: JsonObject) -> sa.Insert:
        """An insert that does nothing when the row's primary key exists."""
        if self.engine.dialect.name == "postgresql":
            return postgresql.insert(table).values(row).on_conflict_do_nothing()
        return sqlite.insert(table).values(row).on_conflict_do_nothing()


def _alias_move(row: JsonObject) -> AliasMove:
    fields = {name: row[name] for name in AliasMove.model_fields}
    return AliasMove.model_validate({**fields, "moved_at": aware(row["moved_at"])})


def _training_step(row: JsonObject) -> TrainingStep:
    return TrainingStep.model_validate({**row, "created_at": aware(row["created_at"])})


def _trainable(
    group: JsonObject,
    rewards: dict[str, float],
    cost: float,
    judged_at: datetime | None = None,
    *,
    unrewarded: Sequence[str] = (),
    judged_by: tuple[str, str] | None = None,
) -> TrainableGroup:
    return TrainableGroup(
        judged_at=judged_at,
        judged_by=judged_by,
        unrewarded=list(unrewarded),
        group_id=group["id"],
        scenario_id=group["scenario_id"],
        split=group["split"],
        created_at=aware(group["created_at"]),
        rewards=rewards,
        judge_cost_usd=cost,
    )


def _canary_look(row: JsonObject) -> CanaryLook:
    fields = {name: row[name] for name in CanaryLook.model_fields}
    return CanaryLook.model_validate({**fields, "looked_at": aware(row["looked_at"])})
