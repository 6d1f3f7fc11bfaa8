"""Which group a new trajectory joins: the siblings RULER ranks against each other.

A new trajectory joins its scenario's current group while that group has an open member or its
newest member started less than `group_window` seconds ago, and while the group is not full: runs
of one scenario side by side (or in quick succession) become siblings. A `val` run and a `train` run
of one opening are never siblings (groups are per scenario and split), or the trainer would train
on validation data.

An explicit group (`X-Art-Group` or `/group/{id}` in the URL) overrides that: a new trajectory joins
the named group, whatever the window and size, and the group is created on first use. Without an
explicit scenario the trajectory takes the group's; an explicit scenario that differs from it is a
conflict. Explicit groups are never joined automatically.

The hot path never asks the store which group a new trajectory joins: `refresh` merges the groups
the store saw active (other proxies' too) every second. It also forgets groups no trajectory can
join any more, looking only at those whose time has come: each group without an open member here,
or full, is scheduled for when it may stop being joinable. A sweep of every group held 20,000 open
trajectories' groups in the event loop for tens of milliseconds a second; a sweep of every group
without an open member (those of the trajectories memory let go of, at 2,000 new trajectories a
second, for the window's 60 s) held it for hundreds.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from dataclasses import dataclass

from art_proxy.errors import Conflict, StoreError
from art_proxy.ids import new_id
from art_proxy.records import JsonObject, Split
from art_proxy.store.trajectory_store import TrajectoryStore

from .attribution import Explicit
from .continuation import looked_up_in_memory_only

GroupKey = tuple[str, Split]  # (scenario id, split)


@dataclass
class _Group:
    id: str
    size: int
    open_ids: set[str]  # members started here and not finished
    newest_start: float  # monotonic seconds
    # Until when (monotonic) the store's word that other proxies' members are open holds.
    elsewhere_until: float = 0.0


class Groups:
    def __init__(
        self, store: TrajectoryStore, *, size: int, window: float, max_explicit: int
    ) -> None:
        self._store = store
        self._size = size
        self._window = window
        self._max_explicit = max_explicit
        self._automatic: dict[GroupKey, _Group] = {}  # each key's current automatic group
        # Explicit group id -> its scenario, oldest first (bounded like the trajectories).
        self._explicit: OrderedDict[str, str] = OrderedDict()
        # Keys whose group has no open member here, or is full (joinable for a while at most), by
        # when (monotonic) to look at the group again: a heap, and each key's earliest time in it.
        self._settling: list[tuple[float, GroupKey]] = []
        self._settling_at: dict[GroupKey, float] = {}

    def __len__(self) -> int:
        """Automatic groups held in memory (joinable, or not yet forgotten)."""
        return len(self._automatic)

    def join_automatic(self, key: GroupKey, trajectory_id: str) -> str:
        """The id of the group a new trajectory of `key` joins (a new group if none is open)."""
        group = self._automatic.get(key)
        if group is None or not self._joinable(group):
            group = _Group(new_id(), 0, set(), time.monotonic())
            self._automatic[key] = group
        group.size += 1
        group.open_ids.add(trajectory_id)
        group.newest_start = time.monotonic()
        if self._size and group.size >= self._size:
            self._settle(key, group)
        return group.id

    def join_explicit(self, group_id: str, scenario_id: str) -> str:
        self._explicit[group_id] = scenario_id
        self._explicit.move_to_end(group_id)
        while len(self._explicit) > self._max_explicit:
            self._explicit.popitem(last=False)
        return group_id

    async def explicit_scenario(self, explicit: Explicit, scenario_id: str) -> str:
        """The scenario a new trajectory of an explicit group gets: the group's, if it exists."""
        assert explicit.group_id is not None
        known = self._explicit.get(explicit.group_id)
        if known is None:
            try:
                known = await self._store.group_scenario(explicit.group_id)
            except StoreError as exc:  # down: answered all the same, the group taken as new
                looked_up_in_memory_only(f"group {explicit.group_id!r}", exc)
        if known is None:
            return scenario_id
        if explicit.scenario_id not in (None, known):
            raise Conflict(
                f"group {explicit.group_id!r} belongs to scenario {known!r}, "
                f"not {explicit.scenario_id!r}",
                param="group",
            )
        return known

    def add_shadow(self, key: GroupKey, group_id: str) -> None:
        """A shadow sample fills a sized group like any member."""
        group = self._automatic.get(key)
        if group is not None and group.id == group_id:
            group.size += 1
            self._settle(key, group)

    def member_finished(self, key: GroupKey, trajectory_id: str) -> None:
        group = self._automatic.get(key)
        if group is not None:
            group.open_ids.discard(trajectory_id)
            if not group.open_ids:
                self._settle(key, group)

    def _full(self, group: _Group) -> bool:
        return bool(self._size) and group.size >= self._size

    def _joinable(self, group: _Group) -> bool:
        return not self._full(group) and (
            bool(group.open_ids) or time.monotonic() < self._joinable_until(group)
        )

    def _joinable_until(self, group: _Group) -> float:
        """Until when (monotonic) a group with room is joinable without an open member here."""
        return max(group.newest_start + self._window, group.elsewhere_until)

    def _settle(self, key: GroupKey, group: _Group) -> None:
        """Look at `key`'s group again when it may have stopped being joinable (at once if full)."""
        at = time.monotonic() if self._full(group) else self._joinable_until(group)
        if at < self._settling_at.get(key, float("inf")):
            self._settling_at[key] = at
            heapq.heappush(self._settling, (at, key))

    def refresh(self, active_groups: list[JsonObject]) -> None:
        """Merge groups the store saw active (other proxies' too), and forget stale ones.

        Called by housekeeping every second with the groups active since the last call, so
        siblings that reach different proxies within that second may form two groups; everything
        else stays exact.
        """
        now = time.monotonic()
        for row in active_groups:
            key, group_id = (row["scenario_id"], row["split"]), row["id"]
            if group_id in self._explicit:
                continue
            group = self._automatic.get(key)
            if group is None or (group.id != group_id and not self._joinable(group)):
                group = _Group(group_id, 0, set(), now)
                self._automatic[key] = group
            if group.id == group_id:
                group.size = max(group.size, int(row["size"]))
                if int(row["open_count"]) > len(group.open_ids):
                    group.elsewhere_until = now + self._window
                self._settle(key, group)
        self._forget_settled(now)

    def _forget_settled(self, now: float) -> None:
        """Forget the settling groups whose time has come and that no trajectory can join now; one
        still joinable without an open member here is looked at again when that may end, and one
        with an open member again (and room) when its last one finishes (`member_finished`)."""
        settling, settling_at = self._settling, self._settling_at
        while settling and settling[0][0] <= now:
            at, key = heapq.heappop(settling)
            if settling_at.get(key) != at:
                continue  # superseded by an earlier time, already looked at
            del settling_at[key]
            group = self._automatic.get(key)
            if group is None:
                continue
            if not self._joinable(group):
                del self._automatic[key]
            elif not group.open_ids:
                self._settle(key, group)  # its window moved on (a new member, another proxy's)
