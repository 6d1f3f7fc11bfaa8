"""The MCP example's agent, run by the rollout runner through the real proxy, the fake vLLM and the
real MCP store server (a subprocess over stdio).

The fake calls the first tool offered, the store's `stock`, with its `reply` as the argument, then
answers `answer_after_tool`: one tool call, then the final answer the reward checks.
"""

from __future__ import annotations

import json

import pytest

from art_proxy.proxy.server import running_proxy
from art_proxy.records import Split, TrajectoryRecord
from art_proxy.rollout import RolloutReport, run_rollouts
from art_proxy.scenarios import Scenario
from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm
from examples.mcp_agent.agent import rollout
from tests.conftest import proxy_settings, trajectories

# create_react_agent is what the example uses; LangGraph 1.x points to langchain.agents instead.
pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
SCENARIO = Scenario(
    id="stock-apple", input="How many apples are in stock?", reference="12", split="train"
)


async def run_example(
    sqlite_url: str, answer: str, split: Split | None = None
) -> tuple[RolloutReport, TrajectoryRecord]:
    config = FakeVllmConfig(reply="apples", answer_after_tool=answer)
    async with (
        running_fake_vllm(config) as vllm,
        running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy,
    ):
        report = await run_rollouts(
            rollout,
            [SCENARIO],
            proxy_url=proxy.root_url,
            group_size=1,
            concurrency=1,
            timeout_s=60,
            model=MODEL,
            split=split,
        )
        [trajectory] = await trajectories(proxy)
    return report, trajectory


async def test_tool_call_and_mcp_result_are_stitched_and_the_right_answer_scores_1(
    sqlite_url: str,
) -> None:
    report, trajectory = await run_example(sqlite_url, answer="There are 12 apples in stock.")

    assert report.failed == 0 and not report.groups[0].unrecorded
    assert (
        trajectory.scenario_id == "stock-apple" and trajectory.group_id == report.groups[0].group_id
    )
    assert trajectory.status == "finished" and trajectory.reward == 1.0
    assert trajectory.calls is not None and len(trajectory.calls) == 2
    first, second = trajectory.calls
    assert first.response is not None
    [call] = first.response["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "stock"
    assert json.loads(call["function"]["arguments"]) == {"item": "apples"}
    tool_message = second.request["messages"][-1]
    assert tool_message["role"] == "tool" and tool_message["tool_call_id"] == call["id"]
    assert tool_message["content"] == [{"type": "text", "text": "12"}]  # the MCP server's answer
    assert second.stitched and second.trainable


async def test_a_wrong_answer_scores_0(sqlite_url: str) -> None:
    report, trajectory = await run_example(sqlite_url, answer="There are 120 apples.")

    assert report.failed == 0
    assert trajectory.status == "finished" and trajectory.reward == 0.0
    assert trajectory.call_count == 2


async def test_a_rollout_under_another_split_is_recorded_under_it(sqlite_url: str) -> None:
    """`art-proxy eval` runs validation scenarios under the split `eval`: the LangGraph agent's
    calls must carry the rollout's split, not the scenario's, or the evaluation lands among the
    validation groups."""
    report, trajectory = await run_example(sqlite_url, answer="12 apples.", split="eval")

    assert trajectory.split == "eval" and not report.warnings
