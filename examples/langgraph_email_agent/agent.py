"""A LangGraph ReAct agent that answers questions about an inbox (`inbox.py`), trained with RULER.

Each rollout runs `create_react_agent` with the inbox's two tools (`search_inbox`, `read_email`) on
the scenario's question, through the proxy with the project's LangGraph integration
(`examples/react_agent.py`).

The reward the agent reports is whether the answer is right (the scenario's reference, normalized,
inside the normalized answer). Training does not use it: `art-proxy train --judge ...` makes the
reward RULER's score of the group, and the reported one stays on the trajectory, which is what
`evaluate.py` measures on the validation questions (and what `art-proxy judge --programmatic-for
validation` records beside the score). Validation questions are answered greedily, training ones
sampled at temperature 1 (GRPO needs different answers to compare).

    .venv/bin/art-proxy train --agent examples.langgraph_email_agent.agent:rollout \\
        --scenarios examples/langgraph_email_agent/scenarios.jsonl --judge ...
"""

from __future__ import annotations

from art_proxy.rollout import Rollout, RolloutOutcome
from examples.langgraph_email_agent.inbox import TOOLS
from examples.react_agent import react_rollout

SYSTEM = (
    "You answer questions about Sam Carter's email inbox. First call search_inbox with a few "
    "keywords from the question, then read_email on the most relevant result, then answer with "
    "the fact alone, as it is written in the email (a time, an amount, a name or a code)."
)


def normalize(text: str) -> str:
    """Lowercase letters and digits only: "3:00 PM" and "3:00pm", "$4,250" and "4250" agree."""
    return "".join(character for character in text.lower() if character.isalnum())


def correct(answer: str, reference: object) -> float:
    """1.0 when the normalized reference is inside the normalized answer, else 0.0."""
    return 1.0 if normalize(str(reference)) in normalize(answer) else 0.0


async def rollout(run: Rollout) -> float | RolloutOutcome:
    return await react_rollout(
        run,
        TOOLS,
        system=SYSTEM,
        reward=lambda answer: correct(answer, run.scenario.reference),
        temperature=0.0 if run.scenario.split == "val" else 1.0,
    )
