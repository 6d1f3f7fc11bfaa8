"""The routes beside generation that read without generating: the upstream's models (the aliases
added), a prompt's tokens counted by the upstream's tokenizer (Anthropic's `count_tokens`,
OpenAI's `input_tokens`), and a stored Responses answer. Nothing here is recorded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from art_proxy.errors import NotFound, UpstreamError
from art_proxy.ids import made_at_s
from art_proxy.privacy.subjects import Subject, may_read, subject_of, subject_of_row
from art_proxy.records import AliasRecord, JsonObject
from art_proxy.store.trajectory_store import TrajectoryStore

from .aliases import Aliases
from .answering import json_answer
from .dialects import anthropic, responses, responses_answer
from .translation import loaded_body
from .upstream import Upstreams, client_auth, read_body

# How long a call another proxy may still be ingesting is awaited in the store: an ingester
# normally takes 10-20 ms, seconds in a backlog (docs/operations.md, "What readers see").
OTHER_PROXY_WAIT_S = 10.0
_OTHER_PROXY_POLL_S = 0.05
# Lookups waiting at once: past it, a call not in the store is not found at once, so that ids
# made up to look recent cannot hold many requests open, each asking the store 20 times a second.
_MAX_WAITING = 32


class Lookups:
    def __init__(
        self,
        upstreams: Upstreams,
        store: TrajectoryStore,
        aliases: Aliases,
        *,
        read_your_writes: Callable[[], Awaitable[None]],
        answered_within_s: float,
    ) -> None:
        """`answered_within_s`: the longest a call's answer may take (the upstream's timeout)."""
        self._upstreams = upstreams
        self._store = store
        self._aliases = aliases
        self._read_your_writes = read_your_writes
        self._answered_within_s = answered_within_s
        self._waiting = 0

    async def stored_call(self, call_id: str) -> JsonObject | None:
        """A recorded call's row, once this proxy's own records before it are in the store. A
        call not there whose id says it may still be on its way from another proxy is awaited
        for up to `OTHER_PROXY_WAIT_S`."""
        await self._read_your_writes()
        row = await self._store.call_row(call_id)
        if row is None and self._may_be_on_its_way(call_id):
            # Behind a load balancer a chain's next call may reach this proxy before the one
            # that answered the last has ingested it: a 400 would break the conversation.
            self._waiting += 1
            try:
                deadline = time.monotonic() + OTHER_PROXY_WAIT_S
                while row is None and time.monotonic() < deadline:
                    await asyncio.sleep(_OTHER_PROXY_POLL_S)
                    row = await self._store.call_row(call_id)
            finally:
                self._waiting -= 1
        return row

    async def readable_call(self, call_id: str, reader: Subject) -> JsonObject | None:
        """`stored_call`'s row where `reader` may read it (`may_read`), else None, as late as
        for an id not (yet) in the store: neither the answer nor its time tells another
        subject's call apart from a made-up id."""
        row = await self.stored_call(call_id)
        if row is None or may_read(reader, subject_of_row(row)):
            return row
        if self._may_be_on_its_way(call_id):
            await asyncio.sleep(OTHER_PROXY_WAIT_S)
        return None

    def _may_be_on_its_way(self, call_id: str) -> bool:
        """Whether a proxy made `call_id` recently enough that its answer may still be coming or
        not yet ingested: an id is made when its call arrives, and the answer can take up to the
        upstream's timeout."""
        made_at = made_at_s(call_id)
        return (
            made_at is not None
            and time.time() - made_at < self._answered_within_s + OTHER_PROXY_WAIT_S
            and self._waiting < _MAX_WAITING
        )

    async def stored_response(self, request: web.Request) -> web.Response:
        """`GET /v1/responses/{id}`: a stored response, rendered again from its call's record."""
        response_id = request.match_info["response"]
        call_id = responses.call_id_of(response_id)
        reader = subject_of(request.headers, None)
        row = await self.readable_call(call_id, reader) if call_id else None
        if not responses.retrievable(row):
            raise NotFound(f"no response with id {response_id!r}", param="response_id")
        assert row is not None  # retrievable
        created = row["created_at"].timestamp()
        body = responses_answer.response_object(
            call_id or "", row["client_request"], row["response"], created
        )
        return json_answer(body)

    async def models(self, request: web.Request) -> web.Response:
        upstream = self._upstreams.urls[0]
        response = await self._upstreams.get(upstream, "/models", client_auth(request))
        raw = await read_body(upstream, response)
        if response.status == 200 and self._aliases.records:
            raw = _with_aliases(raw, self._aliases.records)
        return web.Response(body=raw, status=response.status, content_type="application/json")

    async def count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's `POST /v1/messages/count_tokens`: the body's prompt, translated as
        `/v1/messages` translates it, counted by the upstream (`_counted`)."""
        loaded = await loaded_body(request)
        model = self._aliases.resolve(anthropic.model_of(loaded))
        prompt = {"model": model, **anthropic.prompt_of(loaded)}
        counted = await self._counted(request, prompt, anthropic.failed_answer)
        if isinstance(counted, web.Response):
            return counted
        return json_answer({"input_tokens": counted})

    async def input_tokens(self, request: web.Request) -> web.Response:
        """OpenAI's `POST /v1/responses/input_tokens`: the body's prompt, translated as
        `/v1/responses` translates it (instructions, tools and a `previous_response_id`'s
        conversation included), counted by the upstream (`_counted`)."""
        loaded = await loaded_body(request)
        reader = subject_of(request.headers, loaded)
        done = await responses.translate(loaded, lambda call: self.readable_call(call, reader))
        chat = done.chat
        prompt: JsonObject = {"model": self._aliases.resolve(chat["model"])}
        prompt |= {key: chat[key] for key in ("messages", "tools") if key in chat}
        counted = await self._counted(request, prompt)
        if isinstance(counted, web.Response):
            return counted
        return json_answer({"object": "response.input_tokens", "input_tokens": counted})

    async def _counted(
        self,
        request: web.Request,
        prompt: JsonObject,
        failed: Callable[[bytes, int], bytes] | None = None,
    ) -> int | web.Response:
        """The tokens of a chat prompt (`model`, `messages`, `tools`) by the upstream's tokenizer:
        vLLM's `/tokenize` (at the server's root) renders it as a chat call's prompt. Else the
        upstream's failure, its body rendered by `failed` (None: as sent, OpenAI-shaped)."""
        upstream = self._upstreams.urls[0]
        root = upstream.removesuffix("/v1")
        response = await self._upstreams.post(root, "/tokenize", prompt, client_auth(request))
        answer = await read_body(root, response)
        if response.status == 200:
            return _count_of(upstream, answer)
        if response.status in (404, 405) and b'"detail"' in answer:  # the route, not the model
            raise NotFound(
                f"upstream {upstream} counts no tokens: it serves no /tokenize (vLLM does)"
            )
        return web.Response(
            body=failed(answer, response.status) if failed is not None else answer,
            status=response.status,
            content_type="application/json",
        )


def _count_of(upstream: str, raw: bytes) -> int:
    """The `count` of a `/tokenize` answer; `UpstreamError` if it has none."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    count = parsed.get("count") if isinstance(parsed, dict) else None
    if type(count) is not int:
        raise UpstreamError(f"upstream {upstream} answered /tokenize without a count")
    return count


def _with_aliases(raw: bytes, aliases: list[AliasRecord]) -> bytes:
    """The upstream's model list plus a card for each alias it lacks (SDKs check the list)."""
    try:
        listed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
    if not isinstance(listed, dict) or not isinstance(listed.get("data"), list):
        return raw
    names = {card.get("id") for card in listed["data"] if isinstance(card, dict)}
    listed["data"] += [
        {"id": alias.alias, "object": "model", "owned_by": "art-proxy", "root": alias.model}
        for alias in aliases
        if alias.alias not in names
    ]
    return orjson.dumps(listed)
