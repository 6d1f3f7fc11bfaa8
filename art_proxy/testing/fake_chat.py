"""`POST /v1/chat/completions` of the fake vLLM, stream and non-stream.

A tool call is generated as `<tool_call>` markup (what Qwen emits); the response reports it parsed, as
vLLM's hermes parser does, and a stream holds the markup back: its ids travel in `"delta": {}` chunks
while the arguments go out as fragments, so the ids of all chunks concatenated equal the non-stream
`token_ids`. A named `tool_choice` generates the bare arguments JSON (vLLM's guided decoding) and keeps
finish reason "stop"; as in vLLM, its re-rendered markup then no longer extends the previous prompt.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from art_proxy.testing.fake_engine import (
    FakeEngine,
    Generated,
    ScriptedCall,
    chunks_of,
    mid_stream_error,
    sampled_logprob,
    serve_events,
)
from art_proxy.testing.fake_tokenizer import TemplateError
from art_proxy.wire import (
    MAX_LOGPROBS,
    ApiError,
    bool_field,
    chat_max_tokens,
    choice_count,
    include_usage,
    int_field,
    json_response,
    read_json_object,
)

ToolMode = Literal["text", "markup", "named"]


@dataclass(frozen=True, slots=True)
class _ChatRequest:
    model: str
    n: int
    max_tokens: int | None
    max_tokens_param: str  # the field it came from, which errors name
    logprobs: bool
    top_logprobs: int
    tokens_as_ids: bool
    return_token_ids: bool
    stream: bool
    include_usage: bool
    tool_mode: ToolMode
    tool: dict[str, Any] | None
    after_tool_result: bool  # the last message is a tool result
    arguments: str | None  # the tool call's arguments, from `tool_script` (None: from the reply)


@dataclass(frozen=True, slots=True)
class _ToolCall:
    id: str
    name: str
    arguments: str
    # Ids before the arguments (the markup header); 0 for a named tool_choice.
    header_len: int
    arguments_len: int


@dataclass(frozen=True, slots=True)
class _Choice:
    index: int
    output: Generated
    tool_call: _ToolCall | None
    content: str | None


async def handle_chat_completions(engine: FakeEngine, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    engine.record(body)
    chat = _parse(engine, body)
    try:
        prompt_ids = engine.tokenizer.render_prompt(body["messages"], body.get("tools"))
    except TemplateError as exc:
        raise ApiError(400, str(exc), param="messages") from exc
    limit = engine.completion_limit(len(prompt_ids), chat.max_tokens, param=chat.max_tokens_param)
    choices = [_generate(engine, chat, index, limit) for index in range(chat.n)]
    await engine.before_answer()
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    if chat.stream:
        events = _stream_events(engine, chat, response_id, prompt_ids, choices)
        return await serve_events(request, events, engine.config.chunk_delay_s)
    return json_response(_response(engine, chat, response_id, prompt_ids, choices))


def _parse(engine: FakeEngine, body: dict[str, Any]) -> _ChatRequest:
    model = engine.served_model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    n = choice_count(body)
    max_tokens, max_tokens_param = chat_max_tokens(body)
    logprobs = bool_field(body, "logprobs")
    top_logprobs = int_field(body, "top_logprobs", 0, minimum=0, maximum=MAX_LOGPROBS)
    if top_logprobs and not logprobs:
        raise ApiError(
            400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs"
        )
    stream = bool_field(body, "stream")
    last = messages[-1]
    after_tool_result = isinstance(last, dict) and last.get("role") == "tool"
    scripted = engine.scripted_call(messages)
    tool_mode, tool = _tool_choice(engine, body, after_tool_result, scripted)
    return _ChatRequest(
        model=model,
        n=n,
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        tokens_as_ids=bool_field(body, "return_tokens_as_token_ids"),
        return_token_ids=bool_field(body, "return_token_ids"),
        stream=stream,
        include_usage=include_usage(body, stream),
        tool_mode=tool_mode,
        tool=tool,
        after_tool_result=after_tool_result,
        arguments=json.dumps(scripted.arguments) if scripted and tool_mode == "markup" else None,
    )


def _tool_choice(
    engine: FakeEngine,
    body: dict[str, Any],
    after_tool_result: bool,
    scripted: ScriptedCall | None,
) -> tuple[ToolMode, dict[str, Any] | None]:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise ApiError(400, "When using `tool_choice`, `tools` must be set.", param="tools")
        return "text", None
    if not isinstance(tools, list) or not tools:
        raise ApiError(400, "'tools' must be a non-empty list when given.", param="tools")
    functions = [_function_of(tool) for tool in tools]
    if choice is None or choice == "auto":
        if scripted is not None:
            return "markup", _named_function(functions, scripted.name)
        if engine.config.tool_call and not after_tool_result:
            return "markup", functions[0]
        return "text", None
    if choice == "none":
        return "text", None
    if choice == "required":  # the model picks a tool: the script's, else the first
        return "markup", _named_function(functions, scripted.name) if scripted else functions[0]
    named = choice.get("function") if isinstance(choice, dict) else None
    name = named.get("name") if isinstance(named, dict) else None
    for function in functions:
        if name is not None and function["name"] == name:
            return "named", function
    raise ApiError(400, f"Invalid 'tool_choice': {json.dumps(choice)}.", param="tool_choice")


def _named_function(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for function in functions:
        if function["name"] == name:
            return function
    raise ApiError(400, f"tool_script calls {name!r}, which is not offered.", param="tools")


def _function_of(tool: Any) -> dict[str, Any]:
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(400, "Each tool needs a 'function' with a string 'name'.", param="tools")
    return function


def _arguments(function: dict[str, Any], value: str) -> str:
    """`{"<first required parameter>": value}`, or `{}` when the tool requires none."""
    parameters = function.get("parameters")
    required = parameters.get("required") if isinstance(parameters, dict) else None
    if isinstance(required, list) and required and isinstance(required[0], str):
        return json.dumps({required[0]: value}, ensure_ascii=False)
    return "{}"


def _generate(engine: FakeEngine, chat: _ChatRequest, index: int, limit: int) -> _Choice:
    tokenizer = engine.tokenizer
    reply = engine.reply_text(index, after_tool_result=chat.after_tool_result)
    if chat.tool_mode == "text" or chat.tool is None:
        output = engine.generate(tokenizer.encode(reply), limit, "stop")
        return _Choice(index, output, None, output.text)
    name = chat.tool["name"]
    arguments = chat.arguments if chat.arguments is not None else _arguments(chat.tool, reply)
    if chat.tool_mode == "markup":
        header, argument_ids, trailer = tokenizer.tool_call_segments(name, arguments)
        output = engine.generate((*header, *argument_ids, *trailer), limit, "tool_calls")
        content = None
    else:
        header, argument_ids = (), tokenizer.encode(arguments)
        output = engine.generate(argument_ids, limit, "stop")
        content = ""
    if output.finish_reason == "length":
        # Cut markup does not parse: vLLM returns it as plain text.
        return _Choice(index, output, None, output.text)
    call_id = f"chatcmpl-tool-{uuid.uuid4().hex}"
    call = _ToolCall(call_id, name, arguments, len(header), len(argument_ids))
    return _Choice(index, output, call, content)


def _logprobs(
    engine: FakeEngine, chat: _ChatRequest, ids: tuple[int, ...], start: int
) -> dict[str, Any] | None:
    """One entry per id (EOS included); `start` is the first id's position in the completion."""
    if not chat.logprobs:
        return None
    content = []
    for position, token_id in enumerate(ids, start):
        entry = _token(engine, chat, token_id, sampled_logprob(position))
        ranked = engine.top_logprobs(token_id, position, chat.top_logprobs)
        entry["top_logprobs"] = [_token(engine, chat, i, lp) for i, lp in ranked]
        content.append(entry)
    return {"content": content}


def _token(engine: FakeEngine, chat: _ChatRequest, token_id: int, logprob: float) -> dict[str, Any]:
    if chat.tokens_as_ids:
        token = f"token_id:{token_id}"
        return {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    tokenizer = engine.tokenizer
    return {
        "token": tokenizer.piece(token_id),
        "logprob": logprob,
        "bytes": tokenizer.piece_bytes(token_id),
    }


def _usage(prompt_ids: list[int], choices: list[_Choice]) -> dict[str, int]:
    completion_tokens = sum(len(choice.output.token_ids) for choice in choices)
    return {
        "prompt_tokens": len(prompt_ids),
        "total_tokens": len(prompt_ids) + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _response(
    engine: FakeEngine,
    chat: _ChatRequest,
    response_id: str,
    prompt_ids: list[int],
    choices: list[_Choice],
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [_response_choice(engine, chat, choice) for choice in choices],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {**_usage(prompt_ids, choices), "prompt_tokens_details": None},
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if chat.return_token_ids else None,
        "kv_transfer_params": None,
    }


def _response_choice(engine: FakeEngine, chat: _ChatRequest, choice: _Choice) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": choice.content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if choice.tool_call is not None:
        call = choice.tool_call
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
        ]
    message["reasoning"] = None
    ids = choice.output.token_ids
    return {
        "index": choice.index,
        "message": message,
        "logprobs": _logprobs(engine, chat, ids, 0),
        "finish_reason": choice.output.finish_reason,
        "stop_reason": None,
        "token_ids": list(ids) if chat.return_token_ids else None,
    }


def _stream_events(
    engine: FakeEngine,
    chat: _ChatRequest,
    response_id: str,
    prompt_ids: list[int],
    choices: list[_Choice],
) -> Iterator[dict[str, Any]]:
    head = {
        "id": response_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": chat.model,
    }
    for choice in choices:
        role = {"index": choice.index, "delta": {"role": "assistant", "content": ""}}
        yield {
            **head,
            "choices": [{**role, "logprobs": None, "finish_reason": None}],
            "prompt_token_ids": prompt_ids if chat.return_token_ids else None,
        }
    # Held-back markup still costs a chunk when it has ids or logprobs to carry (vLLM's rule).
    skip_empty = not chat.return_token_ids and not chat.logprobs
    bounds = [chunks_of(len(c.output.token_ids), engine.config.tokens_per_chunk) for c in choices]
    # Choices advance in turn, one chunk each, the way parallel sequences leave the engine.
    for step in range(max(len(b) for b in bounds)):
        for choice, choice_bounds in zip(choices, bounds, strict=True):
            if step >= len(choice_bounds):
                continue
            start, end = choice_bounds[step]
            last = step == len(choice_bounds) - 1
            chunk_choice = _stream_choice(engine, chat, choice, start, end, last)
            if skip_empty and not last and not chunk_choice["delta"]:
                continue
            yield {**head, "choices": [chunk_choice]}
            if engine.config.fail_mid_stream:
                yield mid_stream_error()
                return
    if chat.include_usage:
        yield {**head, "choices": [], "usage": _usage(prompt_ids, choices)}


def _stream_choice(
    engine: FakeEngine, chat: _ChatRequest, choice: _Choice, start: int, end: int, last: bool
) -> dict[str, Any]:
    ids = choice.output.token_ids[start:end]
    if choice.tool_call is None:
        delta: dict[str, Any] = {"content": engine.tokenizer.decode(ids)}
    else:
        delta = _tool_delta(engine, choice.tool_call, choice.output.token_ids, start, end)
    chunk: dict[str, Any] = {
        "index": choice.index,
        "delta": delta,
        "logprobs": _logprobs(engine, chat, ids, start),
        "finish_reason": choice.output.finish_reason if last else None,
    }
    if last:
        chunk["stop_reason"] = None
    chunk["token_ids"] = list(ids) if chat.return_token_ids else None
    return chunk


def _tool_delta(
    engine: FakeEngine, call: _ToolCall, ids: tuple[int, ...], start: int, end: int
) -> dict[str, Any]:
    """The parsed part of ids[start:end]: the call's head once, argument text, or nothing."""
    arguments_start = call.header_len
    arguments_end = call.header_len + call.arguments_len
    first = max(call.header_len - 1, 0)
    function: dict[str, Any] = {}
    fragment: dict[str, Any] = {"index": 0}
    if start <= first < end:
        fragment |= {"id": call.id, "type": "function"}
        function["name"] = call.name
    text = engine.tokenizer.decode(ids[max(start, arguments_start) : min(end, arguments_end)])
    if text:
        function["arguments"] = text
    if not function:
        return {}
    fragment["function"] = function
    return {"tool_calls": [fragment]}
