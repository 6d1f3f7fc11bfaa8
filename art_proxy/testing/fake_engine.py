"""The fake vLLM's configuration, shared state and deterministic "sampling".

Generation is a pure function of the request: choice `i` says `reply` (plus ` (i)` for i > 0), then
EOS; after a tool result it says `answer_after_tool` instead, when set; turn `k` of a conversation
calls `tool_script[k]` instead, when there is one. `max_tokens` cuts it (no EOS then, finish reason
"length"). Logprobs depend only on a token's position in its completion, so a stream and a
non-stream call of the same request agree id for id and logprob for logprob. Errors and
request-field rules are vLLM's own, from `art_proxy.wire`, which `art-proxy local-llm` shares.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from art_proxy.testing.fake_tokenizer import IM_END_ID, FakeTokenizer
from art_proxy.wire import ApiError, completion_limit

FinishReason = Literal["stop", "length", "tool_calls"]

# Deterministic stand-ins for sampled logprobs, cycling by position (exact decimals, no float noise).
_SAMPLED_LOGPROBS = (-0.01, -0.02, -0.03, -0.04, -0.05, -0.06, -0.07)
# Pieces offered as runners-up in `top_logprobs`; more than MAX_LOGPROBS so one may equal the sample.
_ALTERNATIVE_PIECES = (
    "the", ",", ".", " ", "a", "and", "to", "of", "I", "is", "in",
    "it", "you", "that", "\n", "for", "on", "with", "as", "was", "be", "!",
)  # fmt: skip


class ScriptedCall(BaseModel):
    """A tool call the fake makes at its turn of `tool_script`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="An offered tool (else a 400).")
    arguments: dict[str, Any] = Field(default_factory=dict)


class FakeVllmConfig(BaseModel):
    """How the fake answers. Every knob has a default, so `FakeVllmConfig()` is a plain vLLM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("Qwen/Qwen2.5-0.5B-Instruct", description="Served name of the base model.")
    max_model_len: int = Field(2048, ge=1, description="Context length in tokens, prompt included.")
    allow_runtime_lora: bool = Field(
        True, description="Serve /v1/load_lora_adapter and /v1/unload_lora_adapter (else 404)."
    )
    reply: str = Field("Hello from the fake.", description="Assistant text of choice 0.")
    answer_after_tool: str | None = Field(
        None,
        description="Assistant text of choice 0 when the last message is a tool result (None = "
        "reply): with tool_call, a scripted agent turn that calls a tool with `reply` as its "
        "argument, then answers this.",
    )
    delay_s: float = Field(0.0, ge=0, description="Seconds to wait before answering (0 = none).")
    chunk_delay_s: float = Field(0.0, ge=0, description="Seconds between stream chunks (0 = none).")
    tokens_per_chunk: int = Field(
        1, ge=1, description="Generated ids carried by each stream chunk."
    )
    fail_mid_stream: bool = Field(
        False, description="Streams send one token chunk, then an error event, then [DONE]."
    )
    error_status: int = Field(
        0, description="Answer every valid generation request with this HTTP error (0 = off)."
    )
    tool_call: bool = Field(
        True,
        description="Call the first tool when tools are offered and the last message is not a "
        "tool result (False = always answer text, unless tool_choice names or requires a tool).",
    )
    tool_script: tuple[ScriptedCall, ...] = Field(
        (),
        description="Tool calls by turn, for multi-step agents: a request whose conversation holds "
        "k assistant messages, with tools offered and tool_choice auto or required, calls "
        "tool_script[k]; past its end the fake answers as without a script.",
    )
    record_requests: bool = Field(
        True, description="Keep each generation request body (off for long benchmark runs)."
    )
    eos_token_id: int = Field(IM_END_ID, description="Id that ends a turn (Qwen's <|im_end|>).")


@dataclass(frozen=True, slots=True)
class Generated:
    """One choice's output: ids (EOS last unless cut), decoded text and why it ended."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason


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

    def record(self, body: dict[str, Any]) -> None:
        if self.config.record_requests:
            self.requests.append(body)

    def served_model(self, body: dict[str, Any]) -> str:
        """The name a response echoes: the requested base or adapter name (omitted = base)."""
        model = body.get("model")
        if model is None or model == self.config.model:
            return self.config.model
        if not isinstance(model, str):
            raise ApiError(400, "'model' must be a string.", param="model")
        if model in self.adapters:
            return model
        raise ApiError(404, f"The model `{model}` does not exist.", param="model")

    def completion_limit(
        self, prompt_len: int, max_tokens: int | None, *, param: str = "max_tokens"
    ) -> int:
        """How many ids a choice may generate (`wire.completion_limit`'s rules)."""
        return completion_limit(prompt_len, max_tokens, self.config.max_model_len, param=param)

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

    def generate(self, body_ids: tuple[int, ...], limit: int, finish: FinishReason) -> Generated:
        """`body_ids` + EOS, cut to `limit` ids; `finish` is the reason when nothing was cut."""
        ids = (*body_ids, self.config.eos_token_id)
        if len(ids) > limit:
            ids = ids[:limit]
            return Generated(ids, self.tokenizer.decode(ids), "length")
        return Generated(ids, self.tokenizer.decode(ids), finish)

    def top_logprobs(self, token_id: int, position: int, k: int) -> list[tuple[int, float]]:
        """The sampled id and its logprob first, then k - 1 runners-up with lower logprobs."""
        if k <= 0:
            return []
        ranked = [(token_id, sampled_logprob(position))]
        for alternative in self._alternative_ids:
            if len(ranked) >= k:
                break
            if alternative != token_id:
                ranked.append((alternative, -2.0 - len(ranked)))
        return ranked

    async def before_answer(self) -> None:
        """Injected failure and latency, applied once a request has been validated."""
        if self.config.error_status:
            raise ApiError(self.config.error_status, "Injected failure (error_status).")
        if self.config.delay_s:
            await asyncio.sleep(self.config.delay_s)


def sampled_logprob(position: int) -> float:
    return _SAMPLED_LOGPROBS[position % len(_SAMPLED_LOGPROBS)]


def mid_stream_error() -> dict[str, Any]:
    return ApiError(500, "Injected failure in the middle of the stream (fail_mid_stream).").body()


# -- stream chunks -------------------------------------------------------------------------


def chunks_of(length: int, size: int) -> list[tuple[int, int]]:
    """[start, end) bounds of the stream chunks for `length` ids; an empty output still ends once."""
    return [(start, min(start + size, length)) for start in range(0, length, size)] or [(0, 0)]


# -- server-sent events --------------------------------------------------------------------


async def serve_events(
    request: web.Request, events: Iterable[dict[str, Any]], chunk_delay_s: float
) -> web.StreamResponse:
    """Write each event as `data: {json}` the moment it is made, then `data: [DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    try:
        for number, payload in enumerate(events):
            if chunk_delay_s and number:
                await asyncio.sleep(chunk_delay_s)
            await response.write(b"data: " + orjson.dumps(payload) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    except ConnectionResetError:
        pass  # The client hung up mid-stream: nothing is left to answer, and that is no error.
    return response
