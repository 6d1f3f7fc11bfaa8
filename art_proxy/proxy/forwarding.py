"""A call's third stage: its body sent to the upstream its trajectory is assigned to, as vLLM
reads it (token ids and logprobs asked for, an alias's target as the model, guidance added),
falling back to text for an upstream that refuses vLLM's fields (a hosted API)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import aiohttp
import orjson

from art_proxy.errors import ArtProxyError
from art_proxy.records import JsonObject

from .call import CallInProgress
from .upstream import PATHS, Upstreams, read_body

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Forwarded:
    """The upstream's answer: its response, and its whole body where it was read (a non-stream
    answer, or any error); None for a stream still to be relayed."""

    response: aiohttp.ClientResponse
    raw: bytes | None


async def forward(upstreams: Upstreams, call: CallInProgress, auth: str | None) -> Forwarded:
    """Send `call` upstream (`auth`: the client's key, which the upstream may check)."""
    upstream = call.assignment.upstream
    token_ids = upstreams.returns_token_ids(upstream)
    sent, call.asks = call.upstream_body(token_ids=token_ids)
    if call.unguided_messages is not None:
        unguided = {**sent, "messages": call.unguided_messages}
        call.unguided_prompt_ids = await _prompt_ids(upstreams, upstream, unguided, auth)
    response = await upstreams.post(upstream, PATHS[call.kind], sent, auth, call.trace)
    if response.status == 400 and token_ids:
        raw = await read_body(upstream, response)
        if b"return_token_ids" not in raw:
            return Forwarded(response, raw)
        # A hosted API rejects vLLM's field: learn that, ask again, record text only. Said once:
        # calls in flight together all learn it.
        if upstreams.returns_token_ids(upstream):
            log.warning("upstream %s returns no token ids: its calls are not trainable", upstream)
        upstreams.mark_without_token_ids(upstream)
        sent, call.asks = call.upstream_body(token_ids=False)
        response = await upstreams.post(upstream, PATHS[call.kind], sent, auth, call.trace)
    if response.status >= 400 or not call.stream:
        return Forwarded(response, await read_body(upstream, response))
    return Forwarded(response, None)


async def _prompt_ids(
    upstreams: Upstreams, upstream: str, body: JsonObject, auth: str | None
) -> list[int] | None:
    """The ids a chat body's prompt renders to, by the upstream's `/tokenize` (None when it
    cannot tell: a guided call is then recorded untrainable, guidance.py)."""
    prompt: JsonObject = {k: body[k] for k in ("model", "messages", "tools") if k in body}
    root = upstream.removesuffix("/v1")
    try:
        response = await upstreams.post(root, "/tokenize", prompt, auth)
        answer = orjson.loads(await read_body(root, response))
    except (ArtProxyError, orjson.JSONDecodeError) as exc:
        log.warning("the prompt of a guided call could not be tokenized: %s", exc)
        return None
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if response.status != 200 or not isinstance(tokens, list):
        log.warning("the prompt of a guided call could not be tokenized: %s", answer)
        return None
    return [int(token) for token in tokens]
