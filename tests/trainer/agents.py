"""Agents the training-loop tests hand to the trainer (loaded by path, as users' agents are)."""

from __future__ import annotations

from art_proxy.rollout import Rollout


async def length_agent(run: Rollout) -> float:
    """One short call; the reward is a function of the reply's length that a random model's
    replies spread over [0, 1] (what it measures does not matter here, only that it varies)."""
    async with run.openai_client() as client:
        reply = await client.chat.completions.create(
            model=run.model,
            messages=[{"role": "user", "content": str(run.scenario.input)}],
            max_tokens=6,
            temperature=1.0,
        )
    return len(reply.choices[0].message.content or "") % 7 / 6
