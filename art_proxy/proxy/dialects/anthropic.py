"""Anthropic's Messages API (`POST /v1/messages`), spoken to the agent over chat completions.

Translated: `system` (a string or text blocks), messages of text and image blocks, `tool_use`
blocks (the assistant's tool calls, their `input` written as JSON the way vLLM's tool parsers write
arguments, so a re-sent call reads as the model wrote it), `tool_result` blocks (a tool message
each), custom tools with their `input_schema`, `tool_choice` (auto, any, tool, none; and
`disable_parallel_tool_use`), `stop_sequences`, `max_tokens` and the sampling fields. `thinking`
blocks are dropped, as chat templates drop reasoning. Server tools (web search, code execution...)
and block types without a chat form are refused, naming the field.

Answers: a `message` with text and `tool_use` blocks, `stop_reason` (end_turn, max_tokens,
stop_sequence, tool_use) and usage; a stream is `message_start`, per block `content_block_start`,
its deltas and `content_block_stop`, then `message_delta` and `message_stop`, validated by the
`anthropic` package's own models.
"""

from __future__ import annotations

import json
from typing import Any

from anthropic.types import Message

from art_proxy.errors import ArtProxyError, BadRequest, error_message
from art_proxy.records import JsonObject
from art_proxy.wire import sse

from . import error_body
from .chat_reply import (
    PASSED_FIELDS,
    Delta,
    DeltaReader,
    Reply,
    a_list,
    an_object,
    arguments_object,
    joined_text,
    reply_of,
    require,
    upstream_error,
)

MESSAGE_ID_PREFIX = "msg_"


def translate(body: JsonObject) -> JsonObject:
    """The chat-completions body for a Messages request; `BadRequest` naming the field."""
    model_of(body)
    max_tokens = body.get("max_tokens")
    require(type(max_tokens) is int and max_tokens > 0, "max_tokens", "must be a positive integer")
    chat: JsonObject = {key: body[key] for key in PASSED_FIELDS if key in body}
    chat.update(prompt_of(body))
    chat["max_tokens"] = max_tokens
    stops = body.get("stop_sequences")
    if stops is not None:
        require(
            isinstance(stops, list) and all(isinstance(stop, str) for stop in stops),
            "stop_sequences",
            "must be a list of strings",
        )
        chat["stop"] = stops
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice(body["tool_choice"]))
    return chat


def model_of(body: JsonObject) -> str:
    model = body.get("model")
    require(isinstance(model, str) and bool(model), "model", "must be a non-empty string")
    return str(model)


def prompt_of(body: JsonObject) -> JsonObject:
    """What of a Messages request (or a `count_tokens` one) makes the prompt: its `system`,
    messages and tools, as chat `messages` and `tools`."""
    messages: list[JsonObject] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text_blocks(system, "system")})
    turns = a_list(body.get("messages"), "messages", "must be a non-empty list")
    require(bool(turns), "messages", "must be a non-empty list")
    for index, turn in enumerate(turns):
        messages += _turn(turn, f"messages[{index}]")
    prompt: JsonObject = {"messages": messages}
    tools = body.get("tools")
    if tools:
        require(isinstance(tools, list), "tools", "must be a list")
        prompt["tools"] = [_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools)]
    return prompt


def _text_blocks(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    require(isinstance(value, list), where, "must be a string or a list of text blocks")
    texts = []
    for index, block in enumerate(value):
        require(
            isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str),
            f"{where}[{index}]",
            "must be a text block",
        )
        texts.append(block["text"])
    return joined_text(texts)


def _turn(turn: Any, where: str) -> list[JsonObject]:
    require(isinstance(turn, dict), where, "must be an object")
    role = turn.get("role")
    require(role in ("user", "assistant"), f"{where}.role", "must be user or assistant")
    content = turn.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    require(isinstance(content, list), f"{where}.content", "must be a string or a list of blocks")
    results: list[JsonObject] = []  # tool results come first in a user turn
    parts: list[JsonObject] = []
    calls: list[JsonObject] = []
    for index, block in enumerate(content):
        at = f"{where}.content[{index}]"
        require(isinstance(block, dict), at, "must be an object")
        kind = block.get("type")
        if kind == "text":
            require(isinstance(block.get("text"), str), f"{at}.text", "must be a string")
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append(_image(block, at))
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block, at))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, at))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise BadRequest(
                f"{at}.type {kind!r} is not supported in a {role} turn", param=f"{at}.type"
            )
    messages = results
    if role == "assistant":
        text = joined_text([part["text"] for part in parts]) if parts else None
        message: JsonObject = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = calls
        if text is not None or calls:
            messages.append(message)
    elif parts:
        if all(part["type"] == "text" for part in parts):
            messages.append({"role": "user", "content": joined_text([p["text"] for p in parts])})
        else:
            messages.append({"role": "user", "content": parts})
    return messages


def _image(block: JsonObject, where: str) -> JsonObject:
    source = an_object(block.get("source"), f"{where}.source", "must be an object")
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
        return {"type": "image_url", "image_url": {"url": url}}
    raise BadRequest(f"{where}.source must be a url or base64 image", param=f"{where}.source")


def _tool_use(block: JsonObject, where: str) -> JsonObject:
    require(isinstance(block.get("id"), str), f"{where}.id", "must be a string")
    require(isinstance(block.get("name"), str), f"{where}.name", "must be a string")
    require(isinstance(block.get("input"), dict), f"{where}.input", "must be an object")
    # json.dumps' default separators and ensure_ascii=False: how vLLM's tool parsers write
    # arguments, so a tool call sent back reads as the model wrote it.
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }


def _tool_result(block: JsonObject, where: str) -> JsonObject:
    require(isinstance(block.get("tool_use_id"), str), f"{where}.tool_use_id", "must be a string")
    content = block.get("content", "")
    text = _text_blocks(content, f"{where}.content") if content else ""
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _tool(tool: Any, where: str) -> JsonObject:
    require(isinstance(tool, dict), where, "must be an object")
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise BadRequest(
            f"{where}.type {kind!r} is not supported: art-proxy serves custom (client) tools "
            "only (server tools run at Anthropic)",
            param=f"{where}.type",
        )
    require(isinstance(tool.get("name"), str), f"{where}.name", "must be a string")
    require(
        isinstance(tool.get("input_schema"), dict), f"{where}.input_schema", "must be an object"
    )
    function = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> JsonObject:
    require(isinstance(choice, dict), "tool_choice", "must be an object")
    kind = choice.get("type")
    chosen: JsonObject
    if kind in ("auto", "none"):
        chosen = {"tool_choice": kind}
    elif kind == "any":
        chosen = {"tool_choice": "required"}
    elif kind == "tool":
        require(isinstance(choice.get("name"), str), "tool_choice.name", "must be a string")
        chosen = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    else:
        raise BadRequest(
            "tool_choice.type must be auto, any, tool or none", param="tool_choice.type"
        )
    if choice.get("disable_parallel_tool_use"):
        chosen["parallel_tool_calls"] = False
    return chosen


# --- answers -------------------------------------------------------------------------------------


def _stop(reply: Reply) -> tuple[str, str | None]:
    if reply.tool_calls:
        return "tool_use", None
    if reply.finish_reason == "length":
        return "max_tokens", None
    if isinstance(reply.stop_reason, str):
        return "stop_sequence", reply.stop_reason
    return "end_turn", None


def message_object(call_id: str, model: Any, chat_response: JsonObject) -> JsonObject:
    reply = reply_of(chat_response, call_id)
    content: list[JsonObject] = []
    if reply.text:
        content.append({"type": "text", "text": reply.text})
    for call in reply.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": arguments_object(call.arguments),
            }
        )
    stop_reason, stop_sequence = _stop(reply)
    return _validated(
        {
            "id": MESSAGE_ID_PREFIX + call_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {
                "input_tokens": reply.prompt_tokens,
                "output_tokens": reply.completion_tokens,
            },
        }
    )


def _validated(message: JsonObject) -> JsonObject:
    return Message.model_validate(message).model_dump(mode="json", exclude_unset=True)


def failed_answer(raw: bytes, status: int) -> bytes:
    """An upstream error body (OpenAI-shaped) in Anthropic's shape, same status."""
    message = error_message(raw)
    return json.dumps(error_body("anthropic", ArtProxyError(message, status=status))).encode()


class AnthropicRendering:
    """A chat answer as a Messages `message`, or its stream as Anthropic's event sequence."""

    def __init__(self, call_id: str, client: JsonObject) -> None:
        self._call_id = call_id
        self._model = client.get("model")
        self._reader = DeltaReader(call_id)
        self._started = False
        self._blocks = 0
        self._open: tuple[str, int] | None = None  # ("text", -1) or ("tool", tool index)

    def whole(self, response: JsonObject) -> JsonObject:
        return message_object(self._call_id, self._model, response)

    def failed_answer(self, raw: bytes, status: int) -> bytes:
        return failed_answer(raw, status)

    def chunk(self, chunk: JsonObject, raw: bytes) -> bytes:
        if "error" in chunk:  # vLLM's mid-stream error
            return self.stream_error(upstream_error(chunk))
        out = self._start(chunk)
        for delta in self._reader.read(chunk):
            out += self._delta(delta)
        return out

    def end(self, response: JsonObject | None) -> bytes:
        if response is None:
            return b""
        out = self._start(response) + self._close()
        reply = reply_of(response, self._call_id)
        stop_reason, stop_sequence = _stop(reply)
        out += sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": {
                    "input_tokens": reply.prompt_tokens,
                    "output_tokens": reply.completion_tokens,
                },
            },
        )
        return out + sse("message_stop", {"type": "message_stop"})

    def stream_error(self, error: ArtProxyError) -> bytes:
        return sse("error", error_body("anthropic", error))

    def _start(self, chunk: JsonObject) -> bytes:
        if self._started:
            return b""
        self._started = True
        prompt_ids = chunk.get("prompt_token_ids")
        message = _validated(
            {
                "id": MESSAGE_ID_PREFIX + self._call_id,
                "type": "message",
                "role": "assistant",
                "model": self._model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": len(prompt_ids or []), "output_tokens": 0},
            }
        )
        return sse("message_start", {"type": "message_start", "message": message})

    def _delta(self, delta: Delta) -> bytes:
        if delta.kind == "reasoning":
            return b""  # no thinking blocks: the request did not ask for them
        if delta.kind == "text":
            out = b""
            if self._open is None or self._open[0] != "text":
                out += self._close() + self._block({"type": "text", "text": ""}, ("text", -1))
            return out + self._block_delta({"type": "text_delta", "text": delta.text})
        if delta.kind == "tool_start":
            block = {"type": "tool_use", "id": delta.call_id, "name": delta.name, "input": {}}
            return self._close() + self._block(block, ("tool", delta.index))
        if self._open != ("tool", delta.index):
            return b""  # arguments of a call already closed: parallel fragments interleaved
        return self._block_delta({"type": "input_json_delta", "partial_json": delta.text})

    def _block(self, block: JsonObject, opened: tuple[str, int]) -> bytes:
        self._open = opened
        event = {"type": "content_block_start", "index": self._blocks, "content_block": block}
        return sse("content_block_start", event)

    def _block_delta(self, delta: JsonObject) -> bytes:
        event = {"type": "content_block_delta", "index": self._blocks, "delta": delta}
        return sse("content_block_delta", event)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        event = {"type": "content_block_stop", "index": self._blocks}
        self._blocks += 1
        return sse("content_block_stop", event)
