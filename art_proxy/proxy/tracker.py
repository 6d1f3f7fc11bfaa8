"""Open trajectories: which trajectory a call joins, and the rows that creates.

The proxy keeps what it needs for the next call in memory (continuation keys, the last token ids
for the stitch check, each scenario's current group) and asks the store when it meets a trajectory
it has not seen, which is what lets several stateless proxies share one PostgreSQL store. Nothing is
written here: `assign` returns the rows a new trajectory needs, and the proxy commits them together
with the call, so a trajectory never exists without its first call.

A new trajectory joins a group (groups.py). A call never continues a trajectory of another group,
and an existing trajectory keeps its group.

A shadow sample (shadow.py) is a new trajectory beside a served one, in its group and scenario,
born finished: nothing continues it, so it is never kept in memory. So is each candidate of a
best-of-N call (best_of.py), in a group of the candidates only.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from art_proxy.errors import Conflict, StoreError
from art_proxy.ids import new_id
from art_proxy.records import Attribution, JsonObject, Split
from art_proxy.records.trajectories import BEST_OF, SHADOW_OF
from art_proxy.store.rows import GroupRow, NewTrajectoryRows, TrajectoryRow
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .attribution import (
    Conversation,
    Explicit,
    auto_scenario_id,
    conversation_of,
    opening_of,
)
from .continuation import find_continuation, looked_up_in_memory_only, restored_echo
from .groups import Groups
from .leases import LeaseCounters, Served, held, leased_model
from .open_trajectories import (
    MAX_TRAJECTORIES_IN_MEMORY,
    OpenTrajectories,
    OpenTrajectory,
    Restored,
    same_subject,
)


@dataclass(frozen=True)
class Assignment:
    """Where one call goes, and the rows to commit with it if it starts a trajectory."""

    trajectory_id: str
    scenario_id: str
    group_id: str
    split: Split
    upstream: str
    seq: int
    attribution: Attribution
    previous_sequences: list[list[int]]
    new_rows: NewTrajectoryRows | None
    claimed_tip: list[str] = field(default_factory=list)  # given back if the call fails
    reason: str = ""  # why the call was attributed so, for the debug log
    # The keys of the call's messages, hashed once for attribution and the record (a chat call).
    conversation: Conversation | None = None
    # Echoed replies to forward as the model wrote them.
    restored: Restored = ()


class TrajectoryTracker:
    def __init__(
        self,
        store: TrajectoryStore,
        upstreams: list[str],
        *,
        group_size: int = 0,
        group_window: float = 60.0,
        own_records_stored: Callable[[], Awaitable[bool]],
    ) -> None:
        self._store = store
        # Awaited before the store is asked about a conversation memory does not know: this
        # proxy's own records may still be on their way there (the journal; app.py).
        self._own_records_stored = own_records_stored
        self._upstreams = itertools.cycle(upstreams)
        self.groups = Groups(
            store,
            size=group_size,
            window=group_window,
            max_explicit=MAX_TRAJECTORIES_IN_MEMORY,
        )
        self.lease_counters = LeaseCounters()
        # Told of the model each lease is taken on, and that leases were given up (a trajectory
        # that held some left memory): lease_publisher.py.
        self.on_lease: Callable[[str], None] = lambda _model: None
        self.on_leases_released: Callable[[], None] = lambda: None
        self._memory = OpenTrajectories(on_forget=self._forgotten)

    def _forgotten(self, state: OpenTrajectory) -> None:
        self.groups.member_finished((state.scenario_id, state.split), state.id)
        if state.leases:
            self.on_leases_released()

    @property
    def open_count(self) -> int:
        return len(self._memory)

    def lease(self, assignment: Assignment, alias: str, target: str, served: Served) -> str:
        """The model a call of `assignment`'s trajectory to `alias` goes to (leases.py)."""
        trajectory = (
            self._memory.get(assignment.trajectory_id) if assignment.trajectory_id else None
        )
        model = leased_model(trajectory, alias, target, served, self.lease_counters)
        if trajectory is not None:
            self.on_lease(model)
        return model

    def held_leases(self) -> dict[str, int]:
        """This proxy's open trajectories by the model each lease holds."""
        return held(self._memory.all())

    async def assign(
        self,
        explicit: Explicit,
        messages: list[JsonObject] | None,
        *,
        continues: str | None = None,
    ) -> Assignment:
        """Where a call goes. `continues`: the trajectory a Responses call's
        `previous_response_id` names (it continues that trajectory, if still open)."""
        conversation = conversation_of(messages) if messages else None
        if explicit.trajectory_id is not None:
            known = await self._open(explicit.trajectory_id, finished_is_conflict=True)
            if known is not None and not same_subject(explicit.subject, known.subject):
                # Joined, the call would be filed (and erased, and listed) under the other's
                # name: an id is no proof of whose conversation it is.
                raise Conflict(
                    f"trajectory {explicit.trajectory_id!r} belongs to another user or tenant "
                    "(or to none, which a named call does not join): start a new trajectory id",
                    param="trajectory",
                )
            if known is not None:
                source: Attribution = "url" if explicit.source == "url" else "header"
                assignment = self._next_call(
                    known, source, reason=f"the {source} names it", conversation=conversation
                )
                return replace(assignment, restored=restored_echo(known, messages))
        elif continues is not None:
            known = await self._open(continues)
            if known is not None and known.fits(explicit):
                claimed = self._memory.move_tip(known, [])
                return self._next_call(
                    known,
                    "response",
                    claimed,
                    reason="previous_response_id names its call",
                    conversation=conversation,
                )
        if explicit.trajectory_id is None and messages and conversation is not None:
            found = await find_continuation(
                self._memory,
                self._store,
                messages,
                conversation.candidates,
                explicit,
                self._own_records_stored,
            )
            if found is not None:
                claimed = self._memory.move_tip(found.state, [])
                assignment = self._next_call(
                    found.state,
                    found.attribution,
                    claimed,
                    reason=found.reason,
                    conversation=conversation,
                )
                return replace(assignment, restored=found.restored)
        scenario_id = explicit.scenario_id or (
            conversation.scenario_id if conversation is not None else auto_scenario_id([])
        )
        if explicit.group_id is not None:
            scenario_id = await self.groups.explicit_scenario(explicit, scenario_id)
        return self._start(explicit, scenario_id, messages, conversation)

    def unrecorded(self, split: Split) -> Assignment:
        """Where a call that is not recorded goes (privacy/consent.py): an upstream, and no trajectory.
        Memory and the store learn nothing of it, so no later call can continue it."""
        return Assignment("", "", "", split, next(self._upstreams), 0, "new", [], None)

    def record_call(
        self,
        assignment: Assignment,
        continuation_keys: list[str],
        sequences: list[list[int]],
        *,
        committed: bool,
        prompt_key: str | None = None,
        replies: list[JsonObject] | None = None,
    ) -> None:
        """Remember a recorded call: an answered one becomes the tip the next call continues."""
        state = self._memory.get(assignment.trajectory_id)
        if state is None:
            return
        if committed and assignment.new_rows:
            state.unsaved_rows = None
        if continuation_keys:
            state.previous_sequences = sequences
            self._memory.move_tip(state, continuation_keys)
            self._memory.move_prompt(state, prompt_key)
            state.replies = replies or []
            state.restored = assignment.restored
        elif not state.tip_keys:  # failed: the agent may retry from where it was
            self._memory.move_tip(state, assignment.claimed_tip)

    def forget(self, trajectory_ids: list[str]) -> None:
        """Drop trajectories from memory (finished ones); the store still has them."""
        self._memory.forget(trajectory_ids)

    async def _open(
        self, trajectory_id: str, *, finished_is_conflict: bool = False
    ) -> OpenTrajectory | None:
        """An open trajectory by id (memory, else the store); None if unknown, and if finished
        too unless `finished_is_conflict` (an explicit id: the agent must start a new one)."""
        state = self._memory.get(trajectory_id)
        if state is not None:
            return state
        try:
            row = await self._store.trajectory_row(trajectory_id)
        except StoreError as exc:
            # Answered all the same (the record is journaled), as a trajectory memory does not
            # know: an agent's new id (the common case) is right; one only the store knows gets
            # a second seq 0, which the store refuses at ingest and sets aside, listed by
            # `art-proxy journal rejected`.
            looked_up_in_memory_only(f"trajectory {trajectory_id!r}", exc)
            return None
        # Another call of it may have brought it into memory while the store answered: two
        # states of one trajectory would give two calls the same seq (one set aside at ingest).
        state = self._memory.get(trajectory_id)
        if state is not None:
            return state
        if row is None:
            return None
        if row["status"] != "open":
            if finished_is_conflict:
                raise Conflict(
                    f"trajectory {trajectory_id!r} is finished; start a new trajectory id",
                    param="trajectory",
                )
            return None
        return self._memory.remember(OpenTrajectory.of_row(row))

    def _next_call(
        self,
        state: OpenTrajectory,
        attribution: Attribution,
        claimed_tip: list[str] | None = None,
        *,
        reason: str,
        conversation: Conversation | None,
    ) -> Assignment:
        self._memory.touch(state)
        seq = state.next_seq
        state.next_seq += 1
        return _assignment(
            state, seq, attribution, state.unsaved_rows, claimed_tip or [], reason, conversation
        )

    # --- new trajectories ------------------------------------------------------------------------

    def _start(
        self,
        explicit: Explicit,
        scenario_id: str,
        messages: list[JsonObject] | None,
        conversation: Conversation | None,
    ) -> Assignment:
        now = utcnow()
        trajectory_id = explicit.trajectory_id or new_id()
        group_id = (
            self.groups.join_explicit(explicit.group_id, scenario_id)
            if explicit.group_id is not None
            else self.groups.join_automatic((scenario_id, explicit.split), trajectory_id)
        )
        state = OpenTrajectory(
            id=trajectory_id,
            scenario_id=scenario_id,
            group_id=group_id,
            split=explicit.split,
            upstream=next(self._upstreams),
            next_seq=1,
            subject=explicit.subject,
        )
        self._memory.remember(state)
        rows = NewTrajectoryRows(
            scenario={
                "id": scenario_id,
                "created_at": now,
                "auto": explicit.scenario_id is None,
                "opening": opening_of(messages or []),  # scrubbed with its record
            },
            group={"id": group_id, "scenario_id": scenario_id, "created_at": now},
            trajectory={
                "id": trajectory_id,
                "scenario_id": scenario_id,
                "group_id": group_id,
                "split": explicit.split,
                "status": "open",
                "finish_reason": None,
                "finished_at": None,
                "created_at": now,
                "updated_at": now,
                "upstream": state.upstream,
                "call_count": 0,
                "tip_key": None,
                "tip_prompt_key": None,
                "metrics": {},
                "metadata": {},
                "user_id": explicit.subject.user,
                "tenant_id": explicit.subject.tenant,
            },
        )
        state.unsaved_rows = rows
        attribution: Attribution = "new" if explicit.source == "none" else explicit.source
        reason = (
            "no open trajectory's last call starts these messages"
            if explicit.trajectory_id is None
            else f"the {explicit.source} names a trajectory not seen before"
        )
        return _assignment(state, 0, attribution, rows, reason=reason, conversation=conversation)

    def shadow_of(self, served: Assignment) -> Assignment:
        """A new one-call trajectory beside `served` (which opened its own): same scenario, group,
        split and upstream, finished from the start, marked by `finish_reason` "shadow" and
        `metadata["shadow_of"]`."""
        assert served.seq == 0, "only a call that opened its trajectory is shadowed"
        self.groups.add_shadow((served.scenario_id, served.split), served.group_id)
        assert served.new_rows is not None
        return _sibling(served, served.new_rows, "shadow", {SHADOW_OF: served.trajectory_id})

    def best_of_group(self, served: Assignment, n: int) -> list[Assignment]:
        """`n` new one-call trajectories, the candidates of a best-of-N call (best_of.py): a group
        of their own in `served`'s scenario (which opened its trajectory), finished from the start,
        marked by `finish_reason` "best_of" and `metadata["best_of"]` (the served trajectory)."""
        assert served.seq == 0 and served.new_rows is not None, "only an opening call"
        group: GroupRow = {
            "id": new_id(),
            "scenario_id": served.scenario_id,
            "created_at": utcnow(),
        }
        rows = replace(served.new_rows, group=group)
        marked = {BEST_OF: served.trajectory_id}
        return [_sibling(served, rows, "best_of", marked) for _ in range(n)]


def _sibling(
    served: Assignment,
    rows: NewTrajectoryRows,
    finish_reason: Literal["shadow", "best_of"],
    metadata: JsonObject,
) -> Assignment:
    """A finished one-call trajectory in `rows`' group, `served`'s scenario, split and upstream.
    The served call's creation rows: its scenario and group rows are idempotent inserts, which
    keeps the sibling recordable even if the served record was lost. Its metadata names the
    served trajectory, whose erasure drops it whenever it arrives (store/fences.py)."""
    now = utcnow()
    trajectory_id = new_id()
    trajectory: TrajectoryRow = {
        **rows.trajectory,
        "id": trajectory_id,
        "group_id": rows.group["id"],
        "status": "finished",
        "finish_reason": finish_reason,
        "finished_at": now,
        "created_at": now,
        "updated_at": now,
        "metadata": metadata,
    }
    return Assignment(
        trajectory_id=trajectory_id,
        scenario_id=served.scenario_id,
        group_id=rows.group["id"],
        split=served.split,
        upstream=served.upstream,
        seq=0,
        attribution=finish_reason,
        previous_sequences=[],
        new_rows=replace(rows, trajectory=trajectory),
    )


def _assignment(
    state: OpenTrajectory,
    seq: int,
    attribution: Attribution,
    rows: NewTrajectoryRows | None,
    claimed_tip: list[str] | None = None,
    reason: str = "",
    conversation: Conversation | None = None,
) -> Assignment:
    return Assignment(
        trajectory_id=state.id,
        scenario_id=state.scenario_id,
        group_id=state.group_id,
        split=state.split,
        upstream=state.upstream,
        seq=seq,
        attribution=attribution,
        previous_sequences=state.previous_sequences,
        new_rows=rows,
        claimed_tip=claimed_tip or [],
        reason=reason,
        conversation=conversation,
    )
