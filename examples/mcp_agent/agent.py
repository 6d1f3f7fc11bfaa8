"""A LangGraph ReAct agent whose tools come from an MCP server: the grocery store of `server.py`.

Each rollout starts the server over stdio (the same Python, `sys.executable`) through
langchain-mcp-adapters, loads its tools and runs `create_react_agent` on the scenario's question,
through the proxy with the project's LangGraph integration (`examples/react_agent.py`). The reward
is checked by code against the scenario's reference, so no judge is needed.

One server per rollout: it starts in about 0.7 s and closes in 0.25 s (mostly importing `mcp`),
small beside the model's calls, and no rollout sees another's server. The agent contract has no
hook to close a server shared by a whole run.

    ART_PROXY_GROUP_SIZE=4 .venv/bin/art-proxy up --agent examples.mcp_agent.agent:rollout \\
        --scenarios examples/mcp_agent/scenarios.jsonl --steps 3
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

from art_proxy.rollout import Rollout, RolloutOutcome
from examples.react_agent import react_rollout

SERVER = Path(__file__).with_name("server.py")
SYSTEM = (
    "You are the assistant of a grocery store. Look up stock and prices with the tools, then "
    "answer with the number."
)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def reward(answer: str, reference: object) -> float:
    """1.0 when the reference number is one of the numbers the answer states ("12" is in "There are
    12.", not in "120" nor "$0.12"), else 0.0."""
    return 1.0 if str(reference) in _NUMBER.findall(answer) else 0.0


def store_client() -> MultiServerMCPClient:
    """An MCP client that runs the store server over stdio, with this Python."""
    return MultiServerMCPClient(
        {"store": {"transport": "stdio", "command": sys.executable, "args": [str(SERVER)]}}
    )


async def rollout(run: Rollout) -> float | RolloutOutcome:
    async with store_client().session("store") as session:
        tools = await load_mcp_tools(session)
        return await react_rollout(
            run,
            tools,
            system=SYSTEM,
            reward=lambda answer: reward(answer, run.scenario.reference),
        )
