"""The fake vLLM's engine: its shared state and deterministic "sampling", behind `vllm_api`'s seam.

Generation is a pure function of the request: choice `i` says `reply` (plus ` (i)` for i > 0), then
EOS; after a tool result it says `answer_after_tool` instead, when set; turn `k` of a conversation
calls `tool_script[k]` instead, when there is one (`fake_chat`). `max_tokens` cuts it (no EOS then,
finish reason "length"). Logprobs depend only on a token's position in its completion, so a stream
and a non-stream call of the same request agree id for id and logprob for logprob. Everything else
on the wire, errors and request-field rules included, is `vllm_api`'s, which local-llm shares.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from art_proxy.testing.fake_chat import chat_generation
from art_proxy.testing.fake_config import FakeVllmConfig, ScriptedCall
from art_proxy.testing.fake_generation import FakeGeneration
from art_proxy.testing.fake_tokenizer import VOCAB_SIZE, FakeTokenizer
from art_proxy.vllm_api.engine import (
    ChatRequest,
    ChoiceOutput,
    CompletionRequest,
    FinishReason,
    PromptLogprob,
    PromptLogprobs,
    TokenLogprob,
)
from art_proxy.wire import ApiError

# Deterministic stand-ins for sampled logprobs, cycling by position (exact decimals, no float noise).
_SAMPLED_LOGPROBS = (-0.01, -0.02, -0.03, -0.04, -0.05, -0.06, -0.07)
_BARE_LOGPROBS = tuple(TokenLogprob(logprob, ()) for logprob in _SAMPLED_LOGPROBS)
# Pieces offered as runners-up in `top_logprobs`; more than MAX_LOGPROBS so one may equal the sample.
_ALTERNATIVE_PIECES = (
    "the", ",", ".", " ", "a", "and", "to", "of", "I", "is", "in",
    "it", "you", "that", "\n", "for", "on", "with", "as", "was", "be", "!",
)  # fmt: skip


@dataclass
class FakeEngine:
    """The state one fake server shares across requests."""

    config: FakeVllmConfig
    tokenizer: FakeTokenizer = field(init=False)
    # Runtime LoRA adapters, name -> path, in load order (the order /v1/models lists them).
    adapters: dict[str, str] = field(default_factory=dict)
    # JSON bodies received on the generation endpoints, in arrival order, for tests to inspect.
    requests: list[dict[str, Any]] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.tokenizer = FakeTokenizer(self.config.eos_token_id)
        self._alternative_ids = [self.tokenizer.encode(p)[0] for p in _ALTERNATIVE_PIECES]
        self._pieces: dict[int, tuple[str, list[int]]] = {}

    # -- what the seam asks of an engine -----------------------------------------------------

    @property
    def name(self) -> str:
        return self.config.model

    @property
    def root(self) -> str:
        return self.config.model

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def adapter_paths(self) -> Mapping[str, str]:
        return self.adapters

    def screen(self, body: dict[str, Any]) -> None:
        """Keeps every generation request for tests to inspect, the invalid ones too."""
        if self.config.record_requests:
            self.requests.append(body)

    def render(
        self,
        messages: list[Any],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        return self.tokenizer.render_prompt(messages, tools, continue_final=continue_final)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        cached = self._pieces.get(token_id)
        if cached is None:
            cached = self._pieces[token_id] = (
                self.tokenizer.piece(token_id),
                self.tokenizer.piece_bytes(token_id),
            )
        return cached

    async def chat(self, request: ChatRequest, prompt_ids: list[int], limit: int) -> FakeGeneration:
        generation = chat_generation(self, request, limit)
        await self._before_answer()
        return generation

    async def complete(self, request: CompletionRequest, limits: list[int]) -> FakeGeneration:
        outputs = [
            self.generate(
                self.tokenizer.encode(self.reply_text(i)), limit, "stop", request.logprobs
            )
            for limit in limits
            for i in range(request.n)
        ]
        if request.prompt_logprobs is not None:
            k = request.prompt_logprobs
            outputs = [
                dataclasses.replace(
                    output,
                    prompt_logprobs=fake_prompt_logprobs(
                        request.prompts[index // request.n], k, self._alternative_ids
                    ),
                )
                for index, output in enumerate(outputs)
            ]
        await self._before_answer()

        def text(index: int, start: int, end: int) -> tuple[str, tuple[dict[str, Any], ...]]:
            return self.tokenizer.decode(outputs[index].token_ids[start:end]), ()

        return FakeGeneration(outputs, self.config, text)

    async def load_adapter(self, name: str, path: str, *, replace: bool) -> None:
        if name in self.adapters and not replace:
            raise ApiError(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True.",
                type="InvalidUserInput",
            )
        if not await asyncio.to_thread(os.path.exists, path):
            raise ApiError(404, f"Loading lora {name} failed: No adapter found for {path}")
        # In place keeps the adapter's position in /v1/models, as vLLM's registry does.
        self.adapters[name] = path

    async def unload_adapter(self, name: str) -> None:
        if self.adapters.pop(name, None) is None:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.")

    # -- what it generates -------------------------------------------------------------------

    def reply_text(self, choice_index: int, *, after_tool_result: bool = False) -> str:
        reply = self.config.reply
        if after_tool_result and self.config.answer_after_tool is not None:
            reply = self.config.answer_after_tool
        return reply if choice_index == 0 else f"{reply} ({choice_index})"

    def scripted_call(self, messages: list[Any]) -> ScriptedCall | None:
        """The call of `tool_script` for the turn that answers `messages` (None: past the end)."""
        turn = sum(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)
        script = self.config.tool_script
        return script[turn] if turn < len(script) else None

    def generate(
        self, body_ids: tuple[int, ...], limit: int, finish: FinishReason, top_logprobs: int | None
    ) -> ChoiceOutput:
        """`body_ids` + EOS, cut to `limit` ids; `finish` is the reason when nothing was cut.
        With `top_logprobs` None the output has no logprobs (nobody asked)."""
        ids = (*body_ids, self.config.eos_token_id)
        if len(ids) > limit:
            ids, finish = ids[:limit], "length"
        logprobs = () if top_logprobs is None else self._logprobs(ids, top_logprobs)
        return ChoiceOutput(ids, logprobs, self.tokenizer.decode(ids), finish)

    def _logprobs(self, ids: tuple[int, ...], k: int) -> tuple[TokenLogprob, ...]:
        """Each id's logprob by its position; with k > 0 the sampled id and its logprob rank
        first among the top k, then k - 1 runners-up with lower logprobs."""
        if k <= 0:  # the commonest ask, on every call the proxy makes: no runners-up
            return tuple(
                _BARE_LOGPROBS[position % len(_BARE_LOGPROBS)] for position in range(len(ids))
            )
        return tuple(
            TokenLogprob(_sampled_logprob(position), self._top_logprobs(token_id, position, k))
            for position, token_id in enumerate(ids)
        )

    def _top_logprobs(self, token_id: int, position: int, k: int) -> tuple[tuple[int, float], ...]:
        ranked = [(token_id, _sampled_logprob(position))]
        for alternative in self._alternative_ids:
            if len(ranked) >= k:
                break
            if alternative != token_id:
                ranked.append((alternative, -2.0 - len(ranked)))
        return tuple(ranked)

    async def _before_answer(self) -> None:
        """Injected failure and latency, applied once a request has been validated."""
        if self.config.error_status:
            raise ApiError(self.config.error_status, "Injected failure (error_status).")
        if self.config.delay_s:
            await asyncio.sleep(self.config.delay_s)


def _sampled_logprob(position: int) -> float:
    return _SAMPLED_LOGPROBS[position % len(_SAMPLED_LOGPROBS)]


def fake_prompt_logprob(token_id: int) -> float:
    """The fake's `prompt_logprobs` of an id: a function of the id alone (exact decimals), so a
    test knows what a teacher served by the fake says of any token."""
    return -(10 + token_id % 13) / 100


def fake_prompt_logprobs(ids: list[int], k: int, alternatives: list[int]) -> PromptLogprobs:
    """Each prompt id after the first: `fake_prompt_logprob`, ranked first, then k runners-up."""
    scored: list[PromptLogprob | None] = [None]
    for token_id in ids[1:]:
        top = [(token_id, fake_prompt_logprob(token_id))]
        top += [(other, -3.0 - n) for n, other in enumerate(alternatives) if other != token_id]
        scored.append(PromptLogprob(fake_prompt_logprob(token_id), 1, tuple(top[:k])))
    return tuple(scored)
