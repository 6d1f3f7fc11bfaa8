"""The journal's promises all at once: 8 clients holding multi-turn conversations through a proxy
process while its PostgreSQL store goes away, its journal's disk fills, and the proxy is killed
with SIGKILL in the middle of a second outage and started again. Afterwards `art-proxy export`
has every call a client saw answered, none twice, and every trajectory's seqs run 0..n-1.

`make test` runs 45 s of it; its long form is `benchmarks/soak.py` (10 minutes by default), the
figure in docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy.testing.fault_tcp import FaultyTcp
from tests.proxy_load import MODEL, run_cli
from tests.test_durability import fill, kill, relay, serve_process, small_disk, through

pytestmark = pytest.mark.postgres
__all__ = ["relay"]  # the fault relay fixture, shared with the durability tests

CLIENTS = 8
TURNS = 3  # calls a conversation
SOAK_S = 45.0


@dataclass
class Load:
    """What the clients saw: each answered call's response id, and the calls refused."""

    answered: list[str] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    base: str = ""
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def conversation(http: aiohttp.ClientSession, load: Load, client: int, number: int) -> None:
    """One conversation of `TURNS` calls: even clients' calls stitched by their messages as an
    unmodified agent's are, odd clients' named by an explicit trajectory id (LangGraph's
    callback). A call that is not answered ends the conversation."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"soak {client}-{number}"}]
    headers = {"X-Art-Trajectory": f"soak-{client}-{number}"} if client % 2 else {}
    for turn in range(TURNS):
        body = {"model": MODEL, "messages": messages, "max_tokens": 8}
        try:
            async with http.post(f"{load.base}/chat/completions", json=body, headers=headers) as r:
                if r.status != 200:
                    load.refused[str(r.status)] += 1
                    return
                reply = await r.json()
        except (TimeoutError, aiohttp.ClientError) as exc:
            load.refused[type(exc).__name__] += 1
            await asyncio.sleep(0.2)  # the proxy is being restarted
            return
        load.answered.append(reply["id"])
        messages += [reply["choices"][0]["message"], {"role": "user", "content": f"and {turn}"}]


async def clients(load: Load) -> None:
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def client(number: int) -> None:
            conversations = 0
            while not load.stop.is_set():
                await conversation(http, load, number, conversations)
                conversations += 1

        await asyncio.gather(*(client(number) for number in range(CLIENTS)))


async def health(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/health") as response:
        return dict(await response.json())


@dataclass
class Soaked:
    """What a soak ended with: what the clients saw against what `art-proxy export` holds."""

    seconds: float
    answered: list[str]
    refused: dict[str, int]
    trajectories: int
    phases: list[tuple[str, float]]
    backlog_during_outage: int  # journal frames waiting while the store was cut off
    lost_records: int  # the proxy's /health at the end
    missing: set[str]  # answered, not exported
    twice: list[str]  # exported more than once
    bad_seqs: list[tuple[str, list[int]]]  # trajectories whose seqs do not run 0..n-1

    def summary(self) -> str:
        return (
            f"{self.seconds:.0f} s, {len(self.answered)} calls answered, refused "
            f"{self.refused}, {self.trajectories} trajectories exported; phases {self.phases}; "
            f"backlog during the outage {self.backlog_during_outage}; lost_records at the end "
            f"{self.lost_records}"
        )


async def soak(
    seconds: float, postgres_url: str, relay: FaultyTcp, upstream: str, workdir: Path
) -> Soaked:
    """`CLIENTS` clients for `seconds` through a proxy process on `postgres_url` (reached through
    `relay`) in front of `upstream`, with the module's faults at fixed fractions of the time."""
    store = through(relay, postgres_url)
    load = Load()
    started = time.monotonic()

    async def at(fraction: float) -> None:
        await asyncio.sleep(max(0.0, started + fraction * seconds - time.monotonic()))

    phases: list[tuple[str, float]] = []

    def mark(what: str) -> None:
        phases.append((what, round(time.monotonic() - started, 1)))

    with small_disk(workdir / "disk", "size=512m,nr_inodes=4096") as disk:
        journal = disk / "journal"
        # A record that can be neither journaled nor stored is refused (503), never answered
        # and lost: what the soak counts is what clients saw answered.
        extra = ("--on-store-error", "fail")
        async with contextlib.AsyncExitStack() as stack:
            process, port = await stack.enter_async_context(
                serve_process(store, upstream, journal, *extra)
            )
            load.base = f"http://127.0.0.1:{port}/v1"
            running = asyncio.create_task(clients(load))

            await at(0.15)
            mark("store outage")
            await relay.refuse()
            await at(0.30)
            during_outage = await health(f"http://127.0.0.1:{port}")
            mark("store back")
            await relay.restore()

            await at(0.40)
            mark("journal disk full")
            taken = await asyncio.to_thread(fill, disk)
            await at(0.55)
            mark("journal disk freed")
            for path in taken:
                path.unlink()

            await at(0.65)
            mark("store outage, then SIGKILL")
            await relay.refuse()
            await at(0.72)
            await kill(process)
            mark("proxy restarted")
            process, port = await stack.enter_async_context(
                serve_process(store, upstream, journal, *extra)
            )
            load.base = f"http://127.0.0.1:{port}/v1"
            await at(0.80)
            mark("store back")
            await relay.restore()

            await at(1.0)
            load.stop.set()
            await asyncio.wait_for(running, timeout=120)
            final = await health(f"http://127.0.0.1:{port}")
            process.terminate()  # a graceful stop ingests what is journaled first
            await asyncio.wait_for(process.wait(), timeout=120)

    code, out, err = await run_cli("export", "--store", postgres_url, timeout_s=600)
    assert code == 0, err
    exported = [orjson.loads(line) for line in out.splitlines()]
    recorded: Counter[str] = Counter()
    bad_seqs = []
    for line in exported:
        calls = line["trajectory"]["calls"]
        recorded.update(call["response"]["id"] for call in calls if call["response"])
        if [call["seq"] for call in calls] != list(range(len(calls))):
            bad_seqs.append((line["trajectory"]["id"], [call["seq"] for call in calls]))
    return Soaked(
        seconds=seconds,
        answered=load.answered,
        refused=dict(load.refused),
        trajectories=len(exported),
        phases=phases,
        backlog_during_outage=during_outage["journal"]["backlog_frames"],
        lost_records=final["lost_records"],
        missing=set(load.answered) - set(recorded),
        twice=[response_id for response_id, n in recorded.items() if n > 1],
        bad_seqs=bad_seqs,
    )


async def test_a_soak_with_an_outage_a_full_journal_disk_and_a_sigkill_loses_nothing(
    postgres_url: str, relay: FaultyTcp, vllm: FakeVllm, tmp_path: Path
) -> None:
    soaked = await soak(SOAK_S, postgres_url, relay, vllm.base_url, tmp_path)
    summary = soaked.summary()
    print(summary)
    assert soaked.backlog_during_outage > 0, summary  # the outage was one
    assert len(soaked.answered) > 50, summary
    assert not soaked.missing, f"{len(soaked.missing)} answered calls missing; {summary}"
    assert not soaked.twice, f"{len(soaked.twice)} calls exported twice; {summary}"
    assert not soaked.bad_seqs, f"seqs not 0..n-1: {soaked.bad_seqs[:5]}; {summary}"
