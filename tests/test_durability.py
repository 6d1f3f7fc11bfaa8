"""Durability: a call whose response reached the client is in the store, even after SIGKILL.

The proxy runs as a real `art-proxy serve` process under concurrent load (plain and streamed calls),
is killed with SIGKILL mid-load, and every response id a client saw complete must be recorded.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy.testing.loopback import free_port

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
CLIENTS = 16
# Completed calls before the kill: enough that several group commits are in flight.
ENOUGH = 200


def art_proxy_command() -> list[str]:
    return [str(Path(sys.executable).parent / "art-proxy")]


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


async def load(base: str, completed: list[str], enough: asyncio.Event, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as http:

        async def client(number: int) -> None:
            index = number
            while not stop.is_set():
                try:
                    completed.append(await one_call(http, base, index))
                    if len(completed) >= ENOUGH:
                        enough.set()
                except (aiohttp.ClientError, ConnectionError, AssertionError):
                    return  # the proxy is gone
                index += CLIENTS

        await asyncio.gather(*(client(number) for number in range(CLIENTS)))


async def test_every_completed_call_survives_sigkill(store_url: str, vllm: FakeVllm) -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *art_proxy_command(),
        "serve",
        "--upstream",
        vllm.base_url,
        "--store",
        store_url,
        "--port",
        str(port),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "ART_PROXY_IDLE_TIMEOUT": "0"},
    )
    try:
        await wait_healthy(f"http://127.0.0.1:{port}/health", process)
        completed: list[str] = []
        enough, stop = asyncio.Event(), asyncio.Event()
        load_task = asyncio.create_task(
            load(f"http://127.0.0.1:{port}/v1", completed, enough, stop)
        )
        await asyncio.wait_for(enough.wait(), timeout=60)
        process.send_signal(signal.SIGKILL)
        await asyncio.wait_for(process.wait(), timeout=10)
        stop.set()
        await asyncio.wait_for(load_task, timeout=30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    store = await TrajectoryStore.open(store_url, writer=False)
    try:
        recorded: set[str] = set()
        offset = 0
        while page := await store.trajectories(limit=1000, offset=offset):
            calls = await store.calls([t.id for t in page])
            recorded |= {c.response["id"] for cs in calls.values() for c in cs if c.response}
            offset += len(page)
    finally:
        await store.aclose()
    missing = set(completed) - recorded
    assert len(completed) >= ENOUGH
    assert not missing, f"{len(missing)} of {len(completed)} completed calls are not in the store"
