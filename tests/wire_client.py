"""HTTP helpers for tests that talk to a vLLM-compatible server (the fake, local-llm, real vLLM)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any] | bytes
) -> tuple[int, Any]:
    """Status and body (JSON-decoded where it is JSON, else text)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    async with http.post(url, data=data, headers=headers) as response:
        text = await response.text()
        try:
            return response.status, orjson.loads(text)
        except orjson.JSONDecodeError:
            return response.status, text


async def stream_events(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    """Each `data:` event in order, JSON-decoded, with the final "[DONE]" kept as a string."""
    async with http.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = await response.text()
    assert raw.endswith("\n\n")
    events: list[Any] = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events


def choice_chunks(events: list[Any], index: int) -> list[dict[str, Any]]:
    """The stream choices of one index after its role chunk, in order."""
    return [
        choice
        for event in events
        if isinstance(event, dict)
        for choice in event.get("choices") or []
        if choice["index"] == index and "role" not in choice["delta"]
    ]


async def admin_get(http: aiohttp.ClientSession, proxy: Any, path: str) -> Any:
    """GET `/art/v1{path}` of a running proxy (`proxy.root_url`), expecting a 200."""
    async with http.get(f"{proxy.root_url}/art/v1{path}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def steady_load(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    served: list[str],
    failures: list[str],
    *,
    pause_s: float = 0.0,
) -> None:
    """An agent calling `model` until cancelled: the model that served each 200 goes to
    `served`, every other answer to `failures`."""
    body = {"model": model, "messages": [{"role": "user", "content": "load"}], "max_tokens": 2}
    while True:
        async with http.post(f"{base_url}/chat/completions", json=body) as response:
            if response.status != 200:
                failures.append(f"{response.status}: {await response.text()}")
            else:
                served.append((await response.json())["model"])
        await asyncio.sleep(pause_s)
