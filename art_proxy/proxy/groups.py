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
join any more, looking only at those that may have become so (no open member here, or full): a
sweep of every group held 20,000 open trajectories' groups in the event loop for tens of
milliseconds a second.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from art_proxy.errors import Conflict
from art_proxy.ids import new_id
from art_proxy.records import JsonObject, Split
from art_proxy.store.trajectory_store import TrajectoryStore

from .attribution import Explicit

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
        # Keys whose group has no open member here, or is full: joinable for a while at most.
        self._settling: set[GroupKey] = set()

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
            self._settling.add(key)
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
            known = await self._store.group_scenario(explicit.group_id)
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
            self._settling.add(key)

    def member_finished(self, key: GroupKey, trajectory_id: str) -> None:
        group = self._automatic.get(key)
        if group is not None:
            group.open_ids.discard(trajectory_id)
            if not group.open_ids:
                self._settling.add(key)

    def _joinable(self, group: _Group) -> bool:
        if self._size and group.size >= self._size:
            return False
        now = time.monotonic()
        recent = now - group.newest_start < self._window
        return bool(group.open_ids) or group.elsewhere_until > now or recent

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
                self._settling.add(key)
        self._forget_settled()

    def _forget_settled(self) -> None:
        """Forget the settling groups no trajectory can join now; one with an open member again
        (and room) leaves the settling set until it has none."""
        for key in list(self._settling):
            group = self._automatic.get(key)
            if group is None:
                self._settling.discard(key)
            elif not self._joinable(group):
                del self._automatic[key]
                self._settling.discard(key)
            elif group.open_ids:  # joinable, so not full
                self._settling.discard(key)
