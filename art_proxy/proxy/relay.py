"""The hot path: forward a generation call, relay the answer, record it.

Non-stream: the upstream body is parsed once, recorded whole, and the client gets it back cut to
what it asked for. Stream: every chunk is written to the client as it arrives; `[DONE]` is held back
until the record is committed, so a client that saw the end of a stream finds it in the store.
Upstream 4xx/5xx answers pass through unchanged. A client that leaves mid-stream closes the upstream
response (vLLM then aborts the request) and leaves an `aborted` record of what was generated.
A `model` that names an alias goes upstream as the alias's target (aliases.py); nothing else in the
body changes, and the answer names the served model, as OpenAI's does. Once an answer is wholly
sent, the shadow sampler may sample the call again in the background (shadow.py).
"""

from __future__ import annotations

import contextlib
import logging

import aiohttp
import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from art_proxy.errors import (
    ArtProxyError,
    BadRequest,
    StoreUnavailable,
    UpstreamError,
)
from art_proxy.records import AliasRecord, CallKind, CallStatus, Split

from .aliases import Aliases
from .attribution import explicit_attribution
from .capture import ClientAsks, StreamRecorder, chunk_problem, strip_chunk, strip_response
from .recording import CallInProgress, Outcome, Recorder
from .request_body import Rejection, body_too_large, parse_body
from .shadow import ShadowSampler
from .tracker import TrajectoryTracker
from .upstream import PATHS, Upstreams, read_body

log = logging.getLogger(__name__)

_DONE = b"data: [DONE]\n\n"


class Relay:
    def __init__(
        self,
        upstreams: Upstreams,
        tracker: TrajectoryTracker,
        recorder: Recorder,
        aliases: Aliases,
        shadow: ShadowSampler,
        *,
        default_split: Split = "train",
    ) -> None:
        self._upstreams = upstreams
        self._tracker = tracker
        self._recorder = recorder
        self._aliases = aliases
        self._shadow = shadow
        self._default_split: Split = default_split

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def completion(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion")

    async def models(self, request: web.Request) -> web.Response:
        upstream = self._upstreams.urls[0]
        response = await self._upstreams.get(upstream, "/models", _client_auth(request))
        raw = await read_body(upstream, response)
        if response.status == 200 and self._aliases.records:
            raw = _with_aliases(raw, self._aliases.records)
        return web.Response(body=raw, status=response.status, content_type="application/json")

    async def _generate(self, request: web.Request, kind: CallKind) -> web.StreamResponse:
        raw = await _read_body(request)
        parsed = raw if isinstance(raw, Rejection) else parse_body(raw, kind)
        if not isinstance(parsed, Rejection):
            try:
                explicit = explicit_attribution(
                    request.match_info, request.headers, self._default_split
                )
            except BadRequest as exc:
                parsed = Rejection(exc, parsed, messages_valid=kind == "chat")
        if isinstance(parsed, Rejection):
            await self._reject(request, kind, parsed)
            raise parsed.error
        body = parsed
        messages = body.get("messages") if kind == "chat" else None
        assignment = await self._tracker.assign(explicit, messages)
        model = body.get("model")
        served = self._aliases.resolve(model) if isinstance(model, str) else None
        call = CallInProgress(kind, body, assignment, stream=bool(body.get("stream")), model=served)
        upstream = assignment.upstream
        token_ids = self._upstreams.returns_token_ids(upstream)
        sent, asks = call.upstream_body(token_ids=token_ids)
        call.asks = asks
        try:
            response = await self._upstreams.post(
                upstream, PATHS[kind], sent, _client_auth(request)
            )
            if response.status == 400 and token_ids:
                raw = await read_body(upstream, response)
                if b"return_token_ids" not in raw:
                    return await self._answer(
                        request, call, response.status, response.content_type, raw, asks
                    )
                # A hosted API rejects vLLM's field: learn that, ask again, record text only.
                log.warning(
                    "upstream %s returns no token ids: its calls are not trainable", upstream
                )
                self._upstreams.mark_without_token_ids(upstream)
                sent, asks = call.upstream_body(token_ids=False)
                response = await self._upstreams.post(
                    upstream, PATHS[kind], sent, _client_auth(request)
                )
            if response.status >= 400 or not call.stream:
                raw = await read_body(upstream, response)
                return await self._answer(
                    request, call, response.status, response.content_type, raw, asks
                )
        except ArtProxyError as exc:
            if not isinstance(exc, StoreUnavailable):
                await self._recorder.record(call, Outcome("failed", exc.status, error=exc.message))
            raise
        return await self._relay_stream(request, call, response, asks)

    async def _reject(self, request: web.Request, kind: CallKind, rejection: Rejection) -> None:
        """Record a request the proxy refused, in the trajectory it would have joined where the
        refusal leaves that knowable (valid attribution headers, valid messages)."""
        try:
            explicit = explicit_attribution(
                request.match_info, request.headers, self._default_split
            )
        except BadRequest:
            explicit = explicit_attribution({}, {}, self._default_split)
        body = rejection.body
        messages = body.get("messages") if body is not None and rejection.messages_valid else None
        assignment = await self._tracker.assign(explicit, messages)
        stored = body if body is not None else {"unreadable_body": rejection.error.message}
        call = CallInProgress(kind, stored, assignment, stream=False)
        error = rejection.error
        with contextlib.suppress(StoreUnavailable):  # the client's mistake is the answer
            await self._recorder.record(
                call, Outcome("rejected", error.status, error=error.message)
            )

    async def _answer(
        self,
        request: web.Request,
        call: CallInProgress,
        status: int,
        content_type: str,
        raw: bytes,
        asks: ClientAsks,
    ) -> web.Response:
        """Answer with a whole (non-stream or error) upstream body."""
        outcome = Outcome.of_answer(call.assignment.upstream, status, raw, call.kind)
        await self._recorder.record(call, outcome)
        if outcome.response is None:
            # Passed through unchanged: vLLM's error bodies are already OpenAI-shaped.
            return web.Response(body=raw, status=status, content_type=content_type)
        answer = web.Response(
            body=orjson.dumps(strip_response(outcome.response, asks)),
            content_type="application/json",
        )
        await self._shadow.after_answer(request, answer, call, outcome)
        return answer

    async def _relay_stream(
        self,
        request: web.Request,
        call: CallInProgress,
        response: aiohttp.ClientResponse,
        asks: ClientAsks,
    ) -> web.StreamResponse:
        client = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await client.prepare(request)
        recorder = StreamRecorder(call.kind)
        outcome_status: CallStatus = "ok"
        error: str | None = None
        try:
            outcome_status, error = await self._pump(client, response, recorder, asks)
        finally:
            response.close()  # an aborted client closes the upstream request too
        if recorder.error is not None and outcome_status == "ok":
            outcome_status, error = "upstream_error", str(recorder.error.get("message"))
        outcome = Outcome(outcome_status, 200, response=recorder.response(), error=error)
        try:
            await self._recorder.record(call, outcome)
        except StoreUnavailable as exc:
            if outcome_status != "aborted":
                await _write_quietly(client, b"data: " + orjson.dumps(exc.body()) + b"\n\n")
                await _write_quietly(client, _DONE)
            return client
        if outcome_status != "aborted":
            await _write_quietly(client, _DONE)
            await self._shadow.after_answer(request, client, call, outcome)
        return client

    async def _pump(
        self,
        client: web.StreamResponse,
        response: aiohttp.ClientResponse,
        recorder: StreamRecorder,
        asks: ClientAsks,
    ) -> tuple[CallStatus, str | None]:
        """Relay chunks until `[DONE]`; returns the call's status and error. A stream that breaks
        off or sends what the proxy cannot read ends with an error event (then `[DONE]`)."""
        try:
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return "ok", None
                chunk = orjson.loads(payload)
                problem = chunk_problem(chunk, recorder.kind)
                if problem is not None:
                    error = UpstreamError(f"upstream sent a malformed stream chunk: {problem}")
                    break
                recorder.add(chunk)
                out = strip_chunk(chunk, asks)
                if out is not None:
                    try:
                        await client.write(b"data: " + orjson.dumps(out) + b"\n\n")
                    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                        return "aborted", "the client closed the connection mid-stream"
            else:
                error = UpstreamError("upstream stream ended without [DONE]")
        except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
            error = UpstreamError(f"upstream stream broke off: {type(exc).__name__}: {exc}")
        await _write_quietly(client, b"data: " + orjson.dumps(error.body()) + b"\n\n")
        return "failed", error.message


async def _read_body(request: web.Request) -> bytes | Rejection:
    """The raw body; one that is too large or cannot be decoded is refused."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return Rejection(body_too_large(request.client_max_size), None, False)
    except RequestPayloadError:
        encoding = request.headers.get("Content-Encoding")
        reason = f"is not valid {encoding}" if encoding else "could not be read"
        return Rejection(
            BadRequest(f"request body {reason}", param="Content-Encoding"), None, False
        )


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


def _client_auth(request: web.Request) -> str | None:
    return request.headers.get("Authorization")


async def _write_quietly(client: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await client.write(data)
