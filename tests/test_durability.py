"""Durability: a call whose response reached the client reaches the store, exactly once, whatever
happens to the proxy or the store in between.

Real `art-proxy serve` processes killed with SIGKILL mid-load, a real PostgreSQL made unreachable
for 30 s by a TCP relay that cuts and refuses its connections (`art_proxy.testing.fault_tcp`), and
journals cut mid-frame as a killed process leaves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import sqlalchemy as sa

from art_proxy.config import Durability, ProxySettings
from art_proxy.errors import ConfigError, StoreError
from art_proxy.journal import directory as journal_files
from art_proxy.journal import ingester, rejected, segments
from art_proxy.journal.entries import encode
from art_proxy.journal.frames import frame_bytes, scan
from art_proxy.journal.ingester import Ingester
from art_proxy.journal.left_behind import opened_for_reading
from art_proxy.journal.rejected import REJECTED_FILE
from art_proxy.proxy import app
from art_proxy.proxy.server import running_proxy
from art_proxy.store import engine
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.store.writer import Batch
from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy.testing.fault_tcp import FaultyTcp, faulty_tcp
from art_proxy.testing.loopback import free_port
from tests.conftest import POSTGRES_ADMIN_DSN, proxy_settings
from tests.proxy_load import (
    MODEL,
    art_proxy_command,
    assert_each_once,
    load,
    one_call,
    recorded_response_ids,
    run_cli,
    until,
    wait_healthy,
)
from tests.store_rows import call_row
from tests.test_metrics import scrape

CLIENTS = 16
# Completed calls before the kill: enough that several group commits are in flight.
ENOUGH = 200
OUTAGE_S = 30.0


@pytest.fixture
async def relay() -> AsyncIterator[FaultyTcp]:
    async with faulty_tcp("127.0.0.1", 5432) as started:
        yield started


def through(relay: FaultyTcp, postgres_url: str) -> str:
    """The same database, reached through the relay."""
    return postgres_url.replace("127.0.0.1:5432", f"127.0.0.1:{relay.port}")


@contextlib.asynccontextmanager
async def serve_process(
    store: str, upstream: str, journal: Path, *extra: str
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *art_proxy_command(),
        "serve",
        "--upstream",
        upstream,
        "--store",
        store,
        "--journal",
        str(journal),
        "--port",
        str(port),
        *extra,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "ART_PROXY_IDLE_TIMEOUT": "0"},
    )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}/health", process)
        yield process, port
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def kill(process: asyncio.subprocess.Process) -> None:
    process.send_signal(signal.SIGKILL)
    await asyncio.wait_for(process.wait(), timeout=10)


async def ingest_what_is_left(store: str, upstream: str, journal: Path) -> dict[str, object]:
    """Start a proxy on the journal a killed one left; its /health once all of it is ingested."""
    async with running_proxy(proxy_settings(store, upstream, journal=str(journal))) as proxy:
        await asyncio.wait_for(proxy.parts.settled(), timeout=60)
        async with aiohttp.ClientSession() as http:
            return await get_health(http, proxy.root_url)


async def test_every_completed_call_survives_sigkill(
    store_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    completed: list[str] = []
    stop = asyncio.Event()
    async with serve_process(store_url, vllm.base_url, journal) as (process, port):
        load_task = asyncio.create_task(
            load(f"http://127.0.0.1:{port}/v1", completed, stop, clients=CLIENTS)
        )
        await until(lambda: len(completed) >= ENOUGH, 60, f"{ENOUGH} completed calls")
        await kill(process)
        stop.set()
        await asyncio.wait_for(load_task, timeout=30)
    await ingest_what_is_left(store_url, vllm.base_url, journal)
    assert len(completed) >= ENOUGH
    assert_each_once(completed, await recorded_response_ids(store_url))


async def test_export_takes_in_what_a_killed_proxy_left_in_its_journal(
    sqlite_url: str, vllm: FakeVllm
) -> None:
    """Calls answered while the store was locked are in the journal only when the proxy is
    killed; `art-proxy export`, run before any proxy starts again, reads them all the same."""
    database = sqlite_url.removeprefix("sqlite:///")
    journal = Path(database + ".journal")  # where --journal auto puts it, and readers look
    locker = sqlite3.connect(database, isolation_level=None)
    try:
        async with serve_process(sqlite_url, vllm.base_url, journal) as (process, port):
            async with aiohttp.ClientSession() as http:
                answered = [await one_call(http, f"http://127.0.0.1:{port}/v1", 0)]
                await asyncio.sleep(0.5)  # in the store: the lock comes after it
                locker.execute("BEGIN IMMEDIATE")
                base = f"http://127.0.0.1:{port}/v1"
                answered += [await one_call(http, base, index) for index in range(1, 4)]
            await kill(process)
        locker.execute("ROLLBACK")
    finally:
        locker.close()
    status, out, err = await run_cli("export", "--store", sqlite_url)
    assert status == 0, err
    responses = [
        call["response"]["id"]
        for line in out.splitlines()
        for call in json.loads(line)["trajectory"]["calls"]
    ]
    assert sorted(responses) == sorted(answered)
    # (A record already in the store may be counted again: it is filtered by its call id.)
    assert re.search(r"took in \d+ records a stopped proxy left", " ".join(err.split()))


async def get_health(http: aiohttp.ClientSession, root: str) -> dict[str, object]:
    async with http.get(root + "/health") as response:
        assert response.status == 200  # still answering and recording: stays in rotation
        health: dict[str, object] = await response.json()
    return health


@pytest.mark.postgres
async def test_a_store_outage_of_30_s_under_load_loses_no_record(
    postgres_url: str, relay: FaultyTcp, vllm: FakeVllm, tmp_path: Path
) -> None:
    settings = proxy_settings(
        through(relay, postgres_url),
        vllm.base_url,
        journal=str(tmp_path / "journal"),
        idle_timeout=0,
    )
    completed: list[str] = []
    stop = asyncio.Event()
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        load_task = asyncio.create_task(
            load(proxy.base_url, completed, stop, clients=8, pause_s=0.01)
        )
        await until(lambda: len(completed) >= 50, 30, "50 calls before the outage")
        started = time.monotonic()
        await relay.drop()  # the server goes away mid-conversation...
        ingester = proxy.parts.ingester
        assert ingester is not None
        await until(lambda: ingester.state.unavailable_since is not None, 10, "the outage noticed")
        before_refusal = len(completed)
        await asyncio.sleep(OUTAGE_S / 2)
        await relay.refuse()  # ...and then refuses to be reached at all
        await asyncio.sleep(OUTAGE_S / 2)
        during = await get_health(http, proxy.root_url)
        metrics_during = await scrape(http, proxy)
        answered_in_outage = len(completed) - before_refusal
        await relay.restore()
        outage_s = time.monotonic() - started
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(load_task, timeout=30)
        await asyncio.wait_for(proxy.parts.settled(), timeout=120)
        after = await get_health(http, proxy.root_url)
        metrics_after = await scrape(http, proxy)

    assert outage_s >= OUTAGE_S
    assert answered_in_outage > 100, "the proxy stopped answering while the store was down"
    journal = during["journal"]
    assert isinstance(journal, dict)
    assert during["status"] == "store unavailable: journaling"
    assert journal["store"] == "unavailable"
    assert isinstance(journal["backlog_frames"], int) and journal["backlog_frames"] > 100
    assert isinstance(journal["backlog_bytes"], int) and journal["backlog_bytes"] > 0
    assert isinstance(journal["oldest_frame_age_s"], float)
    assert journal["oldest_frame_age_s"] >= OUTAGE_S - 5
    assert after["status"] == "ok" and after["lost_records"] == 0
    assert isinstance(after["journal"], dict) and after["journal"]["backlog_frames"] == 0
    assert_each_once(completed, await recorded_response_ids(postgres_url))
    # What a scraper alerts on: the store gone, the backlog growing, calls still recorded.
    assert metrics_during[("art_proxy_store_available", ())] == 0
    assert metrics_during[("art_proxy_recording", ())] == 1
    assert metrics_during[("art_proxy_journal_backlog_frames", ())] > 100
    assert metrics_during[("art_proxy_store_unavailable_seconds", ())] >= OUTAGE_S - 5
    assert metrics_after[("art_proxy_store_available", ())] == 1
    assert metrics_after[("art_proxy_journal_backlog_frames", ())] == 0
    assert metrics_after[("art_proxy_lost_records_total", ())] == 0


@pytest.mark.postgres
async def test_a_postgres_connection_gone_silent_is_noticed_and_loses_no_record(
    postgres_url: str,
    relay: FaultyTcp,
    vllm: FakeVllm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition: the connection stays open and nothing answers. Each statement is timed by
    the client, so the store is marked unavailable and the records wait in the journal."""
    monkeypatch.setattr(engine, "_POSTGRES_COMMAND_TIMEOUT_S", 1.0)
    settings = proxy_settings(
        through(relay, postgres_url), vllm.base_url, journal=str(tmp_path / "journal")
    )
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        answered = [await one_call(http, proxy.base_url, 0)]
        await proxy.parts.settled()
        ingester = proxy.parts.ingester
        assert ingester is not None
        await relay.stall()
        answered += [await one_call(http, proxy.base_url, index) for index in range(1, 6)]
        await until(lambda: ingester.state.unavailable_since is not None, 15, "the silence noticed")
        during = await get_health(http, proxy.root_url)
        await relay.restore()
        await asyncio.wait_for(proxy.parts.settled(), timeout=60)
        after = await get_health(http, proxy.root_url)
    assert during["status"] == "store unavailable: journaling"
    assert after["status"] == "ok" and after["lost_records"] == 0
    assert_each_once(answered, await recorded_response_ids(postgres_url))


@pytest.mark.postgres
async def test_during_a_store_outage_calls_naming_a_new_trajectory_or_group_are_answered(
    postgres_url: str, relay: FaultyTcp, vllm: FakeVllm, tmp_path: Path
) -> None:
    """A trajectory or group id memory does not know was looked up in the store, and a store
    that could not answer failed the call with 500: during an outage, every first call of a
    LangGraph run (its callback names a new trajectory) was refused. Found by the soak."""
    settings = proxy_settings(
        through(relay, postgres_url), vllm.base_url, journal=str(tmp_path / "journal")
    )
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        answered = [await one_call(http, proxy.base_url, 0)]
        await proxy.parts.settled()
        await relay.refuse()
        answered += [await turn_of(http, proxy.base_url, f"new-{n}", 0) for n in range(3)]
        answered.append(await turn_of(http, proxy.base_url, "new-0", 1))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "grouped"}]}
        headers = {"X-Art-Group": "a-new-group", "X-Art-Trajectory": "grouped"}
        async with http.post(
            f"{proxy.base_url}/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status == 200
            answered.append(str((await response.json())["id"]))
        await relay.restore()
        await asyncio.wait_for(proxy.parts.settled(), timeout=60)
        after = await get_health(http, proxy.root_url)
    assert after["lost_records"] == 0
    assert isinstance(after["journal"], dict) and after["journal"]["rejected_records"] == 0
    assert_each_once(answered, await recorded_response_ids(postgres_url))
    assert len(await stored_turns(postgres_url, "new-0")) == 2


@pytest.mark.postgres
async def test_postgres_connections_are_kept_alive_and_timed_at_both_ends(
    postgres_url: str,
) -> None:
    """An idle pooled connection to a server gone behind a partition is found dead by TCP
    keepalives (about a minute, not the kernel's two hours), and the server cancels a statement
    the proxy stopped waiting for. (A partition's silence on an idle connection cannot be made
    here: a relay's kernel answers the probes; the options are read back instead.)"""
    store_engine = engine.create_engine(postgres_url)
    try:
        async with store_engine.connect() as connection:
            raw = await connection.get_raw_connection()
            sock = raw.driver_connection._transport.get_extra_info("socket")  # type: ignore[union-attr]
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
            query = "SELECT current_setting('statement_timeout'), current_setting('tcp_keepalives_idle')"
            server = (await connection.execute(sa.text(query))).one()
            assert tuple(server) == ("1min", "30")
    finally:
        await store_engine.dispose()


@pytest.mark.postgres
async def test_sigkill_during_a_store_outage_loses_no_record(
    postgres_url: str, relay: FaultyTcp, vllm: FakeVllm, tmp_path: Path
) -> None:
    journal, store = tmp_path / "journal", through(relay, postgres_url)
    completed: list[str] = []
    stop = asyncio.Event()
    async with serve_process(store, vllm.base_url, journal) as (process, port):
        load_task = asyncio.create_task(
            load(f"http://127.0.0.1:{port}/v1", completed, stop, clients=8)
        )
        await until(lambda: len(completed) >= 50, 30, "50 calls before the outage")
        await relay.refuse()
        outage_began = len(completed)
        await until(lambda: len(completed) >= outage_began + 200, 60, "200 calls in the outage")
        await kill(process)
        stop.set()
        await asyncio.wait_for(load_task, timeout=30)
    await relay.restore()
    health = await ingest_what_is_left(store, vllm.base_url, journal)
    assert isinstance(health["journal"], dict) and health["journal"]["ingested"] >= 200
    assert_each_once(completed, await recorded_response_ids(postgres_url))


@pytest.mark.postgres
async def test_a_proxy_started_while_its_store_is_unreachable_answers_and_records_all_later(
    postgres_url: str, relay: FaultyTcp, vllm: FakeVllm, tmp_path: Path
) -> None:
    """A restart during a database outage: the proxy starts, answers and journals; when the
    store answers (a new database here: its schema first), every call lands, exactly once."""
    await relay.refuse()
    journal = tmp_path / "journal"
    settings = proxy_settings(through(relay, postgres_url), vllm.base_url, journal=str(journal))
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        completed = [await one_call(http, proxy.base_url, index) for index in range(20)]
        during = await get_health(http, proxy.root_url)
        await relay.restore()
        await asyncio.wait_for(proxy.parts.settled(), timeout=60)
        after = await get_health(http, proxy.root_url)

    assert during["status"] == "store unavailable: journaling"
    assert isinstance(during["journal"], dict) and during["journal"]["backlog_frames"] == 20
    assert after["status"] == "ok" and after["lost_records"] == 0
    assert_each_once(completed, await recorded_response_ids(postgres_url))


@pytest.mark.postgres
async def test_a_wrong_store_or_no_journal_still_stops_the_proxy_at_start(
    postgres_url: str, relay: FaultyTcp, vllm: FakeVllm, tmp_path: Path
) -> None:
    """Only an unreachable store is waited for, and only with a journal to keep the records in:
    a wrong database is a mistake to say at once."""
    wrong = postgres_url.rsplit("/", 1)[0] + "/no_such_database"
    settings = proxy_settings(wrong, vllm.base_url, journal=str(tmp_path / "journal"))
    with pytest.raises(StoreError, match="no_such_database"):
        async with running_proxy(settings):
            pass
    await relay.refuse()
    settings = proxy_settings(through(relay, postgres_url), vllm.base_url, journal="off")
    with pytest.raises(StoreError, match="Connect call failed"):
        async with running_proxy(settings):
            pass


@pytest.mark.postgres
async def test_a_journal_at_its_bound_sends_records_to_the_store_and_keeps_the_rest(
    postgres_url: str, relay: FaultyTcp, vllm: FakeVllm, tmp_path: Path
) -> None:
    """`--journal-max-mb`: during an outage the journal takes records up to its bound; past it a
    record goes to the store directly, and with the store down too it is lost (counted) while the
    call is still answered. What the journal kept lands once the store is back."""
    settings = proxy_settings(
        through(relay, postgres_url),
        vllm.base_url,
        journal=str(tmp_path / "journal"),
        journal_max_mb=0.01,  # about four records
    )
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        await relay.refuse()
        completed = [await one_call(http, proxy.base_url, index) for index in range(12)]
        during = await get_health(http, proxy.root_url)
        await relay.restore()
        await asyncio.wait_for(proxy.parts.settled(), timeout=60)

    journal = during["journal"]
    assert isinstance(journal, dict) and isinstance(journal["backlog_bytes"], int)
    assert 0 < journal["backlog_bytes"] <= 0.01 * 2**20
    kept, lost = journal["backlog_frames"], during["lost_records"]
    assert isinstance(kept, int) and isinstance(lost, int) and kept > 0 and lost > 0
    assert kept + lost == len(completed)
    recorded = await recorded_response_ids(postgres_url)
    assert_each_once(completed[:kept], recorded)
    assert sum(recorded.values()) == kept


async def test_a_record_past_the_journal_bound_goes_in_behind_the_backlog_not_ahead_of_it(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is up, the ingester not yet through what the journal holds (it gathers calls a
    while): a record the full journal refuses is written to the store after those, so a call of
    a trajectory whose first call is still journaled is neither refused nor out of order."""
    monkeypatch.setattr(ingester, "_LINGER_S", 5.0)
    settings = proxy_settings(
        sqlite_url, vllm.base_url, journal=str(tmp_path / "journal"), journal_max_mb=0.01
    )
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        # About four fit in the journal.
        answered = [await turn_of(http, proxy.base_url, "bounded", index) for index in range(8)]
        await asyncio.wait_for(proxy.parts.settled(), timeout=30)
        health = await get_health(http, proxy.root_url)
    assert health["lost_records"] == 0
    assert await stored_turns(sqlite_url, "bounded") == answered


async def turn_of(http: aiohttp.ClientSession, base: str, trajectory: str, index: int) -> str:
    """A call of an explicit trajectory (as the LangGraph callback makes them); its response id."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"turn {index}"}]}
    async with http.post(
        f"{base}/chat/completions", json=body, headers={"X-Art-Trajectory": trajectory}
    ) as response:
        assert response.status == 200
        return str((await response.json())["id"])


async def stored_turns(store_url: str, trajectory: str) -> list[str]:
    """The response ids of a trajectory's calls in the store, in seq order."""
    async with TrajectoryStore.opened(store_url, writer=False) as store:
        calls = (await store.calls([trajectory])).get(trajectory, [])
    return [
        call.response["id"] for call in sorted(calls, key=lambda call: call.seq) if call.response
    ]


async def test_a_restarted_proxy_ingests_what_it_adopted_before_it_answers(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first proxy stops with two calls of a trajectory still journaled (its store locked);
    the next one's first call of that trajectory is its third, not a second seq 0."""
    monkeypatch.setattr(engine, "_SQLITE_BUSY_TIMEOUT_MS", 100)
    monkeypatch.setattr(app, "DRAIN_TIMEOUT_S", 0.5)
    monkeypatch.setattr(ingester, "_LINGER_S", 2.0)  # an ingester slow to start on its own
    settings = proxy_settings(
        sqlite_url, vllm.base_url, journal=str(tmp_path / "journal"), drain_timeout=0.5
    )
    locker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        async with running_proxy(settings) as first, aiohttp.ClientSession() as http:
            locker.execute("BEGIN IMMEDIATE")
            answered = [await turn_of(http, first.base_url, "resumed", index) for index in (0, 1)]
        locker.execute("ROLLBACK")
    finally:
        locker.close()
    async with running_proxy(settings) as second, aiohttp.ClientSession() as http:
        answered.append(await turn_of(http, second.base_url, "resumed", 2))
        await asyncio.wait_for(second.parts.settled(), timeout=30)
    assert await stored_turns(sqlite_url, "resumed") == answered


def segment_files(journal: Path) -> list[Path]:
    return sorted(journal.glob("*/*.frames"))


async def journaled_only(
    store: str, upstream: str, journal: Path, monkeypatch: pytest.MonkeyPatch, calls: int
) -> tuple[list[str], Path]:
    """`calls` answered by a proxy whose ingester never runs: their response ids, and the one
    journal segment holding them."""
    settings = proxy_settings(store, upstream, journal=str(journal))
    with monkeypatch.context() as patch:
        patch.setattr(Ingester, "start", lambda self: None)  # journaled, never ingested
        async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
            completed = [await one_call(http, proxy.base_url, index) for index in range(calls)]
    [segment] = segment_files(journal)
    return completed, segment


async def test_a_torn_last_frame_is_skipped_and_counted_and_the_rest_ingested(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy killed mid-append leaves part of a frame: the next one ingests every whole frame
    before it, never the half one, and counts it."""
    journal = tmp_path / "journal"
    completed, segment = await journaled_only(sqlite_url, vllm.base_url, journal, monkeypatch, 3)
    whole = segment.read_bytes()
    segment.write_bytes(whole + whole[:40])  # the head of a fourth frame, as a kill leaves it
    health = await ingest_what_is_left(sqlite_url, vllm.base_url, journal)
    assert isinstance(health["journal"], dict)
    assert health["journal"]["torn_frames"] == 1
    assert health["journal"]["ingested"] == 3
    assert_each_once(completed, await recorded_response_ids(sqlite_url))
    assert segment_files(journal) == []  # ingested and trimmed


async def test_a_damaged_frame_in_the_middle_loses_that_record_only_and_is_quarantined(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flipped bit in the middle of a segment: the frames after it are ingested (the old
    format dropped the rest of the segment, up to 16 MiB of answered calls), the damaged bytes
    are copied aside, and /health counts the one record they held."""
    journal = tmp_path / "journal"
    completed, segment = await journaled_only(sqlite_url, vllm.base_url, journal, monkeypatch, 6)
    data = bytearray(segment.read_bytes())
    frames = scan(bytes(data)).frames
    data[frames[2].start + 40] ^= 0x10  # a bit in the third record
    segment.write_bytes(bytes(data))
    health = await ingest_what_is_left(sqlite_url, vllm.base_url, journal)
    assert isinstance(health["journal"], dict)
    assert health["journal"]["damaged_spans"] == 1
    assert health["journal"]["damaged_records"] == 1
    assert health["journal"]["ingested"] == 5
    recorded = await recorded_response_ids(sqlite_url)
    assert_each_once(completed[:2] + completed[3:], recorded)
    assert completed[2] not in recorded
    [kept] = (journal / "quarantine").iterdir()
    assert kept.read_bytes() == bytes(data[frames[2].start : frames[2].end])


async def test_a_journal_written_before_frames_carried_a_magic_is_ingested(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Upgrading with records journaled (a store outage, then a restart on the new release)."""
    journal = tmp_path / "journal"
    completed, segment = await journaled_only(sqlite_url, vllm.base_url, journal, monkeypatch, 3)
    payloads = [frame.payload for frame in scan(segment.read_bytes()).frames]
    segment.write_bytes(b"".join(struct.pack("<II", len(p), zlib.crc32(p)) + p for p in payloads))
    health = await ingest_what_is_left(sqlite_url, vllm.base_url, journal)
    assert isinstance(health["journal"], dict) and health["journal"]["ingested"] == 3
    assert_each_once(completed, await recorded_response_ids(sqlite_url))


async def test_a_journal_replayed_after_its_records_landed_records_them_once(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    """A proxy killed after its records were ingested but before the journal was trimmed."""
    journal, kept = tmp_path / "journal", tmp_path / "kept"
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(journal))
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        completed = [await one_call(http, proxy.base_url, index) for index in range(4)]
        await proxy.parts.settled()
        [segment] = segment_files(journal)
        kept.mkdir()
        shutil.copy(segment, kept / segment.name)
        slot = segment.parent
    shutil.copytree(kept, slot, dirs_exist_ok=True)  # as if the proxy had died before trimming
    health = await ingest_what_is_left(sqlite_url, vllm.base_url, journal)
    assert isinstance(health["journal"], dict) and health["journal"]["rejected_records"] == 0
    assert_each_once(completed, await recorded_response_ids(sqlite_url))


async def test_durability_power_makes_each_sqlite_commit_sync_its_wal(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    """Under `power` the journal lets go of a record once the store committed it: the commit
    must be on disk then, which SQLite's WAL is only with synchronous=FULL (2), not NORMAL (1)."""
    seen: dict[str, object] = {}
    for durability in ("process", "power"):
        journal = str(tmp_path / durability)
        settings = proxy_settings(sqlite_url, vllm.base_url, journal=journal, durability=durability)
        async with running_proxy(settings) as proxy:

            def synchronous(connection: sa.Connection, durability: str = durability) -> None:
                seen[durability] = connection.exec_driver_sql("PRAGMA synchronous").scalar()

            # The writer's own connection, the one that commits what the journal lets go of.
            await proxy.parts.store.writer._runner.run(synchronous)
    assert seen == {"process": 1, "power": 2}


def test_durability_power_syncs_the_directories_a_journal_creates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file's name is on disk once its directory is synced: the journal's directory (in its
    parent), its store file and slot (in it), the slot's lock and first segment (in the slot)."""
    synced: list[Path] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    directory = tmp_path / "state" / "journal"
    journal = segments.Journal.open(directory, "sqlite:///a.db", Durability.power)
    try:
        assert {directory.parent, directory, journal.slot} <= set(synced)
    finally:
        journal.close()


async def test_durability_power_syncs_the_journal_before_answering(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def counting_fdatasync(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    settings = proxy_settings(
        sqlite_url, vllm.base_url, journal=str(tmp_path / "journal"), durability="power"
    )
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        await one_call(http, proxy.base_url, 0)
        assert len(synced) == 1  # before the answer
        await asyncio.gather(*(one_call(http, proxy.base_url, n) for n in range(1, 17)))
        assert len(synced) <= 17  # group commit: never more than one a call
        health = await get_health(http, proxy.root_url)
    assert isinstance(health["journal"], dict) and health["journal"]["durability"] == "power"
    assert len(await recorded_response_ids(sqlite_url)) == 17


async def test_after_a_failed_fdatasync_the_call_waits_for_the_store_and_the_segment_is_left(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An fdatasync that fails (an I/O error: no disk here fails on cue, so the call is made to)
    leaves the frame's durability unknown: the call is answered once the store (synchronous=FULL)
    holds it, and no later frame goes to that file, whose dropped pages a later sync would not
    cover (PostgreSQL's fsync lesson)."""
    journal = tmp_path / "journal"
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(journal), durability="power")
    real_fdatasync = os.fdatasync
    failures = [OSError(errno.EIO, os.strerror(errno.EIO))]

    def failing_once(fd: int) -> None:
        if failures:
            raise failures.pop()
        real_fdatasync(fd)

    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        answered = [await one_call(http, proxy.base_url, 0)]
        before = segment_files(journal)
        monkeypatch.setattr(os, "fdatasync", failing_once)
        answered.append(await one_call(http, proxy.base_url, 1))
        answered.append(await one_call(http, proxy.base_url, 2))
        after = segment_files(journal)
        await asyncio.wait_for(proxy.parts.settled(), timeout=30)
        health = await get_health(http, proxy.root_url)
    assert failures == [] and health["lost_records"] == 0
    assert after and after[-1] not in before  # call 2 went to a new segment
    assert_each_once(answered, await recorded_response_ids(sqlite_url))


async def test_a_full_journal_disk_falls_back_to_committing_in_the_store(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(tmp_path / "journal"))
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        first = await one_call(http, proxy.base_url, 0)
        with monkeypatch.context() as patch:

            def full(fd: int, buffers: object) -> int:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            patch.setattr(os, "writev", full)
            second = await one_call(http, proxy.base_url, 1)
        third = await one_call(http, proxy.base_url, 2)
        await proxy.parts.settled()
        health = await get_health(http, proxy.root_url)
    assert health["lost_records"] == 0
    assert_each_once([first, second, third], await recorded_response_ids(sqlite_url))


@contextlib.contextmanager
def small_disk(path: Path, options: str) -> Iterator[Path]:
    """A tmpfs of its own at `path` (a disk that really fills); skips where mounting is not
    allowed (not root)."""
    path.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"a small disk needs a tmpfs mount: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path) -> list[Path]:
    """Take every inode and every byte `disk` has left; the files that hold them."""
    taken: list[Path] = []
    with contextlib.suppress(OSError):
        while True:
            taken.append(disk / f"inode-{len(taken)}")
            taken[-1].touch()
    taken.pop()
    fd = os.open(taken[0], os.O_WRONLY)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, bytes(65536))
    finally:
        os.close(fd)
    return taken


@pytest.mark.parametrize("durability", ["process", "power"])
async def test_a_journal_whose_disk_fills_at_a_rotation_journals_again_once_there_is_room(
    sqlite_url: str,
    vllm: FakeVllm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    durability: str,
) -> None:
    """The next segment cannot even be created (no inode, no byte): calls go to the store
    directly meanwhile, and once room is made the journal takes them again."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 4096)  # a rotation every call or two
    with small_disk(tmp_path / "disk", "size=256k,nr_inodes=64") as disk:
        settings = proxy_settings(
            sqlite_url, vllm.base_url, journal=str(disk / "journal"), durability=durability
        )
        async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
            answered = [await one_call(http, proxy.base_url, 0)]
            taken = fill(disk)
            answered += [await one_call(http, proxy.base_url, index) for index in range(1, 9)]
            await asyncio.wait_for(proxy.parts.settled(), timeout=30)
            full = await get_health(http, proxy.root_url)
            for path in taken:
                path.unlink()
            answered += [await one_call(http, proxy.base_url, index) for index in range(9, 13)]
            await asyncio.wait_for(proxy.parts.settled(), timeout=30)
            after = await get_health(http, proxy.root_url)
    assert isinstance(full["journal"], dict) and isinstance(after["journal"], dict)
    assert full["journal"]["ingested"] == 1  # the calls on a full disk went to the store
    assert after["journal"]["ingested"] == 1 + 4  # journaled again
    assert after["lost_records"] == 0
    assert_each_once(answered, await recorded_response_ids(sqlite_url))


async def test_the_default_journal_sits_beside_a_sqlite_store_and_goes_when_empty(
    tmp_path: Path, vllm: FakeVllm
) -> None:
    settings = proxy_settings(f"sqlite:///{tmp_path / 'art.db'}", vllm.base_url)
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        await one_call(http, proxy.base_url, 0)
        assert proxy.parts.journal is not None
        assert proxy.parts.journal.slot.parent == tmp_path / "art.db.journal"
    assert not (tmp_path / "art.db.journal").exists()


def test_a_journal_of_another_store_is_refused(tmp_path: Path) -> None:
    journal = segments.Journal.open(tmp_path, "sqlite:///a.db", Durability.process)
    try:
        with pytest.raises(ConfigError, match=r"holds records of store sqlite:///\S*/a\.db, not"):
            segments.Journal.open(tmp_path, "sqlite:///b.db", Durability.process)
    finally:
        journal.close()


def test_one_sqlite_url_from_two_working_directories_names_two_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sqlite:///art.db` is a file of the working directory: a journal shared by proxies
    started in two directories would otherwise ingest one's records into the other's store."""
    shared = tmp_path / "journal"
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path / "first")
    journal = segments.Journal.open(shared, "sqlite:///art.db", Durability.process)
    try:
        monkeypatch.chdir(tmp_path / "second")
        owner = re.escape(f"sqlite:///{tmp_path}/first/art.db")
        with pytest.raises(ConfigError, match=f"holds records of store {owner}, not"):
            segments.Journal.open(shared, "sqlite:///art.db", Durability.process)
        again = segments.Journal.open(
            shared, f"sqlite:///{tmp_path}/first/art.db", Durability.process
        )
        again.close()
    finally:
        journal.close()
    # A journal named its SQLite store by the URL's text before: read from where it was written.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "store").write_text("sqlite:///art.db\n")
    segments.Journal.open(legacy, "sqlite:///art.db", Durability.process).close()


async def test_a_record_the_store_refuses_is_set_aside_and_the_next_ones_land(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store answers, but not for this record (here: the call is for a trajectory the store
    was told to refuse): it is kept in `rejected-records` and counted, never blocking the rest;
    the set-aside file's fsyncs run off the event loop."""
    journal = tmp_path / "journal"
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(journal))
    database = sqlite_url.removeprefix("sqlite:///")
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        on_loop = syncs_on_the_loop(monkeypatch)
        first = await one_call(http, proxy.base_url, 0)
        await proxy.parts.settled()
        with contextlib.closing(sqlite3.connect(database)) as connection, connection:
            connection.execute(
                "CREATE TRIGGER refuse BEFORE INSERT ON calls WHEN NEW.seq = 0 "
                "AND NEW.request LIKE '%durable 1\"%' BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
        refused = await one_call(http, proxy.base_url, 1)
        after = await one_call(http, proxy.base_url, 2)
        await proxy.parts.settled()
        health = await get_health(http, proxy.root_url)
        assert on_loop == []
    assert isinstance(health["journal"], dict) and health["journal"]["rejected_records"] == 1
    recorded = await recorded_response_ids(sqlite_url)
    assert_each_once([first, after], recorded)
    assert refused not in recorded
    kept = scan((journal / REJECTED_FILE).read_bytes())
    assert len(kept.frames) == 1 and not kept.torn
    assert b"durable 1" in kept.frames[0].payload


async def assert_every_record_kept_through(
    store_url: str, settings: ProxySettings, hold: Callable[[], AsyncIterator[None]]
) -> None:
    """Five calls answered while `hold` keeps the store from writing: none is set aside, each is
    in the store once it writes again."""
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        answered = [await one_call(http, proxy.base_url, 0)]
        await proxy.parts.settled()
        ingester = proxy.parts.ingester
        assert ingester is not None
        async with contextlib.asynccontextmanager(hold)():
            answered += [await one_call(http, proxy.base_url, index) for index in range(1, 6)]
            await until(lambda: ingester.state.unavailable_since is not None, 20, "the outage")
            await asyncio.sleep(0.5)  # retries go on: none of them sets a record aside
            during = await get_health(http, proxy.root_url)
        await asyncio.wait_for(proxy.parts.settled(), timeout=30)
        after = await get_health(http, proxy.root_url)
    journal = during["journal"]
    assert isinstance(journal, dict)
    assert journal["store"] == "unavailable" and journal["rejected_records"] == 0
    assert journal["backlog_frames"] == 5
    assert after["status"] == "ok" and after["lost_records"] == 0
    assert isinstance(after["journal"], dict) and after["journal"]["rejected_records"] == 0
    assert_each_once(answered, await recorded_response_ids(store_url))


async def test_a_sqlite_store_locked_by_another_writer_keeps_every_record_until_it_writes(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another connection holds the write lock past the busy timeout: the store answers reads
    all the while, but it cannot write, which is an outage, not a refusal of these records."""
    monkeypatch.setattr(engine, "_SQLITE_BUSY_TIMEOUT_MS", 100)
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(tmp_path / "journal"))

    async def write_lock_held() -> AsyncIterator[None]:
        locker = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            locker.execute("BEGIN IMMEDIATE")
            yield
            locker.execute("ROLLBACK")
        finally:
            locker.close()

    await assert_every_record_kept_through(sqlite_url, settings, write_lock_held)


@pytest.mark.postgres
async def test_a_postgres_store_switched_read_only_keeps_every_record_until_it_writes(
    postgres_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    """The database goes read-only (as a hot standby or a full-disk guard makes it): every
    INSERT fails with SQLSTATE 25006 while every SELECT succeeds."""
    database = postgres_url.rsplit("/", 1)[1]
    settings = proxy_settings(postgres_url, vllm.base_url, journal=str(tmp_path / "journal"))

    async def read_only(on: bool) -> None:
        admin = await asyncpg.connect(POSTGRES_ADMIN_DSN, timeout=3)
        try:
            await admin.execute(
                f'ALTER DATABASE "{database}" SET default_transaction_read_only = {on}'
            )
            await admin.execute(  # sessions take the setting when they start
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1",
                database,
            )
        finally:
            await admin.close()

    async def read_only_meanwhile() -> AsyncIterator[None]:
        await read_only(True)
        yield
        await read_only(False)

    await assert_every_record_kept_through(postgres_url, settings, read_only_meanwhile)


async def test_records_set_aside_are_counted_again_after_a_restart(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    payloads = [b"one", b"two"]
    (journal / REJECTED_FILE).write_bytes(b"".join(frame_bytes(p, 0) for p in payloads))
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(journal))
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        health = await get_health(http, proxy.root_url)
    assert isinstance(health["journal"], dict) and health["journal"]["rejected_records"] == 2


def refuse_calls_saying_refuse_me(database: str) -> None:
    """The store refuses (a constraint: SQLite's RAISE(ABORT)) every call that says "refuse me"."""
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON calls WHEN NEW.request LIKE '%refuse me%' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )


async def test_records_set_aside_are_listed_replayed_once_the_cause_is_fixed_and_dropped(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    journal = tmp_path / "journal"
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(journal))
    database = sqlite_url.removeprefix("sqlite:///")
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        refuse_calls_saying_refuse_me(database)
        refused = []
        for index in range(3):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"refuse me {index}"}]}
            async with http.post(f"{proxy.base_url}/chat/completions", json=body) as response:
                refused.append(str((await response.json())["id"]))
        await proxy.parts.settled()
    where = ("--store", sqlite_url, "--journal", str(journal))
    status, out, err = await run_cli("journal", "rejected", *where)
    assert status == 0 and "3 set aside in" in " ".join(err.split()) and out.count("\n") > 3
    status, _, err = await run_cli("journal", "replay", *where)  # the trigger still refuses
    assert status == 0 and "0 records put in the store, 3 still refused" in err
    assert "IntegrityError: refused" in err
    with contextlib.closing(sqlite3.connect(database)) as connection, connection:
        connection.execute("DROP TRIGGER refuse")
    status, _, err = await run_cli("journal", "replay", *where)
    assert status == 0 and "3 records put in the store, 0 still refused" in err
    assert_each_once(refused, await recorded_response_ids(sqlite_url))
    assert not (journal / REJECTED_FILE).exists()
    status, _, err = await run_cli("journal", "drop", *where)
    assert status == 0 and "0 records would be dropped" in err


async def test_the_ingester_gathers_calls_into_one_transaction_until_a_reader_waits(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames wait `_LINGER_S` for more to share their transaction, after an idle wait and after
    a transaction alike; a read of the store on a client's behalf ends the wait at once."""
    monkeypatch.setattr(ingester, "_LINGER_S", 3600.0)
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(tmp_path / "journal"))
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        first = [await one_call(http, proxy.base_url, n) for n in range(4)]
        assert not await recorded_response_ids(sqlite_url)  # gathered, not yet in the store
        async with http.get(f"{proxy.root_url}/art/v1/trajectories") as response:
            assert response.status == 200
            listed = (await response.json())["data"]
            assert len(listed) == 4  # its wait for the records ended the gathering
        second = [await one_call(http, proxy.base_url, n) for n in range(4, 8)]
        assert_each_once(first, await recorded_response_ids(sqlite_url))
        assert len(await recorded_response_ids(sqlite_url)) == 4
        await asyncio.wait_for(proxy.parts.settled(), 30)
    assert_each_once(first + second, await recorded_response_ids(sqlite_url))


async def test_segments_rotate_and_are_trimmed_once_ingested(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 8192)  # a few records a segment
    journal = tmp_path / "journal"
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(journal))
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        completed = await asyncio.gather(*(one_call(http, proxy.base_url, n) for n in range(40)))
        await proxy.parts.settled()
        assert len(segment_files(journal)) == 1  # only the live one is left
        assert proxy.parts.journal is not None and proxy.parts.journal.backlog_bytes == 0
    assert_each_once(list(completed), await recorded_response_ids(sqlite_url))


def syncs_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The `fsync`s and `fdatasync`s called from this thread (the event loop's) from now on."""
    loop_thread = threading.get_ident()
    on_loop: list[str] = []
    for name in ("fdatasync", "fsync"):
        real = getattr(os, name)

        def watched(fd: int, real: Callable[[int], None] = real, name: str = name) -> None:
            if threading.get_ident() == loop_thread:
                on_loop.append(name)
            real(fd)

        monkeypatch.setattr(os, name, watched)
    return on_loop


async def test_under_power_no_sync_of_the_journal_runs_on_the_event_loop(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rotation's fdatasync of the old segment and the fsync of the directory a new segment
    was created in ran on the event loop, stalling every call in flight for a disk's flush."""
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 8192)  # a rotation every few records
    on_loop = syncs_on_the_loop(monkeypatch)
    journal = tmp_path / "journal"
    settings = proxy_settings(
        sqlite_url, vllm.base_url, journal=str(journal), durability=Durability.power
    )
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        on_loop.clear()  # opening the journal syncs its new directories: before any call
        completed = await asyncio.gather(*(one_call(http, proxy.base_url, n) for n in range(40)))
        await proxy.parts.settled()
        rotations = proxy.parts.journal is not None and proxy.parts.journal._next_number
        assert on_loop == []
    assert rotations and rotations > 3
    assert_each_once(list(completed), await recorded_response_ids(sqlite_url))


async def test_a_record_larger_than_a_read_is_journaled_and_ingested_whole(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    """The ingester reads 4 MiB at a time; a bigger frame is read on its own. (The fake refuses
    a prompt this long, as vLLM would: the call is recorded as an upstream error, body and all.)"""
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(tmp_path / "journal"))
    content = "many words " * 500_000  # 5.5 MB
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        async with http.post(f"{proxy.base_url}/chat/completions", json=body) as response:
            assert response.status == 400
        await proxy.parts.settled()
        [trajectory] = await proxy.parts.store.trajectories()
        whole = await proxy.parts.store.trajectory(trajectory.id)
    assert whole is not None and whole.calls is not None
    [call] = whole.calls
    assert call.status == "upstream_error"
    assert call.request["messages"][0]["content"] == content


async def test_a_refused_first_call_still_creates_its_trajectory_for_the_calls_after_it(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(tmp_path / "journal"))
    database = sqlite_url.removeprefix("sqlite:///")
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        refuse_calls_saying_refuse_me(database)
        headers = {"X-Art-Trajectory": "t-refused"}
        for content in ("refuse me", "take me"):
            body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
            async with http.post(
                f"{proxy.base_url}/chat/completions", json=body, headers=headers
            ) as response:
                assert response.status == 200
        await proxy.parts.settled()
        whole = await proxy.parts.store.trajectory("t-refused")
        health = await get_health(http, proxy.root_url)
    assert isinstance(health["journal"], dict) and health["journal"]["rejected_records"] == 1
    assert whole is not None and whole.calls is not None
    assert [call.seq for call in whole.calls] == [1]
    assert whole.call_count == 1


@pytest.mark.parametrize("written", ["", "\x00\x00\x00", "not a url"])
def test_a_store_file_a_crash_left_unreadable_is_a_clear_error(
    tmp_path: Path, written: str
) -> None:
    """The store file was written without a sync: a power loss could leave it empty, and every
    start (and every reader) then failed in sqlalchemy's ArgumentError."""
    (tmp_path / "store").write_text(written)
    with pytest.raises(ConfigError, match=r"store file \S+/store is unreadable .* write that line"):
        segments.Journal.open(tmp_path, "sqlite:///a.db", Durability.process)


def test_the_store_file_is_written_whole_and_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    journal = segments.Journal.open(tmp_path, "sqlite:///a.db", Durability.process)
    try:
        assert (tmp_path / "store").read_text().startswith("sqlite:///")
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []
    finally:
        journal.close()
    # The file's bytes before its name, then the name in its directory.
    assert any(path.endswith(".partial") for path in synced) and str(tmp_path) in synced


def encode_entry(text: str) -> bytes:
    """A journal entry holding one call that says `text`."""
    return encode(Batch([call_row("t", datetime.now(UTC), request={"said": text})]))


def test_a_record_the_full_disk_cut_short_hides_no_later_one_and_replay_keeps_what_it_cannot_read(
    tmp_path: Path,
) -> None:
    """On a real full disk the append of a set-aside record fails half written; the next one,
    once there is room, landed after the torn bytes, where readers (and `journal replay`, which
    then rewrote the file with what it read) never saw it."""
    first, big, third = encode_entry("first"), encode_entry("big" * 30000), encode_entry("third")
    with small_disk(tmp_path / "disk", "size=256k,nr_inodes=64") as disk:
        directory = disk / "journal"
        directory.mkdir()
        rejected.set_aside(directory, first)
        taken = fill(disk)
        os.truncate(taken[0], max(0, os.path.getsize(taken[0]) - 16384))  # a little room
        with pytest.raises(OSError):
            rejected.set_aside(directory, big)
        for path in taken:
            path.unlink()
        rejected.set_aside(directory, third)
        assert [r.payload for r in rejected.read(directory)] == [first, third]
        assert rejected.count(directory) == 2
        # Damage no reader can read stays through a rewrite (replay's, erasure's, retention's).
        with (directory / REJECTED_FILE).open("ab") as file:
            file.write(b"ARTJ" + bytes(40))
        assert rejected.drop_older(directory, before=0.0) == 0
        assert (directory / REJECTED_FILE).read_bytes().endswith(b"ARTJ" + bytes(40))
        assert rejected.drop(directory) == 2 and not (directory / REJECTED_FILE).exists()


async def test_forget_takes_in_the_journal_it_is_given_so_erasure_holds(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path
) -> None:
    """A killed proxy's journal under `--journal DIR` held alice's call: `forget --journal DIR`
    erased the store without it, and the next proxy started on DIR put her trajectory back."""
    database = sqlite_url.removeprefix("sqlite:///")
    journal = tmp_path / "elsewhere"
    locker = sqlite3.connect(database, isolation_level=None)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "alice's secret"}]}
    try:
        async with serve_process(sqlite_url, vllm.base_url, journal) as (process, port):
            async with aiohttp.ClientSession() as http:
                base = f"http://127.0.0.1:{port}/v1"
                await one_call(http, base, 0)
                await asyncio.sleep(0.5)  # in the store: the lock comes after it
                locker.execute("BEGIN IMMEDIATE")
                async with http.post(
                    f"{base}/chat/completions", json=body, headers={"X-Art-User": "alice"}
                ) as answered:
                    assert answered.status == 200
            await kill(process)
        locker.execute("ROLLBACK")
    finally:
        locker.close()
    status, _, err = await run_cli(
        "forget", "--store", sqlite_url, "--journal", str(journal), "--user", "alice", "--yes"
    )
    assert status == 0, err
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=str(journal))
    async with running_proxy(settings) as proxy:
        await proxy.parts.settled()
        back = await proxy.parts.store.trajectories(user="alice")
    assert back == []
    assert "deleted 1 trajectories" in " ".join(err.split())


def _counted_directory_syncs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The directories the journal fsyncs from now on, in order (each still synced)."""
    synced: list[Path] = []
    real = journal_files.fsync_directory

    def fsync_directory(path: Path) -> None:
        synced.append(path)
        real(path)

    for module in (segments, journal_files):  # the segments' own syncs, and the slot's
        monkeypatch.setattr(module, "fsync_directory", fsync_directory)
    return synced


async def test_under_power_a_segment_deleted_is_deleted_durably(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unlink of an ingested (or erased) segment survives a power loss only once its
    directory is synced; under `process` no sync is spent on it."""
    synced = _counted_directory_syncs(monkeypatch)
    for durability in (Durability.process, Durability.power):
        synced.clear()
        journal = segments.Journal.open(tmp_path / durability.value, "sqlite:///a.db", durability)
        try:
            position = journal.append(b"a record")
            await journal.synced(position)
            journal.consume(position, 1)  # in the store
            slot = journal.slot
            synced.clear()
            journal.seal()
            assert synced == []  # never on the event loop
            await journal.deletions_synced()  # as erasure does, after it seals
            assert [p.stat().st_size for p in slot.glob("*" + journal_files.SEGMENT_SUFFIX)] == [0]
            assert (slot in synced) is (durability is Durability.power), durability
        finally:
            journal.close()


async def test_a_reader_takes_in_a_stopped_proxys_journal_as_power_durability_keeps_it(
    sqlite_url: str, vllm: FakeVllm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`art-proxy export` (any reader) ingests what a stopped proxy left, then deletes the
    segments: each commit must be on disk first (synchronous=FULL) and the deletions synced,
    else a power loss right after loses answered calls or brings erased ones back."""
    database = sqlite_url.removeprefix("sqlite:///")
    journal = Path(database + ".journal")  # where readers look
    completed, segment = await journaled_only(sqlite_url, vllm.base_url, journal, monkeypatch, 3)
    synchronous: list[int] = []

    def full_sync_pragmas(connection: Any, record: Any) -> None:
        real_full_sync(connection, record)
        cursor = connection.cursor()
        synchronous.append(cursor.execute("PRAGMA synchronous").fetchone()[0])
        cursor.close()

    real_full_sync = engine._sqlite_full_sync_pragmas
    monkeypatch.setattr(engine, "_sqlite_full_sync_pragmas", full_sync_pragmas)
    synced = _counted_directory_syncs(monkeypatch)

    async with opened_for_reading(sqlite_url) as store:
        assert len(await store.trajectories()) == 3
    assert_each_once(completed, await recorded_response_ids(sqlite_url))
    assert synchronous == [2]  # the ingesting connection: FULL
    assert segment.parent in synced and not segment.exists()
