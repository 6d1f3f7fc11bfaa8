"""Agents the training-loop tests hand to the trainer (loaded by path, as users' agents are)."""

from __future__ import annotations

import asyncio
import re

from openai.types.chat import ChatCompletion

from art_proxy.rollout import Rollout

# The validation reward of each served model: up at step 1, down at 2, back up (equal) at 3.
SCRIPTED_VAL_REWARDS = {
    "tiny-llama": 0.5,
    "tiny-llama@1": 0.7,
    "tiny-llama@2": 0.6,
    "tiny-llama@3": 0.7,
}


def untagged(text: str) -> str:
    """`tiny-llama@3-3f9a1c` -> `tiny-llama@3`: adapters' names (in a name or a sentence) without
    their run's tag, which is random."""
    return re.sub(r"@(\d+)-[0-9a-f]{6}\b", r"@\1", text)


async def _ask(run: Rollout) -> ChatCompletion:
    async with run.openai_client() as client:
        return await client.chat.completions.create(
            model=run.model,
            messages=[{"role": "user", "content": str(run.scenario.input)}],
            max_tokens=6,
            temperature=1.0,
        )


def length_reward(reply: ChatCompletion, index: int) -> float:
    """A function of the reply's length, in [0, 1/3] for a group's even rollouts and [2/3, 1] for
    its odd ones: every group of two or more has a spread. By length alone, the random model's four
    replies of a group sometimes scored alike: the trainer skips such a group and takes another,
    so a test that counts groups waited for one that never came."""
    return (len(reply.choices[0].message.content or "") % 7 / 6 + 2 * (index % 2)) / 3


async def length_agent(run: Rollout) -> float:
    """One short call; the reward is `length_reward` (what it measures does not matter here, only
    that it varies)."""
    return length_reward(await _ask(run), run.index)


async def scripted_validation_agent(run: Rollout) -> float:
    """`length_agent` on training scenarios; on validation ones, the reward scripted for the
    model that served the call (the proxy answers with the served adapter's name)."""
    reply = await _ask(run)
    if run.scenario.split == "val":
        return SCRIPTED_VAL_REWARDS.get(untagged(reply.model), 0.0)
    return length_reward(reply, run.index)


async def fails_unless_guided(run: Rollout) -> float:
    """Fails every unguided rollout; a guided retry's rollouts alternate 0 and 1 (a group with
    signal): the loop's plumbing of guided retries, not learning."""
    await _ask(run)
    return float(run.guidance is not None and run.index % 2 == 1)


async def rescued_when_guided(run: Rollout) -> float:
    """Fails every unguided rollout and succeeds every guided one: a retry without spread of
    its own, whose signal is against the unguided failures."""
    await _ask(run)
    return float(run.guidance is not None)


# How long `slow_validation_agent`'s validation rollouts wait on their tool: longer than a tiny
# model's steps, so a step that waited for its validation shows it.
SLOW_VALIDATION_S = 6.0


async def slow_validation_agent(run: Rollout) -> float:
    """`length_agent`, whose validation rollouts then wait on a slow tool."""
    reply = await _ask(run)
    if run.scenario.split == "val":
        await asyncio.sleep(SLOW_VALIDATION_S)
    return length_reward(reply, run.index)


async def misnamed_model_agent(run: Rollout) -> float:
    """Asks for a model nobody serves: every rollout fails with the same 404."""
    async with run.openai_client(max_retries=0) as client:
        await client.chat.completions.create(
            model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    return 1.0


async def flaky_agent(run: Rollout) -> float:
    """Fails every time, each rollout with its own error."""
    raise RuntimeError(f"the tool of rollout {run.trajectory_id} broke")


async def unrewarded_agent(run: Rollout) -> None:
    """One short call and no reward: what production traffic without a judge looks like."""
    await _ask(run)


async def same_reward_agent(run: Rollout) -> float:
    """One short call, every rollout rewarded alike: no group has a spread (GRPO learns nothing
    from it; a teacher's term still does)."""
    await _ask(run)
    return 0.5
