"""Concurrent clients against a proxy, plain and streamed calls, for the durability tests: each
call's response id is kept once the client has seen the whole response (a stream's `[DONE]`)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from art_proxy.store.trajectory_store import TrajectoryStore

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def art_proxy_command() -> list[str]:
    return [str(Path(sys.executable).parent / "art-proxy")]


async def run_cli(*args: str, timeout_s: float = 120) -> tuple[int, str, str]:
    """`art-proxy ARGS` as a user runs it: its exit status, standard output and error."""
    process = await asyncio.create_subprocess_exec(
        *art_proxy_command(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def wait_healthy(
    url: str, process: asyncio.subprocess.Process, timeout_s: float = 30
) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            assert process.returncode is None, "art-proxy exited during start-up"
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    raise AssertionError("art-proxy did not become healthy")


async def one_call(http: aiohttp.ClientSession, base: str, index: int) -> str:
    """One call; returns the response id once the client has seen the whole response."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"durable {index}"}],
        "stream": index % 2 == 1,
    }
    async with http.post(f"{base}/chat/completions", json=body) as response:
        assert response.status == 200
        if not body["stream"]:
            return str((await response.json())["id"])
        response_id, done = "", False
        async for line in response.content:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b"data: "):
                response_id = orjson.loads(line[6:])["id"]
        if not done:
            raise ConnectionError("stream cut before [DONE]")
        return response_id


async def load(
    base: str,
    completed: list[str],
    stop: asyncio.Event,
    *,
    clients: int,
    pause_s: float = 0.0,
) -> None:
    """`clients` concurrent clients calling until `stop` (or until the proxy is gone)."""
    async with aiohttp.ClientSession() as http:

        async def client(number: int) -> None:
            index = number
            while not stop.is_set():
                try:
                    completed.append(await one_call(http, base, index))
                except (aiohttp.ClientError, ConnectionError, AssertionError):
                    return  # the proxy is gone
                index += clients
                if pause_s:
                    await asyncio.sleep(pause_s)

        await asyncio.gather(*(client(number) for number in range(clients)))


async def until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def recorded_response_ids(store_url: str) -> Counter[str]:
    """How many recorded calls carry each response id, read straight from the store."""
    store = await TrajectoryStore.open(store_url, writer=False)
    counts: Counter[str] = Counter()
    try:
        offset = 0
        while page := await store.trajectories(limit=1000, offset=offset):
            calls = await store.calls([t.id for t in page])
            counts.update(c.response["id"] for cs in calls.values() for c in cs if c.response)
            offset += len(page)
    finally:
        await store.aclose()
    return counts


def assert_each_once(completed: list[str], recorded: Counter[str]) -> None:
    missing = set(completed) - set(recorded)
    twice = {response_id: n for response_id, n in recorded.items() if n > 1}
    assert not missing, f"{len(missing)} of {len(completed)} completed calls are not in the store"
    assert not twice, f"{len(twice)} calls are recorded more than once"
