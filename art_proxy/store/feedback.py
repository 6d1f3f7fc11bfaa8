"""Learning from production: users' feedback on trajectories, and the scenario bank.

Feedback is appended, never edited; with `as_reward` it also sets the reward of a finished
trajectory, in the same transaction (an open one may still change, so it is refused). The scenario
bank is the scenarios that traffic of one split opened: their openings replay as rollout scenarios.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from art_proxy.errors import Conflict
from art_proxy.records import Feedback, FeedbackRequest, JsonObject, ScenarioRecord
from art_proxy.store import schema
from art_proxy.store.base import StoreBase, aware, utcnow

F, T, S = schema.feedback, schema.trajectories, schema.scenarios


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
        """Scenarios with at least one trajectory of `split`, newest first (`limit` 0 = all)."""
        seen = sa.exists(sa.select(T.c.id).where(T.c.scenario_id == S.c.id, T.c.split == split))
        query = sa.select(S).where(seen).order_by(S.c.created_at.desc(), S.c.id)
        if limit > 0:
            query = query.limit(limit)
        return [
            ScenarioRecord.model_validate({**row, "created_at": aware(row["created_at"])})
            for row in await self._all(query)
        ]


def _feedback(row: JsonObject) -> Feedback:
    return Feedback.model_validate({**row, "created_at": aware(row["created_at"])})
