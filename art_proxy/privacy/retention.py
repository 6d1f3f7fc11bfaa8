"""Retention: records older than `--retain-days` deleted, a bounded batch at a time.

The proxy runs it every `PERIOD_S` (`serve --retain-days`), and `art-proxy housekeeping` once.
Each batch is one transaction over `store.erasure.BATCH` trajectories (calls, feedback, their
groups' judgments, their scenarios' openings: as erasure deletes them), with a pause between
batches, so a first run over months of records never holds up recording. Records the store refused,
set aside in the journal directory, and damaged journal bytes quarantined, go once they are as
old. A trajectory's age is its start.
What training consumed stays listed by its steps (group ids, no text), as after erasure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from art_proxy.journal import quarantine, rejected
from art_proxy.store.erasure import BATCH
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

PERIOD_S = 600.0  # how often a proxy deletes what aged past its retention
PAUSE_S = 0.05  # between two batches: the writer's own transactions go in between


async def expire(
    store: TrajectoryStore,
    retain_days: float,
    journal_directory: Path | None = None,
    *,
    pause_s: float = PAUSE_S,
    on_deleted: Callable[[list[str]], None] | None = None,
) -> dict[str, int]:
    """Delete everything started more than `retain_days` ago; rows deleted by table.
    `on_deleted` hears each batch's trajectory ids (a proxy forgets them)."""
    before = utcnow() - timedelta(days=retain_days)
    totals: dict[str, int] = {}
    while True:
        batch = await store.expire(before)
        if not batch.trajectory_ids:
            break
        if on_deleted is not None:
            on_deleted(batch.trajectory_ids)
        for table, count in batch.deleted.items():
            totals[table] = totals.get(table, 0) + count
        await asyncio.sleep(pause_s)
    if totals.get("trajectories", 0) >= BATCH:
        await store.refresh_statistics()
    if journal_directory is not None:
        totals["set_aside_records"] = await asyncio.to_thread(
            rejected.drop_older, journal_directory, before.timestamp()
        )
        totals["quarantined_files"] = await asyncio.to_thread(
            quarantine.drop_older, journal_directory, before.timestamp()
        )
    return totals
