"""`POST /v1/chat/completions`, stream and non-stream, in vLLM's exact shapes (VLLM_WIRE.md).

A stream sends one role chunk per choice (the only one with `prompt_token_ids`), then a chunk per
delta with that delta's ids; a delta whose tool-call markup is held back still sends a chunk
(`"delta": {}`) when it carries ids or logprobs, so the ids of all chunks add up to the non-stream
`token_ids` (vLLM's rule). An engine failure after the stream began is an error event.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from art_proxy.vllm_api.answer import relay_deltas, send_answer, usage
from art_proxy.vllm_api.engine import (
    ChatRequest,
    ChoiceDelta,
    ChoiceOutput,
    Generation,
    InferenceEngine,
    PromptError,
)
from art_proxy.vllm_api.logprobs import chat_logprobs
from art_proxy.vllm_api.requests import read_chat
from art_proxy.vllm_api.server_metrics import ServerMetrics
from art_proxy.wire import ApiError, completion_limit, send_event


async def chat_completions(
    engine: InferenceEngine, request: web.Request, metrics: ServerMetrics
) -> web.StreamResponse:
    chat = await read_chat(engine, request)
    try:
        prompt_ids = engine.render(chat.messages, chat.tools, continue_final=chat.continue_final)
    except PromptError as exc:
        raise ApiError(400, str(exc), param="messages") from exc
    limit = completion_limit(
        len(prompt_ids), chat.max_tokens, engine.max_model_len, param=chat.max_tokens_param
    )
    generation = metrics.metered(
        await engine.chat(chat, prompt_ids, limit), chat.model, len(prompt_ids)
    )
    response_id = f"chatcmpl-{uuid.uuid4().hex}"
    return await send_answer(
        request,
        generation,
        stream=chat.stream,
        whole=lambda choices: _response(engine, chat, response_id, prompt_ids, choices),
        streamed=lambda response: _stream(
            engine, response, chat, response_id, prompt_ids, generation
        ),
    )


def _response(
    engine: InferenceEngine,
    chat: ChatRequest,
    response_id: str,
    prompt_ids: list[int],
    choices: list[ChoiceOutput],
) -> dict[str, Any]:
    completion_tokens = sum(len(choice.token_ids) for choice in choices)
    return {
        "id": response_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": chat.model,
        "choices": [
            _response_choice(engine, chat, index, choice) for index, choice in enumerate(choices)
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {**usage(len(prompt_ids), completion_tokens), "prompt_tokens_details": None},
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_ids if chat.return_token_ids else None,
        "kv_transfer_params": None,
    }


def _response_choice(
    engine: InferenceEngine, chat: ChatRequest, index: int, choice: ChoiceOutput
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": choice.text,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if choice.tool_calls:  # the key is absent without calls, as in current vLLM
        message["tool_calls"] = list(choice.tool_calls)
    message["reasoning"] = None
    logprobs = None
    if chat.logprobs:
        logprobs = chat_logprobs(
            engine, choice.token_ids, choice.logprobs, as_id=chat.tokens_as_ids
        )
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": choice.finish_reason,
        "stop_reason": choice.stop_reason,
        "token_ids": list(choice.token_ids) if chat.return_token_ids else None,
    }


async def _stream(
    engine: InferenceEngine,
    response: web.StreamResponse,
    chat: ChatRequest,
    response_id: str,
    prompt_ids: list[int],
    generation: Generation,
) -> None:
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
    await relay_deltas(
        response,
        head,
        generation,
        lambda delta: _stream_choice(engine, chat, delta),
        len(prompt_ids) if chat.include_usage else None,
    )


def _stream_choice(
    engine: InferenceEngine, chat: ChatRequest, delta: ChoiceDelta
) -> dict[str, Any] | None:
    """The delta's chunk choice; None for held-back markup with neither ids nor logprobs to carry."""
    last = delta.finish_reason is not None
    message: dict[str, Any] = {}
    if delta.text is not None:
        message["content"] = delta.text
    if delta.tool_calls:
        message["tool_calls"] = list(delta.tool_calls)
    if not (message or last or chat.return_token_ids or chat.logprobs):
        return None
    logprobs = None
    if chat.logprobs:
        logprobs = chat_logprobs(engine, delta.token_ids, delta.logprobs, as_id=chat.tokens_as_ids)
    chunk: dict[str, Any] = {
        "index": delta.index,
        "delta": message,
        "logprobs": logprobs,
        "finish_reason": delta.finish_reason,
    }
    if last:
        chunk["stop_reason"] = delta.stop_reason
    chunk["token_ids"] = list(delta.token_ids) if chat.return_token_ids else None
    return chunk
