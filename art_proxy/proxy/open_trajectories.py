"""The open trajectories a proxy holds in memory, and the keys that find them.

Memory answers the common case (the agent's last call went through this proxy) without asking the
store: each open trajectory keeps its last call's token ids (for the stitch check), the
continuation keys of its tip and the key of its last call's messages. Memory is bounded; a
trajectory dropped from it stays open in the store, where the next call finds it again.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from art_proxy.privacy.subjects import NO_SUBJECT, Subject, subject_of_row
from art_proxy.records import JsonObject, Split
from art_proxy.store.rows import NewTrajectoryRows

from .attribution import Explicit

# Open trajectories kept in memory (each holds its last call's token ids for the stitch check);
# production traffic opens many that never continue, and the store still has every one.
MAX_TRAJECTORIES_IN_MEMORY = 20_000


# Echoed replies forwarded upstream as the model wrote them: (their index in the call's
# messages, the message as sampled). A later call's messages start with the same messages.
Restored = tuple[tuple[int, JsonObject], ...]


@dataclass
class OpenTrajectory:
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
    restored: Restored = ()  # what the latest answered call forwarded as the model wrote it
    # Rows creating the trajectory, until a commit carried them (a lost first record must not
    # orphan the calls after it; the inserts are idempotent).
    unsaved_rows: NewTrajectoryRows | None = None
    subject: Subject = NO_SUBJECT  # whose conversation it is (privacy/subjects.py)
    # Its leases: alias -> the model the alias served its first call through it (leases.py).
    leases: dict[str, str] = field(default_factory=dict)
    # Read from the store (another proxy, or this one before a restart, served its calls): the
    # model that served its last call, which its next call through an alias keeps (leases.py).
    served_before: str | None = None

    def fits(self, explicit: Explicit) -> bool:
        """Whether this trajectory can take a call that said `explicit`."""
        return fits(explicit, self.scenario_id, self.group_id, self.subject)

    @classmethod
    def of_row(cls, row: JsonObject) -> OpenTrajectory:
        """An open trajectory as the store has it (another proxy or an earlier run started it)."""
        return cls(
            id=row["id"],
            scenario_id=row["scenario_id"],
            group_id=row["group_id"],
            split=row["split"],
            upstream=row["upstream"],
            next_seq=_next_seq(row),
            previous_sequences=sequences_of(row),
            subject=subject_of_row(row),
            served_before=row.get("last_model"),
        )


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


class OpenTrajectories:
    """Open trajectories by id, least recently used first, indexed by tip and prompt key.

    `on_forget` hears of every trajectory dropped from memory (finished, or least recently used).
    """

    def __init__(self, on_forget: Callable[[OpenTrajectory], None]) -> None:
        self._on_forget = on_forget
        self._by_id: OrderedDict[str, OpenTrajectory] = OrderedDict()
        self._tips = _KeyIndex()  # continuation key -> trajectory ids, oldest first
        self._prompts = _KeyIndex()  # prompt key -> trajectory ids, oldest first

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, trajectory_id: str) -> OpenTrajectory | None:
        return self._by_id.get(trajectory_id)

    def all(self) -> list[OpenTrajectory]:
        return list(self._by_id.values())

    def remember(self, state: OpenTrajectory) -> OpenTrajectory:
        """Keep `state`, dropping the least recently used beyond the bound."""
        self._by_id[state.id] = state
        while len(self._by_id) > MAX_TRAJECTORIES_IN_MEMORY:
            self.forget([next(iter(self._by_id))])
        return state

    def touch(self, state: OpenTrajectory) -> None:
        """Mark `state` the most recently used."""
        self._by_id.move_to_end(state.id)

    def forget(self, trajectory_ids: list[str]) -> None:
        for trajectory_id in trajectory_ids:
            state = self._by_id.pop(trajectory_id, None)
            if state is None:
                continue
            self.move_tip(state, [])
            self.move_prompt(state, None)
            self._on_forget(state)

    def move_tip(self, state: OpenTrajectory, keys: list[str]) -> list[str]:
        """Point `state`'s tip at `keys`; returns the keys it had."""
        previous = state.tip_keys
        self._tips.move(state.id, previous, keys)
        state.tip_keys = list(keys)
        return previous

    def move_prompt(self, state: OpenTrajectory, key: str | None) -> None:
        self._prompts.move(
            state.id, [state.prompt_key] if state.prompt_key else [], [key] if key else []
        )
        state.prompt_key = key

    def tip_owner(self, key: str, explicit: Explicit) -> OpenTrajectory | None:
        """The oldest trajectory whose tip has `key` and that can take the call."""
        for trajectory_id in self._tips.owners(key):
            state = self._by_id[trajectory_id]
            if state.fits(explicit):
                return state
        return None

    def prompt_owners(self, key: str) -> list[OpenTrajectory]:
        """The trajectories whose last call's messages have `key`, oldest first."""
        return [self._by_id[trajectory_id] for trajectory_id in self._prompts.owners(key)]


def fits(
    explicit: Explicit, scenario_id: str, group_id: str, subject: Subject = NO_SUBJECT
) -> bool:
    """Whether a trajectory of this scenario, group and subject can take a call that said
    `explicit`. Two users' conversations that read alike (the same greeting, answered alike) stay
    apart: a call naming a user or tenant never continues another's trajectory, or erasing one
    user would leave their calls under the other's name."""
    return (
        explicit.scenario_id in (None, scenario_id)
        and explicit.group_id in (None, group_id)
        and same_subject(explicit.subject, subject)
    )


def same_subject(said: Subject, kept: Subject) -> bool:
    """Whether a call that said `said` may join a trajectory of `kept`: each user or tenant it
    names is the trajectory's. A trajectory keeps the subject of its first call, so a named call
    never joins one without that name, where no erasure of it would find its words."""
    return all(
        spoken is None or spoken == known
        for spoken, known in ((said.user, kept.user), (said.tenant, kept.tenant))
    )


def _next_seq(row: JsonObject) -> int:
    """After the last recorded call: a lost call leaves the count short of the seqs."""
    last = row.get("last_seq")
    return int(row["call_count"]) if last is None else max(int(row["call_count"]), last + 1)


def sequences_of(row: JsonObject) -> list[list[int]]:
    """Prompt plus completion ids of each choice of a recorded call (for the stitch check)."""
    prompt_ids = row.get("prompt_token_ids")
    if prompt_ids is None:
        return []
    return [prompt_ids + ids for ids in row.get("completion_token_ids") or []]
