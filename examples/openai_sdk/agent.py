"""The smallest agent that art-proxy records: the plain OpenAI SDK, unmodified.

Only the environment changes: `OPENAI_BASE_URL=http://127.0.0.1:8100/v1` points the SDK at the
proxy, which stitches the two turns below into one trajectory (automatic attribution) and records
every call with its token ids. Run it with the proxy up:

    OPENAI_BASE_URL=http://127.0.0.1:8100/v1 OPENAI_API_KEY=unused python examples/openai_sdk/agent.py
"""

from __future__ import annotations

import os

from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

MODEL = os.environ.get("ART_MODEL", "SmolLM2-135M-Instruct")


def run(client: OpenAI, question: str) -> list[ChatCompletionMessageParam]:
    """Ask, then ask for a shorter answer: two calls of one conversation."""
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": question},
    ]
    for follow_up in ("Now say it in five words or fewer.", None):
        reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=48)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
        if follow_up is None:
            break
        messages.append({"role": "user", "content": follow_up})
    return messages


if __name__ == "__main__":
    for message in run(OpenAI(), "Why is the sky blue?"):
        print(f"{message['role']:>9}: {message.get('content')}")
