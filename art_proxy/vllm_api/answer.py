"""How an answer leaves, the same for chat and text completions: whole as JSON, or streamed.

An engine failure before the answer is a 500; once a stream began it becomes vLLM's in-stream error
event (the HTTP status is already 200), and the stream still ends with `[DONE]`. Either way the
generation is cancelled when the handler ends, which frees the engine's rows of a client that went
away (its handler is cancelled).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from art_proxy.vllm_api.engine import ChoiceDelta, ChoiceOutput, EngineFailure, Generation
from art_proxy.wire import ApiError, close_event_stream, event_stream, json_response, send_event


async def send_answer(
    request: web.Request,
    generation: Generation,
    *,
    stream: bool,
    whole: Callable[[list[ChoiceOutput]], dict[str, Any]],
    streamed: Callable[[web.StreamResponse], Awaitable[None]],
) -> web.StreamResponse:
    """`whole` builds the JSON body from the choices; `streamed` writes the events of a stream
    (before `[DONE]`)."""
    try:
        if not stream:
            try:
                choices = await generation.collect()
            except EngineFailure as exc:
                raise ApiError(500, str(exc)) from exc
            return json_response(whole(choices))
        async with event_stream(request) as response:
            await streamed(response)
            await close_event_stream(response)
        return response
    finally:
        generation.cancel()


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """`completion_tokens` sums every choice; a prompt counts once however many choices it has."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


async def relay_deltas(
    response: web.StreamResponse,
    head: dict[str, Any],
    generation: Generation,
    chunk_of: Callable[[ChoiceDelta], dict[str, Any] | None],
    prompt_tokens: int | None,
) -> None:
    """One chunk per delta (none where `chunk_of` gives None), then the usage chunk when asked
    for (`prompt_tokens` set); usage counts the ids of every delta, sent or not."""
    completion_tokens = 0
    try:
        async for delta in generation.deltas():
            completion_tokens += len(delta.token_ids)
            chunk = chunk_of(delta)
            if chunk is not None:
                await send_event(response, {**head, "choices": [chunk]})
    except EngineFailure as exc:
        await send_event(response, ApiError(500, str(exc)).body())
        return
    if prompt_tokens is not None:
        await send_event(
            response, {**head, "choices": [], "usage": usage(prompt_tokens, completion_tokens)}
        )
