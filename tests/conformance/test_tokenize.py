"""`POST /tokenize` (at the server's root): art-proxy counts an Anthropic `count_tokens` request
with it, so the chat form must give exactly the ids a chat call's prompt has, tools included."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conformance.upstream import (
    WEATHER_TOOL,
    YES_OR_NO,
    Upstream,
    assert_vllm_error,
    chat,
    is_token_ids,
)
from tests.wire_client import post


def tokenize_url(upstream: Upstream) -> str:
    return upstream.base_url.removesuffix("/v1") + "/tokenize"


@pytest.mark.parametrize("tools", [None, [WEATHER_TOOL]], ids=["no-tools", "a-tool"])
async def test_tokenize_gives_the_ids_of_a_chat_calls_prompt(
    upstream: Upstream, http: aiohttp.ClientSession, tools: list[dict[str, Any]] | None
) -> None:
    offered = {"tools": tools} if tools else {}
    status, counted = await post(
        http, tokenize_url(upstream), {"model": upstream.model, "messages": YES_OR_NO, **offered}
    )
    assert status == 200, counted
    answered = await chat(http, upstream, return_token_ids=True, max_tokens=1, **offered)

    assert is_token_ids(counted["tokens"])
    assert counted["tokens"] == answered["prompt_token_ids"]
    assert counted["count"] == len(counted["tokens"]) == answered["usage"]["prompt_tokens"]
    assert isinstance(counted["max_model_len"], int) and counted["max_model_len"] > 0


async def test_tokenize_of_a_model_not_served_is_a_404(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    status, body = await post(
        http, tokenize_url(upstream), {"model": "no-such-model", "messages": YES_OR_NO}
    )
    assert status == 404
    assert_vllm_error(body, 404)
