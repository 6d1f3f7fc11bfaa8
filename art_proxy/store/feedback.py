"""Learning from production: users' feedback on trajectories, the scenario bank, live rewards.

Feedback is appended, never edited; with `as_reward` it also sets the reward of a finished
trajectory, in the same transaction (an open one may still change, so it is refused). The scenario
bank is the scenarios that traffic of one split opened: their openings replay as rollout scenarios.
The live reward of a served model is the mean reward of the finished `prod` trajectories it served:
the reward the trajectory carries (finish or feedback), else its newest scored judgment's.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from art_proxy.errors import Conflict
from art_proxy.records import (
    Feedback,
    FeedbackRequest,
    JsonObject,
    LiveReward,
    ScenarioRecord,
    TrajectoryScore,
)
from art_proxy.store import schema
from art_proxy.store.base import StoreBase, aware, is_split, utcnow

F, T, S, C, J = (
    schema.feedback,
    schema.trajectories,
    schema.scenarios,
    schema.calls,
    schema.judgments,
)


class FeedbackRecords(StoreBase):
    async def add_feedback(self, request: FeedbackRequest) -> Feedback | None:
        """Store the feedback; None when there is no such trajectory. Raises `Conflict` (nothing
        written) for `as_reward` on a trajectory that is still open."""
        feedback = Feedback(
            id=uuid.uuid4().hex,
            **request.model_dump(include={"trajectory_id", "score", "thumbs", "comment"}),
            created_at=utcnow(),
        )
        async with self._transaction() as connection:
            status = await connection.scalar(
                sa.select(T.c.status).where(T.c.id == request.trajectory_id).with_for_update()
            )
            if status is None:
                return None
            if request.as_reward:
                if status != "finished":
                    raise Conflict(
                        f"trajectory {request.trajectory_id!r} is open: finish it before "
                        "its feedback becomes its reward",
                        param="as_reward",
                    )
                await connection.execute(
                    sa.update(T)
                    .where(T.c.id == request.trajectory_id)
                    .values(reward=request.reward, updated_at=feedback.created_at)
                )
            await connection.execute(sa.insert(F).values(feedback.model_dump()))
        return feedback

    async def feedback(self, trajectory_ids: Sequence[str]) -> dict[str, list[Feedback]]:
        """Each trajectory's feedback, oldest first (trajectories without any are left out)."""
        rows = await self._all(
            sa.select(F)
            .where(F.c.trajectory_id.in_(trajectory_ids))
            .order_by(F.c.created_at, F.c.id)
        )
        by_trajectory: dict[str, list[Feedback]] = {}
        for row in rows:
            by_trajectory.setdefault(row["trajectory_id"], []).append(_feedback(row))
        return by_trajectory

    async def bank_scenarios(self, split: str, limit: int = 0) -> list[ScenarioRecord]:
        """Scenarios with at least one trajectory of `split`, newest first (`limit` 0 = all); one
        whose opening was erased (store/erasure.py) is left out: there is nothing to replay."""
        seen = sa.exists(sa.select(T.c.id).where(T.c.scenario_id == S.c.id, is_split(split)))
        length = (
            "jsonb_array_length"
            if self.engine.dialect.name == "postgresql"
            else "json_array_length"
        )
        opened = getattr(sa.func, length)(S.c.opening) > 0
        query = sa.select(S).where(seen, opened).order_by(S.c.created_at.desc(), S.c.id)
        if limit > 0:
            query = query.limit(limit)
        return [
            ScenarioRecord.model_validate({**row, "created_at": aware(row["created_at"])})
            for row in await self._all(query)
        ]

    async def live_rewards(
        self,
        since: datetime | None = None,
        until: datetime | None = None,
        alias: str | None = None,
    ) -> dict[str, LiveReward]:
        """Served model -> the live reward of the finished `prod` trajectories that started in
        [since, until) (None: unbounded). A trajectory counts for the model of its first call:
        the alias may move mid-conversation, and the opening is what it was served by. Shadow
        samples and best-of candidates are left out: each repeats a served conversation's prompt
        (a best-of call's answer is its served trajectory), so counting them would count one
        conversation several times. `alias`: only the trajectories whose first call asked for
        it (a canary's arms are its alias's traffic, not every app's calls to the same model)."""
        query = sa.select(T.c.id, T.c.group_id, T.c.reward, _first_model().label("model")).where(
            T.c.split == "prod",
            T.c.status == "finished",
            sa.or_(T.c.finish_reason.is_(None), T.c.finish_reason.notin_(("shadow", "best_of"))),
        )
        if since is not None:
            query = query.where(T.c.created_at >= since)
        if until is not None:
            query = query.where(T.c.created_at < until)
        if alias is not None:
            query = query.where(_first_call(C.c.request["model"].as_string()) == alias)
        rows = [row for row in await self._all(query) if row["model"] is not None]
        rewards: dict[str, list[float]] = {}
        pending: dict[str, int] = {}
        for row, reward in zip(rows, await self._rewards(rows), strict=True):
            rewards.setdefault(row["model"], [])
            if reward is None:
                pending[row["model"]] = pending.get(row["model"], 0) + 1
            else:
                rewards[row["model"]].append(reward)
        return {
            model: LiveReward(
                model=model,
                count=len(values),
                mean=math.fsum(values) / len(values) if values else None,
                mean_square=math.fsum(v * v for v in values) / len(values) if values else None,
                pending=pending.get(model, 0),
            )
            for model, values in rewards.items()
        }

    async def shadow_rewards(self, model: str, limit: int) -> dict[str, float]:
        """The newest `limit` finished shadow samples that `model` drew, with a reward:
        trajectory id -> reward (what an off-policy estimate reweighs)."""
        query = (
            sa.select(T.c.id, T.c.group_id, T.c.reward)
            .where(
                T.c.split == "prod",
                T.c.status == "finished",
                T.c.finish_reason == "shadow",
                _first_model() == model,
            )
            .order_by(T.c.created_at.desc(), T.c.id)
            .limit(limit)
        )
        rows = await self._all(query)
        return {
            row["id"]: reward
            for row, reward in zip(rows, await self._rewards(rows), strict=True)
            if reward is not None
        }

    async def _rewards(self, rows: Sequence[JsonObject]) -> list[float | None]:
        """Each trajectory row's reward: its own (finish or feedback), else its group's newest
        scored judgment's; None: none yet."""
        judged = await self._judged_rewards([r["group_id"] for r in rows if r["reward"] is None])
        return [
            float(row["reward"]) if row["reward"] is not None else judged.get(row["id"])
            for row in rows
        ]

    async def _judged_rewards(self, group_ids: Sequence[str]) -> dict[str, float]:
        """Trajectory id -> its reward in the newest scored judgment of its group that has it."""
        if not group_ids:
            return {}
        judgments = await self._all(
            sa.select(J.c.scores)
            .where(J.c.group_id.in_(set(group_ids)), J.c.status == "scored")
            .order_by(J.c.created_at, J.c.id)
        )
        rewards: dict[str, float] = {}
        for judgment in judgments:  # oldest first: the newest one is written last
            for score in judgment["scores"]:
                parsed = TrajectoryScore.model_validate(score)
                rewards[parsed.trajectory_id] = parsed.reward
        return rewards


def _feedback(row: JsonObject) -> Feedback:
    return Feedback.model_validate({**row, "created_at": aware(row["created_at"])})


def _first_model() -> sa.ScalarSelect[str]:
    """The model a trajectory's first call was served by."""
    return _first_call(C.c.model)


def _first_call(column: sa.ColumnElement[str]) -> sa.ScalarSelect[str]:
    """`column` of a trajectory's first call."""
    return (
        sa.select(column)
        .where(C.c.trajectory_id == T.c.id)
        .order_by(C.c.seq)
        .limit(1)
        .scalar_subquery()
    )
