"""`POST /v1/completions`, stream and non-stream, in vLLM's shapes (VLLM_WIRE.md).

Unlike chat, ids sit inside each choice (`prompt_token_ids`, `token_ids`; in a stream the prompt
ids ride on a choice's first chunk only) and `logprobs` is an integer asking for vLLM's legacy
object. Each prompt gets its own room in the context (`wire.completion_limit`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from art_proxy.vllm_api.answer import relay_deltas, send_answer, usage
from art_proxy.vllm_api.engine import (
    ChoiceDelta,
    ChoiceOutput,
    CompletionRequest,
    Generation,
    InferenceEngine,
    PromptLogprobs,
    TokenLogprob,
)
from art_proxy.vllm_api.logprobs import legacy_logprobs, prompt_logprob_entries
from art_proxy.vllm_api.requests import read_completion
from art_proxy.vllm_api.server_metrics import ServerMetrics
from art_proxy.wire import completion_limit


async def completions(
    engine: InferenceEngine, request: web.Request, metrics: ServerMetrics
) -> web.StreamResponse:
    completion = await read_completion(engine, request)
    limits = [
        completion_limit(len(prompt_ids), completion.max_tokens, engine.max_model_len)
        for prompt_ids in completion.prompts
    ]
    generation = metrics.metered(
        await engine.complete(completion, limits), completion.model, _prompt_tokens(completion)
    )
    response_id = f"cmpl-{uuid.uuid4().hex}"
    return await send_answer(
        request,
        generation,
        stream=completion.stream,
        whole=lambda choices: _response(engine, completion, response_id, choices),
        streamed=lambda response: _stream(engine, response, completion, response_id, generation),
    )


def _prompt_tokens(completion: CompletionRequest) -> int:
    return sum(len(prompt) for prompt in completion.prompts)


def _logprobs(
    engine: InferenceEngine,
    completion: CompletionRequest,
    ids: tuple[int, ...],
    logprobs: tuple[TokenLogprob, ...],
    text_offset: int,
) -> dict[str, Any] | None:
    if completion.logprobs is None:
        return None
    return legacy_logprobs(engine, ids, logprobs, text_offset)


def _prompt_logprobs(
    engine: InferenceEngine, ids: list[int], scored: PromptLogprobs | None
) -> list[dict[str, dict[str, Any]] | None] | None:
    return None if scored is None else prompt_logprob_entries(engine, ids, scored)


def _response(
    engine: InferenceEngine,
    completion: CompletionRequest,
    response_id: str,
    choices: list[ChoiceOutput],
) -> dict[str, Any]:
    ids_wanted = completion.return_token_ids
    completion_tokens = sum(len(choice.token_ids) for choice in choices)
    return {
        "id": response_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": completion.model,
        "choices": [
            {
                "index": index,
                "text": choice.text,
                "logprobs": _logprobs(engine, completion, choice.token_ids, choice.logprobs, 0),
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
                "token_ids": list(choice.token_ids) if ids_wanted else None,
                "prompt_logprobs": _prompt_logprobs(
                    engine, completion.prompts[index // completion.n], choice.prompt_logprobs
                ),
                "prompt_token_ids": (
                    completion.prompts[index // completion.n] if ids_wanted else None
                ),
            }
            for index, choice in enumerate(choices)
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            **usage(_prompt_tokens(completion), completion_tokens),
            "prompt_tokens_details": None,
        },
        "kv_transfer_params": None,
    }


async def _stream(
    engine: InferenceEngine,
    response: web.StreamResponse,
    completion: CompletionRequest,
    response_id: str,
    generation: Generation,
) -> None:
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
        lambda delta: _stream_choice(engine, completion, delta, text_offsets, started),
        _prompt_tokens(completion) if completion.include_usage else None,
    )


def _stream_choice(
    engine: InferenceEngine,
    completion: CompletionRequest,
    delta: ChoiceDelta,
    text_offsets: list[int],
    started: list[bool],
) -> dict[str, Any]:
    index, ids_wanted = delta.index, completion.return_token_ids
    first = not started[index]
    started[index] = True
    text = delta.text or ""
    logprobs = _logprobs(engine, completion, delta.token_ids, delta.logprobs, text_offsets[index])
    text_offsets[index] += len(text)
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": delta.finish_reason,
        "stop_reason": delta.stop_reason,
        "prompt_token_ids": (
            completion.prompts[index // completion.n] if ids_wanted and first else None
        ),
        "token_ids": list(delta.token_ids) if ids_wanted else None,
    }
