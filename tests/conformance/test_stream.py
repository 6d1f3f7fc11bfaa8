"""Chat streams: a role chunk per choice with the prompt ids, then one choice per chunk with its
new ids, a finish chunk, the usage chunk and `[DONE]`. art-proxy rebuilds the non-stream response
from these chunks, so their ids must add up to exactly the non-stream `token_ids`."""

from __future__ import annotations

import aiohttp

from tests.conformance.upstream import (
    IDS_AND_LOGPROBS,
    Upstream,
    chat,
    chat_stream,
    is_token_ids,
)
from tests.wire_client import choice_chunks

INCLUDE_USAGE = {"stream_options": {"include_usage": True}}


async def test_stream_sends_a_role_chunk_per_choice_carrying_prompt_token_ids(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(
        http, upstream, n=2, max_tokens=4, temperature=1.0, return_token_ids=True, **INCLUDE_USAGE
    )

    roles = events[:2]
    for index, role in enumerate(roles):
        assert role["object"] == "chat.completion.chunk"
        [choice] = role["choices"]
        assert choice["index"] == index and choice["delta"]["role"] == "assistant"
        assert choice["finish_reason"] is None and choice.get("token_ids") is None
        assert is_token_ids(role["prompt_token_ids"])
    assert roles[0]["prompt_token_ids"] == roles[1]["prompt_token_ids"]
    assert len(roles[0]["prompt_token_ids"]) == events[-2]["usage"]["prompt_tokens"]
    assert all(event.get("prompt_token_ids") is None for event in events[2:-1])


async def test_stream_chunks_hold_one_choice_each_with_its_new_ids(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(
        http, upstream, n=2, max_tokens=4, temperature=1.0, **IDS_AND_LOGPROBS
    )

    for event in events[2:-1]:
        [choice] = event["choices"]
        assert is_token_ids(choice["token_ids"])
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    for index in (0, 1):
        ids = [i for chunk in choice_chunks(events, index) for i in chunk["token_ids"]]
        assert 0 < len(ids) <= 4


async def test_stream_ids_concatenate_to_the_non_stream_ids(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    # Greedy (temperature 0, fixed seed): both calls generate the same ids.
    expected = (await chat(http, upstream, **IDS_AND_LOGPROBS))["choices"][0]

    chunks = choice_chunks(await chat_stream(http, upstream, **IDS_AND_LOGPROBS), 0)

    assert [i for chunk in chunks for i in chunk["token_ids"]] == expected["token_ids"]
    streamed = [entry for chunk in chunks for entry in chunk["logprobs"]["content"]]
    assert [entry["token"] for entry in streamed] == [
        entry["token"] for entry in expected["logprobs"]["content"]
    ]
    assert chunks[-1]["finish_reason"] == expected["finish_reason"]


async def test_stream_ends_with_a_finish_chunk_a_usage_chunk_and_done(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, upstream, return_token_ids=True, **INCLUDE_USAGE)

    chunks = choice_chunks(events, 0)
    assert chunks[-1]["finish_reason"] in ("stop", "length")
    assert "stop_reason" in chunks[-1]
    assert all(chunk["finish_reason"] is None for chunk in chunks[:-1])
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    streamed = sum(len(chunk["token_ids"]) for chunk in chunks)
    assert usage_chunk["usage"]["completion_tokens"] == streamed
    assert events[-1] == "[DONE]"


async def test_stream_ids_are_null_and_usage_absent_when_not_requested(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, upstream, max_tokens=2)

    assert events[0]["prompt_token_ids"] is None
    assert all(chunk.get("token_ids") is None for chunk in choice_chunks(events, 0))
    assert all(event["choices"] and not event.get("usage") for event in events[:-1])
