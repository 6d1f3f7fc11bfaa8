"""The request local-llm tests send most, on top of `tests.wire_client`."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.wire_client import post

USER = [{"role": "user", "content": "Name a color."}]


async def chat(http: aiohttp.ClientSession, base_url: str, **fields: Any) -> dict[str, Any]:
    status, body = await post(
        http, f"{base_url}/chat/completions", {"messages": USER, "max_tokens": 8, **fields}
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body
