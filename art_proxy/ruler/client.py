"""The seam between the scorer and a judge: one request in, one reply (text, logprobs, usage) out.

`judge.LitellmJudge` is the implementation; this module stays free of litellm so that code which
only scores (the trainer) or fakes a judge does not import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from art_proxy.records import JsonObject, JudgeMode
from art_proxy.ruler.logprob import TokenChoice


@dataclass(frozen=True)
class JudgeRequest:
    messages: list[JsonObject]
    mode: JudgeMode
    labels: int  # trajectories in the prompt: bounds a logprob answer's length
    answer_schema: type[BaseModel] | None = None  # structured output, where the judge has it
    # The last message is the judge's answer begun for it: a token or two more are wanted, read
    # by their logprobs (vLLM's `continue_final_message`).
    continue_final: bool = False
    max_tokens: int | None = None  # the answer's room in the judge's context (None: no cap)


@dataclass(frozen=True)
class JudgeReply:
    text: str
    tokens: list[TokenChoice] | None  # with logprobs (logprob mode)
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    cut: bool = False  # stopped at a token limit (finish_reason "length"): it may end mid-word
    # Cut before its answer began: a reasoning model still thinking (its thinking counts against
    # `max_tokens`), which the same room would cut again.
    cut_while_thinking: bool = False


class JudgeClient(Protocol):
    model: str
    # The judge's context in tokens where its server says (`/v1/models` `max_model_len`), after
    # `check()`; None: unknown (a hosted model: `--judge-max-prompt-tokens` bounds the prompt).
    context_tokens: int | None

    async def complete(self, request: JudgeRequest) -> JudgeReply: ...

    async def prompt_tokens(self, messages: list[JsonObject]) -> int | None:
        """`messages` counted by the judge's own tokenizer, where its server counts (vLLM's
        and local-llm's `/tokenize`); None where it cannot."""
        ...

    async def aclose(self) -> None: ...
