"""Recorded calls and messages turned into what a page shows: text, tool calls, token counts.

Everything here returns plain strings and numbers; the templates escape them (autoescape), so a
trajectory that holds HTML or script shows as text. Nothing is fetched on the page's behalf: an
image part of a message is named, never loaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from art_proxy.records import CallRecord, JsonObject
from art_proxy.store.trajectory_store import final_messages

# Raw JSON beyond this is cut in the page (the whole record stays in the store and the export).
MAX_RAW_CHARS = 100_000


@dataclass(frozen=True)
class ToolCallView:
    id: str
    name: str
    arguments: str  # pretty-printed when it is JSON


@dataclass(frozen=True)
class MessageView:
    role: str
    text: str
    name: str | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallView] = field(default_factory=list)


@dataclass(frozen=True)
class CallView:
    call: CallRecord
    prompt_tokens: int | None
    completion_tokens: int | None
    served_model: str | None  # what the upstream says served the call (an adapter, say)
    request_json: str
    response_json: str


def conversation(calls: Sequence[CallRecord]) -> list[MessageView]:
    """The trajectory as it ended: the final chat conversation, or each text completion."""
    messages = final_messages(calls)
    if messages:
        return [message_view(message) for message in messages]
    views: list[MessageView] = []
    for call in calls:
        if call.kind != "completion":
            continue
        views.append(MessageView(role="prompt", text=_text(call.request.get("prompt"))))
        for choice in (call.response or {}).get("choices") or []:
            views.append(MessageView(role="completion", text=_text(choice.get("text"))))
    return views


def message_view(message: JsonObject) -> MessageView:
    tool_calls = [
        ToolCallView(
            id=str(tool_call.get("id") or ""),
            name=str((tool_call.get("function") or {}).get("name") or "?"),
            arguments=_arguments((tool_call.get("function") or {}).get("arguments")),
        )
        for tool_call in message.get("tool_calls") or []
        if isinstance(tool_call, dict)
    ]
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    return MessageView(
        role=str(message.get("role") or "?"),
        text=_text(message.get("content")),
        name=_optional_text(message.get("name")),
        tool_call_id=_optional_text(message.get("tool_call_id")),
        reasoning=_text(reasoning) if reasoning else None,
        tool_calls=tool_calls,
    )


def shared_prefix(conversations: Sequence[Sequence[MessageView]]) -> int:
    """How many opening messages every conversation shares (shown once above the columns)."""
    if len(conversations) < 2:
        return 0
    length = 0
    for column in zip(*conversations, strict=False):
        if any(message != column[0] for message in column[1:]):
            break
        length += 1
    # The last message of a conversation is its own ending, never part of a shared opening.
    return min(length, *(len(conversation) - 1 for conversation in conversations))


def call_view(call: CallRecord) -> CallView:
    usage = (call.response or {}).get("usage") or {}
    if call.prompt_token_ids is not None:
        prompt_tokens: int | None = len(call.prompt_token_ids)
    else:
        prompt_tokens = usage.get("prompt_tokens")
    if call.completion_token_ids is not None:
        completion_tokens: int | None = sum(len(ids) for ids in call.completion_token_ids)
    else:
        completion_tokens = usage.get("completion_tokens")
    served = (call.response or {}).get("model")
    return CallView(
        call=call,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        served_model=str(served) if served else None,
        request_json=pretty_json(call.request),
        response_json=pretty_json(call.response),
    )


def pretty_json(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) <= MAX_RAW_CHARS:
        return text
    return f"{text[:MAX_RAW_CHARS]}\n... ({len(text) - MAX_RAW_CHARS} more characters not shown)"


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts (others named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_part_text(part) for part in content)
    return pretty_json(content)


def _part_text(part: Any) -> str:
    if isinstance(part, dict):
        if part.get("type") == "text" or "text" in part:
            return str(part.get("text") or "")
        return f"[{part.get('type') or 'part'}]"
    return str(part)


def _optional_text(value: Any) -> str | None:
    return None if value is None else str(value)


def _arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
        except json.JSONDecodeError:
            return arguments
    return pretty_json(arguments)
