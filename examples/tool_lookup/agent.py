"""A stock LangGraph `create_react_agent` with one ordinary LangChain tool, on a task it cannot do
without it: tell the code word of a city, which only the tool knows (`codes.py`).

The agent is unchanged LangGraph code; only the chat model's base URL points at the proxy (through
the project's LangGraph integration, `examples/react_agent.py`). The reward is checked by code: 1
when the final answer states the scenario's code word, else 0. Each rollout also reports its tool
calls, so the tool-call rate is measured beside the success rate. `mcp_rollout` is the same agent
with the tool taken from a local MCP server (`mcp_server.py`, one per rollout, over stdio, through
langchain-mcp-adapters).

    .venv/bin/python -m examples.tool_lookup.run              # demonstrations, warm start, GRPO
    .venv/bin/python -m examples.tool_lookup.run --tools mcp  # the tool from the MCP server
"""

from __future__ import annotations

import sys
from pathlib import Path

from langchain_core.tools import tool
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

from art_proxy.rollout import Rollout, RolloutOutcome
from examples.react_agent import react_rollout
from examples.tool_lookup.codes import code_word

ROOT = Path(__file__).resolve().parents[2]  # the repository root, where `examples` imports from

SYSTEM = (
    "You answer questions about code words. You cannot know a code word: call the "
    "lookup_code_word tool with the city, then answer with the code word it returns."
)


@tool
def lookup_code_word(city: str) -> str:
    """The code word of a city."""
    return code_word(city)


def reward(answer: str, reference: object) -> float:
    """1.0 when the answer states the code word, else 0.0."""
    return 1.0 if isinstance(reference, str) and reference in answer.lower() else 0.0


async def rollout(run: Rollout) -> float | RolloutOutcome:
    return await react_rollout(
        run,
        [lookup_code_word],
        system=SYSTEM,
        reward=lambda answer: reward(answer, run.scenario.reference),
    )


async def mcp_rollout(run: Rollout) -> float | RolloutOutcome:
    """`rollout` with the tool loaded from the MCP server, started for this rollout."""
    client = MultiServerMCPClient(
        {
            "codes": {
                "transport": "stdio",
                "command": sys.executable,
                "args": ["-m", "examples.tool_lookup.mcp_server"],
                "cwd": str(ROOT),
            }
        }
    )
    async with client.session("codes") as session:
        return await react_rollout(
            run,
            await load_mcp_tools(session),
            system=SYSTEM,
            reward=lambda answer: reward(answer, run.scenario.reference),
        )
