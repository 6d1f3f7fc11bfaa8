"""Loopback for fakes, tests and benchmarks: serve an aiohttp app on 127.0.0.1 at a free port,
or find a free port for a server started as its own process and ask whether it answers yet."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
from aiohttp import web


@asynccontextmanager
async def serving(app: web.Application, *, shutdown_timeout: float = 1.0) -> AsyncIterator[str]:
    """`app` served for the duration of the block; yields its root URL, `http://127.0.0.1:PORT`.

    `shutdown_timeout` is short: a test that leaves a stream open must not hold up teardown for
    aiohttp's default minute."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (another process may still take it
    before the server that is given it binds: fine for tests on one machine)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def answers_health(url: str) -> bool:
    """Whether `url` answers 200 now (False while the server there is still starting)."""
    with (
        contextlib.suppress(urllib.error.URLError, OSError),
        urllib.request.urlopen(url, timeout=2) as response,
    ):
        return bool(response.status == 200)
    return False


async def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Until `url` answers 200; for a script that started `process` to serve it, a one-line
    SystemExit when the process exits first or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"{process.args!r} exited with status {process.returncode}")
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5)
    raise SystemExit(f"{url} was not healthy after {timeout_s:.0f} s")
