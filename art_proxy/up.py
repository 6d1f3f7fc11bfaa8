"""`art-proxy up`: the embedded stack (inference server + proxy) as one command.

Each part is a child process whose output is streamed with its name in front. Parts start in order
and each must answer its health check before the next starts. The stack stops cleanly (SIGTERM, then
SIGKILL after a grace period) on Ctrl-C, when any part dies (its last lines are shown), or, with
`--run CMD`, when that command ends, after a summary of what the proxy recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import aiohttp
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from art_proxy.config import Engine, LogLevel, TrainerConfig, UpSettings
from art_proxy.errors import ConfigError
from art_proxy.ids import short_id
from art_proxy.local import missing_local_packages
from art_proxy.local.errors import ModelLoadError
from art_proxy.privacy.redaction import redact_url
from art_proxy.records import JsonObject
from art_proxy.vllm_server import VllmLaunch

# Soft wrap: commands, URLs and a part's log lines stay whole lines, to copy or grep.
console = Console(stderr=True, highlight=False, soft_wrap=True)

_STOP_GRACE_S = 10.0
_TAIL_LINES = 15


T = TypeVar("T")


class StackError(Exception):
    """A part failed to start or died; the message says which and shows its last lines."""


class Interrupted(StackError):
    """Ctrl-C (or SIGTERM) came while the stack was working."""


@dataclass
class Part:
    name: str
    argv: list[str]
    health_url: str | None  # None: ready once started (a part without a health check)
    ready_timeout_s: float
    color: str
    env: dict[str, str] = field(default_factory=dict)
    first_request: tuple[str, JsonObject] | None = None  # (URL, body) posted once it is ready
    process: asyncio.subprocess.Process | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))

    def died(self) -> StackError:
        code = self.process.returncode if self.process else None
        lines = "\n".join(f"    {line}" for line in self.tail) or "    (no output)"
        return StackError(f"{self.name} exited with status {code}; its last lines:\n{lines}")


def flags(**values: object) -> list[str]:
    """`flags(max_loras=4)` -> `["--max-loras", "4"]`; True is a bare flag, None is left out."""
    argv: list[str] = []
    for name, value in values.items():
        if value is None or value is False:
            continue
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv.append(str(value))
    return argv


# vLLM's share of one GPU the trainer also trains on when the model's size or the GPU's cannot be
# read (a hub id not in the local cache, torch without CUDA beside a CUDA vLLM).
ONE_GPU_VLLM_SHARE = 0.5


def one_gpu_share(settings: UpSettings, model_dir: str) -> float:
    """vLLM's share of the GPU the whole loop's trainer trains on: what the trainer's step leaves
    by `art_proxy_trainer.memory` (docs/training.md, One GPU), from the model's config and
    the GPU's size. ConfigError when vLLM cannot fit beside the trainer."""
    try:
        import torch
        from transformers import AutoConfig

        from art_proxy_trainer.memory import GB, ModelShape, vllm_share

        config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory
    except (ImportError, OSError, ValueError, RuntimeError, AssertionError):
        return ONE_GPU_VLLM_SHARE
    shape = ModelShape.of(config, model_dir)
    share = vllm_share(
        shape,
        gpu_bytes,
        micro_batch_tokens=TrainerConfig().micro_batch_tokens,
        lora_rank=settings.lora_rank,
        sleeping=settings.sleep_mode,
    )
    if share is None:
        raise ConfigError(
            f"{model_dir} does not fit beside the trainer on this {gpu_bytes / GB:.0f} GB GPU "
            f"({shape.parameters * 2 / GB:.1f} GB of bf16 weights each side): pass --sleep-mode "
            "(vLLM sleeps through each step), a smaller model, or --gpu-memory-utilization "
            "and a trainer on another GPU"
        )
    return share


def refuse_taken_port(host: str, port: int, flag: str) -> None:
    """ConfigError when something already listens on `host:port`: the stack would start beside
    it, and its health checks would be answered by the other server."""
    with socket.socket() as probe:
        probe.settimeout(1.0)
        if probe.connect_ex((host, port)) == 0:
            variable = "ART_PROXY_" + flag.removeprefix("--").replace("-", "_").upper()
            raise ConfigError(
                f"port {port} on {host} is taken (another art-proxy, vLLM or local-llm still "
                f"running?): stop it, or pass {flag} with a free port (or set {variable}, "
                f"e.g. {variable}={port + 1} make demo)"
            )


def plan(settings: UpSettings) -> list[Part]:
    """The parts of the stack, in start order (with `--engine vllm`, the bundled model is
    converted first, once per machine)."""
    for flag, port in (("--llm-port", settings.llm_port), ("--port", settings.port)):
        refuse_taken_port(settings.host if flag == "--port" else "127.0.0.1", port, flag)
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    llm_url = f"http://127.0.0.1:{settings.llm_port}"
    if settings.engine is Engine.vllm:
        launch = VllmLaunch.of(
            settings.model,
            port=settings.llm_port,
            python=settings.vllm_python,
            max_lora_rank=settings.max_lora_rank,
            tool_call_parser=settings.tool_call_parser,
            dtype=settings.vllm_dtype,
            gpu_memory_utilization=settings.gpu_memory_utilization or None,
            sleep_mode=settings.sleep_mode,
            reasoning_parser=settings.reasoning_parser,
        )
        if settings.agent and not launch.cpu and not settings.gpu_memory_utilization:
            launch = replace(launch, gpu_memory_utilization=one_gpu_share(settings, launch.model))
        llm = Part(
            "vllm",
            launch.argv(),
            f"{llm_url}/health",
            ready_timeout_s=900,  # a GPU machine may first download the model
            color="magenta",
            env=launch.env(),
            first_request=launch.grammar_pin,
        )
    else:
        missing = missing_local_packages("up")
        if missing is not None:
            raise ConfigError(missing)
        llm = Part(
            "local-llm",
            [art_proxy, "local-llm", *flags(port=settings.llm_port, model=settings.model)],
            f"{llm_url}/health",
            ready_timeout_s=600,  # the first start converts the bundled GGUF once
            color="magenta",
        )
    proxy_flags = flags(
        upstream=f"{llm_url}/v1",
        store=settings.store,
        host=settings.host,
        port=settings.port,
        journal=settings.journal,
        durability=settings.durability.value,
        journal_max_mb=settings.journal_max_mb or None,
        log_level=None if settings.log_level is LogLevel.info else settings.log_level.value,
    )
    proxy = Part(
        "proxy",
        [art_proxy, "serve", *proxy_flags],
        f"http://{settings.host}:{settings.port}/health",
        ready_timeout_s=60,
        color="cyan",
    )
    return [llm, proxy]


def trainer_command(settings: UpSettings) -> str | None:
    """`art-proxy train` running the whole loop against this stack (None without --agent)."""
    if not settings.agent or not settings.scenarios:
        return None
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    train_flags = flags(
        agent=settings.agent,
        scenarios=settings.scenarios,
        steps=settings.steps,
        out=settings.out,
        store=settings.store,
        proxy=f"http://{settings.host}:{settings.port}",
        upstream=f"http://127.0.0.1:{settings.llm_port}/v1",
        model=settings.model,
        nproc=settings.nproc if settings.nproc > 1 else None,
        sharding=settings.sharding if settings.sharding != "ddp" else None,
        lora_rank=settings.lora_rank if "lora_rank" in settings.model_fields_set else None,
        sleep_upstreams=settings.sleep_mode,
    )
    return shlex.join([art_proxy, "train", *train_flags])


def eval_command(settings: UpSettings) -> str | None:
    """`art-proxy eval` of the base model against the trained adapter on the val scenarios,
    after the whole loop (None without --agent, --eval-repeats 0 or val scenarios)."""
    if not settings.agent or not settings.scenarios or not settings.eval_repeats:
        return None
    from art_proxy.scenarios import load_scenarios

    if not any(scenario.split == "val" for scenario in load_scenarios(settings.scenarios)):
        return None
    art_proxy = str(Path(sys.executable).parent / "art-proxy")
    eval_flags = flags(
        agent=settings.agent,
        scenarios=settings.scenarios,
        store=settings.store,
        proxy=f"http://{settings.host}:{settings.port}",
        repeats=settings.eval_repeats,
        out=f"{settings.out}/eval",
    )
    return shlex.join([art_proxy, "eval", *eval_flags, "--model", "base", "--model", "trained"])


async def _post_once(part: Part, url: str, body: JsonObject) -> None:
    """POST `body` to `url` (a part's first request). Refused or unanswered, the part still
    serves: said in one line, not fatal."""
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.post(url, json=body) as got,
        ):
            if got.status == 200:
                return
            problem = f"{got.status}: {(await got.text())[:200]}"
    except (aiohttp.ClientError, TimeoutError) as exc:
        problem = str(exc) or type(exc).__name__
    console.print(f"[yellow]{part.name} did not take its first request ({escape(problem)})[/]")


async def _pipe_output(part: Part) -> None:
    assert part.process is not None and part.process.stdout is not None
    async for raw in part.process.stdout:
        line = raw.decode("utf-8", "replace").rstrip()
        part.tail.append(line)
        console.print(f"[{part.color}]{part.name:>9}[/] | {escape(line)}")


class Supervisor:
    """A stack's parts as child processes: started in order (each ready before the next), their
    output streamed, stopped in reverse when the `async with` block ends. SIGINT and SIGTERM set
    `stop` instead of killing us, so the parts always stop cleanly."""

    def __init__(self) -> None:
        self.parts: list[Part] = []
        self.stop = asyncio.Event()
        self._pipes: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Supervisor:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self.stop.set)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for part in reversed(self.parts):
            await _stop_part(part)
        for pipe in self._pipes:
            pipe.cancel()

    async def start(self, part: Part) -> None:
        """Start `part` and wait for its health check; a StackError if it dies or never answers."""
        self.parts.append(part)
        console.print(f"[bold]starting {part.name}[/]: {escape(shlex.join(part.argv))}")
        try:
            part.process = await asyncio.create_subprocess_exec(
                *part.argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                # Children print through a pipe; a wide console keeps their log lines whole.
                env={**os.environ, "COLUMNS": "160", **part.env},
                start_new_session=True,  # Ctrl-C reaches us only; we stop the parts in order
            )
        except FileNotFoundError as exc:
            raise StackError(f"{part.name}: {part.argv[0]} is not installed") from exc
        self._pipes.append(asyncio.create_task(_pipe_output(part)))
        if part.health_url is not None:
            await self._ready(part, part.health_url)

    async def watch(self, work: Awaitable[T]) -> T:
        """`work`'s result; a StackError when a part dies or Ctrl-C comes first (`work` is
        cancelled then)."""
        task = asyncio.ensure_future(work)
        death = asyncio.create_task(self.first_death())
        stopper = asyncio.create_task(self.stop.wait())
        await asyncio.wait({task, death, stopper}, return_when=asyncio.FIRST_COMPLETED)
        for waiter in (death, stopper):
            waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        if death.done() and not death.cancelled():
            raise death.result().died()
        raise Interrupted("interrupted")

    async def serve(self) -> None:
        """Until Ctrl-C (returns) or a part dies (a StackError)."""
        with contextlib.suppress(Interrupted):
            await self.watch(asyncio.get_running_loop().create_future())

    async def first_death(self) -> Part:
        """The first part to exit (waits for ever while all run)."""
        waits = {asyncio.create_task(p.process.wait()): p for p in self.parts if p.process}
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return waits[next(iter(done))]

    async def _ready(self, part: Part, health_url: str) -> None:
        assert part.process is not None
        deadline = time.monotonic() + part.ready_timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while time.monotonic() < deadline:
                if self.stop.is_set():  # Ctrl-C must not wait out a start of many minutes
                    raise Interrupted(f"interrupted while {part.name} was starting")
                if part.process.returncode is not None:
                    await asyncio.sleep(0.2)  # let the last lines arrive
                    raise part.died()
                try:
                    async with http.get(health_url) as response:
                        ready = response.status == 200
                    if ready:
                        if part.first_request is not None:
                            await _post_once(part, *part.first_request)
                        console.print(f"[bold green]{part.name} ready[/]")
                        return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.25)
        raise StackError(f"{part.name} was not ready after {part.ready_timeout_s:.0f} s")


async def _stop_part(part: Part) -> None:
    process = part.process
    if process is None or process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=_STOP_GRACE_S)
    except TimeoutError:
        process.kill()
        await process.wait()
    console.print(f"stopped {part.name}")


async def run_stack(settings: UpSettings) -> int:
    """Bring the stack up, serve (or run `--run`), bring it down; returns an exit status."""
    proxy_root = f"http://{settings.host}:{settings.port}"
    try:
        parts = plan(settings)
    except (ConfigError, ModelLoadError) as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    try:
        async with Supervisor() as stack:
            for part in parts:
                await stack.start(part)
            console.rule("[bold green]art-proxy is up")
            console.print(f"export OPENAI_BASE_URL={proxy_root}/v1")
            console.print(
                f"store: {escape(settings.store)}   trajectories: {proxy_root}/art/v1/trajectories"
            )
            console.print(f"dashboard: {proxy_root}/dashboard")
            command = settings.run or trainer_command(settings)
            if command:
                status = await _run_command(command, f"{proxy_root}/v1", stack)
                evaluation = None if settings.run else eval_command(settings)
                if status == 0 and evaluation is not None:
                    status = await _run_command(evaluation, f"{proxy_root}/v1", stack)
                await summarize(proxy_root, settings.store, table=settings.show_trajectories)
                return status
            console.print("Ctrl-C stops everything.")
            await stack.serve()
            return 0
    except StackError as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}")
        return 1


async def _run_command(command: str, base_url: str, stack: Supervisor) -> int:
    """Run `command` against the stack; a part dying meanwhile stops it and is the error."""
    console.rule(f"running: {escape(command)}")
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "art-proxy-local"}
    process = await asyncio.create_subprocess_shell(command, env=env)
    stopper = asyncio.create_task(stack.stop.wait())
    death = asyncio.create_task(stack.first_death())
    finished = asyncio.create_task(process.wait())
    await asyncio.wait({stopper, death, finished}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    part_died = death.done() and not finished.done()
    if not finished.done():
        process.terminate()
        await process.wait()
    if part_died:
        raise death.result().died()
    death.cancel()
    status = process.returncode or 0
    if status < 0:  # killed by a signal: report it the way a shell does
        status = 128 - status
    console.rule(f"command exited with status {status}")
    return status


async def summarize(proxy_root: str, store: str, *, table: bool) -> None:
    """What the proxy recorded, in a line of counts (`table`: the newest trajectories above it);
    short, so that a trainer's summary above stays on the screen. The stack stops after it, so
    it says how to read the store then, not the dashboard's address."""
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{proxy_root}/health") as response:
            health = await response.json()
        if table:
            console.print(await _trajectory_table(http, proxy_root))
    store = escape(redact_url(store))  # a PostgreSQL URL may hold its password
    console.print(
        f"{health['calls']} calls recorded, {health['failed_calls']} failed, "
        f"{health['stitch_misses']} stitch misses, {health['lost_records']} lost records. "
        f"The stack stops now; they stay in {store}: art-proxy export --store {store}, or "
        f"art-proxy up --store {store} for the dashboard"
    )


async def _trajectory_table(http: aiohttp.ClientSession, proxy_root: str) -> Table:
    async with http.get(f"{proxy_root}/art/v1/trajectories?limit=20") as response:
        trajectories = (await response.json())["data"]
    table = Table(title="recorded trajectories (newest first)")
    for column in ("trajectory", "scenario", "group", "calls", "completion tokens", "trainable"):
        table.add_column(column)
    for summary in trajectories:
        async with http.get(f"{proxy_root}/art/v1/trajectories/{summary['id']}") as response:
            whole = await response.json()
        calls = whole["calls"]
        tokens = sum(len(ids) for c in calls for ids in c["completion_token_ids"] or [])
        table.add_row(
            short_id(summary["id"], 10),
            escape(summary["scenario_id"][:16]),
            short_id(summary["group_id"]),
            str(len(calls)),
            str(tokens),
            "yes" if calls and all(c["trainable"] for c in calls) else "no",
        )
    return table
