"""`art-proxy forget` and `POST /art/v1/forget`: a subject's records deleted wherever they are
kept (the store, the journal, the records set aside beside it), with what learned from them.

The store's part is store/erasure.py. The journal's: a running proxy first waits until what it
journaled is in the store, then deletes its journal segments (`Journal.seal`), since a segment
keeps an ingested record's bytes until it is rotated away; the records the store refused, set
aside in the journal directory, are dropped where they are the subject's, as are the damaged
bytes a recovery quarantined that name one of its ids. The judge's cache is the store's
judgments, deleted with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from art_proxy.journal import quarantine, rejected
from art_proxy.journal.segments import Journal
from art_proxy.records import Erasure, SubjectSelector
from art_proxy.store.trajectory_store import TrajectoryStore


def deleted_text(deleted: Mapping[str, int]) -> str:
    """ "3 trajectories, 7 calls": what was deleted, for a person (`nothing` when nothing was)."""
    said = [f"{count} {table.replace('_', ' ')}" for table, count in deleted.items() if count]
    return ", ".join(said) or "nothing"


async def forget(
    store: TrajectoryStore,
    subject: SubjectSelector,
    journal_directory: Path | None,
    journal: Journal | None = None,
) -> Erasure:
    """Delete `subject`'s records; `journal`: a running proxy's own, settled by the caller."""
    erasure = await store.forget(subject)
    dropped = quarantined = 0
    if journal_directory is not None:
        trajectories = erasure.lineage.trajectories
        dropped = await asyncio.to_thread(
            rejected.drop_subject, journal_directory, subject, trajectories
        )
        names = [*trajectories, *(n for n in (subject.user, subject.tenant) if n is not None)]
        quarantined = await asyncio.to_thread(quarantine.drop_naming, journal_directory, names)
    if journal is not None:
        journal.seal()
        await journal.deletions_synced()
    return erasure.model_copy(
        update={"journal_frames_dropped": dropped, "quarantined_files_dropped": quarantined}
    )
