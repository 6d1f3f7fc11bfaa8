"""Open trajectories: which trajectory a call joins, and the rows that creates.

The proxy keeps what it needs for the next call in memory (continuation keys, the last token ids
for the stitch check, each scenario's current group) and asks the store when it meets a trajectory
it has not seen, which is what lets several stateless proxies share one PostgreSQL store. Nothing is
written here: `assign` returns the rows a new trajectory needs, and the proxy commits them together
with the call, so a trajectory never exists without its first call.

A new trajectory joins a group (groups.py). A call never continues a trajectory of another group,
and an existing trajectory keeps its group.

A shadow sample (shadow.py) is a new trajectory beside a served one, in its group and scenario,
born finished: nothing continues it, so it is never kept in memory.
"""

from __future__ import annotations

import itertools
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any

from art_proxy.errors import Conflict
from art_proxy.records import Attribution, JsonObject, Split
from art_proxy.redaction import scrub
from art_proxy.store.rows import NewTrajectoryRows, TrajectoryRow
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .attribution import (
    Candidate,
    Explicit,
    auto_scenario_id,
    candidates,
    opening_of,
    reply_messages,
    resemblance,
    verbatim,
)
from .groups import Groups

# Open trajectories kept in memory (each holds its last call's token ids for the stitch check);
# production traffic opens many that never continue, and the store still has every one.
MAX_TRAJECTORIES_IN_MEMORY = 20_000


@dataclass
class _Trajectory:
    id: str
    scenario_id: str
    group_id: str
    split: Split
    upstream: str
    next_seq: int = 0
    # prompt + completion ids of each choice of the last call: a stitched call starts with one.
    previous_sequences: list[list[int]] = field(default_factory=list)
    # Continuation keys of the latest answered call (one per choice); empty while a call that
    # continues it is in flight, so identical sibling conversations each keep their own.
    tip_keys: list[str] = field(default_factory=list)
    # Key of the latest answered call's messages, and its replies as the model wrote them: an
    # agent that re-renders a reply is still recognised by the messages that preceded it.
    prompt_key: str | None = None
    replies: list[JsonObject] = field(default_factory=list)
    # Rows creating the trajectory, until a commit carried them (a lost first record must not
    # orphan the calls after it; the inserts are idempotent).
    unsaved_rows: NewTrajectoryRows | None = None


class _KeyIndex:
    """Key -> the trajectories whose tip has it, oldest first."""

    def __init__(self) -> None:
        self._owners: dict[str, list[str]] = {}

    def owners(self, key: str) -> list[str]:
        return self._owners.get(key, [])

    def move(self, trajectory_id: str, old: list[str], new: list[str]) -> None:
        for key in old:
            owners = self._owners.get(key, [])
            if trajectory_id in owners:
                owners.remove(trajectory_id)
            if not owners:
                self._owners.pop(key, None)
        for key in new:
            self._owners.setdefault(key, []).append(trajectory_id)


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


class TrajectoryTracker:
    def __init__(
        self,
        store: TrajectoryStore,
        upstreams: list[str],
        *,
        group_size: int = 0,
        group_window: float = 60.0,
    ) -> None:
        self._store = store
        self._upstreams = itertools.cycle(upstreams)
        self.groups = Groups(
            store,
            size=group_size,
            window=group_window,
            max_explicit=MAX_TRAJECTORIES_IN_MEMORY,
        )
        self._trajectories: OrderedDict[str, _Trajectory] = OrderedDict()  # least recent first
        self._tips = _KeyIndex()  # continuation key -> trajectory ids, oldest first
        self._prompts = _KeyIndex()  # prompt key -> trajectory ids, oldest first

    @property
    def open_count(self) -> int:
        return len(self._trajectories)

    async def assign(
        self,
        explicit: Explicit,
        messages: list[JsonObject] | None,
        *,
        continues: str | None = None,
    ) -> Assignment:
        """Where a call goes. `continues`: the trajectory a Responses call's
        `previous_response_id` names (it continues that trajectory, if still open)."""
        if explicit.trajectory_id is not None:
            known = await self._open(explicit.trajectory_id, finished_is_conflict=True)
            if known is not None:
                source: Attribution = "url" if explicit.source == "url" else "header"
                return self._next_call(known, source, reason=f"the {source} names it")
        elif continues is not None:
            known = await self._open(continues)
            if known is not None and _fits(explicit, known.scenario_id, known.group_id):
                claimed = self._move_tip(known, [])
                return self._next_call(
                    known, "response", claimed, reason="previous_response_id names its call"
                )
        if explicit.trajectory_id is None and messages:
            automatic = await self._automatic(messages, explicit)
            if automatic is not None:
                return automatic
        scenario_id = explicit.scenario_id or auto_scenario_id(messages or [])
        if explicit.group_id is not None:
            scenario_id = await self.groups.explicit_scenario(explicit, scenario_id)
        return self._start(explicit, scenario_id, messages)

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
        state = self._trajectories.get(assignment.trajectory_id)
        if state is None:
            return
        if committed and assignment.new_rows:
            state.unsaved_rows = None
        if continuation_keys:
            state.previous_sequences = sequences
            self._move_tip(state, continuation_keys)
            self._move_prompt(state, prompt_key)
            state.replies = replies or []
        elif not state.tip_keys:  # failed: the agent may retry from where it was
            self._move_tip(state, assignment.claimed_tip)

    def forget(self, trajectory_ids: list[str]) -> None:
        """Drop trajectories from memory (finished ones, or the least recently used)."""
        for trajectory_id in trajectory_ids:
            state = self._trajectories.pop(trajectory_id, None)
            if state is None:
                continue
            self._move_tip(state, [])
            self._move_prompt(state, None)
            self.groups.member_finished((state.scenario_id, state.split), trajectory_id)

    def _remember(self, state: _Trajectory) -> None:
        """Keep `state` in memory, dropping the least recently used beyond the bound.

        A dropped trajectory stays open in the store; its next call finds it there again.
        """
        self._trajectories[state.id] = state
        while len(self._trajectories) > MAX_TRAJECTORIES_IN_MEMORY:
            self.forget([next(iter(self._trajectories))])

    def _move_tip(self, state: _Trajectory, keys: list[str]) -> list[str]:
        """Point `state`'s tip at `keys`; returns the keys it had."""
        previous = state.tip_keys
        self._tips.move(state.id, previous, keys)
        state.tip_keys = list(keys)
        return previous

    def _move_prompt(self, state: _Trajectory, key: str | None) -> None:
        self._prompts.move(
            state.id, [state.prompt_key] if state.prompt_key else [], [key] if key else []
        )
        state.prompt_key = key

    # --- lookups ---------------------------------------------------------------------------------

    async def _open(
        self, trajectory_id: str, *, finished_is_conflict: bool = False
    ) -> _Trajectory | None:
        """An open trajectory by id (memory, else the store); None if unknown, and if finished
        too unless `finished_is_conflict` (an explicit id: the agent must start a new one)."""
        state = self._trajectories.get(trajectory_id)
        if state is not None:
            return state
        row = await self._store.trajectory_row(trajectory_id)
        if row is None:
            return None
        if row["status"] != "open":
            if finished_is_conflict:
                raise Conflict(
                    f"trajectory {trajectory_id!r} is finished; start a new trajectory id",
                    param="trajectory",
                )
            return None
        return self._adopt(row)

    async def _automatic(self, messages: list[JsonObject], explicit: Explicit) -> Assignment | None:
        """The call of an open trajectory these messages continue, None when they continue none.

        Exactly first: the messages extend a trajectory's last call and reply. Memory answers when
        it knows the newest candidate (the common case: the agent's last call went through this
        proxy). Otherwise the store does, which covers conversations another proxy or an earlier
        run served, and catches up a trajectory whose newer calls went through another proxy.
        Then re-rendered: the messages extend a trajectory's last call, and the assistant message
        after it is that call's reply in another form.
        """
        found = candidates(messages)
        if not found:
            return None
        newest = self._tip_owner(found[0].key, explicit)
        if newest is not None:
            return self._continue(newest, messages[found[0].position])
        exact, prompted = await self._store.open_trajectories_by_tip(
            [c.key for c in found], [c.prompt_key for c in found]
        )
        for candidate in found:
            for row in exact.get(candidate.key, []):
                state = self._claimable(row, explicit)
                if state is not None:
                    return self._continue(state, messages[candidate.position])
        # Not in the store: maybe its record was lost (store errors) while memory kept it.
        for candidate in found[1:]:
            owner = self._tip_owner(candidate.key, explicit)
            if owner is not None:
                return self._continue(owner, messages[candidate.position])
        rerendered = self._by_rerender(found, messages, explicit, prompted)
        if rerendered is None:
            return None
        claimed = self._move_tip(rerendered, [])
        return self._next_call(
            rerendered,
            "rerendered",
            claimed,
            reason="the messages extend its last call; the reply came back in another form",
        )

    def _continue(self, state: _Trajectory, echoed: JsonObject) -> Assignment:
        """The next call of `state`, whose last reply `echoed` sends back: as the model wrote it
        (a continuation), or in another form its tokens do not match (re-rendered)."""
        replies = state.replies
        claimed = self._move_tip(state, [])
        if replies and not any(verbatim(reply, echoed) for reply in replies):
            return self._next_call(
                state,
                "rerendered",
                claimed,
                reason="the messages extend its last call and reply, the reply re-rendered "
                "(reformatted tool arguments)",
            )
        return self._next_call(
            state, "continuation", claimed, reason="the messages extend its last call and reply"
        )

    def _claimable(self, row: JsonObject, explicit: Explicit) -> _Trajectory | None:
        """The trajectory of a store row, caught up with the row, unless it cannot take this call
        (another scenario or group, or a call continuing it is in flight here)."""
        if not _fits(explicit, row["scenario_id"], row["group_id"]):
            return None
        state = self._trajectories.get(row["id"])
        if state is not None and not state.tip_keys:
            return None
        state = state or self._adopt(row)
        state.next_seq = max(state.next_seq, int(row["call_count"]))
        state.previous_sequences = _sequences(row)
        state.replies = reply_messages(row["response"] or {})
        return state

    def _by_rerender(
        self,
        found: list[Candidate],
        messages: list[JsonObject],
        explicit: Explicit,
        prompted: dict[str, list[JsonObject]],
    ) -> _Trajectory | None:
        """The open trajectory whose last call's messages this call extends with that call's
        reply in another form: of those answered and not being continued (in memory, or in the
        store's `prompted` rows), the one whose reply the echoed message resembles most (its
        tool-call ids, its text), oldest first on a tie; None when no reply left a mark."""
        for candidate in found:
            echoed = messages[candidate.position]
            best: tuple[int, _Trajectory | JsonObject | None] = (0, None)
            seen = set()
            for trajectory_id in self._prompts.owners(candidate.prompt_key):
                state = self._trajectories[trajectory_id]
                seen.add(state.id)
                if state.tip_keys and _fits(explicit, state.scenario_id, state.group_id):
                    best = max(best, (_resemblance(state.replies, echoed), state), key=_score)
            for row in prompted.get(candidate.prompt_key, []):
                known = self._trajectories.get(row["id"])
                if row["id"] in seen or (known is not None and not known.tip_keys):
                    continue  # scored from memory, or a call continuing it is in flight here
                if _fits(explicit, row["scenario_id"], row["group_id"]):
                    replies = reply_messages(row["response"] or {})
                    best = max(best, (_resemblance(replies, echoed), row), key=_score)
            score, owner = best
            if score > 0 and owner is not None:
                return owner if isinstance(owner, _Trajectory) else self._claimable(owner, explicit)
        return None

    def _tip_owner(self, key: str, explicit: Explicit) -> _Trajectory | None:
        for trajectory_id in self._tips.owners(key):
            state = self._trajectories[trajectory_id]
            if _fits(explicit, state.scenario_id, state.group_id):
                return state
        return None

    def _adopt(self, row: JsonObject) -> _Trajectory:
        """Take over an open trajectory another proxy (or an earlier run) started."""
        state = _Trajectory(
            id=row["id"],
            scenario_id=row["scenario_id"],
            group_id=row["group_id"],
            split=row["split"],
            upstream=row["upstream"],
            next_seq=int(row["call_count"]),
            previous_sequences=_sequences(row),
        )
        self._remember(state)
        return state

    def _next_call(
        self,
        state: _Trajectory,
        attribution: Attribution,
        claimed_tip: list[str] | None = None,
        *,
        reason: str,
    ) -> Assignment:
        self._trajectories.move_to_end(state.id)
        seq = state.next_seq
        state.next_seq += 1
        return _assignment(state, seq, attribution, state.unsaved_rows, claimed_tip or [], reason)

    # --- new trajectories ------------------------------------------------------------------------

    def _start(
        self, explicit: Explicit, scenario_id: str, messages: list[JsonObject] | None
    ) -> Assignment:
        now = utcnow()
        trajectory_id = explicit.trajectory_id or uuid.uuid4().hex
        group_id = (
            self.groups.join_explicit(explicit.group_id, scenario_id)
            if explicit.group_id is not None
            else self.groups.join_automatic((scenario_id, explicit.split), trajectory_id)
        )
        state = _Trajectory(
            id=trajectory_id,
            scenario_id=scenario_id,
            group_id=group_id,
            split=explicit.split,
            upstream=next(self._upstreams),
            next_seq=1,
        )
        self._remember(state)
        rows = NewTrajectoryRows(
            scenario={
                "id": scenario_id,
                "created_at": now,
                "auto": explicit.scenario_id is None,
                "opening": scrub(opening_of(messages or [])),
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
            },
        )
        state.unsaved_rows = rows
        attribution: Attribution = "new" if explicit.source == "none" else explicit.source
        reason = (
            "no open trajectory's last call starts these messages"
            if explicit.trajectory_id is None
            else f"the {explicit.source} names a trajectory not seen before"
        )
        return _assignment(state, 0, attribution, rows, reason=reason)

    def shadow_of(self, served: Assignment) -> Assignment:
        """A new one-call trajectory beside `served` (which opened its own): same scenario, group,
        split and upstream, finished from the start, marked by `finish_reason` "shadow" and
        `metadata["shadow_of"]`."""
        assert served.seq == 0, "only a call that opened its trajectory is shadowed"
        now = utcnow()
        trajectory_id = uuid.uuid4().hex
        self.groups.add_shadow((served.scenario_id, served.split), served.group_id)
        assert served.new_rows is not None
        # The served call's creation rows: its scenario and group rows are idempotent inserts,
        # which keeps the shadow recordable even if the served record was lost.
        shadow: TrajectoryRow = {
            **served.new_rows.trajectory,
            "id": trajectory_id,
            "status": "finished",
            "finish_reason": "shadow",
            "finished_at": now,
            "created_at": now,
            "updated_at": now,
            "metadata": {"shadow_of": served.trajectory_id},
        }
        rows = replace(served.new_rows, trajectory=shadow)
        return Assignment(
            trajectory_id=trajectory_id,
            scenario_id=served.scenario_id,
            group_id=served.group_id,
            split=served.split,
            upstream=served.upstream,
            seq=0,
            attribution="shadow",
            previous_sequences=[],
            new_rows=rows,
        )


def _assignment(
    state: _Trajectory,
    seq: int,
    attribution: Attribution,
    rows: NewTrajectoryRows | None,
    claimed_tip: list[str] | None = None,
    reason: str = "",
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
    )


def _resemblance(replies: list[JsonObject], echoed: JsonObject) -> int:
    return max((resemblance(reply, echoed) for reply in replies), default=0)


def _score(option: tuple[int, Any]) -> int:
    return option[0]


def _fits(explicit: Explicit, scenario_id: str, group_id: str) -> bool:
    """Whether a trajectory of this scenario and group can take a call that said `explicit`."""
    return explicit.scenario_id in (None, scenario_id) and explicit.group_id in (None, group_id)


def _sequences(row: JsonObject) -> list[list[int]]:
    """Prompt plus completion ids of each choice of a recorded call (for the stitch check)."""
    prompt_ids = row.get("prompt_token_ids")
    if prompt_ids is None:
        return []
    return [prompt_ids + ids for ids in row.get("completion_token_ids") or []]
