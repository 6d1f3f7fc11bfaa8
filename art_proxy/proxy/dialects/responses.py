"""OpenAI's Responses API (`POST /v1/responses`), spoken to the agent over chat completions.

Translated: string or item `input` (messages with text or image parts, `function_call` and
`function_call_output` items; `reasoning` items are dropped, as chat templates drop reasoning),
`instructions` (a system message first), function tools, `tool_choice`, `parallel_tool_calls`,
`text.format` (as `response_format`), `max_output_tokens` and the sampling fields. Hosted tools and
item types without a chat form are refused, naming the field.

`previous_response_id` continues a stored response: the proxy rebuilds that response's
conversation from its call row (the chat messages it sent, less the old instructions, which OpenAI
does not carry over, plus its reply), so a chain works across proxy restarts and across proxies on
one PostgreSQL store, and the call joins that response's trajectory. A response's id is its call's:
`resp_<call id>`, and its items' ids derive from it, so `GET /v1/responses/{id}` renders the same
object again from the record. `store: false` responses are neither returned nor continued.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import Response

from art_proxy.errors import ArtProxyError, BadRequest
from art_proxy.records import JsonObject

from . import sse
from .chat_reply import (
    PASSED_FIELDS,
    Delta,
    DeltaReader,
    Reply,
    a_list,
    joined_text,
    reply_of,
    require,
    upstream_error,
)

RESPONSE_ID_PREFIX = "resp_"

# A stored call, by its id: the row fields `previous_response_id` and GET need (None: no such call).
CallLookup = Callable[[str], Awaitable[JsonObject | None]]


@dataclass(frozen=True)
class ChatRequest:
    """A Responses request as chat completions, and the trajectory it continues."""

    chat: JsonObject
    continues: str | None  # the trajectory of the response `previous_response_id` names


def call_id_of(response_id: str) -> str | None:
    if not response_id.startswith(RESPONSE_ID_PREFIX):
        return None
    return response_id[len(RESPONSE_ID_PREFIX) :]


async def translate(body: JsonObject, lookup: CallLookup) -> ChatRequest:
    """The chat-completions body for a Responses request; `BadRequest` naming the field."""
    for name in ("conversation", "prompt"):
        require(body.get(name) is None, name, "is not supported by art-proxy")
    require(not body.get("background"), "background", "must be false: art-proxy answers in line")
    model = body.get("model")
    require(isinstance(model, str) and bool(model), "model", "must be a non-empty string")
    instructions = body.get("instructions")
    require(
        instructions is None or isinstance(instructions, str), "instructions", "must be a string"
    )
    history: list[JsonObject] = []
    continues = None
    previous_id = body.get("previous_response_id")
    if previous_id is not None:
        require(isinstance(previous_id, str), "previous_response_id", "must be a string")
        history, continues = await _previous_conversation(previous_id, lookup)
    messages = [{"role": "system", "content": instructions}] if instructions else []
    messages += history + _input_messages(body.get("input"))
    require(bool(messages), "input", "must not be empty")
    chat: JsonObject = {key: body[key] for key in PASSED_FIELDS if key in body}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("parallel_tool_calls") is not None:
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    tools = body.get("tools")
    if tools:
        require(isinstance(tools, list), "tools", "must be a list")
        chat["tools"] = [_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    response_format = _response_format(body.get("text"))
    if response_format is not None:
        chat["response_format"] = response_format
    return ChatRequest(chat, continues)


async def _previous_conversation(
    response_id: str, lookup: CallLookup
) -> tuple[list[JsonObject], str | None]:
    """The messages of a stored response's conversation (without its instructions), its reply
    included, and its trajectory."""
    call_id = call_id_of(response_id)
    row = await lookup(call_id) if call_id else None
    if not retrievable(row):
        raise BadRequest(
            f"previous response with id {response_id!r} not found", param="previous_response_id"
        )
    assert row is not None
    client, chat = row["client_request"] or {}, row["request"]
    messages = list(chat.get("messages") or [])
    if client.get("instructions"):
        messages = messages[1:]
    reply = (row["response"]["choices"] or [{}])[0].get("message") or {}
    messages.append(
        {key: reply[key] for key in ("role", "content", "tool_calls") if reply.get(key) is not None}
    )
    return messages, row["trajectory_id"]


def retrievable(row: JsonObject | None) -> bool:
    return (
        row is not None
        and row["dialect"] == "responses"
        and row["status"] == "ok"
        and row["response"] is not None
        and (row["client_request"] or {}).get("store") is not False
    )


def _input_messages(value: Any) -> list[JsonObject]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    require(isinstance(value, list), "input", "must be a string or a list of items")
    messages: list[JsonObject] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        require(isinstance(item, dict), where, "must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # the same turn's calls
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            require(isinstance(call_id, str), f"{where}.call_id", "must be a string")
            output = _text_content(item.get("output"), f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            continue
        else:
            raise BadRequest(
                f"{where}.type {kind!r} is not supported: art-proxy translates message, "
                "function_call, function_call_output and reasoning items",
                param=f"{where}.type",
            )
    return messages


_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


def _message(item: JsonObject, where: str) -> JsonObject:
    role = _ROLES.get(str(item.get("role")))
    require(role is not None, f"{where}.role", f"must be one of {', '.join(_ROLES)}")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    content = a_list(content, f"{where}.content", "must be a string or a list of parts")
    parts = [_part(part, f"{where}.content[{index}]") for index, part in enumerate(content)]
    if all(part["type"] == "text" for part in parts):
        return {"role": role, "content": joined_text([part["text"] for part in parts])}
    return {"role": role, "content": parts}


def _part(part: Any, where: str) -> JsonObject:
    require(isinstance(part, dict), where, "must be an object")
    kind = part.get("type")
    if kind in ("input_text", "output_text", "text"):
        require(isinstance(part.get("text"), str), f"{where}.text", "must be a string")
        return {"type": "text", "text": part["text"]}
    if kind == "refusal":
        require(isinstance(part.get("refusal"), str), f"{where}.refusal", "must be a string")
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image":
        url = part.get("image_url")
        require(
            isinstance(url, str), f"{where}.image_url", "must be a URL (file ids are not supported)"
        )
        return {"type": "image_url", "image_url": {"url": url}}
    raise BadRequest(f"{where}.type {kind!r} is not supported", param=f"{where}.type")


def _text_content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    require(isinstance(value, list), where, "must be a string or a list of text parts")
    parts = [_part(part, f"{where}[{index}]") for index, part in enumerate(value)]
    require(all(part["type"] == "text" for part in parts), where, "must hold text parts only")
    return joined_text([part["text"] for part in parts])


def _function_call(item: JsonObject, where: str) -> JsonObject:
    for name in ("call_id", "name", "arguments"):
        require(isinstance(item.get(name), str), f"{where}.{name}", "must be a string")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _tool(tool: Any, where: str) -> JsonObject:
    require(isinstance(tool, dict), where, "must be an object")
    kind = tool.get("type")
    if kind != "function":
        raise BadRequest(
            f"{where}.type {kind!r} is not supported: art-proxy serves function tools only "
            "(hosted tools run at OpenAI)",
            param=f"{where}.type",
        )
    require(isinstance(tool.get("name"), str), f"{where}.name", "must be a string")
    function = {"name": tool["name"]}
    for key in ("description", "parameters"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        require(isinstance(choice.get("name"), str), "tool_choice.name", "must be a string")
        return {"type": "function", "function": {"name": choice["name"]}}
    raise BadRequest("tool_choice must be auto, none, required or a function", param="tool_choice")


def _response_format(text: Any) -> JsonObject | None:
    if text is None:
        return None
    require(isinstance(text, dict), "text", "must be an object")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    require(isinstance(fmt, dict), "text.format", "must be an object")
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {
            key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt
        }
        return {"type": "json_schema", "json_schema": schema}
    raise BadRequest(
        "text.format.type must be text, json_object or json_schema", param="text.format.type"
    )


# --- answers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ids:
    response: str

    @property
    def message(self) -> str:
        return "msg_" + self.response[len(RESPONSE_ID_PREFIX) :]

    @property
    def reasoning(self) -> str:
        return "rs_" + self.response[len(RESPONSE_ID_PREFIX) :]

    def function_call(self, index: int) -> str:
        return f"fc_{self.response[len(RESPONSE_ID_PREFIX) :]}_{index}"


def response_object(
    call_id: str, client: JsonObject, chat_response: JsonObject | None, created_at: float
) -> JsonObject:
    """The Responses object of a call: its answer's items, usage and status, and the request's
    settings echoed, as OpenAI's SDKs read it (validated by the `openai` package's own model)."""
    ids = _Ids(RESPONSE_ID_PREFIX + call_id)
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
        self._ids = _Ids(RESPONSE_ID_PREFIX + call_id)
        self._reader = DeltaReader(call_id)
        self._sequence = 0
        self._started = False
        self._items: list[_Item] = []
        self._tools: dict[int, _Item] = {}

    def whole(self, response: JsonObject) -> JsonObject:
        return response_object(self._call_id, self._client, response, self._created_at)

    def failed_answer(self, raw: bytes, status: int) -> bytes:
        return raw  # OpenAI-shaped, like the Responses API's own errors

    def chunk(self, chunk: JsonObject) -> bytes:
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
