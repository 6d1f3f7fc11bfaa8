"""Tool calls, where the upstream makes one: the parsed shape art-proxy records, and a stream whose
chunks still carry every id while the parser holds the markup back (`"delta": {}` chunks).

A model that answers text instead skips these tests: only the shape of a call is pinned."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.conformance.upstream import (
    IDS_AND_LOGPROBS,
    WEATHER_TOOL,
    Upstream,
    chat,
    chat_stream,
)
from tests.wire_client import choice_chunks

# Room for a hermes `<tool_call>{...}</tool_call>` and its EOS.
TOOL_CALL_MAX_TOKENS = 64


def weather_request(upstream: Upstream) -> dict[str, Any]:
    if upstream.tool_choice is None:
        pytest.skip(f"{upstream.model} cannot be made to call tools here")
    return {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": upstream.tool_choice,
        "max_tokens": TOOL_CALL_MAX_TOKENS,
        **IDS_AND_LOGPROBS,
    }


def tool_call_choice(body: dict[str, Any]) -> dict[str, Any]:
    choice = body["choices"][0]
    if not choice["message"].get("tool_calls"):
        pytest.skip(f"the model answered text: {choice['message']['content']!r}")
    assert isinstance(choice, dict)
    return choice


async def test_a_tool_call_is_parsed_with_an_id_a_name_and_json_arguments(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    choice = tool_call_choice(await chat(http, upstream, **weather_request(upstream)))

    assert choice["finish_reason"] == "tool_calls"
    for call in choice["message"]["tool_calls"]:
        assert isinstance(call["id"], str) and call["id"]
        assert call["type"] == "function"
        assert call["function"]["name"] == "get_weather"
        # A JSON text (SmolLM2 under vLLM writes `"Paris"` where the schema asks for an object:
        # `required` picks a tool but does not constrain its arguments).
        json.loads(call["function"]["arguments"])
    # The markup's ids are kept, EOS included, each with its logprob.
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])


async def test_a_streamed_tool_call_carries_every_id_and_names_the_call_once(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    request = weather_request(upstream)
    expected = tool_call_choice(await chat(http, upstream, **request))

    chunks = choice_chunks(await chat_stream(http, upstream, **request), 0)

    assert [i for chunk in chunks for i in chunk["token_ids"]] == expected["token_ids"]
    fragments = [f for chunk in chunks for f in chunk["delta"].get("tool_calls") or []]
    assert all(isinstance(fragment["index"], int) for fragment in fragments)
    first, *rest = [fragment for fragment in fragments if fragment["index"] == 0]
    assert first["id"] and first["type"] == "function"
    assert first["function"]["name"] == "get_weather"
    for fragment in rest:
        assert fragment.get("id") is None and fragment.get("type") is None
        assert fragment.get("function", {}).get("name") is None
    arguments = "".join(f.get("function", {}).get("arguments") or "" for f in [first, *rest])
    # The same arguments: vLLM streams them as the model wrote them (a model shown the tools may
    # indent its JSON) and re-serialises them in a whole answer.
    whole = expected["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(arguments) == json.loads(whole)
    assert chunks[-1]["finish_reason"] == "tool_calls"
