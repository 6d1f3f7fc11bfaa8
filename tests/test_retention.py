"""Retention: what started more than --retain-days ago is deleted, in batches, by a proxy given
`--retain-days` and by `art-proxy housekeeping`; what is younger stays whole.

Conversations are recorded through a real proxy in front of the fake vLLM (SQLite and PostgreSQL);
some are then dated 40 days back in the store itself, as time would have.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import openai
import orjson
import sqlalchemy as sa

from art_proxy.journal import rejected
from art_proxy.privacy.retention import expire
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.store import schema
from art_proxy.store.rows import RowKind
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings, trajectories
from tests.test_erasure import store_text

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


async def record(proxy: RunningProxy, *openings: str) -> None:
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        for opening in openings:
            messages: list[Any] = [{"role": "user", "content": opening}]
            await client.chat.completions.create(model=MODEL, messages=messages)


async def age(store: TrajectoryStore, days: float, *openings: str) -> None:
    """Date the trajectories that open with `openings` `days` back."""
    async with store.engine.begin() as connection:
        for trajectory in await store.trajectories(limit=1000):
            calls = await store.calls([trajectory.id])
            if calls[trajectory.id][0].request["messages"][0]["content"] in openings:
                then = utcnow() - timedelta(days=days)
                await connection.execute(
                    sa.update(schema.trajectories)
                    .where(schema.trajectories.c.id == trajectory.id)
                    .values(created_at=then, updated_at=then)
                )


def housekeeping(*args: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "housekeeping", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def test_housekeeping_deletes_what_is_older_than_the_retention_in_batches(
    store_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    async with running_proxy(
        proxy_settings(store_url, vllm.base_url, journal=str(journal))
    ) as proxy:
        old = [f"OLD-{n} task" for n in range(5)]
        await record(proxy, *old, "NEW task")
        await proxy.parts.settled()
        await age(proxy.parts.store, 40, *old)
        # One batch of two: the batches go oldest first, each its own transaction.
        first = await proxy.parts.store.expire(utcnow() - timedelta(days=30), limit=2)
    journal.mkdir(exist_ok=True)  # a stopped proxy leaves none behind
    for at, marker in ((time.time() - 40 * 86400, "OLD-aside"), (time.time(), "NEW-aside")):
        payload = orjson.dumps({"at": at, "rows": [[int(RowKind.trajectory), {"id": marker}]]})
        rejected.set_aside(journal, payload)
    result = await asyncio.to_thread(
        housekeeping, "--store", store_url, "--journal", str(journal), "--retain-days", "30"
    )
    after = await TrajectoryStore.open(store_url, writer=False)
    try:
        text = await store_text(after)
        left = await after.trajectories()
    finally:
        await after.aclose()
    aside = b"".join(record.payload for record in rejected.read(journal))

    assert len(first.trajectory_ids) == 2 and first.deleted["calls"] == 2
    assert result.returncode == 0, result.stderr
    assert "deleted 3 trajectories, 3 calls" in result.stderr
    assert "1 set aside records" in result.stderr
    assert "OLD-" not in text and "NEW task" in text
    assert len(left) == 1
    assert b"OLD-aside" not in aside and b"NEW-aside" in aside


async def test_a_proxy_with_retain_days_deletes_what_aged_past_it(
    sqlite_url: str, vllm: FakeVllm
) -> None:
    async with running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy:
        await record(proxy, "OLD task", "NEW task")
        await proxy.parts.settled()
        await age(proxy.parts.store, 8, "OLD task")
    settings = proxy_settings(sqlite_url, vllm.base_url, retain_days=7)
    async with running_proxy(settings) as proxy:
        deadline = time.monotonic() + 10
        while len(await trajectories(proxy)) != 1:
            assert time.monotonic() < deadline, "the old trajectory was never deleted"
            await asyncio.sleep(0.05)
        [kept] = await trajectories(proxy)

    assert kept.calls is not None
    assert kept.calls[0].request["messages"][0]["content"] == "NEW task"


async def test_statistics_are_refreshed_after_many_deletions_where_the_store_keeps_them(
    store: TrajectoryStore,
) -> None:
    await store.refresh_statistics()  # ANALYZE on PostgreSQL; SQLite keeps none on purpose


async def test_quarantined_journal_bytes_age_out_with_the_retention(
    store: TrajectoryStore, tmp_path: Path
) -> None:
    folder = tmp_path / "quarantine"
    folder.mkdir()
    old, recent = folder / "0-segment-1-4096.bytes", folder / "0-segment-2-0.bytes"
    old.write_bytes(b"a user's words, cut short")
    recent.write_bytes(b"yesterday's")
    two_days_ago = time.time() - 2 * 86400
    os.utime(old, (two_days_ago, two_days_ago))

    totals = await expire(store, 1.0, tmp_path)

    assert totals["quarantined_files"] == 1
    assert not old.exists() and recent.exists()
