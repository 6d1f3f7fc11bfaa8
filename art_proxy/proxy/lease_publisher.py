"""Leases published: each proxy writes the leases its memory holds to the store (`proxy_leases`),
so a trainer asking any proxy of a shared store sees a lease before its trajectory's first call
is recorded (the call still running upstream, or its record still in the journal).

The rows are replaced whole every `PUBLISH_EVERY_S`, and at once when a trajectory takes a lease
on a model the last publication did not name, or one that held leases leaves memory (finished:
the hot path only sets an event). The proxy that answers `GET /art/v1/leases` reads its own
from memory, never its rows, which may lag it. A proxy's rows
count for `FRESH` after it last wrote them: a proxy killed, or cut off from the store, stops
holding anything then (its recorded calls still hold their models through the store's open
trajectories). A stopping proxy withdraws its rows. Publishing is best effort: while the store
refuses writes the leases live on in this proxy's memory, which its own `GET /art/v1/leases`
answers with too (admin.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import timedelta

from art_proxy.ids import new_id
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .tracker import TrajectoryTracker

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 2.0
# Five publications missed: a proxy that wrote none for this long is gone or cut off.
FRESH = timedelta(seconds=5 * PUBLISH_EVERY_S)
_REPORT_EVERY_S = 60.0  # a failing publication, logged at most this often


class LeasePublisher:
    def __init__(self, store: TrajectoryStore, tracker: TrajectoryTracker) -> None:
        self.proxy_id = new_id()
        self._store = store
        self._tracker = tracker
        self._published: dict[str, int] = {}
        self._changed = asyncio.Event()
        tracker.on_lease = self.leased
        tracker.on_leases_released = self._changed.set

    def leased(self, model: str) -> None:
        """A trajectory took a lease on `model`: publish now unless it is out already."""
        if model not in self._published:
            self._changed.set()

    async def run(self) -> None:
        reported = -_REPORT_EVERY_S
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), PUBLISH_EVERY_S)
            self._changed.clear()
            held = self._tracker.held_leases()
            if not held and not self._published:
                continue  # no row to write, replace or keep fresh: no write on the store
            try:
                await self._store.publish_leases(self.proxy_id, held)
                self._published = held
            except Exception as exc:  # a StoreError, mostly: memory still answers (admin.py)
                if time.monotonic() - reported >= _REPORT_EVERY_S:
                    reported = time.monotonic()
                    log.warning(
                        "leases not published (will retry): %s: %s", type(exc).__name__, exc
                    )

    async def withdraw(self) -> None:
        """This proxy stops: its rows go, and any other proxy's that have not been fresh for a
        while (one killed)."""
        with contextlib.suppress(Exception):
            await self._store.withdraw_leases(self.proxy_id, utcnow() - 10 * FRESH)
