"""What the proxy reads of the store to attribute a call it has not seen itself (another proxy
took the conversation's earlier calls, or this one restarted): open trajectories by their tip,
a trajectory's last call, a recorded call, a group's scenario, the groups active lately."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from art_proxy.records import JsonObject
from art_proxy.store import schema
from art_proxy.store.base import StoreBase, aware, group_split

T, C, G = schema.trajectories, schema.calls, schema.groups

# Housekeeping's query every second, built once (building it took as long as running it).
_ACTIVE_GROUPS = (
    sa.select(
        G.c.id,
        G.c.scenario_id,
        group_split().label("split"),
        sa.func.count(T.c.id).label("size"),
        sa.func.sum(sa.case((T.c.status == "open", 1), else_=0)).label("open_count"),
    )
    .join(T, T.c.group_id == G.c.id)
    .where(
        G.c.id.in_(
            sa.select(T.c.group_id).where(schema.IS_OPEN, T.c.updated_at >= sa.bindparam("since"))
        )
    )
    .group_by(G.c.id, G.c.scenario_id)
)


class AttributionReads(StoreBase):
    async def open_trajectories_by_tip(
        self, keys: Sequence[str], prompt_keys: Sequence[str] = ()
    ) -> tuple[dict[str, list[JsonObject]], dict[str, list[JsonObject]]]:
        """Open trajectories whose latest answered call has one of `keys` (its messages plus its
        reply), and those whose latest answered call's messages have one of `prompt_keys`, oldest
        first, each with that call's token ids (for the stitch check), its response and the model
        that served it (its lease, proxy/leases.py).

        Trajectories are found by the indexes of their tip's keys: through an index led by
        `status` (there was one until migration 0011), SQLite's planner without statistics read
        every open trajectory instead, 15 ms a lookup beside 30,000 of them against 2 by the keys.
        The bound `status = ?` cannot use the partial index of open trajectories (schema.IS_OPEN).
        """
        matches: sa.ColumnElement[bool] = T.c.tip_key.in_(keys)
        if prompt_keys:
            matches = sa.or_(matches, T.c.tip_prompt_key.in_(prompt_keys))
        query = (
            sa.select(
                T,
                C.c.prompt_token_ids,
                C.c.completion_token_ids,
                C.c.response,
                C.c.model.label("last_model"),
            )
            .join(C, sa.and_(C.c.trajectory_id == T.c.id, C.c.continuation_key == T.c.tip_key))
            .where(matches, T.c.status == "open")
            .order_by(T.c.created_at, C.c.seq)
        )
        wanted, wanted_prompts = set(keys), set(prompt_keys)
        by_key: dict[str, dict[str, JsonObject]] = {}
        by_prompt: dict[str, dict[str, JsonObject]] = {}
        for row in await self._all(query):  # the latest call with the tip's key wins
            if row["tip_key"] in wanted:
                by_key.setdefault(row["tip_key"], {})[row["id"]] = row
            if row["tip_prompt_key"] in wanted_prompts:
                by_prompt.setdefault(row["tip_prompt_key"], {})[row["id"]] = row
        return (
            {key: list(rows.values()) for key, rows in by_key.items()},
            {key: list(rows.values()) for key, rows in by_prompt.items()},
        )

    async def trajectory_row(self, trajectory_id: str) -> JsonObject | None:
        """A trajectory row plus its last call's seq and token ids (the next seq follows it: the
        call count lags it after a lost call; the ids are for the stitch check)."""
        row = await self._first(sa.select(T).where(T.c.id == trajectory_id))
        if row is None:
            return None
        last = await self._first(
            sa.select(
                C.c.seq.label("last_seq"),
                C.c.prompt_token_ids,
                C.c.completion_token_ids,
                C.c.model.label("last_model"),
            )
            .where(C.c.trajectory_id == trajectory_id)
            .order_by(C.c.seq.desc())
            .limit(1)
        )
        none = {
            "last_seq": None,
            "prompt_token_ids": None,
            "completion_token_ids": None,
            "last_model": None,
        }
        return {**row, **(last or none)}

    async def call_row(self, call_id: str) -> JsonObject | None:
        """What a Responses call's `previous_response_id` and `GET /v1/responses/{id}` read of a
        recorded call: its trajectory and that one's subject (`user_id`, `tenant_id`), dialect,
        status, bodies and answer."""
        row = await self._first(
            sa.select(
                C.c.trajectory_id,
                T.c.user_id,
                T.c.tenant_id,
                C.c.dialect,
                C.c.status,
                C.c.created_at,
                C.c.request,
                C.c.client_request,
                C.c.response,
            )
            .select_from(C.join(T, T.c.id == C.c.trajectory_id))
            .where(C.c.id == call_id)
        )
        return None if row is None else {**row, "created_at": aware(row["created_at"])}

    async def group_scenario(self, group_id: str) -> str | None:
        """The scenario of a group, None when there is no such group (yet)."""
        row = await self._first(sa.select(G.c.scenario_id).where(G.c.id == group_id))
        return None if row is None else str(row["scenario_id"])

    async def active_groups(self, since: datetime) -> list[JsonObject]:
        """Groups with an open member active since `since`: id, scenario_id, split, size,
        open_count."""
        return await self._all(_ACTIVE_GROUPS.params(since=since))
