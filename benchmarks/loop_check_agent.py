"""The loop check's agent (`loop_check.py`): a task a model with random weights can learn in a few
steps.

The call's `logit_bias` (+100 on two ids, " yes" and " no") leaves the model those two tokens to
sample from at every position, whatever its weights; which of the two it favours depends on the
context, so every group has spread. The reward is the share of " yes" among them: pushing the
hidden state along one direction, which a LoRA adapter learns in a few steps. Plain OpenAI SDK
code: the trainer's rollout runner hands it its base URL and the model to call. The two ids come
from `LOOP_CHECK_TOKENS` ("YES,NO"), which the check sets from its tokenizer.
"""

from __future__ import annotations

import os

from art_proxy.rollout import Rollout

ANSWER_TOKENS = 16
TOKENS_ENV = "LOOP_CHECK_TOKENS"


def token_ids() -> tuple[int, int]:
    yes, no = (int(part) for part in os.environ[TOKENS_ENV].split(","))
    return yes, no


def share_of_yes(answer: str) -> float:
    words = answer.split()
    return words.count("yes") / len(words) if words else 0.0


async def rollout(run: Rollout) -> float:
    yes, no = token_ids()
    async with run.openai_client() as client:
        reply = await client.chat.completions.create(
            model=run.model,
            messages=[{"role": "user", "content": str(run.scenario.input)}],
            max_tokens=ANSWER_TOKENS,
            temperature=1.0,
            logit_bias={str(yes): 100, str(no): 100},
        )
    return share_of_yes(reply.choices[0].message.content or "")
