"""A verifiable task the base model fails: answer with one word. The reward is checked by code.

SmolLM2-135M-Instruct answers "Name a fruit." (told to answer with a single word) with a sentence
nearly every time, so its reward starts near 0. The reward is 1/words for an answer that ended (one
word scores 1, three words 1/3) and 0 for one cut off by `max_tokens`, so most groups of 8 hold some
spread for GRPO to learn from. The agent is plain OpenAI SDK code: art-proxy's rollout runner hands
it a base URL (its trajectory's) and the model name to call (the alias the trainer moves).

    .venv/bin/art-proxy up --agent examples/single_word/agent.py:rollout \\
        --scenarios examples/single_word/scenarios.jsonl --steps 20
"""

from __future__ import annotations

import re
from typing import Any

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletion

from art_proxy.rollout import Rollout

SYSTEM = "You are a helpful assistant. Answer with a single word."
# A guided retry's hint (train --guided-retries --guide): what a teacher would say to a model that
# answered every time with a sentence. The trainer never trains on it.
HINT = "Reply with that one word only, for example: Apple"
# Room for a word and its end-of-turn token, not for a sentence.
MAX_TOKENS = 8
_WORD = re.compile(r"[^\W_]+(?:['-][^\W_]+)*")


def reward(answer: str) -> float:
    """1 / the number of words (1 for exactly one word; 0 for none)."""
    words = len(_WORD.findall(answer))
    return 1.0 / words if words else 0.0


def rate(answer: str | None, finish_reason: str) -> float:
    """The reward of one reply: `reward` of its text, 0 for one cut off by `max_tokens` (it did
    not stop after its words)."""
    return reward(answer or "") if finish_reason == "stop" else 0.0


def check(messages: list[dict[str, Any]], choice: dict[str, Any]) -> float:
    """`rate` as a best-of-N chooser, for the proxy to pick among answers as it serves them:
    `art-proxy serve --best-of-check examples/single_word/agent.py:check`."""
    return rate(choice["message"].get("content"), choice["finish_reason"])


async def ask(client: AsyncOpenAI, model: str, question: str) -> ChatCompletion:
    """The task's one call: the question under the single-word instruction, sampled at 1."""
    return await client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=MAX_TOKENS,
        temperature=1.0,
    )


async def rollout_strict(run: Rollout) -> float:
    """The same call, rewarded 1 for exactly one word and 0 otherwise: a task whose groups the
    base model mostly fails outright (benchmarks/learning_curve.py --guided-study)."""
    async with run.openai_client() as client:
        reply = await ask(client, run.model, str(run.scenario.input))
    choice = reply.choices[0]
    return float(rate(choice.message.content, choice.finish_reason) == 1.0)


async def rollout(run: Rollout) -> float:
    async with run.openai_client() as client:
        reply = await ask(client, run.model, str(run.scenario.input))
    choice = reply.choices[0]
    return rate(choice.message.content, choice.finish_reason)
