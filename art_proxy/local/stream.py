"""Relaying a generation's deltas as SSE chunks, the same way for chat and text completions.

An engine failure after the stream began becomes vLLM's in-stream error event (the HTTP status is
already 200); the caller then closes the stream with `[DONE]` either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from art_proxy.local.errors import EngineFailure
from art_proxy.local.generation import ChoiceDelta, Generation
from art_proxy.wire import ApiError, send_event


async def relay_deltas(
    response: web.StreamResponse,
    head: dict[str, Any],
    generation: Generation,
    chunk_of: Callable[[ChoiceDelta], dict[str, Any]],
    usage_of: Callable[[int], dict[str, Any]] | None,
) -> None:
    """One chunk per delta, then the usage chunk when asked for (`usage_of` set)."""
    completion_tokens = 0
    try:
        async for delta in generation.deltas():
            completion_tokens += len(delta.token_ids)
            await send_event(response, {**head, "choices": [chunk_of(delta)]})
    except EngineFailure as exc:
        await send_event(response, ApiError(500, str(exc)).body())
        return
    if usage_of is not None:
        await send_event(response, {**head, "choices": [], "usage": usage_of(completion_tokens)})
