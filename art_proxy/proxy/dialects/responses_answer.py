"""Answers in OpenAI's Responses API: a chat answer as a Responses object, and a chat stream as the
Responses event sequence, both as OpenAI's SDKs read them (validated by the `openai` package's own
`Response` model). A response's id is its call's (`resp_<call id>`) and its items' ids derive from
it, so `GET /v1/responses/{id}` renders the same object again from the record.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import Response

from art_proxy.errors import ArtProxyError
from art_proxy.records import JsonObject
from art_proxy.wire import sse

from .chat_reply import Delta, DeltaReader, Reply, reply_of, upstream_error

RESPONSE_ID_PREFIX = "resp_"


@dataclass(frozen=True)
class _Ids:
    """A response's id and its items', all derived from its call's id."""

    call: str

    @property
    def response(self) -> str:
        return RESPONSE_ID_PREFIX + self.call

    @property
    def message(self) -> str:
        return "msg_" + self.call

    @property
    def reasoning(self) -> str:
        return "rs_" + self.call

    def function_call(self, index: int) -> str:
        return f"fc_{self.call}_{index}"


def response_object(
    call_id: str, client: JsonObject, chat_response: JsonObject | None, created_at: float
) -> JsonObject:
    """The Responses object of a call: its answer's items, usage and status, and the request's
    settings echoed, as OpenAI's SDKs read it (validated by the `openai` package's own model)."""
    ids = _Ids(call_id)
    output: list[JsonObject] = []
    status, incomplete = "in_progress", None
    usage = None
    if chat_response is not None:
        reply = reply_of(chat_response, call_id)
        output = _output_items(ids, reply)
        status = "completed"
        if reply.finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        usage = {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        }
    fields = {
        "id": ids.response,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "incomplete_details": incomplete,
        "error": None,
        "model": client.get("model"),
        "instructions": client.get("instructions"),
        "output": output,
        "tools": client.get("tools") or [],
        "tool_choice": client.get("tool_choice") or "auto",
        "parallel_tool_calls": client.get("parallel_tool_calls", True),
        "temperature": client.get("temperature"),
        "top_p": client.get("top_p"),
        "max_output_tokens": client.get("max_output_tokens"),
        "previous_response_id": client.get("previous_response_id"),
        "store": client.get("store", True),
        "metadata": client.get("metadata") or {},
        "text": client.get("text") or {"format": {"type": "text"}},
        "truncation": client.get("truncation") or "disabled",
        "user": client.get("user"),
        "usage": usage,
    }
    return Response.model_validate(fields).model_dump(mode="json", exclude_unset=True)


def _output_items(ids: _Ids, reply: Reply) -> list[JsonObject]:
    items: list[JsonObject] = []
    if reply.reasoning:
        items.append(_reasoning_item(ids, reply.reasoning, "completed"))
    if reply.text:
        items.append(_message_item(ids, reply.text, "completed"))
    for index, call in enumerate(reply.tool_calls):
        items.append(_call_item(ids, index, call.id, call.name, call.arguments, "completed"))
    return items


def _reasoning_item(ids: _Ids, text: str, status: str) -> JsonObject:
    return {
        "type": "reasoning",
        "id": ids.reasoning,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def _message_item(ids: _Ids, text: str | None, status: str) -> JsonObject:
    content = [] if text is None else [_text_part(text)]
    return {
        "type": "message",
        "id": ids.message,
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _text_part(text: str) -> JsonObject:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(
    ids: _Ids, index: int, call_id: str, name: str, arguments: str, status: str
) -> JsonObject:
    return {
        "type": "function_call",
        "id": ids.function_call(index),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def now() -> float:
    return float(int(time.time()))


@dataclass
class _Item:
    kind: str  # reasoning, message or function_call
    output_index: int
    item_id: str
    text: list[str] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


class ResponsesRendering:
    """A chat answer as a Responses object, or its stream as the Responses event sequence:
    `response.created`, `response.in_progress`, per item `output_item.added`, its deltas (text,
    reasoning text, function-call arguments), its done events and `output_item.done`, and last
    `response.completed` (or `response.incomplete`) with the whole response and its usage."""

    def __init__(self, call_id: str, client: JsonObject) -> None:
        self._call_id = call_id
        self._client = client
        self._created_at = now()
        self._ids = _Ids(call_id)
        self._reader = DeltaReader(call_id)
        self._sequence = 0
        self._started = False
        self._items: list[_Item] = []
        self._tools: dict[int, _Item] = {}

    def whole(self, response: JsonObject) -> JsonObject:
        return response_object(self._call_id, self._client, response, self._created_at)

    def failed_answer(self, raw: bytes, status: int) -> bytes:
        return raw  # OpenAI-shaped, like the Responses API's own errors

    def chunk(self, chunk: JsonObject, raw: bytes) -> bytes:
        if "error" in chunk:  # vLLM's mid-stream error
            return self.stream_error(upstream_error(chunk))
        out = self._start()
        for delta in self._reader.read(chunk):
            out += self._delta(delta)
        return out

    def end(self, response: JsonObject | None) -> bytes:
        if response is None:
            return b""  # the error event said why
        out = self._start()
        for item in self._items:
            out += self._close(item)
        whole = response_object(self._call_id, self._client, response, self._created_at)
        order = [item.item_id for item in self._items]
        whole["output"].sort(
            key=lambda item: order.index(item["id"]) if item["id"] in order else len(order)
        )
        event = "response.incomplete" if whole["status"] == "incomplete" else "response.completed"
        return out + self._event(event, response=whole)

    def stream_error(self, error: ArtProxyError) -> bytes:
        return self._start() + self._event(
            "error", code=str(error.status), message=error.message, param=error.param
        )

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return sse(kind, event)

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        skeleton = response_object(self._call_id, self._client, None, self._created_at)
        return self._event("response.created", response=skeleton) + self._event(
            "response.in_progress", response=skeleton
        )

    def _open(self, kind: str, item_id: str) -> _Item:
        item = _Item(kind, len(self._items), item_id)
        self._items.append(item)
        return item

    def _find(self, kind: str) -> _Item | None:
        return next((item for item in self._items if item.kind == kind), None)

    def _delta(self, delta: Delta) -> bytes:
        if delta.kind in ("reasoning", "text"):
            return self._text_delta(
                "reasoning" if delta.kind == "reasoning" else "message", delta.text
            )
        if delta.kind == "tool_start":
            item = self._open("function_call", self._ids.function_call(delta.index))
            item.call_id, item.name = delta.call_id, delta.name
            self._tools[delta.index] = item
            added = _call_item(self._ids, delta.index, delta.call_id, delta.name, "", "in_progress")
            return self._added(item, added)
        item = self._tools[delta.index]
        item.text.append(delta.text)
        return self._event(
            "response.function_call_arguments.delta",
            item_id=item.item_id,
            output_index=item.output_index,
            delta=delta.text,
        )

    def _text_delta(self, kind: str, text: str) -> bytes:
        """A reasoning or reply text delta, opening its item first."""
        item = self._find(kind)
        out = b""
        if item is None:
            item = self._open(
                kind, self._ids.reasoning if kind == "reasoning" else self._ids.message
            )
            if kind == "reasoning":
                out += self._added(
                    item, {**_reasoning_item(self._ids, "", "in_progress"), "content": []}
                )
            else:
                out += self._added(item, _message_item(self._ids, None, "in_progress"))
                out += self._event(
                    "response.content_part.added",
                    item_id=item.item_id,
                    output_index=item.output_index,
                    content_index=0,
                    part=_text_part(""),
                )
        item.text.append(text)
        where = {"item_id": item.item_id, "output_index": item.output_index, "content_index": 0}
        if kind == "reasoning":
            return out + self._event("response.reasoning_text.delta", **where, delta=text)
        return out + self._event("response.output_text.delta", **where, delta=text, logprobs=[])

    def _added(self, item: _Item, body: JsonObject) -> bytes:
        return self._event("response.output_item.added", output_index=item.output_index, item=body)

    def _close(self, item: _Item) -> bytes:
        text = "".join(item.text)
        where = {"item_id": item.item_id, "output_index": item.output_index}
        if item.kind == "reasoning":
            done = _reasoning_item(self._ids, text, "completed")
            out = self._event("response.reasoning_text.done", **where, content_index=0, text=text)
        elif item.kind == "message":
            done = _message_item(self._ids, text, "completed")
            out = self._event(
                "response.output_text.done", **where, content_index=0, text=text, logprobs=[]
            )
            out += self._event(
                "response.content_part.done", **where, content_index=0, part=_text_part(text)
            )
        else:
            index = next(i for i, tool in self._tools.items() if tool is item)
            done = _call_item(self._ids, index, item.call_id, item.name, text, "completed")
            out = self._event(
                "response.function_call_arguments.done", **where, name=item.name, arguments=text
            )
        return out + self._event(
            "response.output_item.done", output_index=item.output_index, item=done
        )
