"""The proxy's background rounds: idle trajectories finished, the open groups and the aliases
merged from the store (every second), and `--retain-days` applied (every `retention.PERIOD_S`)."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

from art_proxy.journal.segments import Journal
from art_proxy.privacy.erasure import deleted_text
from art_proxy.privacy.retention import PERIOD_S, expire
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .aliases import Aliases
from .tracker import TrajectoryTracker

log = logging.getLogger(__name__)

# Seconds between merges of the store's open groups and aliases into memory (see
# groups.Groups.refresh and aliases.py).
_GROUP_REFRESH_S = 1.0
_REPORT_EVERY_S = 10.0  # housekeeping's failures, logged at most this often


async def housekeeping(
    idle_timeout: float,
    store: TrajectoryStore,
    tracker: TrajectoryTracker,
    aliases: Aliases,
    journal: Journal | None,
) -> None:
    """Finish idle trajectories and keep the tracker's view of groups and the aliases current,
    off the hot path."""
    period = (
        min(_GROUP_REFRESH_S, max(idle_timeout / 4, 0.05)) if idle_timeout > 0 else _GROUP_REFRESH_S
    )
    since = utcnow()
    reported = 0.0  # when a failure was last logged: an outage fails every round
    while True:
        await asyncio.sleep(period)
        try:
            started = utcnow()
            tracker.groups.refresh(await store.active_groups(since - timedelta(seconds=period)))
            since = started
            await aliases.reload()
            # While records wait in the journal the store's idea of "idle" is stale.
            if idle_timeout > 0 and (journal is None or journal.backlog_frames == 0):
                finished = await store.finish_idle(utcnow() - timedelta(seconds=idle_timeout))
                if finished:
                    tracker.forget(finished)
                    log.info("finished %d idle trajectories", len(finished))
        except Exception as exc:  # a StoreError, mostly; whatever it is, the loop goes on
            if time.monotonic() - reported >= _REPORT_EVERY_S:
                reported = time.monotonic()
                log.error("housekeeping failed (will retry): %s: %s", type(exc).__name__, exc)


async def retention(
    retain_days: float, store: TrajectoryStore, tracker: TrajectoryTracker, journal: Journal | None
) -> None:
    """`--retain-days`: delete what aged past it now, then every `retention.PERIOD_S`."""
    while True:
        try:
            deleted = await expire(
                store,
                retain_days,
                journal.directory if journal is not None else None,
                on_deleted=tracker.forget,
            )
            if any(deleted.values()):
                log.info("retention deleted %s", deleted_text(deleted))
        except Exception as exc:  # a StoreError, mostly: the next round tries again
            log.error("retention failed (will retry): %s: %s", type(exc).__name__, exc)
        await asyncio.sleep(PERIOD_S)
