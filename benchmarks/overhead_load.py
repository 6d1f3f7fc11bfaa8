"""`proxy_overhead.py`'s load: the generator and the phases (sequential latency, throughput rounds
taking turns, streaming), each bounded in count and in time."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from benchmarks.overhead_targets import (
    CALL_MAX_TOKENS,
    CALL_TIMEOUT_S,
    CONCURRENCY,
    INGESTED_POLL_S,
    LATENCY_ROUNDS,
    PHASE_DEADLINE_S,
    STREAM_CHUNKS,
    STREAM_CONCURRENCY,
    TARGET_CONCURRENCY,
    THROUGHPUT_ROUNDS,
    WARMUP_REQUESTS,
    WARMUP_STREAMS,
    CallFailed,
    Report,
    Servers,
    TargetResult,
    TargetUnavailable,
    Workload,
    console,
    health_url,
    wait_ready,
)

# ---------------------------------------------------------------- load


class LoadGenerator:
    """Small chat calls to one target; each says something new, so each is a new trajectory."""

    _numbers = itertools.count()  # shared by all targets: no two calls of a run alike

    def __init__(self, session: aiohttp.ClientSession, base_url: str, workload: Workload) -> None:
        self._session = session
        self._url = base_url + "/chat/completions"
        self._model = workload.model
        self._headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {workload.api_key}",
        }

    def _body(self, *, stream: bool, **more: Any) -> bytes:
        content = f"hi {next(self._numbers)}"
        return orjson.dumps(
            {
                "model": self._model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": CALL_MAX_TOKENS,
                "stream": stream,
                **more,
            }
        )

    async def call(self) -> float:
        """One non-stream call; returns its latency in seconds."""
        data = self._body(stream=False)
        start = time.perf_counter()
        async with self._session.post(self._url, data=data, headers=self._headers) as response:
            body = await response.read()
        elapsed = time.perf_counter() - start
        if response.status != 200 or b'"choices"' not in body:
            raise CallFailed(f"HTTP {response.status}: {body[:200]!r}")
        return elapsed

    async def first_byte(self) -> float:
        """One stream call; returns the seconds until the first body byte, then drains it."""
        data = self._body(stream=True)
        start = time.perf_counter()
        async with self._session.post(self._url, data=data, headers=self._headers) as response:
            first = await response.content.readany()
            elapsed = time.perf_counter() - start
            rest = await response.content.read()
        if response.status != 200 or b"[DONE]" not in first + rest:
            raise CallFailed(f"HTTP {response.status}: stream without [DONE]: {rest[-200:]!r}")
        return elapsed

    async def relayed_stream(self) -> int:
        """One long stream with token ids and logprobs on every chunk; returns its chunks."""
        data = self._body(
            stream=True, max_tokens=STREAM_CHUNKS, logprobs=True, return_token_ids=True
        )
        chunks, done = 0, False
        async with self._session.post(self._url, data=data, headers=self._headers) as response:
            async for line in response.content:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data: "):
                    chunks += 1
        if response.status != 200 or not done or chunks < STREAM_CHUNKS:
            raise CallFailed(f"HTTP {response.status}: {chunks} chunks, [DONE] seen: {done}")
        return chunks


_CALL_ERRORS = (CallFailed, aiohttp.ClientError, TimeoutError)


@dataclass
class Phase:
    """Outcomes of one phase: per-call seconds of the successes, and a count of the failures."""

    seconds: list[float] = field(default_factory=list)
    failed: int = 0
    last_error: str = ""

    def add_failure(self, exc: Exception) -> None:
        self.failed += 1
        self.last_error = f"{type(exc).__name__}: {exc}"

    def checked(self, what: str) -> list[float]:
        if not self.seconds:
            raise TargetUnavailable(f"every {what} call failed; last: {self.last_error}")
        return [s * 1000 for s in self.seconds]


async def sequential(
    load: LoadGenerator, count: int, *, stream: bool = False, deadline_s: float = PHASE_DEADLINE_S
) -> Phase:
    phase = Phase()
    deadline = time.monotonic() + deadline_s
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        try:
            phase.seconds.append(await (load.first_byte() if stream else load.call()))
        except _CALL_ERRORS as exc:
            phase.add_failure(exc)
    return phase


async def concurrent(
    load: LoadGenerator,
    concurrency: int,
    count: int,
    deadline_s: float = PHASE_DEADLINE_S,
    *,
    settled: Callable[[], Awaitable[None]] | None = None,
) -> tuple[float, Phase]:
    """Requests/s of `concurrency` callers sharing `count` calls (or `deadline_s`); with
    `settled`, the clock stops only once it returns (art-proxy: its records in the store)."""
    phase = Phase()
    remaining = count
    deadline = time.monotonic() + deadline_s

    async def caller() -> None:
        nonlocal remaining
        while remaining > 0 and time.monotonic() < deadline:
            remaining -= 1
            try:
                phase.seconds.append(await load.call())
            except _CALL_ERRORS as exc:
                phase.add_failure(exc)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    if settled is not None:
        await settled()
    return len(phase.seconds) / (time.perf_counter() - start), phase


async def ingested(session: aiohttp.ClientSession, health: str) -> None:
    """Until art-proxy's journal has no frame left for the store (its /health says so).

    A throughput round of art-proxy ends here, not with its last answer: under load its
    ingester falls behind the answers (at 16 in flight, 7,600 of a 4 s burst's 12,800 records
    were still journaled when the burst ended; they took 0.7 s of CPU to catch up), and that
    work, left out of the round, fell into the next target's round instead."""
    deadline = time.monotonic() + PHASE_DEADLINE_S
    while time.monotonic() < deadline:
        async with session.get(health) as response:
            journal = (await response.json()).get("journal") or {}
        if not journal.get("backlog_frames"):
            return
        await asyncio.sleep(INGESTED_POLL_S)


async def relayed(
    load: LoadGenerator, streams: int, settled: Callable[[], Awaitable[None]] | None = None
) -> tuple[float, Phase]:
    """Chunks/s of STREAM_CONCURRENCY streams at a time, `streams` in all (or the deadline);
    with `settled`, the clock stops only once it returns."""
    phase = Phase()
    remaining, chunks = streams, 0
    deadline = time.monotonic() + PHASE_DEADLINE_S

    async def streamer() -> None:
        nonlocal remaining, chunks
        while remaining > 0 and time.monotonic() < deadline:
            remaining -= 1
            try:
                got = await load.relayed_stream()  # not `chunks += await`: that reads first
                chunks += got
                phase.seconds.append(0.0)
            except _CALL_ERRORS as exc:
                phase.add_failure(exc)

    start = time.perf_counter()
    await asyncio.gather(*(streamer() for _ in range(STREAM_CONCURRENCY)))
    if settled is not None:
        await settled()
    return chunks / (time.perf_counter() - start), phase


async def latency_taking_turns(report: Report, urls: dict[str, str], workload: Workload) -> None:
    """Sequential latency in LATENCY_ROUNDS blocks per target, the targets taking turns: every
    target meets the same minutes of the machine, whose speed drifts (measured one after the
    other, a bare relay that does nothing added 1.51 ms in one run, twice what art-proxy added
    a minute later). Each target's p50 is over all its calls. Before any stream or load phase:
    a proxy that has taken 30,000 calls is slower than a fresh one (see benchmarks/README.md)."""
    block = max(1, workload.requests // LATENCY_ROUNDS)
    block_s = PHASE_DEADLINE_S / LATENCY_ROUNDS
    async with contextlib.AsyncExitStack() as stack:
        loads = await _warm_loads(stack, report, urls, workload, PHASE_DEADLINE_S)
        for load in loads.values():
            await sequential(load, WARMUP_STREAMS, stream=True)
        console.print(
            f"sequential latency: {LATENCY_ROUNDS} blocks of {block} calls per target, "
            "targets taking turns"
        )
        phases = {name: Phase() for name in loads}
        for _ in range(LATENCY_ROUNDS):
            for name, load in loads.items():
                done = await sequential(load, block, deadline_s=block_s)
                phases[name].seconds += done.seconds
                phases[name].failed += done.failed
                phases[name].last_error = done.last_error or phases[name].last_error
    for name, phase in phases.items():
        if _keep(report, {}, name, phase, "sequential"):
            report.results[name].latencies_ms = phase.checked("sequential")


async def measure_alone(
    result: TargetResult,
    base_url: str,
    workload: Workload,
    settled: Callable[[], Awaitable[None]] | None,
) -> None:
    """The phases a target runs on its own: streaming time to first byte, the streaming relay
    (ending once `settled` returns, if given)."""
    requests, name = workload.requests, result.name
    async with _session() as session:
        load = LoadGenerator(session, base_url, workload)
        console.print(f"  {name}: {requests // 2} sequential streams ...")
        ttfb = await sequential(load, requests // 2, stream=True)
        console.print(
            f"  {name}: {workload.relayed_streams} streams of {STREAM_CHUNKS} chunks, "
            f"{STREAM_CONCURRENCY} at a time ..."
        )
        result.chunks_per_s, streams = await relayed(load, workload.relayed_streams, settled)
        streams.checked("relayed stream")
        result.ttfb_ms = ttfb.checked("stream")
        result.failed_calls += ttfb.failed + streams.failed


async def taking_turns(
    servers: Servers,
    report: Report,
    urls: dict[str, str],
    workload: Workload,
    settled: Mapping[str, Callable[[], Awaitable[None]]],
) -> None:
    """Throughput at each level, THROUGHPUT_ROUNDS rounds with the targets taking turns, each
    target's best round counting, a round of a target in `settled` ending once it returns. A
    target that fails every call of a round is dropped."""
    calls = 2 * workload.requests
    round_s = PHASE_DEADLINE_S / THROUGHPUT_ROUNDS
    async with contextlib.AsyncExitStack() as stack:
        loads = await _warm_loads(stack, report, urls, workload, round_s)
        console.print(
            f"throughput: {THROUGHPUT_ROUNDS} rounds, targets taking turns, up to {calls} calls "
            f"(or {round_s:.0f} s) each; the best round counts"
        )
        cpu_seconds = dict.fromkeys(loads, 0.0)
        cpu_calls = dict.fromkeys(loads, 0)
        for level in CONCURRENCY:
            for round_ in range(1, THROUGHPUT_ROUNDS + 1):
                console.print(f"  round {round_} at {level} in flight: {', '.join(loads)}")
                for name, load in list(loads.items()):
                    cpu_before = servers.cpu_seconds(name)
                    rate, phase = await concurrent(
                        load, level, calls, round_s, settled=settled.get(name)
                    )
                    cpu_after = servers.cpu_seconds(name)
                    if not _keep(report, loads, name, phase, f"{level}-concurrent"):
                        continue
                    result = report.results[name]
                    result.throughput[level] = max(result.throughput.get(level, 0.0), rate)
                    if (
                        level == TARGET_CONCURRENCY
                        and cpu_before is not None
                        and cpu_after is not None
                    ):
                        cpu_seconds[name] += cpu_after - cpu_before
                        cpu_calls[name] += len(phase.seconds)
        for name, result in report.results.items():
            if cpu_calls[name]:
                result.cpu_us_per_call = cpu_seconds[name] / cpu_calls[name] * 1e6


async def _warm_loads(
    stack: contextlib.AsyncExitStack,
    report: Report,
    urls: dict[str, str],
    workload: Workload,
    warmup_s: float,
) -> dict[str, LoadGenerator]:
    """A load generator with a session of its own for each target, its connections opened and
    its caches warmed by WARMUP_REQUESTS calls."""
    loads = {}
    for name in report.results:
        session = await stack.enter_async_context(_session())
        loads[name] = LoadGenerator(session, urls[name], workload)
        await concurrent(loads[name], 4, WARMUP_REQUESTS, warmup_s)
    return loads


def _keep(
    report: Report, loads: dict[str, LoadGenerator], name: str, phase: Phase, what: str
) -> bool:
    """Count a phase's failures; drop the target if it answered none of its calls."""
    report.results[name].failed_calls += phase.failed
    try:
        phase.checked(what)
    except TargetUnavailable as exc:
        report.skipped[name] = str(exc)
        del report.results[name]
        loads.pop(name, None)
        return False
    return True


def _session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(CALL_TIMEOUT_S))


async def run_targets(servers: Servers, urls: dict[str, str], workload: Workload) -> Report:
    report = Report()
    async with aiohttp.ClientSession() as session:
        for name, url in urls.items():
            try:
                await wait_ready(session, servers, name, health_url(name, url))
            except TargetUnavailable as exc:
                report.skipped[name] = f"did not start: {exc}"
        report.results = {name: TargetResult(name) for name in urls if name not in report.skipped}
        # art-proxy's phases of many calls end once its records are in the store (`ingested`).
        settled: dict[str, Callable[[], Awaitable[None]]] = {}
        if "art-proxy" in report.results:
            health = health_url("art-proxy", urls["art-proxy"])
            settled["art-proxy"] = functools.partial(ingested, session, health)
        await latency_taking_turns(report, urls, workload)
        for name, result in list(report.results.items()):
            console.print(f"measuring {name} ({urls[name]})")
            try:
                await measure_alone(result, urls[name], workload, settled.get(name))
            except TargetUnavailable as exc:
                report.skipped[name] = str(exc)
                del report.results[name]
        await taking_turns(servers, report, urls, workload, settled)
        if "art-proxy" in report.results:
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                async with session.get(health_url("art-proxy", urls["art-proxy"])) as response:
                    report.proxy_health = await response.json()
    return report
