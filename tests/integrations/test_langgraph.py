"""The LangGraph callback and chat-model factory against the real proxy in front of the fake vLLM.

The fake calls the first offered tool when tools are offered and the last message is not a tool
result, else answers text, so a ReAct agent with one tool makes two calls: the tool call, then the
final answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from langchain.agents import create_agent
from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from pydantic import BaseModel

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import CallRecord
from art_proxy.testing.fake_config import ScriptedCall
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from art_proxy_integrations.langgraph import (
    SUBAGENT_TAG,
    ArtProxyCallback,
    chat_model,
    current_trajectory_id,
    set_reward,
)
from tests.conftest import proxy_settings, trajectories

# create_react_agent is what most LangGraph agents call; LangGraph 1.x points to langchain.agents'
# create_agent instead, tested here too.
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
QUESTION = {"messages": [{"role": "user", "content": "What is the weather in Rome?"}]}


@tool
def get_weather(city: str) -> str:
    """Weather of a city."""
    return f"sunny in {city}"


@pytest.fixture
async def async_http() -> AsyncIterator[httpx.AsyncClient]:
    # Our own client, closed with the test's loop (LangChain's default one outlives it).
    async with httpx.AsyncClient() as client:
        yield client


def model_for(proxy: RunningProxy, http: httpx.AsyncClient) -> ChatOpenAI:
    return chat_model(proxy.root_url, MODEL, http_async_client=http)


def final_text(outputs: Any) -> str:
    message = outputs["messages"][-1]
    assert isinstance(message, BaseMessage)
    return str(message.content)


def rewarded_handler(proxy: RunningProxy) -> ArtProxyCallback:
    return ArtProxyCallback(
        proxy.root_url,
        scenario="weather-rome",
        reward_fn=lambda outputs: 1.0 if "fake" in final_text(outputs) else 0.0,
    )


async def one_rewarded_trajectory(proxy: RunningProxy) -> list[CallRecord]:
    """The run's calls, once its one trajectory is checked: finished with its reward, a tool
    call and then a stitched, trainable answer."""
    [trajectory] = await trajectories(proxy)
    assert trajectory.scenario_id == "weather-rome"
    assert trajectory.status == "finished" and trajectory.finish_reason == "client"
    assert trajectory.reward == 1.0
    assert trajectory.calls is not None and len(trajectory.calls) == 2
    first, second = trajectory.calls
    assert first.response is not None and first.response["choices"][0]["message"]["tool_calls"]
    assert second.stitched and second.trainable
    return trajectory.calls


async def test_react_agent_run_is_one_trajectory_finished_with_its_reward(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    agent = create_react_agent(model_for(sqlite_proxy, async_http), [get_weather])
    config: RunnableConfig = {"callbacks": [rewarded_handler(sqlite_proxy)]}
    outputs = await agent.ainvoke(QUESTION, config)
    assert final_text(outputs) == "Hello from the fake."
    await one_rewarded_trajectory(sqlite_proxy)


async def test_langchains_create_agent_run_is_one_trajectory_finished_with_its_reward(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    """LangChain 1.x's agent, which LangGraph 1.x points create_react_agent's users to."""
    agent = create_agent(
        model_for(sqlite_proxy, async_http), [get_weather], system_prompt="Answer briefly."
    )
    config: RunnableConfig = {"callbacks": [rewarded_handler(sqlite_proxy)]}
    question = HumanMessage(QUESTION["messages"][0]["content"])
    outputs = await agent.ainvoke({"messages": [question]}, config)
    assert final_text(outputs) == "Hello from the fake."
    first, _ = await one_rewarded_trajectory(sqlite_proxy)
    assert first.request["messages"][0] == {"role": "system", "content": "Answer briefly."}


@pytest.mark.parametrize("strategy", ["provider", "tool"])
async def test_create_agents_structured_response_is_one_trainable_trajectory(
    sqlite_url: str, strategy: str
) -> None:
    """`response_format`: the schema as the provider's json_schema, or as a tool the model
    must call (ToolStrategy); either way the run is one trajectory, every call trainable."""
    # Provider: a weather call, then the JSON. Tool: the model answers by calling the schema's
    # tool at once.
    config = FakeVllmConfig(reply='{"answer": "Rome"}')
    if strategy == "tool":
        config = FakeVllmConfig(
            tool_script=(ScriptedCall(name="Answer", arguments={"answer": "Rome"}),)
        )
    async with (
        running_fake_vllm(config) as vllm,
        running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy,
        httpx.AsyncClient() as http,
    ):
        handler = ArtProxyCallback(proxy.root_url, scenario="structured")
        response_format: Any = (
            ProviderStrategy(Answer) if strategy == "provider" else ToolStrategy(Answer)
        )
        agent = create_agent(model_for(proxy, http), [get_weather], response_format=response_format)
        outputs = await agent.ainvoke(QUESTION, {"callbacks": [handler]})
        assert outputs["structured_response"] == Answer(answer="Rome")

        [trajectory] = await trajectories(proxy)
        assert trajectory.scenario_id == "structured" and trajectory.status == "finished"
        assert trajectory.calls is not None
        assert len(trajectory.calls) == (2 if strategy == "provider" else 1)
        assert all(call.trainable for call in trajectory.calls)
        assert all(call.stitched for call in trajectory.calls[1:])
        asked = trajectory.calls[0].request
        if strategy == "provider":
            assert asked["response_format"]["type"] == "json_schema"
        else:
            assert "Answer" in [tool["function"]["name"] for tool in asked["tools"]]


async def test_two_concurrent_runs_are_two_trajectories(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    handler = ArtProxyCallback(sqlite_proxy.root_url, scenario="weather-rome")
    agent = create_react_agent(model_for(sqlite_proxy, async_http), [get_weather])
    config: RunnableConfig = {"callbacks": [handler]}
    await asyncio.gather(agent.ainvoke(QUESTION, config), agent.ainvoke(QUESTION, config))

    found = await trajectories(sqlite_proxy)
    assert len(found) == 2
    for trajectory in found:
        assert trajectory.status == "finished" and trajectory.call_count == 2
    assert len({t.group_id for t in found}) == 1  # one scenario side by side: one group


async def test_reward_set_inside_the_run_and_run_metadata_ids(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    @tool
    def grade(answer: str) -> str:
        """Grade an answer."""
        set_reward(0.25, metrics={"graded": 1.0})
        return f"graded {answer}"

    handler = ArtProxyCallback(sqlite_proxy.root_url)
    agent = create_react_agent(model_for(sqlite_proxy, async_http), [grade])
    config: RunnableConfig = {
        "callbacks": [handler],
        "metadata": {"art_scenario": "graded", "art_trajectory": "run-1"},
    }
    await agent.ainvoke(QUESTION, config)

    await sqlite_proxy.parts.settled()
    trajectory = await sqlite_proxy.parts.store.trajectory("run-1")
    assert trajectory is not None and trajectory.scenario_id == "graded"
    assert trajectory.reward == 0.25 and trajectory.metrics == {"graded": 1.0}
    assert current_trajectory_id() is None


async def test_failed_run_is_finished_with_the_error(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    @tool
    def explode(city: str) -> str:
        """Always fails."""
        raise RuntimeError("tool broke")

    handler = ArtProxyCallback(sqlite_proxy.root_url, scenario="broken")
    agent = create_react_agent(model_for(sqlite_proxy, async_http), [explode]).with_config(
        {"callbacks": [handler]}
    )
    with pytest.raises(RuntimeError, match="tool broke"):
        await agent.ainvoke(QUESTION, {"metadata": {"art_trajectory": "broken-1"}})

    await sqlite_proxy.parts.settled()
    trajectory = await sqlite_proxy.parts.store.trajectory("broken-1")
    assert trajectory is not None and trajectory.status == "finished"
    assert trajectory.metadata == {"error": "RuntimeError: tool broke"}


async def test_nested_subagent_is_kept_apart(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    model = model_for(sqlite_proxy, async_http)
    researcher = create_react_agent(model, [get_weather], name="researcher").with_config(
        tags=[SUBAGENT_TAG]
    )

    @tool
    async def research(city: str) -> str:
        """Ask the research sub-agent."""
        outputs = await researcher.ainvoke(
            {"messages": [{"role": "user", "content": f"Research {city}"}]}
        )
        return final_text(outputs)

    handler = ArtProxyCallback(sqlite_proxy.root_url, scenario="trip")
    agent = create_react_agent(model, [research])
    await agent.ainvoke(QUESTION, {"callbacks": [handler]})

    found = {t.scenario_id: t for t in await trajectories(sqlite_proxy)}
    assert set(found) == {"trip", "trip/researcher"}
    for trajectory in found.values():
        assert trajectory.status == "finished" and trajectory.call_count == 2
        assert trajectory.calls is not None and trajectory.calls[1].stitched
    main_calls = found["trip"].calls
    assert main_calls is not None
    assert main_calls[0].request["messages"][0]["content"] == "What is the weather in Rome?"


async def test_streamed_messages_are_recorded(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    handler = ArtProxyCallback(sqlite_proxy.root_url, scenario="streamed")
    agent = create_react_agent(model_for(sqlite_proxy, async_http), [get_weather])
    streamed = [
        chunk
        async for chunk, _ in agent.astream(
            QUESTION, {"callbacks": [handler]}, stream_mode="messages"
        )
        if isinstance(chunk, AIMessage)
    ]
    assert "".join(str(chunk.content) for chunk in streamed) == "Hello from the fake."

    [trajectory] = await trajectories(sqlite_proxy)
    assert trajectory.scenario_id == "streamed" and trajectory.status == "finished"
    assert trajectory.calls is not None and [c.stream for c in trajectory.calls] == [True, True]
    assert all(call.trainable for call in trajectory.calls)


class Answer(BaseModel):
    answer: str


async def test_structured_output_through_the_proxy(sqlite_url: str) -> None:
    async with (
        running_fake_vllm(FakeVllmConfig(reply='{"answer": "Rome"}')) as vllm,
        running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy,
        httpx.AsyncClient() as http,
    ):
        handler = ArtProxyCallback(proxy.root_url, scenario="structured")
        structured = model_for(proxy, http).with_structured_output(Answer, method="json_schema")
        answer = await structured.ainvoke("Where?", {"callbacks": [handler]})
        assert answer == Answer(answer="Rome")

        [trajectory] = await trajectories(proxy)
        assert trajectory.scenario_id == "structured" and trajectory.status == "finished"
        assert trajectory.calls is not None and "response_format" in trajectory.calls[0].request


@pytest.fixture
def sync_http() -> Iterator[httpx.Client]:
    with httpx.Client() as client:
        yield client


async def test_sync_invoke_is_one_trajectory(
    sqlite_proxy: RunningProxy, sync_http: httpx.Client
) -> None:
    handler = ArtProxyCallback(sqlite_proxy.root_url, scenario="sync", reward_fn=lambda _: 0.5)
    model = chat_model(sqlite_proxy.root_url, MODEL, http_client=sync_http)
    agent = create_react_agent(model, [get_weather])
    # The proxy serves on this loop, so the blocking client runs in a thread.
    await asyncio.to_thread(lambda: agent.invoke(QUESTION, {"callbacks": [handler]}))

    [trajectory] = await trajectories(sqlite_proxy)
    assert trajectory.scenario_id == "sync" and trajectory.reward == 0.5
    assert trajectory.call_count == 2 and trajectory.status == "finished"


async def test_chat_model_called_alone_is_its_own_trajectory(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    handler = ArtProxyCallback(sqlite_proxy.root_url, scenario="alone")
    model = model_for(sqlite_proxy, async_http)
    await model.ainvoke("Hi", {"callbacks": [handler], "metadata": {"art_trajectory": "a"}})
    await model.ainvoke("Hi", {"callbacks": [handler], "metadata": {"art_trajectory": "b"}})
    await model.ainvoke("Hi")  # outside a run: no headers, the proxy attributes it itself

    found = {t.id: t for t in await trajectories(sqlite_proxy)}
    assert {"a", "b"} <= set(found) and len(found) == 3
    assert found["a"].scenario_id == "alone" and found["a"].status == "finished"
    assert found["b"].call_count == 1 and found["b"].status == "finished"


async def test_admin_key_authenticates_the_finish_and_a_failed_finish_spares_the_run(
    sqlite_url: str, vllm: FakeVllm, async_http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, admin_key="admin-secret")
    async with running_proxy(settings) as proxy:
        agent = create_react_agent(model_for(proxy, async_http), [get_weather])
        for trajectory_id, key in (("right", "admin-secret"), ("wrong", "guess")):
            handler = ArtProxyCallback(proxy.root_url, scenario="keyed", admin_key=key)
            config: RunnableConfig = {
                "callbacks": [handler],
                "metadata": {"art_trajectory": trajectory_id},
            }
            outputs = await agent.ainvoke(QUESTION, config)
            assert final_text(outputs) == "Hello from the fake."

        await proxy.parts.settled()
        right = await proxy.parts.store.trajectory("right")
        await proxy.parts.settled()
        wrong = await proxy.parts.store.trajectory("wrong")
        assert right is not None and right.status == "finished"
        assert wrong is not None and wrong.status == "open"
        assert "finishing trajectory wrong failed: HTTP 401" in caplog.text


async def test_reward_fn_that_raises_finishes_without_a_reward(
    sqlite_proxy: RunningProxy, async_http: httpx.AsyncClient
) -> None:
    def reward_fn(outputs: Any) -> float:
        raise ValueError("no grade")

    handler = ArtProxyCallback(sqlite_proxy.root_url, scenario="ungraded", reward_fn=reward_fn)
    agent = create_react_agent(model_for(sqlite_proxy, async_http), [get_weather])
    await agent.ainvoke(QUESTION, {"callbacks": [handler]})

    [trajectory] = await trajectories(sqlite_proxy)
    assert trajectory.status == "finished" and trajectory.reward is None
    assert trajectory.metadata == {"reward_error": "ValueError: no grade"}
