"""`POST /v1/completions`, stream and non-stream, in vLLM's shapes (VLLM_WIRE.md).

`prompt` is text, a list of ids, or a list of either: one group of `n` choices per prompt, choice
index `prompt_index * n + i`, all generated in one batch. Unlike chat, ids sit inside each choice
(`prompt_token_ids`, `token_ids`) and `logprobs` is an integer asking for vLLM's legacy object.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from art_proxy.local.errors import AdapterNotFound, EngineFailure
from art_proxy.local.generation import ChoiceDelta, ChoiceOutput, Generation
from art_proxy.local.request_params import check_supported, sampling_params
from art_proxy.local.sampling import TokenLogprob
from art_proxy.local.served import ServedModel, not_found, wire_logprob
from art_proxy.local.stream import relay_deltas
from art_proxy.wire import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    MAX_LOGPROBS,
    ApiError,
    bool_field,
    choice_count,
    close_event_stream,
    completion_limit,
    event_stream,
    include_usage,
    int_field,
    json_response,
    read_json_object,
)


@dataclass(frozen=True, slots=True)
class _CompletionRequest:
    model: str
    adapter: str | None
    prompts: list[list[int]]
    n: int
    max_tokens: int
    logprobs: int | None
    return_token_ids: bool
    stream: bool
    include_usage: bool


async def handle_completions(served: ServedModel, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    completion = _parse(served, body)
    # One limit for the batch: the tightest prompt's (vLLM cuts each prompt to its own room).
    limit = min(
        completion_limit(len(prompt_ids), completion.max_tokens, served.max_model_len)
        for prompt_ids in completion.prompts
    )
    top = completion.logprobs or 0
    params = sampling_params(body, max_tokens=limit, top_logprobs=top)
    try:
        generation = served.engine.submit(
            completion.prompts, params, n=completion.n, adapter=completion.adapter
        )
    except AdapterNotFound as exc:
        raise not_found(completion.model) from exc
    response_id = f"cmpl-{uuid.uuid4().hex}"
    try:
        if completion.stream:
            return await _stream(served, request, completion, response_id, generation)
        try:
            choices = await generation.collect()
        except EngineFailure as exc:
            raise ApiError(500, str(exc)) from exc
        return json_response(_response(served, completion, response_id, choices))
    finally:
        generation.cancel()  # frees the rows of a client that went away


def _parse(served: ServedModel, body: dict[str, Any]) -> _CompletionRequest:
    chosen = served.choose(body)
    check_supported(body)
    stream = bool_field(body, "stream")
    return _CompletionRequest(
        model=chosen.name,
        adapter=chosen.adapter,
        prompts=_prompts(served, body.get("prompt")),
        n=choice_count(body),
        max_tokens=int_field(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, minimum=1)
        or COMPLETIONS_DEFAULT_MAX_TOKENS,
        logprobs=int_field(body, "logprobs", None, minimum=0, maximum=MAX_LOGPROBS),
        return_token_ids=bool_field(body, "return_token_ids"),
        stream=stream,
        include_usage=include_usage(body, stream),
    )


def _prompts(served: ServedModel, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str) and prompt:
        return [_encode(served, prompt)]
    if isinstance(prompt, list) and prompt:
        if all(_is_token_id(item) for item in prompt):
            served.check_token_ids(prompt)
            return [prompt]
        prompts = []
        for item in prompt:
            if isinstance(item, str) and item:
                prompts.append(_encode(served, item))
            elif isinstance(item, list) and item and all(_is_token_id(i) for i in item):
                served.check_token_ids(item)
                prompts.append(item)
            else:
                break
        else:
            return prompts
    raise ApiError(
        400,
        "'prompt' must be a non-empty string, list of token ids, or list of either.",
        param="prompt",
    )


def _encode(served: ServedModel, text: str) -> list[int]:
    ids: list[int] = served.tokenizer(text)["input_ids"]
    return ids


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _legacy_logprobs(
    served: ServedModel,
    k: int | None,
    ids: tuple[int, ...],
    logprobs: tuple[TokenLogprob, ...],
    text_offset: int,
) -> dict[str, Any] | None:
    """vLLM's legacy object: per token its offset, logprob, piece, and the sampled piece + top k."""
    if k is None:
        return None
    result: dict[str, list[Any]] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    for token_id, logprob in zip(ids, logprobs, strict=True):
        piece = served.piece(token_id)[0]
        ranked = {piece: wire_logprob(logprob.logprob)}
        for top_id, top_logprob in logprob.top:
            ranked.setdefault(served.piece(top_id)[0], wire_logprob(top_logprob))
        result["text_offset"].append(text_offset)
        result["token_logprobs"].append(wire_logprob(logprob.logprob))
        result["tokens"].append(piece)
        result["top_logprobs"].append(ranked)
        text_offset += len(piece)
    return result


def _usage(completion: _CompletionRequest, completion_tokens: int) -> dict[str, int]:
    prompt_tokens = sum(len(prompt) for prompt in completion.prompts)
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _response(
    served: ServedModel,
    completion: _CompletionRequest,
    response_id: str,
    choices: list[ChoiceOutput],
) -> dict[str, Any]:
    ids_wanted = completion.return_token_ids
    completion_tokens = sum(len(choice.ids) for choice in choices)
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": completion.model,
        "choices": [
            {
                "index": index,
                "text": choice.text,
                "logprobs": _legacy_logprobs(
                    served, completion.logprobs, tuple(choice.ids), tuple(choice.logprobs), 0
                ),
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
                "token_ids": choice.ids if ids_wanted else None,
                "prompt_logprobs": None,
                "prompt_token_ids": (
                    completion.prompts[index // completion.n] if ids_wanted else None
                ),
            }
            for index, choice in enumerate(choices)
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {**_usage(completion, completion_tokens), "prompt_tokens_details": None},
        "kv_transfer_params": None,
    }


async def _stream(
    served: ServedModel,
    request: web.Request,
    completion: _CompletionRequest,
    response_id: str,
    generation: Generation,
) -> web.StreamResponse:
    async with event_stream(request) as response:
        head = {
            "id": response_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": completion.model,
        }
        text_offsets = [0] * generation.choices
        started = [False] * generation.choices
        await relay_deltas(
            response,
            head,
            generation,
            lambda delta: _stream_choice(served, completion, delta, text_offsets, started),
            (lambda tokens: _usage(completion, tokens)) if completion.include_usage else None,
        )
        await close_event_stream(response)
    return response


def _stream_choice(
    served: ServedModel,
    completion: _CompletionRequest,
    delta: ChoiceDelta,
    text_offsets: list[int],
    started: list[bool],
) -> dict[str, Any]:
    index, ids_wanted = delta.index, completion.return_token_ids
    first = not started[index]
    started[index] = True
    logprobs = _legacy_logprobs(
        served, completion.logprobs, delta.token_ids, delta.logprobs, text_offsets[index]
    )
    text_offsets[index] += len(delta.text)
    return {
        "index": index,
        "text": delta.text,
        "logprobs": logprobs,
        "finish_reason": delta.finish_reason,
        "stop_reason": delta.stop_reason,
        "prompt_token_ids": (
            completion.prompts[index // completion.n] if ids_wanted and first else None
        ),
        "token_ids": list(delta.token_ids) if ids_wanted else None,
    }
