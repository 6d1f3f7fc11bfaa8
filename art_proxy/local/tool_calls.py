"""Hermes-style tool calls in generated text, parsed as vLLM's `hermes` tool parser does.

`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` becomes an OpenAI tool call with the
arguments re-serialized as a JSON string; the content is the text before the first call, or None.
A last call whose closing tag never came still parses if its JSON is whole; text that does not
parse stays content and no call is made. Text after the first `<tool_call>` is never content.

Streaming holds back anything that may be markup: content goes out up to the first `<tool_call>`
(or a partial one at the end of the text), and each call goes out whole, in one fragment, once it
closes or the choice ends. The fragments' concatenated arguments equal the non-stream arguments.
`ToolCallReading` applies both to a generation, for a request with tools and tool_choice "auto".
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from art_proxy.vllm_api.engine import ChatRequest, ChoiceDelta, ChoiceOutput, Generation
from art_proxy.wire import ApiError

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_CALLS = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON string

    def as_message_part(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class ParsedReply:
    content: str | None
    tool_calls: list[ToolCall]


def parse_tool_calls(text: str) -> ParsedReply:
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return ParsedReply(text, [])
    calls = _calls_in(text)
    if calls is None:
        return ParsedReply(text, [])
    return ParsedReply(text[:start] or None, calls)


def _calls_in(text: str) -> list[ToolCall] | None:
    """Every call in the text; None when any of them fails to parse."""
    calls = []
    for closed, unclosed in _CALLS.findall(text):
        try:
            call = json.loads(closed or unclosed)
            name, arguments = call["name"], call["arguments"]
        except (json.JSONDecodeError, TypeError, KeyError):
            return None
        if not isinstance(name, str):
            return None
        encoded = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(f"chatcmpl-tool-{uuid.uuid4().hex}", name, encoded))
    return calls


@dataclass(frozen=True, slots=True)
class StreamPiece:
    content: str  # may be ""
    tool_calls: list[tuple[int, ToolCall]]  # (index among the choice's calls, call)


class ToolCallStream:
    """One streamed choice's text, split into content to send now and calls completed so far."""

    def __init__(self) -> None:
        self._text = ""
        self._markup_at: int | None = None  # where the first `<tool_call>` starts
        self._content_sent = 0
        self._calls_sent = 0

    @property
    def called(self) -> bool:
        return self._calls_sent > 0

    def feed(self, text: str, *, final: bool) -> StreamPiece:
        self._text += text
        if self._markup_at is None and (start := self._text.find(TOOL_CALL_START)) >= 0:
            self._markup_at = start
        if self._markup_at is None:
            end = len(self._text) if final else len(self._text) - _partial_tag(self._text)
            return self._take(end, [])
        calls = self._calls(self._text[self._markup_at :], final=final)
        if calls is None:
            # Unparsable markup: as in the non-stream reply, it is content after all (unless
            # calls before it went out already, which cannot be taken back).
            return self._take(self._content_sent if self.called else len(self._text), [])
        return self._take(self._markup_at, calls)

    def _calls(self, markup: str, *, final: bool) -> list[ToolCall] | None:
        if not final:
            closed = markup.rfind(TOOL_CALL_END)
            # A call that fails to parse now is reported when the choice ends.
            return (_calls_in(markup[: closed + len(TOOL_CALL_END)]) or []) if closed >= 0 else []
        return _calls_in(markup)

    def _take(self, content_end: int, calls: list[ToolCall]) -> StreamPiece:
        content = self._text[self._content_sent : content_end]
        self._content_sent = max(self._content_sent, content_end)
        fresh = [(index, call) for index, call in enumerate(calls) if index >= self._calls_sent]
        self._calls_sent = max(self._calls_sent, len(calls))
        return StreamPiece(content, fresh)


def _partial_tag(text: str) -> int:
    """How many characters at the end of `text` could begin `<tool_call>`."""
    for size in range(min(len(TOOL_CALL_START) - 1, len(text)), 0, -1):
        if TOOL_CALL_START.startswith(text[-size:]):
            return size
    return 0


def reads_tool_calls(chat: ChatRequest) -> bool:
    """Whether the reply is parsed for tool calls: with tools and tool_choice "auto" (or none
    given); "none" shows the tools without parsing. Forcing a call needs guided decoding, which
    this server does not have, so other choices are a 400."""
    choice = chat.body.get("tool_choice")
    if chat.tools is None or choice == "none":
        return False
    if choice in (None, "auto"):
        return True
    raise ApiError(
        400,
        "Only tool_choice 'auto' and 'none' are supported by art-proxy local-llm.",
        param="tool_choice",
    )


class ToolCallReading:
    """A generation whose replies are read for tool calls: a whole reply parsed at once, a
    streamed one through a `ToolCallStream` per choice."""

    def __init__(self, generation: Generation) -> None:
        self._generation = generation
        self.choices = generation.choices

    async def deltas(self) -> AsyncIterator[ChoiceDelta]:
        streams = [ToolCallStream() for _ in range(self.choices)]
        async for delta in self._generation.deltas():
            yield _read_delta(delta, streams[delta.index])

    async def collect(self) -> list[ChoiceOutput]:
        return [_read_choice(choice) for choice in await self._generation.collect()]

    def cancel(self) -> None:
        self._generation.cancel()


def _read_choice(choice: ChoiceOutput) -> ChoiceOutput:
    parsed = parse_tool_calls(choice.text or "")
    if not parsed.tool_calls:
        return choice
    return replace(
        choice,
        text=parsed.content,
        tool_calls=tuple(call.as_message_part() for call in parsed.tool_calls),
        finish_reason="tool_calls",
    )


def _read_delta(delta: ChoiceDelta, stream: ToolCallStream) -> ChoiceDelta:
    last = delta.finish_reason is not None
    piece = stream.feed(delta.text or "", final=last)
    return replace(
        delta,
        text=piece.content or None,
        tool_calls=tuple(
            {"index": index, **call.as_message_part()} for index, call in piece.tool_calls
        ),
        finish_reason="tool_calls" if last and stream.called else delta.finish_reason,
    )
