"""The stack's parts as child processes: started in order, each ready before the next, their
output streamed with their name in front, stopped cleanly (SIGTERM, then SIGKILL after a grace
period)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import time
from collections.abc import Awaitable
from typing import TypeVar

import aiohttp
from rich.markup import escape

from art_proxy.records import JsonObject
from art_proxy.up.parts import Interrupted, Part, StackError, console

_STOP_GRACE_S = 10.0

T = TypeVar("T")


async def post_once(part: Part, url: str, body: JsonObject) -> None:
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
                            await post_once(part, *part.first_request)
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
