"""Small HTTP helpers for talking to a local-llm server in tests."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

USER = [{"role": "user", "content": "Name a color."}]


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


async def chat(http: aiohttp.ClientSession, base_url: str, **fields: Any) -> dict[str, Any]:
    status, body = await post(
        http, f"{base_url}/chat/completions", {"messages": USER, "max_tokens": 8, **fields}
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def stream_events(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[Any]:
    """Each `data:` event in order, JSON-decoded, with the final "[DONE]" kept as a string."""
    async with http.post(url, json={**body, "stream": True}) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = await response.text()
    events: list[Any] = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block.removeprefix("data: ")
        events.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return events
