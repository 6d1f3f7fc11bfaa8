"""Unmodified clients (the OpenAI SDK and LangChain's ChatOpenAI) produce stitched trajectories.

Every assistant turn must be recorded with token ids and logprobs, streamed or not, and consecutive
turns of one conversation must land in one trajectory whose later prompts extend the earlier ones.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletionFunctionToolParam
from pydantic import SecretStr

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import CallRecord, TrajectoryRecord
from art_proxy.testing.fake_vllm import FakeVllmConfig, ScriptedCall, running_fake_vllm
from tests.conftest import proxy_settings

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
async def client(proxy: RunningProxy) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as opened:
        yield opened


@pytest.fixture
async def chat_model(proxy: RunningProxy) -> AsyncIterator[ChatOpenAI]:
    # Our own HTTP client, closed with the test's loop (LangChain's default one outlives it).
    async with httpx.AsyncClient() as http:
        yield ChatOpenAI(
            model=MODEL,
            base_url=proxy.base_url,
            api_key=SecretStr("unused"),
            http_async_client=http,
        )


async def only_trajectory(proxy: RunningProxy) -> TrajectoryRecord:
    await proxy.parts.settled()
    found = await proxy.parts.store.trajectories()
    assert len(found) == 1, f"expected one trajectory, got {len(found)}"
    await proxy.parts.settled()
    whole = await proxy.parts.store.trajectory(found[0].id)
    assert whole is not None and whole.calls is not None
    return whole


def assert_fully_recorded(trajectory: TrajectoryRecord, calls: int) -> None:
    """Every call trainable, every later call stitched onto the one before."""
    assert trajectory.calls is not None
    assert [call.seq for call in trajectory.calls] == list(range(calls))
    for call in trajectory.calls:
        assert call.status == "ok"
        assert call.trainable, f"call {call.seq} has no token ids"
        assert call.prompt_token_ids and call.completion_token_ids and call.logprobs
        for ids, logprobs in zip(call.completion_token_ids, call.logprobs, strict=True):
            assert len(ids) == len(logprobs) > 0
    for previous, call in zip(trajectory.calls, trajectory.calls[1:], strict=False):
        assert call.stitched, f"call {call.seq} does not extend call {previous.seq}"
        assert call.attribution == "continuation"
        assert previous.prompt_token_ids is not None and previous.completion_token_ids is not None
        assert call.prompt_token_ids is not None
        prefix = previous.prompt_token_ids + previous.completion_token_ids[0]
        assert call.prompt_token_ids[: len(prefix)] == prefix


async def test_openai_sync_client_two_turns_make_one_stitched_trajectory(
    proxy: RunningProxy,
) -> None:
    sync_client = openai.OpenAI(base_url=proxy.base_url, api_key="unused")
    messages: list[Any] = [{"role": "user", "content": "Hi there"}]

    def conversation() -> None:
        for follow_up in ("And again?", None):
            reply = sync_client.chat.completions.create(model=MODEL, messages=messages)
            assert reply.choices[0].message.content == "Hello from the fake."
            # The client asked for neither token ids nor logprobs, so it gets neither.
            assert reply.choices[0].logprobs is None
            assert "prompt_token_ids" not in (reply.model_extra or {})
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            if follow_up:
                messages.append({"role": "user", "content": follow_up})

    # The sync client blocks, and the proxy runs on this test's event loop.
    with sync_client:
        await asyncio.to_thread(conversation)
    assert_fully_recorded(await only_trajectory(proxy), calls=2)


async def test_openai_async_streaming_turns_are_rebuilt_from_chunks(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Stream to me"}]
    for _ in range(3):
        stream = await client.chat.completions.create(model=MODEL, messages=messages, stream=True)
        text = "".join(
            [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        )
        assert text == "Hello from the fake."
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "more"}]
    trajectory = await only_trajectory(proxy)
    assert_fully_recorded(trajectory, calls=3)
    assert trajectory.calls is not None
    first = trajectory.calls[0]
    assert first.stream and first.response is not None
    assert first.response["choices"][0]["message"]["content"] == "Hello from the fake."


async def test_stream_and_non_stream_record_the_same_token_ids(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    for stream in (False, True):
        messages: list[Any] = [{"role": "user", "content": f"Same question ({stream})"}]
        if stream:
            async for _ in await client.chat.completions.create(
                model=MODEL, messages=messages, stream=True
            ):
                pass
        else:
            await client.chat.completions.create(model=MODEL, messages=messages)
    calls = []
    await proxy.parts.settled()
    for trajectory in await proxy.parts.store.trajectories():
        whole = await proxy.parts.store.trajectory(trajectory.id)
        assert whole is not None and whole.calls
        calls.append(whole.calls[0])
    assert len(calls) == 2
    assert calls[0].completion_token_ids == calls[1].completion_token_ids
    assert calls[0].logprobs == calls[1].logprobs


async def test_tool_call_turns_are_stitched_with_the_tool_result(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    first = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL]
    )
    call = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls" and call
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call[0].id, "content": "sunny, 21 C"})
    stream = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], stream=True
    )
    async for _ in stream:
        pass
    trajectory = await only_trajectory(proxy)
    assert_fully_recorded(trajectory, calls=2)
    assert trajectory.calls is not None
    recorded = trajectory.calls[0].response
    assert recorded is not None
    assert recorded["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


async def test_streamed_tool_call_is_rebuilt_from_fragments(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        stream=True,
    )
    async for _ in stream:
        pass
    trajectory = await only_trajectory(proxy)
    assert trajectory.calls is not None
    message = trajectory.calls[0].response["choices"][0]["message"]  # type: ignore[index]  # recorded
    arguments = message["tool_calls"][0]["function"]["arguments"]
    assert message["tool_calls"][0]["id"].startswith("chatcmpl-tool-")
    assert isinstance(json.loads(arguments), dict)
    assert trajectory.calls[0].trainable


async def test_n_choices_are_all_recorded_and_any_can_be_continued(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    messages: list[Any] = [{"role": "user", "content": "Give me options"}]
    reply = await client.chat.completions.create(model=MODEL, messages=messages, n=3)
    assert len(reply.choices) == 3
    messages += [
        reply.choices[2].message.model_dump(exclude_none=True),
        {"role": "user", "content": "ok"},
    ]
    await client.chat.completions.create(model=MODEL, messages=messages)
    trajectory = await only_trajectory(proxy)
    assert trajectory.calls is not None
    first, second = trajectory.calls
    assert first.completion_token_ids is not None and len(first.completion_token_ids) == 3
    assert first.trainable and second.stitched


async def test_client_that_asks_for_token_ids_and_logprobs_gets_them(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    reply = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "ids please"}],
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content
    assert (reply.model_extra or {}).get("prompt_token_ids")
    assert (reply.choices[0].model_extra or {}).get("token_ids")


async def test_concurrent_runs_of_one_scenario_are_siblings_of_one_group(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:

    async def run(index: int) -> None:
        messages: list[Any] = [
            {"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Plan a trip."},
        ]
        for turn in range(2):
            reply = await client.chat.completions.create(model=MODEL, messages=messages, seed=index)
            messages += [
                reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": f"turn {turn} of run {index}"},
            ]

    await asyncio.gather(*(run(index) for index in range(4)))
    await proxy.parts.settled()
    trajectories = await proxy.parts.store.trajectories()
    # Identical replies make the runs' second calls identical too; each run is still stitched
    # into some open trajectory of the scenario, and all runs share one group.
    assert len({t.scenario_id for t in trajectories}) == 1
    assert len({t.group_id for t in trajectories}) == 1
    await proxy.parts.settled()
    groups = await proxy.parts.store.groups()
    assert len(groups) == 1 and groups[0].size == len(trajectories)


async def test_langchain_chat_openai_invoke_stream_and_tools(
    proxy: RunningProxy, chat_model: ChatOpenAI
) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Weather of a city."""
        return f"sunny in {city}"

    model = chat_model
    with_tools = model.bind_tools([get_weather])
    history: list[BaseMessage] = [HumanMessage("What is the weather in Rome?")]
    ai = await with_tools.ainvoke(history)
    assert isinstance(ai, AIMessage) and ai.tool_calls
    history += [
        ai,
        ToolMessage(
            get_weather.invoke(ai.tool_calls[0]["args"]), tool_call_id=ai.tool_calls[0]["id"]
        ),
    ]
    streamed = "".join([str(chunk.content) async for chunk in with_tools.astream(history)])
    history.append(AIMessage(content=streamed))
    history.append(HumanMessage("Thanks! Anything else?"))
    await with_tools.ainvoke(history)  # the same tools: a prompt without them is a new prefix

    trajectory = await only_trajectory(proxy)
    assert_fully_recorded(trajectory, calls=3)


async def test_langchain_json_mode_is_recorded_as_trainable(
    proxy: RunningProxy, chat_model: ChatOpenAI
) -> None:
    """JSON mode is guided decoding upstream; the trainer replays its grammar (vLLM's JSON object
    schema) to score the tokens as they were drawn (tests/test_real_vllm.py)."""
    model = chat_model
    await model.ainvoke("Hi", response_format={"type": "json_object"})
    trajectory = await only_trajectory(proxy)
    assert trajectory.calls is not None
    [call] = trajectory.calls
    assert call.request["response_format"] == {"type": "json_object"}
    assert call.completion_token_ids is not None
    assert (call.trainable, call.untrainable_reason) == (True, None)


@pytest.mark.parametrize("stream", [False, True])
async def test_completions_endpoint_is_recorded_with_token_ids(
    proxy: RunningProxy, client: openai.AsyncOpenAI, stream: bool
) -> None:
    if stream:
        async for _ in await client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True
        ):
            pass
    else:
        reply = await client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=5
        )
        assert reply.choices[0].logprobs is None
    trajectory = await only_trajectory(proxy)
    assert trajectory.calls is not None
    call = trajectory.calls[0]
    assert call.kind == "completion" and call.trainable
    assert call.completion_token_ids is not None and len(call.completion_token_ids[0]) == 5


async def echoed_tool_call(
    proxy: RunningProxy,
    client: openai.AsyncOpenAI,
    arguments: Callable[[str], str],
    headers: dict[str, str] | None = None,
) -> tuple[CallRecord, str]:
    """A tool call answered, then sent back with its arguments rewritten by `arguments`: the
    second call's record and the arguments the agent sent."""
    messages: list[Any] = [{"role": "user", "content": "Weather in Lima?"}]
    first = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], extra_headers=headers
    )
    reply = first.choices[0].message.model_dump(exclude_none=True)
    call = reply["tool_calls"][0]
    sent = arguments(call["function"]["arguments"])
    assert sent != call["function"]["arguments"]
    call["function"]["arguments"] = sent
    messages += [reply, {"role": "tool", "tool_call_id": call["id"], "content": "cold"}]
    await client.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], extra_headers=headers
    )
    trajectory = await only_trajectory(proxy)
    assert trajectory.calls is not None
    return trajectory.calls[1], sent


async def test_tool_arguments_sent_back_re_serialised_are_forwarded_as_sampled_and_stitch(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    """pydantic-ai (on openai 3) sends a tool call's arguments back re-serialised
    (`{"city":"x"}` for `{"city": "x"}`): the same call, other tokens. The proxy forwards the
    reply as the model wrote it, so the call's prompt extends the sampled tokens (stitched, one
    training sequence); the record keeps what the agent sent."""
    second, sent = await echoed_tool_call(
        proxy,
        client,
        lambda arguments: json.dumps(json.loads(arguments), separators=(",", ":")),
    )
    assert (second.attribution, second.stitched, second.trainable) == ("continuation", True, True)
    echoed = second.request["messages"][1]
    assert echoed["tool_calls"][0]["function"]["arguments"] == sent


async def test_a_named_trajectorys_echo_re_serialised_is_forwarded_as_sampled_too(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    """The LangGraph callback names the trajectory: the echo is put back all the same."""
    second, _ = await echoed_tool_call(
        proxy,
        client,
        lambda arguments: json.dumps(json.loads(arguments), separators=(",", ":")),
        {"X-Art-Trajectory": "named"},
    )
    assert (second.attribution, second.stitched, second.trainable) == ("header", True, True)


async def test_tool_arguments_sent_back_changed_continue_as_rerendered(
    proxy: RunningProxy, client: openai.AsyncOpenAI
) -> None:
    """Arguments that truly differ from what the model wrote are not put back: the call
    continues its trajectory as re-rendered, its tokens a training sequence of their own."""
    second, _ = await echoed_tool_call(
        proxy, client, lambda arguments: json.dumps({**json.loads(arguments), "unit": "K"})
    )
    assert (second.attribution, second.stitched, second.trainable) == ("rerendered", False, True)


Echo = Callable[[dict[str, Any]], list[dict[str, Any]]]


@pytest.fixture
async def three_tool_turns(store_url: str) -> AsyncIterator[RunningProxy]:
    """A fake that calls the weather tool at the first three turns, then answers."""
    lima = ScriptedCall(name="get_weather", arguments={"city": "Lima"})
    config = FakeVllmConfig(model=MODEL, tool_script=(lima, lima, lima))
    async with (
        running_fake_vllm(config) as vllm,
        running_proxy(proxy_settings(store_url, vllm.base_url)) as running,
    ):
        yield running


async def tool_run(proxy: RunningProxy, echo: Echo) -> tuple[list[CallRecord], list[Any]]:
    """An agent's run of four calls, each of the three tool calls sent back as `echo` writes the
    reply and its result (each earlier turn kept as it was first sent): the run's calls, and the
    messages the agent sent last."""
    messages: list[Any] = [{"role": "user", "content": "Weather in Lima?"}]
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        for turn in range(4):
            reply = await client.chat.completions.create(
                model=MODEL, messages=messages, tools=[WEATHER_TOOL]
            )
            if turn < 3:
                message = reply.choices[0].message.model_dump(exclude_none=True)
                messages += echo(message)
    trajectory = await only_trajectory(proxy)
    assert trajectory.calls is not None and len(trajectory.calls) == 4
    return trajectory.calls, messages


def re_serialised(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """pydantic-ai on openai 3: the arguments compacted, the result a tool message."""
    call = reply["tool_calls"][0]
    compact = json.dumps(json.loads(call["function"]["arguments"]), separators=(",", ":"))
    assert compact != call["function"]["arguments"]
    echoed = {**call, "function": {**call["function"], "arguments": compact}}
    return [
        {**reply, "tool_calls": [echoed]},
        {"role": "tool", "tool_call_id": call["id"], "content": "cold"},
    ]


def as_smolagents_writes_it(change: dict[str, Any] | None = None) -> Echo:
    """smolagents' memory: the tool calls as text after `Calling tools:` (a Python list, the
    arguments parsed), the result a user message; `change` rewrites the arguments."""

    def echo(reply: dict[str, Any]) -> list[dict[str, Any]]:
        calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": {**json.loads(call["function"]["arguments"]), **(change or {})},
                },
            }
            for call in reply["tool_calls"]
        ]
        text = "Calling tools:\n" + str(calls)
        return [
            {"role": "assistant", "content": [{"type": "text", "text": text}]},
            {"role": "user", "content": [{"type": "text", "text": "Observation:\ncold"}]},
        ]

    return echo


@pytest.mark.parametrize(
    "echo",
    [re_serialised, as_smolagents_writes_it()],
    ids=["re-serialised", "smolagents-text"],
)
async def test_every_echo_in_another_form_is_forwarded_as_sampled_turn_after_turn(
    three_tool_turns: RunningProxy, echo: Echo
) -> None:
    """Each call of a four-call run carries every earlier reply in the agent's form: each is
    put back as the model wrote it (not only the last), so every call stitches onto the one
    before; the record keeps the agent's body."""
    calls, sent = await tool_run(three_tool_turns, echo)
    assert [(c.attribution, c.stitched, c.trainable) for c in calls[1:]] == [
        ("continuation", True, True)
    ] * 3
    assert calls[3].request["messages"] == sent


async def test_tool_calls_written_back_as_text_with_other_arguments_stay_rerendered(
    three_tool_turns: RunningProxy,
) -> None:
    calls, _ = await tool_run(three_tool_turns, as_smolagents_writes_it({"unit": "K"}))
    assert [(c.attribution, c.stitched, c.trainable) for c in calls[1:]] == [
        ("rerendered", False, True)
    ] * 3
