"""Which open trajectory a call's messages continue, when nothing names one.

Exactly first: the messages extend a trajectory's last call and reply. Memory answers when it
knows the newest candidate (the common case: the agent's last call went through this proxy).
Otherwise the store does, which covers conversations another proxy or an earlier run served, and
catches up a trajectory whose newer calls went through another proxy. Then re-rendered: the
messages extend a trajectory's last call, and the assistant message after it is that call's reply
in another form (attribution.py says how replies are recognised).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from art_proxy.errors import StoreError
from art_proxy.privacy.subjects import subject_of_row
from art_proxy.records import JsonObject
from art_proxy.store.trajectory_store import TrajectoryStore

from .attribution import (
    Candidate,
    Explicit,
    as_sampled,
    reply_messages,
    resemblance,
    verbatim,
)
from .open_trajectories import (
    OpenTrajectories,
    OpenTrajectory,
    Restored,
    fits,
    sequences_of,
)

log = logging.getLogger(__name__)

_REPORT_EVERY_S = 10.0  # a store outage fails every lookup: said at most this often
_unread = {"lookups": 0, "logged": 0.0}


def looked_up_in_memory_only(what: str, exc: StoreError) -> None:
    """A lookup the store failed (it is down: the call is answered and journaled all the same,
    from what memory knows), logged at most every `_REPORT_EVERY_S` with a count."""
    _unread["lookups"] += 1
    now = time.monotonic()
    if now - _unread["logged"] >= _REPORT_EVERY_S:
        log.warning(
            "%s looked up in memory only, the store failed (%d lookups since the last report): %s",
            what,
            _unread["lookups"],
            exc,
        )
        _unread["lookups"], _unread["logged"] = 0, now


@dataclass(frozen=True)
class Continuation:
    """The trajectory a call continues, and how its messages showed it."""

    state: OpenTrajectory
    attribution: Literal["continuation", "rerendered"]
    reason: str
    # Echoes that say a reply of the trajectory in another form, as the model wrote them:
    # forwarded upstream in their place so the call's prompt extends the tokens it sampled.
    restored: Restored = ()


async def find_continuation(
    memory: OpenTrajectories,
    store: TrajectoryStore,
    messages: list[JsonObject],
    found: list[Candidate],
    explicit: Explicit,
    own_records_stored: Callable[[], Awaitable[bool]],
) -> Continuation | None:
    """The open trajectory these messages continue, None when they continue none. `found`: the
    messages' candidates (`attribution.candidates`). Memory knows this proxy's open trajectories
    (but a bounded number); the store knows every proxy's, once `own_records_stored` says this
    one's are in it."""
    if not found:
        return None
    newest = memory.tip_owner(found[0].key, explicit)
    if newest is not None:
        return _continued(newest, messages, found[0].position)
    try:
        await own_records_stored()
        exact, prompted = await store.open_trajectories_by_tip(
            [c.key for c in found], [c.prompt_key for c in found]
        )
    except StoreError as exc:
        # The store is down: answer anyway (the record is journaled); only memory can tell.
        looked_up_in_memory_only("a continuation", exc)
        exact, prompted = {}, {}
    for candidate in found:
        for row in exact.get(candidate.key, []):
            state = claimable(memory, row, explicit)
            if state is not None:
                return _continued(state, messages, candidate.position)
    # Not in the store: maybe its record was lost (store errors) while memory kept it.
    for candidate in found[1:]:
        owner = memory.tip_owner(candidate.key, explicit)
        if owner is not None:
            return _continued(owner, messages, candidate.position)
    rerendered = _by_rerender(memory, found, messages, explicit, prompted)
    if rerendered is None:
        return None
    state, position = rerendered
    return _continued(state, messages, position)


def claimable(
    memory: OpenTrajectories, row: JsonObject, explicit: Explicit
) -> OpenTrajectory | None:
    """The trajectory of a store row, caught up with the row, unless it cannot take this call
    (another scenario or group, or a call continuing it is in flight here)."""
    if not fits(explicit, row["scenario_id"], row["group_id"], subject_of_row(row)):
        return None
    state = memory.get(row["id"])
    if state is not None and not state.tip_keys:
        return None
    state = state or memory.remember(OpenTrajectory.of_row(row))
    state.next_seq = max(state.next_seq, int(row["call_count"]))
    state.previous_sequences = sequences_of(row)
    state.replies = reply_messages(row["response"] or {})
    return state


# How the echo at the call's last assistant message said the trajectory's last reply: the
# attribution it gives the call, and why.
_ECHOED: dict[str, tuple[Literal["continuation", "rerendered"], str]] = {
    "verbatim": ("continuation", "the messages extend its last call and reply"),
    "restored": (
        "continuation",
        "the messages extend its last call and reply, the reply in another form "
        "(forwarded as the model wrote it)",
    ),
    "other": (
        "rerendered",
        "the messages extend its last call; the reply came back in another form",
    ),
}


def _continued(state: OpenTrajectory, messages: list[JsonObject], position: int) -> Continuation:
    """`state` continued by a call that sends its last reply back as `messages[position]`: as
    the model wrote it, or saying the same in another form (a continuation either way: the
    latter is forwarded as the model wrote it), or else re-rendered."""
    restored, echoed = _restorations(state, messages, position)
    attribution, reason = _ECHOED[echoed]
    return Continuation(state, attribution, reason, restored)


def restored_echo(state: OpenTrajectory, messages: list[JsonObject] | None) -> Restored:
    """For a call that names its trajectory: the echoes to forward as the model wrote them (its
    last assistant message, where it says the trajectory's last reply in another form, and the
    earlier ones the trajectory's last call forwarded so)."""
    if not messages:
        return ()
    position = next(
        (n for n in range(len(messages) - 1, -1, -1) if messages[n].get("role") == "assistant"),
        None,
    )
    return () if position is None else _restorations(state, messages, position)[0]


def _restorations(
    state: OpenTrajectory, messages: list[JsonObject], position: int
) -> tuple[Restored, Literal["verbatim", "restored", "other"]]:
    """What to forward as the model wrote it when `messages[position]` echoes the trajectory's
    last reply: the echoes its last call forwarded so (the messages before still hold them), and
    this one where it says the reply in another form; and how it echoed the reply."""
    carried = []
    for earlier, sampled in state.restored:
        if earlier < position:
            again = as_sampled(sampled, messages[earlier])
            if again is not None:
                carried.append((earlier, again))
    echoed = messages[position]
    if not state.replies or any(verbatim(reply, echoed) for reply in state.replies):
        return tuple(carried), "verbatim"
    for reply in state.replies:
        meant = as_sampled(reply, echoed)
        if meant is not None:
            return (*carried, (position, meant)), "restored"
    return tuple(carried), "other"


def _by_rerender(
    memory: OpenTrajectories,
    found: list[Candidate],
    messages: list[JsonObject],
    explicit: Explicit,
    prompted: dict[str, list[JsonObject]],
) -> tuple[OpenTrajectory, int] | None:
    """The open trajectory whose last call's messages this call extends with that call's reply in
    another form, and the position of the echo: of those answered and not being continued (in
    memory, or in the store's `prompted` rows), the one whose reply the echoed message resembles
    most (its tool-call ids, its text), oldest first on a tie; None when no reply left a mark."""
    for candidate in found:
        echoed = messages[candidate.position]
        best: OpenTrajectory | JsonObject | None = None  # a trajectory in memory, or a store row
        best_score = 0
        seen = set()
        for state in memory.prompt_owners(candidate.prompt_key):
            seen.add(state.id)
            score = _resemblance(state.replies, echoed)
            if state.tip_keys and state.fits(explicit) and score > best_score:
                best_score, best = score, state
        for row in prompted.get(candidate.prompt_key, []):
            known = memory.get(row["id"])
            if row["id"] in seen or (known is not None and not known.tip_keys):
                continue  # scored from memory, or a call continuing it is in flight here
            score = _resemblance(reply_messages(row["response"] or {}), echoed)
            if (
                fits(explicit, row["scenario_id"], row["group_id"], subject_of_row(row))
                and score > best_score
            ):
                best_score, best = score, row
        if isinstance(best, OpenTrajectory):
            return best, candidate.position
        if best is not None:
            claimed = claimable(memory, best, explicit)
            return None if claimed is None else (claimed, candidate.position)
    return None


def _resemblance(replies: list[JsonObject], echoed: JsonObject) -> int:
    return max((resemblance(reply, echoed) for reply in replies), default=0)
