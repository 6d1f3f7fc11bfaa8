"""`POST /v1/completions` of the fake vLLM, stream and non-stream.

`prompt` is text, a list of ids, or a list of either (one group of `n` choices per prompt, choice
index `prompt_index * n + i`). Unlike chat, ids sit inside each choice (`prompt_token_ids`,
`token_ids`) and `logprobs` is an integer asking for vLLM's legacy logprobs object.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from art_proxy.testing.fake_engine import (
    FakeEngine,
    Generated,
    chunks_of,
    mid_stream_error,
    serve_events,
)
from art_proxy.testing.fake_tokenizer import VOCAB_SIZE
from art_proxy.wire import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    MAX_LOGPROBS,
    ApiError,
    bool_field,
    choice_count,
    include_usage,
    int_field,
    json_response,
    read_json_object,
)


@dataclass(frozen=True, slots=True)
class _CompletionRequest:
    model: str
    prompts: list[list[int]]
    n: int
    max_tokens: int
    logprobs: int | None
    return_token_ids: bool
    stream: bool
    include_usage: bool


@dataclass(frozen=True, slots=True)
class _Choice:
    index: int
    prompt_ids: list[int]
    output: Generated


async def handle_completions(engine: FakeEngine, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    engine.record(body)
    completion = _parse(engine, body)
    choices = []
    for prompt_index, prompt_ids in enumerate(completion.prompts):
        limit = engine.completion_limit(len(prompt_ids), completion.max_tokens)
        for i in range(completion.n):
            reply_ids = engine.tokenizer.encode(engine.reply_text(i))
            output = engine.generate(reply_ids, limit, "stop")
            choices.append(_Choice(prompt_index * completion.n + i, prompt_ids, output))
    await engine.before_answer()
    response_id = f"cmpl-{uuid.uuid4().hex}"
    if completion.stream:
        events = _stream_events(engine, completion, response_id, choices)
        return await serve_events(request, events, engine.config.chunk_delay_s)
    return json_response(_response(engine, completion, response_id, choices))


def _parse(engine: FakeEngine, body: dict[str, Any]) -> _CompletionRequest:
    model = engine.served_model(body)
    stream = bool_field(body, "stream")
    logprobs = int_field(body, "logprobs", None, minimum=0, maximum=MAX_LOGPROBS)
    return _CompletionRequest(
        model=model,
        prompts=_prompts(engine, body.get("prompt")),
        n=choice_count(body),
        max_tokens=int_field(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, minimum=0) or 0,
        logprobs=logprobs,
        return_token_ids=bool_field(body, "return_token_ids"),
        stream=stream,
        include_usage=include_usage(body, stream),
    )


def _prompts(engine: FakeEngine, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str) and prompt:
        return [list(engine.tokenizer.encode(prompt))]
    if isinstance(prompt, list) and prompt:
        if all(_is_token_id(item) for item in prompt):
            return [_checked_ids(prompt)]
        prompts = []
        for item in prompt:
            if isinstance(item, str) and item:
                prompts.append(list(engine.tokenizer.encode(item)))
            elif isinstance(item, list) and item and all(_is_token_id(i) for i in item):
                prompts.append(_checked_ids(item))
            else:
                break
        else:
            return prompts
    raise ApiError(
        400,
        "'prompt' must be a non-empty string, list of token ids, or list of either.",
        param="prompt",
    )


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_ids(ids: list[int]) -> list[int]:
    for token_id in ids:
        if not 0 <= token_id < VOCAB_SIZE:
            raise ApiError(400, f"Token id {token_id} is out of vocabulary.", param="prompt")
    return ids


def _legacy_logprobs(
    engine: FakeEngine, k: int | None, ids: tuple[int, ...], start: int, text_offset: int
) -> dict[str, Any] | None:
    """vLLM's legacy object; each `top_logprobs` dict holds the sampled token and k - 1 others."""
    if k is None:
        return None
    piece = engine.tokenizer.piece
    result: dict[str, list[Any]] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    for position, token_id in enumerate(ids, start):
        ranked = engine.top_logprobs(token_id, position, max(k, 1))
        result["text_offset"].append(text_offset)
        result["token_logprobs"].append(ranked[0][1])
        result["tokens"].append(piece(token_id))
        result["top_logprobs"].append({piece(i): logprob for i, logprob in ranked})
        text_offset += len(piece(token_id))
    return result


def _usage(choices: list[_Choice], n: int) -> dict[str, int]:
    # Each prompt counts once, however many choices it has.
    prompt_tokens = sum(len(choice.prompt_ids) for choice in choices[::n])
    completion_tokens = sum(len(choice.output.token_ids) for choice in choices)
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _response(
    engine: FakeEngine, completion: _CompletionRequest, response_id: str, choices: list[_Choice]
) -> dict[str, Any]:
    ids_wanted = completion.return_token_ids
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": completion.model,
        "choices": [
            {
                "index": choice.index,
                "text": choice.output.text,
                "logprobs": _legacy_logprobs(
                    engine, completion.logprobs, choice.output.token_ids, 0, 0
                ),
                "finish_reason": choice.output.finish_reason,
                "stop_reason": None,
                "token_ids": list(choice.output.token_ids) if ids_wanted else None,
                "prompt_logprobs": None,
                "prompt_token_ids": choice.prompt_ids if ids_wanted else None,
            }
            for choice in choices
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {**_usage(choices, completion.n), "prompt_tokens_details": None},
        "kv_transfer_params": None,
    }


def _stream_events(
    engine: FakeEngine, completion: _CompletionRequest, response_id: str, choices: list[_Choice]
) -> Iterator[dict[str, Any]]:
    head = {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": completion.model,
    }
    bounds = [chunks_of(len(c.output.token_ids), engine.config.tokens_per_chunk) for c in choices]
    text_offsets = [0] * len(choices)
    ids_wanted = completion.return_token_ids
    for step in range(max(len(b) for b in bounds)):
        for slot, (choice, choice_bounds) in enumerate(zip(choices, bounds, strict=True)):
            if step >= len(choice_bounds):
                continue
            start, end = choice_bounds[step]
            ids = choice.output.token_ids[start:end]
            text = engine.tokenizer.decode(ids)
            last = step == len(choice_bounds) - 1
            chunk_choice = {
                "index": choice.index,
                "text": text,
                "logprobs": _legacy_logprobs(
                    engine, completion.logprobs, ids, start, text_offsets[slot]
                ),
                "finish_reason": choice.output.finish_reason if last else None,
                "stop_reason": None,
                "prompt_token_ids": choice.prompt_ids if ids_wanted and step == 0 else None,
                "token_ids": list(ids) if ids_wanted else None,
            }
            text_offsets[slot] += len(text)
            yield {**head, "choices": [chunk_choice]}
            if engine.config.fail_mid_stream:
                yield mid_stream_error()
                return
    if completion.include_usage:
        yield {**head, "choices": [], "usage": _usage(choices, completion.n)}
