"""Non-stream chat: token ids where art-proxy reads them, EOS kept, one logprob per id, usage, and
the multi-turn prefix invariant that stitches a conversation's calls into one trajectory."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conformance.upstream import (
    EOS_MAX_TOKENS,
    IDS_AND_LOGPROBS,
    YES_OR_NO,
    Upstream,
    chat,
    is_token_ids,
)


def ended_by_eos(choice: dict[str, Any]) -> dict[str, Any]:
    """The choice, when EOS ended it (no stop string, no length cut); the test is skipped otherwise."""
    if choice["finish_reason"] != "stop" or choice["stop_reason"] is not None:
        pytest.skip(f"the model did not end its reply by EOS: {choice['message']['content']!r}")
    return choice


async def test_token_ids_are_null_when_not_requested(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, upstream)

    assert body["prompt_token_ids"] is None
    assert body["choices"][0]["token_ids"] is None


async def test_prompt_token_ids_are_top_level_and_token_ids_per_choice(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, upstream, return_token_ids=True)

    choice = body["choices"][0]
    assert is_token_ids(body["prompt_token_ids"]) and body["prompt_token_ids"]
    assert is_token_ids(choice["token_ids"]) and choice["token_ids"]
    assert "token_ids" not in body and "prompt_token_ids" not in choice
    assert body["usage"]["prompt_tokens"] == len(body["prompt_token_ids"])
    assert body["usage"]["completion_tokens"] == len(choice["token_ids"])


async def test_eos_id_is_last_with_its_own_logprob(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, upstream, max_tokens=EOS_MAX_TOKENS, **IDS_AND_LOGPROBS)
    choice = ended_by_eos(body["choices"][0])

    entries = choice["logprobs"]["content"]
    assert len(entries) == len(choice["token_ids"])
    eos = entries[-1]
    assert isinstance(eos["logprob"], float) and eos["logprob"] <= 0
    # EOS is generated and scored but not part of the text.
    assert eos["token"] and eos["token"] not in choice["message"]["content"]


async def test_logprobs_have_one_entry_per_token_id(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, upstream, n=2, temperature=1.0, top_logprobs=2, **IDS_AND_LOGPROBS)

    for choice in body["choices"]:
        entries = choice["logprobs"]["content"]
        assert len(entries) == len(choice["token_ids"]) > 0
        for entry in entries:
            assert {"token", "logprob", "bytes", "top_logprobs"} <= set(entry)
            assert isinstance(entry["token"], str) and entry["logprob"] <= 0
            assert len(entry["top_logprobs"]) == 2


async def test_usage_sums_completion_tokens_over_choices(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, upstream, n=2, temperature=1.0, return_token_ids=True)

    choices = body["choices"]
    assert [choice["index"] for choice in choices] == [0, 1]
    usage = body["usage"]
    assert usage["completion_tokens"] == sum(len(choice["token_ids"]) for choice in choices)
    assert usage["prompt_tokens"] == len(body["prompt_token_ids"])  # counted once, not per choice
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_tool_calls_key_is_absent_when_there_are_none(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    message = (await chat(http, upstream))["choices"][0]["message"]

    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert "tool_calls" not in message


async def test_second_turn_prompt_extends_first_prompt_and_completion_ids(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    first = await chat(http, upstream, max_tokens=EOS_MAX_TOKENS, return_token_ids=True)
    reply = ended_by_eos(first["choices"][0])
    messages = [
        *YES_OR_NO,
        {"role": "assistant", "content": reply["message"]["content"]},
        {"role": "user", "content": "Why?"},
    ]

    second = await chat(http, upstream, messages=messages, max_tokens=1, return_token_ids=True)

    turn = first["prompt_token_ids"] + reply["token_ids"]
    assert second["prompt_token_ids"][: len(turn)] == turn
    assert len(second["prompt_token_ids"]) > len(turn)
