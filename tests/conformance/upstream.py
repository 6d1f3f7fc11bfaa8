"""What the conformance suite knows about an upstream, and the few requests it sends to one.

Every request names the model explicitly and is greedy, so a stream and a non-stream call of the
same request generate the same ids, and short, so a CPU upstream answers quickly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.wire_client import post, stream_events

# A question small models answer in a word, then end their turn: EOS within a few tokens.
YES_OR_NO = [{"role": "user", "content": "Answer yes or no: is the sky blue?"}]
MAX_TOKENS = 8
# Room to end the turn for a model that answers in a sentence (and for the fake's reply); a model
# that answers in a word stops long before.
EOS_MAX_TOKENS = 16
GREEDY = {"temperature": 0, "seed": 0}
IDS_AND_LOGPROBS = {"return_token_ids": True, "logprobs": True}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@dataclass(frozen=True)
class Upstream:
    """One vLLM-compatible server under test."""

    base_url: str  # "http://HOST:PORT/v1"
    model: str  # served name of the base model
    adapter_path: str | None  # a LoRA adapter it can load (None: LoRA tests are skipped)
    # The `tool_choice` under which the model calls the tool it is offered ("auto": unasked;
    # "required": vLLM forces a call; None: it cannot be made to, and the tool-call tests skip).
    tool_choice: str | None


def chat_body(upstream: Upstream, **fields: Any) -> dict[str, Any]:
    return {
        "model": upstream.model,
        "messages": YES_OR_NO,
        "max_tokens": MAX_TOKENS,
        **GREEDY,
        **fields,
    }


async def chat(http: aiohttp.ClientSession, upstream: Upstream, **fields: Any) -> dict[str, Any]:
    """A non-stream chat reply that must succeed; `fields` override the defaults."""
    status, body = await post(
        http, f"{upstream.base_url}/chat/completions", chat_body(upstream, **fields)
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def chat_stream(http: aiohttp.ClientSession, upstream: Upstream, **fields: Any) -> list[Any]:
    """Each event of a streamed chat reply, JSON-decoded, ending with the string "[DONE]"."""
    return await stream_events(
        http, f"{upstream.base_url}/chat/completions", chat_body(upstream, **fields)
    )


async def model_cards(http: aiohttp.ClientSession, upstream: Upstream) -> list[dict[str, Any]]:
    async with http.get(f"{upstream.base_url}/models") as response:
        assert response.status == 200
        listing = await response.json()
    cards = listing["data"]
    assert isinstance(cards, list)
    return cards


def is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    )


def assert_vllm_error(body: Any, status: int) -> dict[str, Any]:
    """vLLM's error body: `{"error": {"message", "type", "param", "code"}}`, `code` = status."""
    assert isinstance(body, dict) and list(body) == ["error"], body
    error = body["error"]
    assert isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"]
    assert error["code"] == status
    return error
