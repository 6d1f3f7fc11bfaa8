"""Agent frameworks, unmodified but for their base URL, recorded as trainable trajectories.

Each framework's standard one-tool agent runs twice through the proxy in front of the fake vLLM
(on SQLite and on PostgreSQL): the runs must come out as two trajectories holding every call of
their run, each later call stitched onto the one before (echoes in another form put back as the
model wrote them), both in one group, with token ids on every turn. The fake calls the weather tool at the
first turn and answers after the tool result (`tool_script` picks smolagents' `final_answer` at
its second turn). LangGraph, MCP through langchain-mcp-adapters and the OpenAI SDK's chat
completions are covered by test_clients.py and tests/integrations.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_client,
)
from agents.mcp import MCPServerStdio
from openai import AsyncOpenAI
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import CallRecord, TrajectoryRecord
from art_proxy.testing.fake_vllm import FakeVllmConfig, ScriptedCall, running_fake_vllm
from tests.conftest import proxy_settings, trajectories

# No slash: the Agents SDK reads `vendor/model` as a provider prefix.
MODEL = "qwen-fake"
QUESTION = "What is the weather in Paris?"
ANSWER = "It is sunny in Paris."
INSTRUCTIONS = "Answer with the weather of the city asked about."

# The Agents SDK would export traces to OpenAI's servers.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")


@contextlib.asynccontextmanager
async def stack(store_url: str, config: FakeVllmConfig) -> AsyncIterator[RunningProxy]:
    async with (
        running_fake_vllm(config) as vllm,
        running_proxy(proxy_settings(store_url, vllm.base_url)) as running,
    ):
        yield running


WEATHER_CALL = ScriptedCall(name="get_weather", arguments={"city": "Paris"})


@pytest.fixture
async def proxy(store_url: str) -> AsyncIterator[RunningProxy]:
    config = FakeVllmConfig(model=MODEL, answer_after_tool=ANSWER, tool_script=(WEATHER_CALL,))
    async with stack(store_url, config) as running:
        yield running


@pytest.fixture
async def smol_proxy(store_url: str) -> AsyncIterator[RunningProxy]:
    """smolagents ends a run by calling its `final_answer` tool (every call requires a tool)."""
    final = ScriptedCall(name="final_answer", arguments={"answer": ANSWER})
    config = FakeVllmConfig(model=MODEL, tool_script=(WEATHER_CALL, final))
    async with stack(store_url, config) as running:
        yield running


def weather(city: str) -> str:
    return f"sunny, 21 C in {city}"


async def assert_two_runs(proxy: RunningProxy, calls: int) -> list[TrajectoryRecord]:
    """Two trajectories of `calls` calls each in one group, every call answered with token ids,
    each later call a continuation stitched onto the one before."""
    recorded = await trajectories(proxy)
    assert len(recorded) == 2, [len(t.calls or []) for t in recorded]
    assert len({t.group_id for t in recorded}) == 1
    for trajectory in recorded:
        assert trajectory.calls is not None
        assert [call.seq for call in trajectory.calls] == list(range(calls))
        for call in trajectory.calls:
            assert_answered_with_ids(call)
        for call in trajectory.calls[1:]:
            assert call.attribution == "continuation"
            assert call.stitched, f"call {call.seq} does not extend the call before"
    return recorded


def assert_answered_with_ids(call: CallRecord) -> None:
    assert call.status == "ok", call.error
    assert call.trainable, call.untrainable_reason
    assert call.prompt_token_ids and call.completion_token_ids and call.logprobs
    assert len(call.completion_token_ids[0]) == len(call.logprobs[0]) > 0


async def twice(run: Callable[[], Awaitable[Any]]) -> None:
    for _ in range(2):
        await run()


# --- OpenAI Agents SDK, on its default model (the Responses API) --------------------------------


@function_tool(name_override="get_weather")
def agents_weather(city: str) -> str:
    """Weather of a city."""
    return weather(city)


def use_proxy_by_default(proxy: RunningProxy) -> None:
    """What an Agents SDK user does to point every agent at another server."""
    set_default_openai_client(AsyncOpenAI(base_url=proxy.base_url, api_key="unused"))


async def run_agent(agent: Agent[Any], question: str, streamed: bool) -> None:
    if streamed:
        streaming = Runner.run_streamed(agent, question)
        async for _ in streaming.stream_events():
            pass
        assert streaming.final_output == ANSWER
    else:
        assert (await Runner.run(agent, question)).final_output == ANSWER


@pytest.mark.parametrize("streamed", [False, True])
async def test_openai_agents_sdk_default_model(proxy: RunningProxy, streamed: bool) -> None:
    use_proxy_by_default(proxy)
    agent = Agent(name="weather", instructions=INSTRUCTIONS, tools=[agents_weather], model=MODEL)

    async def run() -> None:
        await run_agent(agent, QUESTION, streamed)

    await twice(run)
    recorded = await assert_two_runs(proxy, calls=2)
    calls = [call for t in recorded for call in t.calls or []]
    assert {call.dialect for call in calls} == {"responses"}
    assert {call.stream for call in calls} == {streamed}
    first = recorded[0].calls[0]  # type: ignore[index]  # asserted above
    assert first.client_request is not None and first.client_request["instructions"] == INSTRUCTIONS
    assert first.request["messages"][0] == {"role": "system", "content": INSTRUCTIONS}


@pytest.mark.parametrize("streamed", [False, True])
async def test_openai_agents_sdk_with_an_mcp_server_over_stdio(
    store_url: str, streamed: bool
) -> None:
    # Unscripted: the fake calls the first tool offered, the store example's own.
    config = FakeVllmConfig(model=MODEL, reply="apple", answer_after_tool=ANSWER)
    server = {"command": sys.executable, "args": ["-m", "examples.mcp_agent.server"]}
    async with stack(store_url, config) as proxy, MCPServerStdio(params=server) as store:  # type: ignore[arg-type]  # a TypedDict
        use_proxy_by_default(proxy)
        agent = Agent(name="store", instructions=INSTRUCTIONS, mcp_servers=[store], model=MODEL)
        tools = await store.list_tools()

        async def run() -> None:
            await run_agent(agent, "How many apples are in stock?", streamed)

        await twice(run)
        recorded = await assert_two_runs(proxy, calls=2)
    request = recorded[0].calls[0].client_request  # type: ignore[index]  # asserted above
    assert request is not None
    assert {tool["name"] for tool in request["tools"]} == {tool.name for tool in tools}


async def test_openai_agents_sdk_on_chat_completions(proxy: RunningProxy) -> None:
    client = AsyncOpenAI(base_url=proxy.base_url, api_key="unused")
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    agent = Agent(name="weather", instructions=INSTRUCTIONS, tools=[agents_weather], model=model)

    async def run() -> None:
        await run_agent(agent, QUESTION, streamed=False)

    await twice(run)
    recorded = await assert_two_runs(proxy, calls=2)
    assert {call.dialect for t in recorded for call in t.calls or []} == {"openai"}


# --- Anthropic SDK: its tool loop ---------------------------------------------------------------

ANTHROPIC_TOOL: anthropic.types.ToolParam = {
    "name": "get_weather",
    "description": "Weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk_tool_loop(proxy: RunningProxy, stream: bool) -> None:
    client = anthropic.AsyncAnthropic(base_url=proxy.root_url, api_key="unused")

    async def ask(messages: list[anthropic.types.MessageParam]) -> anthropic.types.Message:
        settings: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 256,
            "system": INSTRUCTIONS,
            "tools": [ANTHROPIC_TOOL],
            "messages": messages,
        }
        if not stream:
            message: anthropic.types.Message = await client.messages.create(**settings)
            return message
        async with client.messages.stream(**settings) as events:
            async for _ in events:
                pass
            return await events.get_final_message()

    async def run() -> None:
        messages: list[anthropic.types.MessageParam] = [{"role": "user", "content": QUESTION}]
        while True:
            reply = await ask(messages)
            messages.append({"role": "assistant", "content": reply.content})
            calls = [block for block in reply.content if block.type == "tool_use"]
            if reply.stop_reason != "tool_use":
                break
            assert calls and calls[0].input == {"city": "Paris"}
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call.id,
                            "content": weather(str(call.input["city"])),
                        }
                        for call in calls
                    ],
                }
            )
        assert reply.content[0].type == "text" and reply.content[0].text == ANSWER

    async with client:
        await twice(run)
    recorded = await assert_two_runs(proxy, calls=2)
    calls = [call for t in recorded for call in t.calls or []]
    assert {(call.dialect, call.stream) for call in calls} == {("anthropic", stream)}


# --- smolagents: writes its tool calls back as text ---------------------------------------------


def smol_agent(proxy: RunningProxy, stream: bool = False) -> ToolCallingAgent:
    @tool
    def get_weather(city: str) -> str:
        """Weather of a city.

        Args:
            city: The city.
        """
        return weather(city)

    model = OpenAIServerModel(model_id=MODEL, api_base=proxy.base_url, api_key="unused")
    return ToolCallingAgent(
        tools=[get_weather], model=model, max_steps=4, verbosity_level=0, stream_outputs=stream
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_smolagents_tool_calling_agent(smol_proxy: RunningProxy, stream: bool) -> None:
    proxy = smol_proxy

    async def run() -> None:
        answer = await asyncio.to_thread(smol_agent(proxy, stream).run, QUESTION)
        assert answer == ANSWER

    await twice(run)
    recorded = await assert_two_runs(proxy, calls=2)
    for trajectory in recorded:
        second = trajectory.calls[1]  # type: ignore[index]  # asserted above
        # smolagents sends the tool call back as text, and the tool result as a user message:
        # the proxy forwards the call as the model wrote it (the record keeps smolagents' text).
        echoed = second.request["messages"][2]
        assert echoed["role"] == "assistant" and "Calling tools" in str(echoed["content"])
    health = await proxy_health(proxy)
    assert health["calls_by_attribution"] == {"new": 2, "continuation": 2}
    assert health["stitch_misses"] == 0


async def test_concurrent_identical_smolagents_runs_stay_apart(smol_proxy: RunningProxy) -> None:
    """Both runs ask the same and get the same answers; only the tool calls' ids, which
    smolagents writes back into its text, tell their second calls apart."""
    proxy = smol_proxy
    await asyncio.gather(*(asyncio.to_thread(smol_agent(proxy).run, QUESTION) for _ in range(2)))
    recorded = await assert_two_runs(proxy, calls=2)
    for trajectory in recorded:
        first, second = trajectory.calls  # type: ignore[misc]  # asserted above
        assert first.response is not None
        call_id = first.response["choices"][0]["message"]["tool_calls"][0]["id"]
        assert call_id in str(second.request["messages"][2]["content"])


async def proxy_health(proxy: RunningProxy) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(proxy.root_url + "/health") as response:
        health: dict[str, Any] = await response.json()
        return health


# --- pydantic-ai --------------------------------------------------------------------------------


@pytest.mark.parametrize("streamed", [False, True])
async def test_pydantic_ai_agent(proxy: RunningProxy, streamed: bool) -> None:
    model = OpenAIChatModel(
        MODEL, provider=OpenAIProvider(base_url=proxy.base_url, api_key="unused")
    )
    agent = PydanticAgent(model, instructions=INSTRUCTIONS)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """Weather of a city."""
        return weather(city)

    async def run() -> None:
        if streamed:
            async with agent.run_stream(QUESTION) as result:
                assert await result.get_output() == ANSWER
        else:
            assert (await agent.run(QUESTION)).output == ANSWER

    await twice(run)
    recorded = await assert_two_runs(proxy, calls=2)
    for trajectory in recorded:
        second = trajectory.calls[1]  # type: ignore[index]  # asserted above
        # pydantic-ai (on openai 3) sends the model's `{"city": "Paris"}` back re-serialised:
        # the record keeps what the agent sent, the upstream got what the model wrote (stitched).
        [echoed] = [m for m in second.request["messages"] if m["role"] == "assistant"]
        assert echoed["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris"}'
