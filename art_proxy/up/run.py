"""`art-proxy up`'s run: the stack brought up, served or running a command (`--run`, the whole
loop), summarized, brought down."""

from __future__ import annotations

import asyncio
import os

import aiohttp
from rich.markup import escape
from rich.table import Table

from art_proxy.config import UpSettings
from art_proxy.errors import ConfigError
from art_proxy.ids import short_id
from art_proxy.local.errors import ModelLoadError
from art_proxy.privacy.redaction import redact_url
from art_proxy.up.parts import StackError, console
from art_proxy.up.plan import eval_command, plan, trainer_command
from art_proxy.up.supervisor import Supervisor


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
