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
`resp_<call id>` (responses_answer.py renders answers). `store: false` responses are neither
returned nor continued.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from art_proxy.errors import BadRequest
from art_proxy.privacy.subjects import Subject, subject_of_row
from art_proxy.records import JsonObject

from .chat_reply import PASSED_FIELDS, a_list, joined_text, require
from .responses_answer import RESPONSE_ID_PREFIX

# A stored call, by its id: the row fields `previous_response_id` and GET need (None: no such call).
CallLookup = Callable[[str], Awaitable[JsonObject | None]]


@dataclass(frozen=True)
class ChatRequest:
    """A Responses request as chat completions, and the trajectory it continues."""

    chat: JsonObject
    continues: str | None  # the trajectory of the response `previous_response_id` names
    owner: Subject | None = None  # whose that trajectory is (`may_read` says who may continue it)


def call_id_of(response_id: str) -> str | None:
    """The call a response id names (None: none can: a NUL, which PostgreSQL refuses in text,
    or anything unprintable is in no id this proxy made)."""
    if not response_id.startswith(RESPONSE_ID_PREFIX) or not response_id.isprintable():
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
    continues = owner = None
    previous_id = body.get("previous_response_id")
    if previous_id is not None:
        require(isinstance(previous_id, str), "previous_response_id", "must be a string")
        history, continues, owner = await _previous_conversation(previous_id, lookup)
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
    return ChatRequest(chat, continues, owner)


async def _previous_conversation(
    response_id: str, lookup: CallLookup
) -> tuple[list[JsonObject], str | None, Subject]:
    """The messages of a stored response's conversation (without its instructions), its reply
    included, its trajectory, and whose that is."""
    call_id = call_id_of(response_id)
    row = await lookup(call_id) if call_id else None
    if not retrievable(row):
        raise previous_not_found(response_id)
    assert row is not None
    client, chat = row["client_request"] or {}, row["request"]
    messages = list(chat.get("messages") or [])
    if client.get("instructions"):
        messages = messages[1:]
    reply = (row["response"]["choices"] or [{}])[0].get("message") or {}
    messages.append(
        {key: reply[key] for key in ("role", "content", "tool_calls") if reply.get(key) is not None}
    )
    return messages, row["trajectory_id"], subject_of_row(row)


def previous_not_found(response_id: str) -> BadRequest:
    """A `previous_response_id` that names nothing, or something of another subject's: alike,
    so that the answer tells nothing of what another user or tenant has."""
    return BadRequest(
        f"previous response with id {response_id!r} not found", param="previous_response_id"
    )


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
