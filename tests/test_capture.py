"""Token capture: what is asked upstream, what the client gets back, and text-only upstreams."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from art_proxy.proxy.capture import strip_chunk, strip_response, tokens_of, upstream_body
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.proxy.stream_rebuild import StreamRecorder
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def test_upstream_is_asked_for_token_ids_logprobs_and_usage() -> None:
    sent, asks = upstream_body(
        {"messages": [], "stream": True, "stream_options": {"continuous_usage_stats": True}},
        "chat",
        token_ids=True,
    )
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    assert sent["stream_options"] == {"continuous_usage_stats": True, "include_usage": True}
    assert not (asks.token_ids or asks.logprobs or asks.usage_chunk)


def test_legacy_completions_ask_for_the_sampled_logprob_only_when_the_client_did_not() -> None:
    sent, asks = upstream_body({"prompt": "x"}, "completion", token_ids=True)
    assert sent["logprobs"] == 0 and not asks.logprobs
    sent, asks = upstream_body({"prompt": "x", "logprobs": 3}, "completion", token_ids=True)
    assert sent["logprobs"] == 3 and asks.logprobs


def test_client_response_loses_what_it_did_not_ask_for() -> None:
    _, asks = upstream_body({"messages": []}, "chat", token_ids=True)
    response = {
        "id": "x",
        "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "token_ids": [3], "logprobs": {"content": []}}],
    }
    stripped = strip_response(response, asks)
    assert "prompt_token_ids" not in stripped
    assert stripped["choices"] == [{"index": 0, "logprobs": None}]
    assert response["prompt_token_ids"] == [1, 2], "the recorded original stays whole"


def test_usage_chunk_is_dropped_unless_asked() -> None:
    _, asks = upstream_body({"messages": [], "stream": True}, "chat", token_ids=True)
    assert strip_chunk({"choices": [], "usage": {"total_tokens": 3}}, asks) is None
    error = {"error": {"message": "boom"}}
    assert strip_chunk(error, asks) == error


def test_stream_recorder_keeps_ids_of_empty_delta_chunks() -> None:
    recorder = StreamRecorder("chat")
    chunks: list[dict[str, Any]] = [
        {
            "id": "c",
            "model": "m",
            "prompt_token_ids": [1],
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        },
        {
            "id": "c",
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "token_ids": [7, 8],
                    "logprobs": {"content": [{"logprob": -1.0}, {"logprob": -2.0}]},
                }
            ],
        },
        {
            "id": "c",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "hi"},
                    "token_ids": [9],
                    "logprobs": {"content": [{"logprob": -3.0}]},
                    "finish_reason": "stop",
                }
            ],
        },
        {"id": "c", "choices": [], "usage": {"total_tokens": 4}},
    ]
    for chunk in chunks:
        recorder.add(chunk)
    rebuilt = recorder.response()
    assert rebuilt["prompt_token_ids"] == [1]
    assert rebuilt["choices"][0]["token_ids"] == [7, 8, 9]
    assert rebuilt["choices"][0]["message"]["content"] == "hi"
    assert rebuilt["usage"] == {"total_tokens": 4}


def test_a_stream_that_lost_chunks_is_recorded_but_not_trainable() -> None:
    """vLLM issue 27482: chunks dropped with their ids and logprobs; usage still counts them."""

    def chunk(ids: list[int], **extra: Any) -> dict[str, Any]:
        logprobs = {"content": [{"logprob": -1.0} for _ in ids]}
        choice = {"index": 0, "delta": {}, "token_ids": ids, "logprobs": logprobs, **extra}
        return {"id": "c", "choices": [choice]}

    role = {"id": "c", "prompt_token_ids": [1], "choices": [{"index": 0, "delta": {}}]}
    usage = {"id": "c", "choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 1}}
    for chunks, trainable in (
        ([role, chunk([7, 8]), chunk([9], finish_reason="stop"), usage], True),
        ([role, chunk([9], finish_reason="stop"), usage], False),  # [7, 8] never arrived
    ):
        recorder = StreamRecorder("chat")
        for each in chunks:
            recorder.add(each)
        tokens = tokens_of(recorder.response(), "chat")
        assert tokens.trainable is trainable
        assert tokens.logprobs is not None  # what did arrive is kept, aligned


@pytest.fixture
async def hosted_api() -> AsyncIterator[str]:
    """An upstream like a hosted API: it rejects vLLM's `return_token_ids` as OpenAI does."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        if "return_token_ids" in body:
            error = {
                "error": {
                    "message": "Unrecognized request argument supplied: return_token_ids",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": None,
                }
            }
            return web.json_response(error, status=400)
        reply = {
            "id": "chatcmpl-hosted",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hosted answer"},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
        return web.json_response(reply)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()


async def test_upstream_without_token_ids_is_recorded_as_text_not_trainable(
    sqlite_url: str, hosted_api: str
) -> None:
    async with (
        running_proxy(proxy_settings(sqlite_url, hosted_api)) as proxy,
        openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client,
    ):
        for _ in range(2):  # the second call goes straight to the text-only request
            reply = await client.chat.completions.create(
                model="gpt-x", messages=[{"role": "user", "content": "hi"}]
            )
            assert reply.choices[0].message.content == "hosted answer"
        await proxy.parts.settled()
        trajectories = await proxy.parts.store.trajectories()
        await proxy.parts.settled()
        calls = await proxy.parts.store.calls([t.id for t in trajectories])
    recorded = [call for found in calls.values() for call in found]
    assert len(recorded) == 2
    for call in recorded:
        assert call.status == "ok" and not call.trainable
        assert call.prompt_token_ids is None
        assert call.response is not None
        assert call.response["choices"][0]["message"]["content"] == "hosted answer"


async def test_many_calls_that_learn_at_once_that_the_upstream_has_no_token_ids_say_it_once(
    sqlite_url: str, hosted_api: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`art-proxy eval` in front of a hosted model sends 16 calls at once: one warning, not 16."""
    async with (
        running_proxy(proxy_settings(sqlite_url, hosted_api)) as proxy,
        openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client,
    ):
        with caplog.at_level(logging.WARNING):
            await asyncio.gather(
                *(
                    client.chat.completions.create(
                        model="gpt-x", messages=[{"role": "user", "content": f"hi {n}"}]
                    )
                    for n in range(8)
                )
            )
    said = [r for r in caplog.records if "returns no token ids" in r.getMessage()]
    assert len(said) == 1


async def test_unknown_request_fields_reach_the_upstream(
    sqlite_proxy: RunningProxy, vllm: FakeVllm
) -> None:
    async with aiohttp.ClientSession() as http:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"},
            "top_k": 5,
            "some_future_field": {"x": 1},
        }
        async with http.post(f"{sqlite_proxy.base_url}/chat/completions", json=body) as response:
            assert response.status == 200
    sent = vllm.requests[-1]
    assert sent["some_future_field"] == {"x": 1} and sent["top_k"] == 5
    assert sent["response_format"] == {"type": "json_object"}
    await sqlite_proxy.parts.settled()
    trajectory = (await sqlite_proxy.parts.store.trajectories())[0]
    await sqlite_proxy.parts.settled()
    whole = await sqlite_proxy.parts.store.trajectory(trajectory.id)
    assert whole is not None and whole.calls is not None
    assert whole.calls[0].sampling == {"top_k": 5}
    assert whole.calls[0].request == body


async def test_stream_chunks_reach_the_client_before_the_upstream_finishes(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    """Relayed as they arrive: the first chunk is read while the call is still unrecorded."""
    from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm

    async with (
        running_fake_vllm(FakeVllmConfig(chunk_delay_s=0.05)) as slow,
        running_proxy(proxy_settings(sqlite_url, slow.base_url)) as proxy,
    ):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with http.post(f"{proxy.base_url}/chat/completions", json=body) as response:
            first = await response.content.readline()
            assert first.startswith(b"data: ")
            assert proxy.parts.counters.calls == 0, "the stream must not be buffered whole"
            rest = await response.read()
        assert rest.rstrip().endswith(b"data: [DONE]")
        assert proxy.parts.counters.calls == 1


def test_incremental_keys_equal_the_keys_of_whole_prefixes() -> None:
    from art_proxy.proxy.attribution import continuation_candidates, conversation_key, reply_keys

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u2"},
    ]
    assert continuation_candidates(messages) == [
        conversation_key(messages[:5]),
        conversation_key(messages[:3]),
    ]
    replies = [{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]
    assert reply_keys(messages, replies) == [
        conversation_key([*messages, reply]) for reply in replies
    ]


@pytest.mark.parametrize(
    "roles",
    [
        ["user"],
        ["system", "user", "assistant", "tool", "assistant", "user"],
        ["assistant", "user", "assistant", "user"],  # a greeting belongs to the opening
        ["system", "assistant", "assistant"],  # no user: the whole conversation opens
    ],
)
def test_one_pass_over_a_conversation_gives_every_key_the_separate_hashes_give(
    roles: list[str],
) -> None:
    """Attribution and the record hash a call's messages once (`conversation_of`): each key must
    be the one hashing its messages alone gives."""
    from art_proxy.proxy.attribution import (
        auto_scenario_id,
        candidates,
        conversation_key,
        conversation_of,
        opening_of,
    )

    messages: list[dict[str, Any]] = [
        {"role": role, "content": f"{role} {position}"} for position, role in enumerate(roles)
    ]
    conversation = conversation_of(messages)
    assert conversation.scenario_id == auto_scenario_id(messages)
    assert conversation.opening_key == conversation_key(opening_of(messages))
    assert conversation.prompt_key == conversation_key(messages)
    assert [(c.position, c.key, c.prompt_key) for c in conversation.candidates] == [
        (p, conversation_key(messages[: p + 1]), conversation_key(messages[:p]))
        for p in reversed(range(len(roles)))
        if roles[p] == "assistant"
    ]
    assert conversation.candidates == candidates(messages)
    reply = {"role": "assistant", "content": "the reply"}
    assert conversation.reply_keys([reply]) == [conversation_key([*messages, reply])]
    assert conversation.prompt_key == conversation_key(messages)  # reply_keys fed a copy


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"temperature": 0.7, "top_p": 0.9, "top_k": 20}, None),
        ({"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}}, None),
        ({"tools": [WEATHER_TOOL], "tool_choice": "auto"}, None),
        (
            {
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            },
            None,  # the trainer replays vLLM's structural tag (tests/test_real_vllm.py)
        ),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, None),
        # Replayed by the trainer (art_proxy.guided_decoding; tests/test_real_vllm.py scores it).
        ({"response_format": {"type": "json_object"}}, None),
        (
            {
                "tools": [
                    {"type": "function", "function": {"name": "get_weather", "strict": True}}
                ],
                "response_format": {"type": "json_object"},
            },
            None,  # a tool call or the structured output: replayed too
        ),
        # Removed from vLLM 0.32, which ignores it: the output is unconstrained.
        ({"guided_regex": "[a-z]+"}, None),
        # The trainer applies these as vLLM does (tests/test_real_vllm.py scores them).
        ({"min_p": 0.1, "repetition_penalty": 1.1, "presence_penalty": 0.5}, None),
        ({"frequency_penalty": 0.5, "logit_bias": {"5": 10}}, None),
        ({"min_tokens": 4, "allowed_token_ids": [1, 2, 3]}, None),
        ({"bad_words": ["rain"]}, None),
    ],
    ids=[
        "reproduced",
        "off-values",
        "tools-auto",
        "named-tool",
        "required-tool",
        "json",
        "strict-tools-and-json",
        "removed-guided-field",
        "min-p-and-penalties",
        "frequency-and-logit-bias",
        "min-tokens-and-allowed-ids",
        "bad-words",
    ],
)
async def test_sampling_the_trainer_cannot_reproduce_is_recorded_not_trainable_with_its_reason(
    sqlite_proxy: RunningProxy,
    http: aiohttp.ClientSession,
    fields: dict[str, Any],
    reason: str | None,
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        **fields,
    }
    async with http.post(sqlite_proxy.base_url + "/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
    await sqlite_proxy.parts.settled()
    [trajectory] = await sqlite_proxy.parts.store.trajectories()
    await sqlite_proxy.parts.settled()
    whole = await sqlite_proxy.parts.store.trajectory(trajectory.id)
    assert whole is not None and whole.calls is not None
    [call] = whole.calls
    assert (call.trainable, call.untrainable_reason) == (reason is None, reason)
    assert call.completion_token_ids is not None  # the tokens are kept all the same
    async with http.get(sqlite_proxy.root_url + "/health") as health:
        assert (await health.json())["untrainable_calls"] == (0 if reason is None else 1)
    async with http.get(sqlite_proxy.root_url + f"/dashboard/trajectories/{trajectory.id}") as page:
        shown = await page.text()
    assert reason is None or reason in shown
