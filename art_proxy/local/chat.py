"""`POST /v1/chat/completions`, stream and non-stream, in vLLM's exact shapes (VLLM_WIRE.md).

With `tools` (and `tool_choice` "auto"), the reply is parsed for Hermes tool calls (`tool_calls`);
a stream then holds markup back, sending its ids and logprobs in `"delta": {}` chunks so that the
ids of all chunks still add up to the non-stream `token_ids`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from art_proxy.local.errors import AdapterNotFound, EngineFailure, PromptError
from art_proxy.local.generation import ChoiceDelta, ChoiceOutput, Generation
from art_proxy.local.request_params import check_supported, sampling_params
from art_proxy.local.served import ServedModel, not_found
from art_proxy.local.stream import relay_deltas
from art_proxy.local.tool_calls import ToolCallStream, parse_tool_calls
from art_proxy.wire import (
    MAX_LOGPROBS,
    ApiError,
    bool_field,
    chat_max_tokens,
    choice_count,
    close_event_stream,
    completion_limit,
    event_stream,
    include_usage,
    int_field,
    json_response,
    read_json_object,
    send_event,
)


@dataclass(frozen=True, slots=True)
class _ChatRequest:
    model: str
    adapter: str | None
    messages: list[Any]
    tools: list[dict[str, Any]] | None
    parse_tools: bool
    n: int
    max_tokens: int | None
    max_tokens_param: str  # the field it came from, which errors name
    logprobs: bool
    top_logprobs: int
    tokens_as_ids: bool
    return_token_ids: bool
    stream: bool
    include_usage: bool


async def handle_chat_completions(served: ServedModel, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    chat = _parse(served, body)
    try:
        prompt_ids = served.renderer.render(chat.messages, chat.tools)
    except PromptError as exc:
        raise ApiError(400, str(exc), param="messages") from exc
    limit = completion_limit(
        len(prompt_ids), chat.max_tokens, served.max_model_len, param=chat.max_tokens_param
    )
    params = sampling_params(body, max_tokens=limit, top_logprobs=chat.top_logprobs)
    try:
        generation = served.engine.submit([prompt_ids], params, n=chat.n, adapter=chat.adapter)
    except AdapterNotFound as exc:  # unloaded since `_parse` looked
        raise not_found(chat.model) from exc
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    try:
        if chat.stream:
            return await _stream(served, request, chat, response_id, prompt_ids, generation)
        try:
            choices = await generation.collect()
        except EngineFailure as exc:
            raise ApiError(500, str(exc)) from exc
        return json_response(_response(served, chat, response_id, prompt_ids, choices))
    finally:
        # A client that went away (the handler is cancelled) frees its rows at the next step.
        generation.cancel()


def _parse(served: ServedModel, body: dict[str, Any]) -> _ChatRequest:
    chosen = served.choose(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    check_supported(body)
    logprobs = bool_field(body, "logprobs")
    top_logprobs = int_field(body, "top_logprobs", 0, minimum=0, maximum=MAX_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise ApiError(
            400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs"
        )
    max_tokens, max_tokens_param = chat_max_tokens(body)
    stream = bool_field(body, "stream")
    tools, parse_tools = _tools(body)
    return _ChatRequest(
        model=chosen.name,
        adapter=chosen.adapter,
        messages=messages,
        tools=tools,
        parse_tools=parse_tools,
        n=choice_count(body),
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        tokens_as_ids=bool_field(body, "return_tokens_as_token_ids"),
        return_token_ids=bool_field(body, "return_token_ids"),
        stream=stream,
        include_usage=include_usage(body, stream),
    )


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, bool]:
    """The tools to show the model, and whether to parse tool calls out of the reply."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise ApiError(400, "When using `tool_choice`, `tools` must be set.", param="tools")
        return None, False
    if not isinstance(tools, list) or not tools:
        raise ApiError(400, "'tools' must be a non-empty list when given.", param="tools")
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, "Each tool needs a 'function' with a string 'name'.", param="tools")
    if choice in (None, "auto"):
        return tools, True
    if choice == "none":
        return tools, False
    # vLLM forces these with guided decoding, which this server does not have.
    raise ApiError(
        400,
        "Only tool_choice 'auto' and 'none' are supported by art-proxy local-llm.",
        param="tool_choice",
    )


def _usage(prompt_ids: list[int], completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": len(prompt_ids),
        "total_tokens": len(prompt_ids) + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _response(
    served: ServedModel,
    chat: _ChatRequest,
    response_id: str,
    prompt_ids: list[int],
    choices: list[ChoiceOutput],
) -> dict[str, Any]:
    completion_tokens = sum(len(choice.ids) for choice in choices)
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [
            _response_choice(served, chat, index, choice) for index, choice in enumerate(choices)
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {**_usage(prompt_ids, completion_tokens), "prompt_tokens_details": None},
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if chat.return_token_ids else None,
        "kv_transfer_params": None,
    }


def _response_choice(
    served: ServedModel, chat: _ChatRequest, index: int, choice: ChoiceOutput
) -> dict[str, Any]:
    content: str | None = choice.text
    calls = []
    finish_reason: str | None = choice.finish_reason
    if chat.parse_tools:
        parsed = parse_tool_calls(choice.text)
        content, calls = parsed.content, parsed.tool_calls
        if calls:
            finish_reason = "tool_calls"
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if calls:
        message["tool_calls"] = [call.as_message_part() for call in calls]
    message["reasoning"] = None
    ids = tuple(choice.ids)
    logprobs = None
    if chat.logprobs:
        entries = served.chat_logprobs(ids, tuple(choice.logprobs), as_id=chat.tokens_as_ids)
        logprobs = {"content": entries}
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": choice.stop_reason,
        "token_ids": list(ids) if chat.return_token_ids else None,
    }


async def _stream(
    served: ServedModel,
    request: web.Request,
    chat: _ChatRequest,
    response_id: str,
    prompt_ids: list[int],
    generation: Generation,
) -> web.StreamResponse:
    async with event_stream(request) as response:
        head = {
            "id": response_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": chat.model,
        }
        for index in range(generation.choices):
            role = {"index": index, "delta": {"role": "assistant", "content": ""}}
            await send_event(
                response,
                {
                    **head,
                    "choices": [{**role, "logprobs": None, "finish_reason": None}],
                    "prompt_token_ids": prompt_ids if chat.return_token_ids else None,
                },
            )
        parsers = [
            ToolCallStream() if chat.parse_tools else None for _ in range(generation.choices)
        ]
        await relay_deltas(
            response,
            head,
            generation,
            lambda delta: _stream_choice(served, chat, delta, parsers[delta.index]),
            (lambda tokens: _usage(prompt_ids, tokens)) if chat.include_usage else None,
        )
        await close_event_stream(response)
    return response


def _stream_choice(
    served: ServedModel, chat: _ChatRequest, delta: ChoiceDelta, parser: ToolCallStream | None
) -> dict[str, Any]:
    last = delta.finish_reason is not None
    finish_reason: str | None = delta.finish_reason
    if parser is None:
        message: dict[str, Any] = {"content": delta.text}
    else:
        piece = parser.feed(delta.text, final=last)
        message = {}
        if piece.content:
            message["content"] = piece.content
        if piece.tool_calls:
            message["tool_calls"] = [
                {"index": index, **call.as_message_part()} for index, call in piece.tool_calls
            ]
        if last and parser.called:
            finish_reason = "tool_calls"
    logprobs = None
    if chat.logprobs:
        entries = served.chat_logprobs(delta.token_ids, delta.logprobs, as_id=chat.tokens_as_ids)
        logprobs = {"content": entries}
    chunk: dict[str, Any] = {
        "index": delta.index,
        "delta": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
    }
    if last:
        chunk["stop_reason"] = delta.stop_reason
    chunk["token_ids"] = list(delta.token_ids) if chat.return_token_ids else None
    return chunk
