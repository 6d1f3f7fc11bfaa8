"""The smallest agent that art-proxy records: the plain OpenAI SDK, unmodified.

Only the environment changes: `OPENAI_BASE_URL=http://127.0.0.1:8100/v1` points the SDK at the
proxy. Each rollout is a two-turn conversation; the proxy stitches its turns into one trajectory
(automatic attribution) and, since the rollouts share their opening, puts them in one group, the
unit RULER ranks. Run it with the stack up (`art-proxy up`):

    OPENAI_BASE_URL=http://127.0.0.1:8100/v1 OPENAI_API_KEY=unused \\
        python examples/openai_sdk/agent.py --rollouts 4
"""

from __future__ import annotations

import argparse
import asyncio
import os

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

MODEL = os.environ.get("ART_MODEL", "SmolLM2-135M-Instruct")
QUESTION = "Why is the sky blue?"


async def rollout(client: AsyncOpenAI, seed: int) -> list[ChatCompletionMessageParam]:
    """Ask, then ask for a shorter answer: two calls of one conversation."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": QUESTION},
    ]
    for follow_up in ("Now say it in five words or fewer.", None):
        reply = await client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=48, temperature=1.0, seed=seed
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        if follow_up is None:
            break
        messages.append({"role": "user", "content": follow_up})
    return messages


async def main(rollouts: int) -> None:
    async with AsyncOpenAI() as client:
        results = await asyncio.gather(*(rollout(client, seed) for seed in range(rollouts)))
    for number, messages in enumerate(results):
        print(f"--- rollout {number}")
        for message in messages[1:]:
            print(f"{message['role']:>9}: {message.get('content')}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=4, help="conversations run side by side")
    asyncio.run(main(parser.parse_args().rollouts))
