"""What the Responses and Messages dialects read of a chat answer, whole or chunk by chunk.

Both dialects answer with one choice (neither has `n`), so only the first is read. A stream is read
as a sequence of `Delta`s (reasoning text, reply text, a tool call's start, a tool call's argument
text), which each dialect renders as its own events.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from art_proxy.errors import ArtProxyError, BadRequest
from art_proxy.records import JsonObject

# Request fields a dialect passes to chat completions as they are: the sampling fields both APIs
# share with it, and vLLM's own (an SDK's `extra_body`), which the capture rules then judge
# (capture.unreproduced_sampling).
PASSED_FIELDS = (
    "model",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "min_tokens",
    "bad_words",
    "allowed_token_ids",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True)
class Reply:
    """The first choice of a chat answer."""

    reasoning: str | None
    text: str | None
    tool_calls: list[ToolCall]
    finish_reason: str | None
    stop_reason: Any  # vLLM: the stop string (or token id) that ended it
    prompt_tokens: int
    completion_tokens: int


def fallback_call_id(call_id: str, index: int) -> str:
    """The id of a tool call the upstream gave none, the same whole or streamed."""
    return f"call_{call_id}_{index}"


def reply_of(response: JsonObject, fallback_id: str) -> Reply:
    choices = response.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    calls = [
        ToolCall(
            id=call.get("id") or fallback_call_id(fallback_id, index),
            name=(call.get("function") or {}).get("name") or "",
            arguments=(call.get("function") or {}).get("arguments") or "{}",
        )
        for index, call in enumerate(message.get("tool_calls") or [])
    ]
    usage = response.get("usage") or {}
    return Reply(
        reasoning=message.get("reasoning") or message.get("reasoning_content") or None,
        text=message.get("content") or None,
        tool_calls=calls,
        finish_reason=choice.get("finish_reason"),
        stop_reason=choice.get("stop_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
    )


def arguments_object(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as an object (what Anthropic's `tool_use.input` is); text that is
    not a JSON object is kept under `arguments` rather than lost."""
    with contextlib.suppress(orjson.JSONDecodeError):
        parsed = orjson.loads(arguments)
        if isinstance(parsed, dict):
            return parsed
    return {"arguments": arguments}


def joined_text(parts: list[str]) -> str:
    """Text parts as one string, joined the way vLLM joins a message's text parts."""
    return "\n".join(parts)


def upstream_error(chunk: JsonObject) -> ArtProxyError:
    """The error a stream chunk carries (vLLM sends `{"error": {...}}` mid-stream)."""
    error = chunk["error"]
    if not isinstance(error, dict):
        return ArtProxyError(str(error))
    code = error.get("code")
    status = code if type(code) is int and 400 <= code < 600 else 500
    return ArtProxyError(str(error.get("message", error)), status=status)


def a_list(value: Any, param: str, message: str) -> list[Any]:
    require(isinstance(value, list), param, message)
    assert isinstance(value, list)
    return value


def an_object(value: Any, param: str, message: str) -> JsonObject:
    require(isinstance(value, dict), param, message)
    assert isinstance(value, dict)
    return value


def require(condition: bool, param: str, message: str) -> None:
    if not condition:
        raise BadRequest(f"{param} {message}", param=param)


@dataclass(frozen=True)
class Delta:
    kind: Literal["reasoning", "text", "tool_start", "tool_arguments"]
    text: str = ""
    index: int = 0  # the tool call's index
    call_id: str = ""
    name: str = ""


@dataclass
class DeltaReader:
    """Turns chat chunks into `Delta`s; remembers what each tool call has received so far."""

    fallback_id: str
    started: set[int] = field(default_factory=set)
    arguments: dict[int, str] = field(default_factory=dict)

    def read(self, chunk: JsonObject) -> list[Delta]:
        deltas: list[Delta] = []
        for choice in chunk.get("choices") or []:
            if int(choice.get("index", 0)) != 0:
                continue
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                deltas.append(Delta("reasoning", reasoning))
            if delta.get("content"):
                deltas.append(Delta("text", delta["content"]))
            for fragment in delta.get("tool_calls") or []:
                deltas += self._tool(fragment)
        return deltas

    def _tool(self, fragment: JsonObject) -> list[Delta]:
        index = int(fragment.get("index", 0))
        function = fragment.get("function") or {}
        deltas = []
        if index not in self.started:
            self.started.add(index)
            self.arguments[index] = ""
            call_id = fragment.get("id") or fallback_call_id(self.fallback_id, index)
            deltas.append(
                Delta("tool_start", index=index, call_id=call_id, name=function.get("name") or "")
            )
        if function.get("arguments"):
            self.arguments[index] += function["arguments"]
            deltas.append(Delta("tool_arguments", function["arguments"], index=index))
        return deltas
