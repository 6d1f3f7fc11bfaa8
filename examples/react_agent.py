"""The rollout the LangGraph examples share: `create_react_agent` through the proxy, scored by code.

`chat_model` sends the run's `X-Art-*` headers (scenario, group, trajectory, split) with every call
and `ArtProxyCallback` finishes the trajectory with the reward when the graph ends; the rollout
runner then finishes it again with what the rollout returns (a finish overwrites, so the two agree).
A model that keeps calling tools hits the recursion limit: that is a failed task, a zero to learn
from, not a crashed rollout. Each rollout reports how many tool calls the model made (the
trajectory's `tool_calls` metric) and whether it made any (`used_tools`, 1 or 0: its mean over a
training step's rollouts, `agent/used_tools` in the step's metrics, is the tool-call rate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import httpx
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.tools import BaseTool
from langgraph.errors import GraphRecursionError
from langgraph.prebuilt import create_react_agent

from art_proxy.rollout import Rollout, RolloutOutcome
from art_proxy_integrations.langgraph import ArtProxyCallback, chat_model

# Room for a tool call or a short answer; a small model that rambles is cut, not waited for.
MAX_TOKENS = 128
# Graph steps: a model call and a tool call are one each, so about 4 tool calls, then an answer.
RECURSION_LIMIT = 10


def final_answer(outputs: dict[str, Any]) -> str:
    message = outputs["messages"][-1]
    return message.text if isinstance(message, BaseMessage) else ""


def tool_calls(outputs: dict[str, Any]) -> int:
    """The tool calls the model made in the run."""
    return sum(len(m.tool_calls) for m in outputs["messages"] if isinstance(m, AIMessage))


async def react_rollout(
    run: Rollout,
    tools: Sequence[BaseTool],
    *,
    system: str,
    reward: Callable[[str], float],
    temperature: float = 1.0,
) -> float | RolloutOutcome:
    """Answer `run`'s question with a ReAct agent over `tools`; `reward(final answer)`."""

    def score(outputs: dict[str, Any]) -> float:
        return reward(final_answer(outputs))

    handler = ArtProxyCallback(
        run.proxy_url,
        scenario=run.scenario.id,
        split=run.split or run.scenario.split,
        reward_fn=score,
    )
    async with httpx.AsyncClient() as http:
        model = chat_model(
            run.proxy_url,
            run.model,
            api_key=run.api_key,
            http_async_client=http,
            max_tokens=MAX_TOKENS,
            temperature=temperature,
        )
        agent = create_react_agent(model, list(tools), prompt=system)
        try:
            outputs = await agent.ainvoke(
                {"messages": [{"role": "user", "content": str(run.scenario.input)}]},
                {
                    "callbacks": [handler],
                    "metadata": {"art_trajectory": run.trajectory_id, "art_group": run.group_id},
                    "recursion_limit": RECURSION_LIMIT,
                },
            )
        except GraphRecursionError:
            return RolloutOutcome(
                0.0,
                # A graph step per model call and per tool call: about half of them called tools.
                metrics=_tool_metrics(RECURSION_LIMIT // 2),
                metadata={"stopped": f"recursion limit {RECURSION_LIMIT}"},
            )
    return RolloutOutcome(score(outputs), metrics=_tool_metrics(tool_calls(outputs)))


def _tool_metrics(calls: int) -> dict[str, float]:
    return {"tool_calls": float(calls), "used_tools": float(calls > 0)}
