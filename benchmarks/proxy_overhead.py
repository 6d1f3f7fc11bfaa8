"""What art-proxy adds to a call, next to a direct call and to LiteLLM's proxy.

One run starts a fake vLLM (`art_proxy.testing.fake_vllm`), a bare aiohttp relay in front of it
(`bare_relay.py`: bytes in, bytes out, the floor any aiohttp proxy meets on this machine),
art-proxy recording into SQLite in a temp dir, and LiteLLM's proxy pointed at the same fake; each
is a subprocess, so none shares the load generator's event loop. LiteLLM lives in its own venv
(`.venv-litellm`, made on first use) so that its pins never touch `.venv`. Against each target the
run measures sequential latency, throughput at 16 and 64 concurrent requests (rounds in which the
targets take turns, the best round counting, and the CPU a call of each server's process),
streaming time to first byte and the streaming relay's throughput (64 concurrent streams of 256
chunks, each chunk with its token id and logprob, as vLLM sends them when asked), then checks the
issue's targets. art-proxy's rounds and its streaming relay end once its records are in the store,
not with its last answer: what it costs to record a call is part of what it costs. The servers and
the load generator share the machine's cores, so absolute figures are this machine's; the targets
are stated as differences and ratios. Traffic stays on 127.0.0.1; every phase is bounded in count
and in time.

    .venv/bin/python benchmarks/proxy_overhead.py [--requests 500] [--skip-litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from art_proxy.testing.fake_vllm import FakeVllmConfig
from art_proxy.testing.loopback import free_port

REPO = Path(__file__).resolve().parents[1]
LITELLM_VENV = REPO / ".venv-litellm"
# Pinned so runs compare; the newest release whose dependencies resolve on the package index here.
LITELLM_VERSION = "1.106.2"
HOST = "127.0.0.1"
CONCURRENCY = (16, 64)
# Opens the connections and warms each server's caches before anything is timed.
WARMUP_REQUESTS = 50
WARMUP_STREAMS = 5
# A slow target (LiteLLM) ends a phase here rather than at its request count.
PHASE_DEADLINE_S = 15.0
# The throughput phases take turns, target after target, this many times at each level, and each
# target's best round counts: the machine's speed drifts within a run (other tenants' load), and
# taking turns lets every target meet the same drift instead of one target a slow minute.
THROUGHPUT_ROUNDS = 3
# How often a throughput round of art-proxy asks whether its records are in the store yet.
INGESTED_POLL_S = 0.005
# Sequential latency is measured in this many blocks per target, the targets taking turns.
LATENCY_ROUNDS = 5
# LiteLLM imports for a long while on 2 busy cores; the others are up in about a second.
START_TIMEOUT_S = 120.0
CALL_TIMEOUT_S = 30.0
PIP_TIMEOUT_S = 900.0

# The targets.
MAX_ADDED_P50_MS = 0.8
MIN_THROUGHPUT_VS_LITELLM = 20.0
MIN_THROUGHPUT_VS_DIRECT = 0.25
MIN_STREAMED_VS_DIRECT = 0.5
TARGET_CONCURRENCY = 16
# The streaming relay's phase: this many streams at once, each of this many chunks (one token each).
STREAM_CONCURRENCY = 64
STREAM_CHUNKS = 256
# Long enough for STREAM_CHUNKS tokens; other calls are cut at CALL_MAX_TOKENS.
FAKE_REPLY = "Hello from the fake." + " word" * STREAM_CHUNKS
CALL_MAX_TOKENS = 16
# The floor beside art-proxy: an aiohttp relay that passes bytes and does nothing else.
BARE_RELAY = "bare relay"

LITELLM_ENV = {
    "LITELLM_LOG": "ERROR",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else it fetches the cost map from GitHub at import
    "DISABLE_SCHEMA_UPDATE": "True",
    "LITELLM_TELEMETRY": "False",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "True",
    "HF_HUB_OFFLINE": "1",
    "NO_DOCS": "True",
}
# Would make LiteLLM open a database, or call something beyond the fake.
LITELLM_ENV_DROPPED = ("DATABASE_URL", "REDIS_HOST", "REDIS_URL", "LITELLM_MASTER_KEY")

# Wide enough for the report when the output goes to a file or CI log (rich assumes 80 there).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


@dataclass(frozen=True)
class Workload:
    model: str
    # LiteLLM refuses to start without a strong master key; every target is sent the same header.
    api_key: str
    requests: int  # sequential calls per target; 4x per concurrency level, 1/2x streams
    relayed_streams: int  # streams of STREAM_CHUNKS chunks in the streaming relay phase


class TargetUnavailable(Exception):
    """A target could not be installed or started, or answered no call of a phase."""


class CallFailed(Exception):
    """A call answered with an error status or an incomplete body."""


# ---------------------------------------------------------------- results


@dataclass
class TargetResult:
    name: str
    latencies_ms: list[float] = field(default_factory=list)  # sequential calls
    throughput: dict[int, float] = field(default_factory=dict)  # concurrency -> best round's req/s
    ttfb_ms: list[float] = field(default_factory=list)
    chunks_per_s: float = 0.0  # the streaming relay phase
    failed_calls: int = 0
    # The target's process (all its threads) over its rounds at TARGET_CONCURRENCY, where
    # /proc tells; the fake's and the load generator's CPU are not in it.
    cpu_us_per_call: float | None = None

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p90_ms(self) -> float:
        return percentile(self.latencies_ms, 90)

    @property
    def ttfb_p50_ms(self) -> float:
        return percentile(self.ttfb_ms, 50)


@dataclass
class Report:
    results: dict[str, TargetResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # target -> why
    proxy_health: dict[str, Any] = field(default_factory=dict)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


# ---------------------------------------------------------------- servers


class Servers:
    """The run's subprocesses, each in its own session so that stopping it stops its children."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with self.log_path(name).open("wb") as log:
            self._procs[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._workdir,
                start_new_session=True,
            )

    def log_path(self, name: str) -> Path:
        return self._workdir / f"{name.replace(' ', '-')}.log"

    def exit_code(self, name: str) -> int | None:
        return self._procs[name].poll()

    def cpu_seconds(self, name: str) -> float | None:
        """CPU time the server's process has used so far (user and system, all threads);
        None where /proc does not tell (not Linux)."""
        try:
            stat = Path(f"/proc/{self._procs[name].pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def log_tail(self, name: str, lines: int = 8) -> str:
        text = self.log_path(name).read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:])

    def stop_all(self) -> None:
        for proc in reversed(self._procs.values()):
            _signal_group(proc, signal.SIGTERM)
        for proc in reversed(self._procs.values()):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        self._procs.clear()


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signum)


def litellm_config(workload: Workload, upstream: str) -> dict[str, Any]:
    model = workload.model
    return {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": upstream,
                    "api_key": "unused",
                },
            }
        ],
        "litellm_settings": {
            "telemetry": False,
            "drop_params": True,
            "num_retries": 0,
            "request_timeout": CALL_TIMEOUT_S,
            "turn_off_message_logging": True,
        },
        "general_settings": {"master_key": workload.api_key, "disable_spend_logs": True},
    }


def ensure_litellm() -> Path:
    """The `litellm` command of `.venv-litellm`, installing it there first if needed."""
    python = LITELLM_VENV / "bin" / "python"
    if not python.exists():
        console.print(f"creating {LITELLM_VENV} (LiteLLM stays out of .venv) ...")
        _run_setup([sys.executable, "-m", "venv", str(LITELLM_VENV)])
    if _installed_litellm(python) != LITELLM_VERSION:
        console.print(
            escape(f"installing litellm[proxy]=={LITELLM_VERSION} into {LITELLM_VENV.name} ..."),
        )
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _run_setup([*pip, f"litellm[proxy]=={LITELLM_VERSION}"])
    return LITELLM_VENV / "bin" / "litellm"


def _installed_litellm(python: Path) -> str | None:
    script = "import importlib.metadata as m; print(m.version('litellm'))"
    found = subprocess.run([str(python), "-c", script], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def _run_setup(argv: list[str]) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.CalledProcessError as exc:
        # pip's "(from versions: ...)" lists every release; the rest of its ERROR lines is the why.
        errors = [
            line.split(" (from versions:")[0] for line in exc.stderr.splitlines() if "ERROR" in line
        ]
        why = " ".join(errors[-2:]) or exc.stderr.strip()[-300:]
        raise TargetUnavailable(f"`{' '.join(argv[:4])} ...` failed: {why}") from exc
    except subprocess.TimeoutExpired as exc:
        raise TargetUnavailable(
            f"`{' '.join(argv[:4])} ...` took over {PIP_TIMEOUT_S:.0f} s"
        ) from exc


def start_servers(
    servers: Servers, workdir: Path, workload: Workload, litellm: Path | None
) -> dict[str, str]:
    """Start every server at once (they boot in parallel); returns each target's base URL."""
    ports = {name: free_port() for name in ("direct", BARE_RELAY, "art-proxy", "LiteLLM")}
    urls = {name: f"http://{HOST}:{port}/v1" for name, port in ports.items()}
    fake = urls["direct"]
    fake_vllm = [
        *[sys.executable, "-m", "art_proxy.testing.fake_vllm", "--model", workload.model],
        *["--reply", FAKE_REPLY],
    ]
    servers.start("direct", [*fake_vllm, *_bind(ports["direct"])])
    bare_relay = [sys.executable, str(Path(__file__).with_name("bare_relay.py"))]
    servers.start(BARE_RELAY, [*bare_relay, *_bind(ports[BARE_RELAY]), "--upstream", fake])
    store = f"sqlite:///{workdir / 'art.db'}"
    art_proxy = Path(sys.executable).with_name("art-proxy")
    servers.start(
        "art-proxy",
        [str(art_proxy), "serve", *_bind(ports["art-proxy"]), "--upstream", fake, "--store", store],
    )
    if litellm is None:
        del urls["LiteLLM"]
        return urls
    config = workdir / "litellm.yaml"
    config.write_text(json.dumps(litellm_config(workload, fake)))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if k not in LITELLM_ENV_DROPPED}
    servers.start(
        "LiteLLM",
        [str(litellm), "--config", str(config), *_bind(ports["LiteLLM"]), "--num_workers", "1"],
        env=env | LITELLM_ENV,
    )
    return urls


def _bind(port: int) -> list[str]:
    return ["--host", HOST, "--port", str(port)]


def health_url(name: str, base_url: str) -> str:
    root = base_url.removesuffix("/v1")
    # LiteLLM's /health calls every model; liveliness only says the server is up.
    return root + ("/health/liveliness" if name == "LiteLLM" else "/health")


async def wait_ready(session: aiohttp.ClientSession, servers: Servers, name: str, url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        code = servers.exit_code(name)
        if code is not None:
            raise TargetUnavailable(f"exited with code {code}:\n{servers.log_tail(name)}")
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                if response.status == 200:
                    return
        await asyncio.sleep(0.2)
    raise TargetUnavailable(f"not ready after {START_TIMEOUT_S:.0f} s:\n{servers.log_tail(name)}")


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


# ---------------------------------------------------------------- report


def print_report(report: Report, requests: int) -> None:
    results = report.results
    direct = results.get("direct")
    table = Table(title=f"proxy overhead ({os.cpu_count()} cores shared by everything)")
    for column in ("target", "p50 ms", "p90 ms", "added p50 ms"):
        table.add_column(column, justify="right")
    for level in CONCURRENCY:
        table.add_column(f"req/s @{level}", justify="right")
    table.add_column("stream TTFB p50 ms", justify="right")
    table.add_column(f"chunks/s @{STREAM_CONCURRENCY} streams", justify="right")
    table.add_column("failed calls", justify="right")
    for result in results.values():
        added = "" if direct in (None, result) else f"{result.p50_ms - direct.p50_ms:+.2f}"
        table.add_row(
            result.name,
            f"{result.p50_ms:.2f}",
            f"{result.p90_ms:.2f}",
            added,
            *(f"{result.throughput[level]:,.0f}" for level in CONCURRENCY),
            f"{result.ttfb_p50_ms:.2f}",
            f"{result.chunks_per_s:,.0f}",
            str(result.failed_calls),
        )
    console.print(table)
    console.print(
        f"sequential: {requests} calls per target in {LATENCY_ROUNDS} blocks, taking turns; "
        f"concurrent: the best of {THROUGHPUT_ROUNDS} "
        f"rounds of up to {2 * requests} calls; streams: {requests // 2}; "
        f"litellm=={LITELLM_VERSION}"
    )
    for result in results.values():
        if result.cpu_us_per_call is not None:
            console.print(
                f"{result.name}'s process: {result.cpu_us_per_call:,.0f} us of CPU a call "
                f"at {TARGET_CONCURRENCY} in flight"
            )
    for name, why in report.skipped.items():
        console.print(f"[yellow]{name} skipped:[/yellow] {escape(why)}")
    if report.proxy_health:
        health = report.proxy_health
        console.print(
            f"art-proxy recorded {health.get('calls')} calls "
            f"({health.get('records_committed')} committed in {health.get('commits')} commits, "
            f"{health.get('lost_records')} lost, {health.get('failed_calls')} failed)"
        )
    proxy = results.get("art-proxy")
    if proxy is None or direct is None:
        console.print("[red]no art-proxy figure: art-proxy or the fake upstream failed[/red]")
        return
    print_targets(proxy, direct, results.get("LiteLLM"), results.get(BARE_RELAY))


def print_targets(
    proxy: TargetResult,
    direct: TargetResult,
    litellm: TargetResult | None,
    floor: TargetResult | None,
) -> None:
    """The issue's targets, and beside them the bare relay's figures: the floor that any aiohttp
    proxy meets on this machine in the same minutes."""
    level = TARGET_CONCURRENCY
    added_ms = proxy.p50_ms - direct.p50_ms
    table = Table(title="targets (from the issue)")
    for column in ("check", "measured", "target", "verdict"):
        table.add_column(column)
    table.add_row(
        "added p50 latency",
        f"{added_ms:+.2f} ms",
        f"<= {MAX_ADDED_P50_MS:g} ms",
        _verdict(added_ms <= MAX_ADDED_P50_MS),
    )
    key = f"art-proxy: {added_ms:+.2f} ms p50"
    if floor is not None:
        floor_ms = floor.p50_ms - direct.p50_ms
        table.add_row(
            "  the bare relay's added p50 (the floor)", f"{floor_ms:+.2f} ms", "(info)", ""
        )
        key += f" (bare relay {floor_ms:+.2f})"
    key += f", {_ratio(proxy, direct, level):.2f}x direct @{level}"
    floor_ratio = _ratio(floor, direct, level) if floor is not None else None
    if floor_ratio is not None:
        key += f" (bare relay {floor_ratio:.2f}x)"
    if litellm is not None:
        _add_ratio_rows(table, proxy, litellm, MIN_THROUGHPUT_VS_LITELLM)
        key += f", {_ratio(proxy, litellm, level):.0f}x LiteLLM @{level}"
    else:
        table.add_row(f"throughput vs LiteLLM @{level}", "skipped", "", "")
        key += ", LiteLLM skipped"
    _add_ratio_rows(table, proxy, direct, MIN_THROUGHPUT_VS_DIRECT)
    if floor_ratio is not None:
        table.add_row(
            f"  the bare relay vs direct @{level} (the floor)", f"{floor_ratio:.2f}x", "(info)", ""
        )
    added_ttfb = proxy.ttfb_p50_ms - direct.ttfb_p50_ms
    table.add_row("added stream TTFB p50", f"{added_ttfb:+.2f} ms", "(info)", "")
    streamed = proxy.chunks_per_s / direct.chunks_per_s
    table.add_row(
        f"streamed chunks/s vs direct @{STREAM_CONCURRENCY} streams",
        f"{streamed:.2f}x",
        f">= {MIN_STREAMED_VS_DIRECT:g}x",
        _verdict(streamed >= MIN_STREAMED_VS_DIRECT),
    )
    key += f", streams {streamed:.2f}x direct"
    console.print(table)
    console.print(key)  # the key figure, last


def _ratio(proxy: TargetResult, baseline: TargetResult, level: int) -> float:
    return proxy.throughput[level] / baseline.throughput[level]


def _add_ratio_rows(
    table: Table, proxy: TargetResult, baseline: TargetResult, minimum: float
) -> None:
    """Throughput ratios at every level; the one at TARGET_CONCURRENCY is checked."""
    for level in CONCURRENCY:
        ratio = _ratio(proxy, baseline, level)
        checked = level == TARGET_CONCURRENCY
        table.add_row(
            f"throughput vs {baseline.name} @{level}",
            f"{ratio:.2f}x",
            f">= {minimum:g}x" if checked else "(info)",
            _verdict(ratio >= minimum) if checked else "",
        )


def _verdict(passed: bool) -> str:
    return "[green]PASS[/green]" if passed else "[red]MISS[/red]"


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--requests",
        type=int,
        default=500,
        help="sequential calls per target; each concurrency level sends 4x, streams 1/2x "
        "(default: 500)",
    )
    parser.add_argument(
        "--streams",
        type=int,
        default=2 * STREAM_CONCURRENCY,
        help=f"streams of {STREAM_CHUNKS} chunks in the streaming relay phase "
        f"(default: {2 * STREAM_CONCURRENCY})",
    )
    parser.add_argument(
        "--skip-litellm",
        action="store_true",
        help="measure only direct, the bare relay and art-proxy",
    )
    args = parser.parse_args(argv)
    if args.requests < 2 or args.streams < 1:
        parser.error("--requests must be at least 2 and --streams at least 1")
    return args


def run_async(coro: Coroutine[Any, Any, Report]) -> Report:
    async def cancelled_on_sigterm() -> Report:
        # As asyncio does for Ctrl-C: cancel the main task, so every `async with` closes.
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await coro

    try:
        import uvloop
    except ImportError:
        return asyncio.run(cancelled_on_sigterm())
    report: Report = uvloop.run(cancelled_on_sigterm())
    return report


@contextlib.contextmanager
def stopped_on_exit(servers: Servers) -> Iterator[Servers]:
    """Stops the servers however the block ends; SIGTERM outside the event loop acts as Ctrl-C."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield servers
    finally:
        servers.stop_all()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    workload = Workload(
        FakeVllmConfig().model, f"sk-{secrets.token_hex(32)}", args.requests, args.streams
    )
    litellm: Path | None = None
    skipped: dict[str, str] = {}
    if args.skip_litellm:
        skipped["LiteLLM"] = "--skip-litellm"
    else:
        try:
            litellm = ensure_litellm()
        except TargetUnavailable as exc:
            skipped["LiteLLM"] = f"could not install it: {exc}"
    try:
        with tempfile.TemporaryDirectory(prefix="proxy-overhead-") as tmp:
            workdir = Path(tmp)
            with stopped_on_exit(Servers(workdir)) as servers:
                urls = start_servers(servers, workdir, workload, litellm)
                console.print(f"started {', '.join(urls)}; waiting until they are ready ...")
                report = run_async(run_targets(servers, urls, workload))
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("interrupted: every server stopped, temp dir removed")
        raise SystemExit(130) from None
    report.skipped |= skipped
    print_report(report, args.requests)


if __name__ == "__main__":
    main()
