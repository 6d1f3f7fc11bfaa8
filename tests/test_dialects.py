"""The Responses and Anthropic Messages APIs, spoken by the proxy over chat completions.

Driven by the `openai` and `anthropic` SDKs themselves against the proxy and the fake vLLM: what
the SDKs parse is the wire format, and the records must be chat calls with token ids whatever the
dialect. Bad input is refused in the dialect's own error shape, naming the field, and recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import anthropic
import openai
import pytest
from openai.types.responses import FunctionToolParam, ResponseInputParam

from art_proxy.ids import made_at_s, new_id
from art_proxy.journal import ingester
from art_proxy.proxy import lookups
from art_proxy.proxy.dialects import responses
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import CallRecord
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, ScriptedCall, running_fake_vllm
from art_proxy_trainer.batch import TrajectorySample, build_batch
from tests.conformance.upstream import WEATHER_TOOL
from tests.conftest import proxy_settings, trajectories

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
ANSWER = "It is sunny."
# The chat tool of the conformance suite, in the Responses API's flat form.
_FUNCTION = cast(dict[str, Any], WEATHER_TOOL["function"])
WEATHER: FunctionToolParam = {
    "type": "function",
    "name": _FUNCTION["name"],
    "description": _FUNCTION["description"],
    "parameters": _FUNCTION["parameters"],
    "strict": True,
}


@pytest.fixture
async def vllm() -> AsyncIterator[FakeVllm]:
    config = FakeVllmConfig(
        answer_after_tool=ANSWER,
        tool_script=(ScriptedCall(name="get_weather", arguments={"city": "Paris"}),),
    )
    async with running_fake_vllm(config) as fake:
        yield fake


@pytest.fixture
async def client(proxy: RunningProxy) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as opened:
        yield opened


async def only_calls(proxy: RunningProxy) -> list[CallRecord]:
    [trajectory] = await trajectories(proxy)
    assert trajectory.calls is not None
    return trajectory.calls


# --- Responses ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_tool_loop_with_previous_response_id(
    proxy: RunningProxy, client: openai.AsyncOpenAI, stream: bool
) -> None:
    async def create(**fields: Any) -> openai.types.responses.Response:
        settings = {"model": MODEL, "tools": [WEATHER], "instructions": "Be brief.", **fields}
        if not stream:
            response: openai.types.responses.Response = await client.responses.create(**settings)
            return response
        async with client.responses.stream(**settings) as events:
            async for _ in events:
                pass
            return await events.get_final_response()

    async def run() -> openai.types.responses.Response:
        first = await create(input="Weather in Paris?")
        [call] = first.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert call.arguments == '{"city": "Paris"}' and first.status == "completed"
        assert first.usage is not None and first.usage.input_tokens > 0
        second = await create(
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        )
        assert second.output_text == ANSWER and second.previous_response_id == first.id
        return first

    first = await run()
    await run()
    recorded = await trajectories(proxy)
    assert len(recorded) == 2 and len({t.group_id for t in recorded}) == 1
    for trajectory in recorded:
        calls = trajectory.calls or []
        assert [(c.seq, c.attribution, c.dialect, c.stream) for c in calls] == [
            (0, "new", "responses", stream),
            (1, "response", "responses", stream),
        ]
        assert calls[1].stitched and calls[1].trainable and calls[1].completion_token_ids
        # The chain is rebuilt as chat messages: instructions, question, tool call, tool result.
        roles = [message["role"] for message in calls[1].request["messages"]]
        assert roles == ["system", "user", "assistant", "tool"]
    stored = await client.responses.retrieve(first.id)
    assert stored.id == first.id
    assert [item.model_dump() for item in stored.output] == [
        item.model_dump(exclude={"parsed_arguments"}) for item in first.output
    ]


async def test_a_dialect_trajectory_exports_and_batches_as_a_chat_one(
    proxy: RunningProxy, claude: anthropic.AsyncAnthropic
) -> None:
    """Nothing downstream knows the dialect: the export's conversation and the trainer's batch
    come from the chat body and the ids, as for any chat call."""
    messages: list[anthropic.types.MessageParam] = [{"role": "user", "content": "Weather?"}]
    tools: list[anthropic.types.ToolParam] = [
        {"name": "get_weather", "input_schema": _FUNCTION["parameters"]}
    ]
    first = await claude.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=tools)
    [use] = first.content
    assert use.type == "tool_use"
    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    await claude.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=tools)
    await proxy.parts.settled()
    [exported] = [
        line async for line in proxy.parts.store.export(scenario=None, status=None, split=None)
    ]
    assert [m["role"] for m in exported.messages] == ["user", "assistant", "tool", "assistant"]
    assert exported.messages[-1]["content"] == ANSWER and exported.trainable
    calls = exported.trajectory.calls or []
    batch = build_batch([TrajectorySample(exported.trajectory.id, calls, 1.0)])
    # One sequence: the second call extends the first, so both replies are trained in place.
    assert batch.tokens_B_T.shape[0] == 1
    completions = [c.completion_token_ids[0] for c in calls if c.completion_token_ids]
    assert len(completions) == 2 and int(batch.mask_B_T.sum()) == sum(map(len, completions))


async def test_a_chain_continues_across_proxy_restarts(
    store_url: str, vllm: FakeVllm, proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    first = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
    [call] = first.output
    assert call.type == "function_call"
    # Another proxy on the same store (a restart, or a second replica) continues the chain.
    async with (
        running_proxy(proxy_settings(store_url, vllm.base_url)) as other,
        openai.AsyncOpenAI(base_url=other.base_url, api_key="unused") as other_client,
    ):
        second = await other_client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
            tools=[WEATHER],
        )
        assert second.output_text == ANSWER
        calls = await only_calls(other)
    assert [call.attribution for call in calls] == ["new", "response"]
    assert calls[1].stitched


async def test_a_chain_continues_on_a_second_proxy_before_the_first_has_stored_its_answer(
    store_url: str,
    vllm: FakeVllm,
    proxy: RunningProxy,
    client: openai.AsyncOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Behind a load balancer the next call of a chain, and a read of the response it names, can
    reach another replica before the one that answered has ingested its answer: they wait for it
    instead of answering 400 and 404, also when the answer took longer than the wait (an id is
    made when its call arrives)."""
    monkeypatch.setattr(lookups, "OTHER_PROXY_WAIT_S", 4.0)
    monkeypatch.setattr(ingester, "_LINGER_S", 6.0)  # the store gets the first proxy's calls late
    first = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
    other_first = await client.responses.create(model=MODEL, input="Weather in Lyon?")
    [call] = first.output
    assert call.type == "function_call"
    async with (
        running_proxy(proxy_settings(store_url, vllm.base_url)) as other,
        openai.AsyncOpenAI(base_url=other.base_url, api_key="unused") as other_client,
    ):
        call_id = responses.call_id_of(first.id)
        made_at = made_at_s(call_id or "")
        assert call_id is not None and made_at is not None
        assert await other.parts.store.call_row(call_id) is None
        # The ids are older than the wait by now, as after a long answer; still not stored.
        await asyncio.sleep(max(0.0, made_at + 4.5 - time.time()))
        second, fetched = await asyncio.gather(
            other_client.responses.create(
                model=MODEL,
                previous_response_id=first.id,
                input=[
                    {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
                ],
                tools=[WEATHER],
            ),
            other_client.responses.retrieve(other_first.id),
        )
    assert second.output_text == ANSWER
    assert fetched.id == other_first.id and fetched.output_text == other_first.output_text


async def test_a_response_id_that_never_comes_is_refused_once_its_wait_is_over(
    proxy: RunningProxy, client: openai.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lookups, "OTHER_PROXY_WAIT_S", 0.5)
    unknown = f"resp_{new_id()}"  # made just now, by no proxy
    with pytest.raises(openai.BadRequestError, match="not found"):
        await client.responses.create(model=MODEL, previous_response_id=unknown, input="and?")
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unknown)


async def test_an_old_id_or_one_past_the_waiting_bound_is_refused_without_waiting(
    proxy: RunningProxy, client: openai.AsyncOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An id made longer ago than an answer can take (the upstream's timeout, 600 s here) is not
    on its way; nor is any while `_MAX_WAITING` lookups wait. Waiting would take 120 s here."""
    monkeypatch.setattr(lookups, "OTHER_PROXY_WAIT_S", 120.0)
    an_hour_ago = f"{(time.time_ns() // 1_000_000 - 3_600_000):012x}" + new_id()[12:]
    with pytest.raises(openai.BadRequestError, match="not found"):
        await asyncio.wait_for(
            client.responses.create(
                model=MODEL, previous_response_id=f"resp_{an_hour_ago}", input="?"
            ),
            30,
        )
    monkeypatch.setattr(lookups, "_MAX_WAITING", 0)
    with pytest.raises(openai.NotFoundError):
        await asyncio.wait_for(client.responses.retrieve(f"resp_{new_id()}"), 30)


async def test_responses_input_tokens_is_the_prompt_a_responses_call_gets(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    """The SDK's `responses.input_tokens.count` is answered by the upstream's `/tokenize` with the
    prompt the same request gets through `/v1/responses`, instructions, tools and a previous
    response's conversation included; a count is not recorded."""
    prompt: dict[str, Any] = {
        "model": MODEL,
        "instructions": "Be brief.",
        "input": "Weather in Paris?",
        "tools": [WEATHER],
    }
    counted = await client.responses.input_tokens.count(**prompt)
    first = await client.responses.create(**prompt)
    [tool_call] = first.output
    assert tool_call.type == "function_call"
    result = {"type": "function_call_output", "call_id": tool_call.call_id, "output": "sunny"}
    follow_up = {**prompt, "input": [result], "previous_response_id": first.id}
    counted_after = await client.responses.input_tokens.count(**follow_up)
    await client.responses.create(**follow_up)

    assert counted.object == "response.input_tokens"
    assert first.usage is not None and counted.input_tokens == first.usage.input_tokens > 0
    calls = await only_calls(proxy)
    assert [len(call.prompt_token_ids or []) for call in calls] == [
        counted.input_tokens,
        counted_after.input_tokens,
    ]
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.input_tokens.count(model=MODEL, input="Hi", conversation="c1")
    assert "conversation" in str(refused.value.body)
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.responses.input_tokens.count(**{**prompt, "model": "no-such-model"})
    assert "no-such-model" in str(unknown.value.body)


async def test_full_history_input_continues_by_its_messages(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    """What the Agents SDK sends by default: the whole history as items, each turn."""
    items: ResponseInputParam = [{"role": "user", "content": "Weather in Paris?"}]
    first = await client.responses.create(model=MODEL, input=items, tools=[WEATHER])
    items += [item.model_dump(exclude_none=True) for item in first.output]  # type: ignore[misc]
    [call] = first.output
    assert call.type == "function_call"
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    second = await client.responses.create(model=MODEL, input=items, tools=[WEATHER])
    assert second.output_text == ANSWER
    calls = await only_calls(proxy)
    assert [call.attribution for call in calls] == ["new", "continuation"]
    assert calls[1].stitched


async def test_responses_stream_event_sequence(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    events = [
        event.type
        async for event in await client.responses.create(
            model=MODEL, input="Weather in Paris?", tools=[WEATHER], stream=True
        )
    ]
    assert events[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in events
    assert events[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]


async def test_max_output_tokens_makes_an_incomplete_response(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    response = await client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    [call] = await only_calls(proxy)
    assert call.request["max_tokens"] == 2
    assert call.completion_token_ids is not None and len(call.completion_token_ids[0]) == 2


async def test_store_false_responses_are_not_kept_for_later(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    first = await client.responses.create(model=MODEL, input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=MODEL, input="Again", previous_response_id=first.id)
    assert refused.value.param == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve("resp_unknown")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {"input": [{"type": "computer_call_output", "call_id": "c", "output": {}}]},
            "input[0].type",
        ),
        ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
        ({"input": "Hi", "conversation": "conv_1"}, "conversation"),
        ({"input": "Hi", "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ],
)
async def test_responses_requests_it_cannot_translate_are_refused_and_recorded(
    proxy: RunningProxy, client: openai.AsyncOpenAI, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=MODEL, **fields)
    assert refused.value.param == param
    [call] = await only_calls(proxy)
    assert (call.status, call.dialect, call.trainable) == ("rejected", "responses", False)
    assert call.client_request is not None and call.client_request["model"] == MODEL


# --- Anthropic Messages -------------------------------------------------------------------------


@pytest.fixture
async def claude(proxy: RunningProxy) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with anthropic.AsyncAnthropic(
        base_url=proxy.root_url, api_key="unused", max_retries=0
    ) as opened:
        yield opened


async def test_anthropic_refusals_are_anthropic_shaped(
    proxy: RunningProxy, claude: anthropic.AsyncAnthropic
) -> None:
    with pytest.raises(anthropic.BadRequestError) as refused:
        await claude.messages.create(
            model=MODEL,
            max_tokens=10,
            messages=[{"role": "user", "content": "Hi"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    assert refused.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "tools[0].type 'web_search_20250305' is not supported: art-proxy serves "
            "custom (client) tools only (server tools run at Anthropic)",
        },
    }
    [call] = await only_calls(proxy)
    assert (call.status, call.dialect) == ("rejected", "anthropic")
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.root_url + "/v1/messages", data=b"{") as response:
            body = await response.json()
            assert response.status == 400 and body["type"] == "error"
        async with http.get(proxy.root_url + "/v1/messages/count_tokens") as response:
            body = await response.json()
            assert response.status == 405 and body["type"] == "error"
        async with http.post(
            proxy.root_url + "/v1/messages/count_tokens",
            data=b'{"model": "m"}',
            headers={"Content-Encoding": "gzip"},
        ) as response:
            body = await response.json()
            assert response.status == 400 and body["type"] == "error"
            assert "Content-Encoding" in body["error"]["message"]


WEATHER_FOR_CLAUDE: anthropic.types.ToolParam = {
    "name": _FUNCTION["name"],
    "description": _FUNCTION["description"],
    "input_schema": _FUNCTION["parameters"],
}


async def test_anthropic_count_tokens_is_the_prompt_a_messages_call_gets(
    proxy: RunningProxy, claude: anthropic.AsyncAnthropic
) -> None:
    """The SDK's `count_tokens` is answered by the upstream's `/tokenize` with the prompt the same
    request gets through `/v1/messages`, system and tools included; a count is not recorded."""
    prompt: dict[str, Any] = {
        "model": MODEL,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
        "tools": [WEATHER_FOR_CLAUDE],
    }
    counted = await claude.messages.count_tokens(**prompt)
    created = await claude.messages.create(max_tokens=5, **prompt)

    assert counted.input_tokens == created.usage.input_tokens > 0
    [call] = await only_calls(proxy)
    assert call.prompt_token_ids is not None
    assert len(call.prompt_token_ids) == counted.input_tokens
    untranslatable = {**prompt, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}
    with pytest.raises(anthropic.BadRequestError) as refused:
        await claude.messages.count_tokens(**untranslatable)
    assert isinstance(refused.value.body, dict) and refused.value.body["type"] == "error"
    with pytest.raises(anthropic.NotFoundError) as unknown:
        await claude.messages.count_tokens(**{**prompt, "model": "no-such-model"})
    assert "no-such-model" in str(unknown.value.body)


async def test_count_tokens_on_an_upstream_without_tokenize_says_so(store_url: str) -> None:
    """A hosted API has no `/tokenize`: the count is a clear 404 in Anthropic's shape."""
    async with running_fake_vllm(FakeVllmConfig()) as fake:
        # Where a hosted API's base URL would be: the fake has no /api/tokenize.
        hosted = fake.base_url.removesuffix("/v1") + "/api/v1"
        async with (
            running_proxy(proxy_settings(store_url, hosted)) as proxy,
            aiohttp.ClientSession() as http,
            http.post(
                proxy.root_url + "/v1/messages/count_tokens",
                json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]},
            ) as response,
        ):
            body = await response.json()
    assert response.status == 404 and body["error"]["type"] == "not_found_error"
    assert "serves no /tokenize" in body["error"]["message"]


async def test_anthropic_sdk_keys_and_upstream_errors(store_url: str) -> None:
    """Anthropic's SDKs send their key as `x-api-key`; an upstream error keeps its status and
    takes Anthropic's shape."""
    async with running_fake_vllm(FakeVllmConfig(error_status=422)) as fake:
        settings = proxy_settings(store_url, fake.base_url, api_key="proxy-key")
        async with running_proxy(settings) as proxy:
            request: dict[str, Any] = {
                "model": MODEL,
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "Hi"}],
            }
            async with anthropic.AsyncAnthropic(
                base_url=proxy.root_url, api_key="wrong", max_retries=0
            ) as wrong:
                with pytest.raises(anthropic.AuthenticationError):
                    await wrong.messages.create(**request)
            async with anthropic.AsyncAnthropic(
                base_url=proxy.root_url, api_key="proxy-key", max_retries=0
            ) as right:
                with pytest.raises(anthropic.UnprocessableEntityError) as failed:
                    await right.messages.create(**request)
            assert isinstance(failed.value.body, dict) and failed.value.body["type"] == "error"
            [call] = await only_calls(proxy)
            assert (call.status, call.http_status) == ("upstream_error", 422)


async def test_stop_sequences_and_max_tokens_map_to_stop_reasons(
    proxy: RunningProxy, claude: anthropic.AsyncAnthropic
) -> None:
    cut = await claude.messages.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "Hi"}]
    )
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    whole = await claude.messages.create(
        model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi again"}]
    )
    assert whole.stop_reason == "end_turn"
    assert [block.type for block in whole.content] == ["text"]


async def test_secrets_in_a_dialect_body_never_reach_the_store(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    secret = "sk-live0123456789abcdefghij"
    await client.responses.create(
        model=MODEL, input=f"my key is {secret}", metadata={"api_key": secret}
    )
    [call] = await only_calls(proxy)
    assert secret not in str(call.model_dump())


# --- what operators see -------------------------------------------------------------------------


async def test_debug_log_says_how_each_call_was_attributed(
    proxy: RunningProxy, client: openai.AsyncOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="art_proxy.proxy"):
        first = await client.responses.create(model=MODEL, input="Hi")
        await client.responses.create(model=MODEL, input="Again", previous_response_id=first.id)
        async with aiohttp.ClientSession() as http:
            async with http.post(proxy.base_url + "/nowhere", json={}) as response:
                assert response.status == 404
            async with http.get(proxy.root_url + "/health") as response:
                health = await response.json()
    lines = [record.getMessage() for record in caplog.records]
    assert any("/v1/responses -> ok 200" in line and "new (no open" in line for line in lines)
    assert any("response (previous_response_id names its call)" in line for line in lines)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("/v1/nowhere" in line for line in warnings)
    assert health["calls_by_attribution"] == {"new": 1, "response": 1}
    assert health["calls_by_dialect"] == {"responses": 2}
