"""A stream's chunks rebuilt into the response a non-stream call would have returned.

The relay writes each chunk to the client as it arrives and hands it to a `StreamRecorder`, so a
streamed call is recorded exactly as a non-stream one: every chunk counts, `"delta": {}` ones too
(their ids and logprobs belong to the answer), and tool calls are joined from their fragments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from art_proxy.records import CallKind, JsonObject


@dataclass
class _ChoiceSoFar:
    index: int
    content: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, JsonObject] = field(default_factory=dict)
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    logprob_entries: list[JsonObject] = field(default_factory=list)
    legacy_logprobs: list[float] = field(default_factory=list)
    has_logprobs: bool = False
    finish_reason: str | None = None
    stop_reason: Any = None


class StreamRecorder:
    """Rebuilds a non-stream response from stream chunks (every chunk, `"delta": {}` ones too)."""

    def __init__(self, kind: CallKind) -> None:
        self.kind = kind
        self.head: JsonObject = {}
        self.prompt_token_ids: list[int] | None = None
        self.usage: JsonObject | None = None
        self.error: JsonObject | None = None
        self._choices: dict[int, _ChoiceSoFar] = {}

    def add(self, chunk: JsonObject) -> None:
        if "error" in chunk:
            self.error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": chunk}
            return
        if not self.head:
            self.head = {key: chunk.get(key) for key in ("id", "created", "model")}
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_token_ids = list(chunk["prompt_token_ids"])
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            self._add_choice(choice)

    def _add_choice(self, choice: JsonObject) -> None:
        index = int(choice.get("index", 0))
        so_far = self._choices.setdefault(index, _ChoiceSoFar(index))
        if choice.get("token_ids") is not None:
            if so_far.token_ids is None:
                so_far.token_ids = []
            so_far.token_ids.extend(choice["token_ids"])
        if choice.get("prompt_token_ids") is not None:
            so_far.prompt_token_ids = list(choice["prompt_token_ids"])
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            so_far.has_logprobs = True
            so_far.logprob_entries.extend(logprobs.get("content") or [])
            so_far.legacy_logprobs.extend(
                float(v) for v in logprobs.get("token_logprobs") or [] if v is not None
            )
        if choice.get("finish_reason") is not None:
            so_far.finish_reason = choice["finish_reason"]
            so_far.stop_reason = choice.get("stop_reason")
        if self.kind == "completion":
            so_far.text.append(choice.get("text") or "")
            return
        delta = choice.get("delta") or {}
        if delta.get("content"):
            so_far.content.append(delta["content"])
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if reasoning:
            so_far.reasoning.append(reasoning)
        for fragment in delta.get("tool_calls") or []:
            self._add_tool_fragment(so_far, fragment)

    @staticmethod
    def _add_tool_fragment(so_far: _ChoiceSoFar, fragment: JsonObject) -> None:
        call = so_far.tool_calls.setdefault(
            int(fragment.get("index", 0)),
            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
        )
        if fragment.get("id"):
            call["id"] = fragment["id"]
        function = fragment.get("function") or {}
        if function.get("name"):
            call["function"]["name"] = function["name"]
        if function.get("arguments"):
            call["function"]["arguments"] += function["arguments"]

    def response(self) -> JsonObject:
        """The response as a non-stream call would have returned it."""
        choices = [self._choice_record(c) for _, c in sorted(self._choices.items())]
        record: JsonObject = {
            **self.head,
            "object": "chat.completion" if self.kind == "chat" else "text_completion",
            "choices": choices,
            "usage": self.usage,
        }
        if self.kind == "chat":
            record["prompt_token_ids"] = self.prompt_token_ids
        return record

    def _choice_record(self, so_far: _ChoiceSoFar) -> JsonObject:
        record: JsonObject = {
            "index": so_far.index,
            "finish_reason": so_far.finish_reason,
            "stop_reason": so_far.stop_reason,
            "token_ids": so_far.token_ids,
        }
        if self.kind == "completion":
            record["text"] = "".join(so_far.text)
            record["prompt_token_ids"] = so_far.prompt_token_ids
            record["logprobs"] = (
                {"token_logprobs": so_far.legacy_logprobs} if so_far.has_logprobs else None
            )
            return record
        message: JsonObject = {"role": "assistant", "content": "".join(so_far.content) or None}
        if so_far.reasoning:
            message["reasoning"] = "".join(so_far.reasoning)
        if so_far.tool_calls:
            message["tool_calls"] = [call for _, call in sorted(so_far.tool_calls.items())]
        record["message"] = message
        record["logprobs"] = {"content": so_far.logprob_entries} if so_far.has_logprobs else None
        return record
