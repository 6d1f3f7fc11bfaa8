"""Model aliases: agents call a stable name, the upstream serves the adapter it points at.

The trainer loads a new adapter (`<alias>@<step>`) into every upstream, then moves the alias with
`PUT /art/v1/aliases/{alias}`. The table lives in the store; each proxy keeps a copy in memory, so
resolving a request's `model` on the hot path is one dict lookup. A move is written to the store
first and then to this proxy's copy at once; the 1-second housekeeping reloads the copy, which is
how every proxy over one PostgreSQL store follows a move within a second.
"""

from __future__ import annotations

from art_proxy.records import AliasMove, AliasRecord, AliasRequest
from art_proxy.store.trajectory_store import TrajectoryStore


class Aliases:
    def __init__(self, store: TrajectoryStore) -> None:
        self._store = store
        self._targets: dict[str, str] = {}  # alias -> the model name the upstream serves
        self._records: list[AliasRecord] = []
        self._moves = 0  # moves made here: a reload that started before one is stale

    def resolve(self, model: str) -> str:
        """The name to send upstream for a request's `model` (itself when it is no alias)."""
        return self._targets.get(model, model)

    @property
    def records(self) -> list[AliasRecord]:
        return self._records

    async def reload(self) -> None:
        """Replace the copy with the store's table (at start-up, then every second)."""
        moves_before = self._moves
        records = await self._store.aliases()
        if self._moves == moves_before:  # else a move landed meanwhile: the next reload has it
            self._set(records)

    async def move(self, alias: str, request: AliasRequest) -> AliasMove:
        """Point `alias` at `request.model`: in the store, then here."""
        move = await self._store.set_alias(alias, request)
        self._moves += 1
        current = AliasRecord(
            alias=alias, model=move.model, step=move.step, updated_at=move.moved_at
        )
        self._set([record for record in self._records if record.alias != alias] + [current])
        return move

    def _set(self, records: list[AliasRecord]) -> None:
        self._records = sorted(records, key=lambda record: record.alias)
        self._targets = {record.alias: record.model for record in self._records}
