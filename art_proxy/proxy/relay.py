"""The hot path: forward a generation call, relay the answer, record it.

Non-stream: the upstream body is parsed once, recorded whole, and the client gets it back cut to
what it asked for. Stream: every chunk is written to the client as it arrives, and `[DONE]` waits
for the record (stream_relay.py). Upstream 4xx/5xx answers pass through unchanged.
A `model` that names an alias goes upstream as the alias's target (aliases.py); nothing else in the
body changes, and the answer names the served model, as OpenAI's does. Once an answer is wholly
sent, the shadow sampler may sample the call again in the background (shadow.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import orjson
from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from art_proxy.config import RecordPolicy
from art_proxy.errors import (
    ArtProxyError,
    BadRequest,
    NotFound,
    StoreUnavailable,
    UpstreamError,
)
from art_proxy.privacy.consent import records_call
from art_proxy.privacy.subjects import subject_of
from art_proxy.records import AliasRecord, CallKind, Dialect, JsonObject, Split
from art_proxy.store.trajectory_store import TrajectoryStore

from .aliases import Aliases
from .attribution import explicit_attribution
from .best_of import BEST_OF_ANSWER, BestOf, asked_candidates
from .dialects import Rendering, anthropic, responses, responses_answer
from .dialects.openai import ChatRendering
from .guidance import guidance_of
from .recording import CallInProgress, Outcome, Recorder
from .request_body import Rejection, body_too_large, check_body, load_body, parse_body
from .shadow import ShadowSampler
from .stream_relay import answer_as_stream, relay_stream
from .tracing import TRACE_HEADERS
from .tracker import Assignment, TrajectoryTracker
from .upstream import PATHS, Upstreams, read_body

log = logging.getLogger(__name__)


class Relay:
    def __init__(
        self,
        upstreams: Upstreams,
        store: TrajectoryStore,
        tracker: TrajectoryTracker,
        recorder: Recorder,
        aliases: Aliases,
        shadow: ShadowSampler,
        best_of: BestOf,
        *,
        default_split: Split = "train",
        record_policy: RecordPolicy = RecordPolicy.all,
        read_your_writes: Callable[[], Awaitable[None]],
    ) -> None:
        self._upstreams = upstreams
        self._read_your_writes = read_your_writes
        self._store = store
        self._tracker = tracker
        self._recorder = recorder
        self._aliases = aliases
        self._shadow = shadow
        self._best_of = best_of
        self._default_split: Split = default_split
        self._record_policy = record_policy

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat", "openai")

    async def completion(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completion", "openai")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat", "responses")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat", "anthropic")

    async def _stored_call(self, call_id: str) -> JsonObject | None:
        """A recorded call's row, once this proxy's own records before it are in the store."""
        await self._read_your_writes()
        return await self._store.call_row(call_id)

    async def stored_response(self, request: web.Request) -> web.Response:
        """`GET /v1/responses/{id}`: a stored response, rendered again from its call's record."""
        response_id = request.match_info["response"]
        call_id = responses.call_id_of(response_id)
        row = await self._stored_call(call_id) if call_id else None
        if row is None or not responses.retrievable(row):
            raise NotFound(f"no response with id {response_id!r}", param="response_id")
        created = row["created_at"].timestamp()
        body = responses_answer.response_object(
            call_id or "", row["client_request"], row["response"], created
        )
        return _json(body)

    async def models(self, request: web.Request) -> web.Response:
        upstream = self._upstreams.urls[0]
        response = await self._upstreams.get(upstream, "/models", _client_auth(request))
        raw = await read_body(upstream, response)
        if response.status == 200 and self._aliases.records:
            raw = _with_aliases(raw, self._aliases.records)
        return web.Response(body=raw, status=response.status, content_type="application/json")

    async def count_tokens(self, request: web.Request) -> web.Response:
        """Anthropic's `POST /v1/messages/count_tokens`: the body's prompt, translated as
        `/v1/messages` translates it, counted by the upstream (`_counted`)."""
        loaded = await _loaded_body(request)
        model = self._aliases.resolve(anthropic.model_of(loaded))
        prompt = {"model": model, **anthropic.prompt_of(loaded)}
        counted = await self._counted(request, prompt, anthropic.failed_answer)
        return counted if isinstance(counted, web.Response) else _json({"input_tokens": counted})

    async def input_tokens(self, request: web.Request) -> web.Response:
        """OpenAI's `POST /v1/responses/input_tokens`: the body's prompt, translated as
        `/v1/responses` translates it (instructions, tools and a `previous_response_id`'s
        conversation included), counted by the upstream (`_counted`)."""
        chat = (await responses.translate(await _loaded_body(request), self._stored_call)).chat
        prompt: JsonObject = {"model": self._aliases.resolve(chat["model"])}
        prompt |= {key: chat[key] for key in ("messages", "tools") if key in chat}
        counted = await self._counted(request, prompt)
        if isinstance(counted, web.Response):
            return counted
        return _json({"object": "response.input_tokens", "input_tokens": counted})

    async def _prompt_ids(
        self, request: web.Request, upstream: str, body: JsonObject
    ) -> list[int] | None:
        """The ids a chat body's prompt renders to, by the upstream's `/tokenize` (None when it
        cannot tell: a guided call is then recorded untrainable, guidance.py)."""
        prompt: JsonObject = {k: body[k] for k in ("model", "messages", "tools") if k in body}
        root = upstream.removesuffix("/v1")
        try:
            response = await self._upstreams.post(root, "/tokenize", prompt, _client_auth(request))
            answer = orjson.loads(await read_body(root, response))
        except (ArtProxyError, orjson.JSONDecodeError) as exc:
            log.warning("the prompt of a guided call could not be tokenized: %s", exc)
            return None
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if response.status != 200 or not isinstance(tokens, list):
            log.warning("the prompt of a guided call could not be tokenized: %s", answer)
            return None
        return [int(token) for token in tokens]

    async def _counted(
        self,
        request: web.Request,
        prompt: JsonObject,
        failed: Callable[[bytes, int], bytes] | None = None,
    ) -> int | web.Response:
        """The tokens of a chat prompt (`model`, `messages`, `tools`) by the upstream's tokenizer:
        vLLM's `/tokenize` (at the server's root) renders it as a chat call's prompt. Else the
        upstream's failure, its body rendered by `failed` (None: as sent, OpenAI-shaped).
        Nothing is recorded: nothing was generated."""
        upstream = self._upstreams.urls[0]
        root = upstream.removesuffix("/v1")
        response = await self._upstreams.post(root, "/tokenize", prompt, _client_auth(request))
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

    async def _generate(
        self, request: web.Request, kind: CallKind, dialect: Dialect
    ) -> web.StreamResponse:
        recorded = records_call(self._record_policy, request.headers)
        raw = await _read_body(request)
        translated = (
            raw if isinstance(raw, Rejection) else await self._translate(raw, kind, dialect)
        )
        if not recorded:
            if isinstance(translated, Rejection):
                raise translated.error
            unrecorded = self._tracker.unrecorded(self._default_split)
            return await self._forward(
                request, self._call(request, kind, dialect, translated, unrecorded, recorded=False)
            )
        if not isinstance(translated, Rejection):
            try:
                explicit = replace(
                    explicit_attribution(request.match_info, request.headers, self._default_split),
                    subject=subject_of(request.headers, translated.client or translated.body),
                )
                asked = asked_candidates(request.headers)
                guidance = guidance_of(request.headers) if kind == "chat" else None
            except BadRequest as exc:
                translated = Rejection(
                    exc,
                    translated.client or translated.body,
                    messages_valid=kind == "chat" and dialect == "openai",
                )
        if isinstance(translated, Rejection):
            await self._reject(request, kind, dialect, translated)
            raise translated.error
        body = translated.body
        messages = body.get("messages") if kind == "chat" else None
        assignment = await self._tracker.assign(explicit, messages, continues=translated.continues)
        call = self._call(request, kind, dialect, translated, assignment, recorded=True)
        call.guidance = guidance
        try:
            candidates = self._best_of.candidates(call, asked)
        except BadRequest as exc:  # a call best-of-N cannot answer: refused, in its trajectory
            log.warning("%s %s refused: %s", request.method, request.path, exc.message)
            with contextlib.suppress(StoreUnavailable):  # the client's mistake is the answer
                await self._recorder.record(
                    call, Outcome("rejected", exc.status, error=exc.message)
                )
            raise
        if candidates:
            return await self._answer_best_of(request, call, candidates)
        return await self._forward(request, call)

    def _call(
        self,
        request: web.Request,
        kind: CallKind,
        dialect: Dialect,
        translated: Translated,
        assignment: Assignment,
        *,
        recorded: bool,
    ) -> CallInProgress:
        """The call to forward, its model resolved through the aliases; `recorded=False`: to
        answer with nothing kept (no trajectory, no record)."""
        body = translated.body
        model = body.get("model")
        return CallInProgress(
            kind,
            body,
            assignment,
            stream=bool(body.get("stream")),
            model=self._served_model(model, assignment) if isinstance(model, str) else None,
            dialect=dialect,
            client_body=translated.client,
            route=request.path,
            recorded=recorded,
            trace={
                name: request.headers[name] for name in TRACE_HEADERS if name in request.headers
            },
        )

    def _served_model(self, model: str, assignment: Assignment) -> str:
        """What serves a call to `model`: an alias's target, or the adapter the trajectory's
        lease holds (leases.py); `ALIAS@0`, the base model under the alias (no lease: it is
        always served)."""
        aliases = self._aliases
        if not aliases.is_alias(model):
            return aliases.resolve(model)
        return self._tracker.lease(assignment, model, aliases.resolve(model), aliases.is_served)

    async def _forward(self, request: web.Request, call: CallInProgress) -> web.StreamResponse:
        """Send `call` upstream and answer the client, recording it as it says."""
        kind = call.kind
        upstream = call.assignment.upstream
        token_ids = self._upstreams.returns_token_ids(upstream)
        sent, asks = call.upstream_body(token_ids=token_ids)
        call.asks = asks
        rendering = _rendering(call)
        if call.unguided_messages is not None:
            unguided = {**sent, "messages": call.unguided_messages}
            call.unguided_prompt_ids = await self._prompt_ids(request, upstream, unguided)
        try:
            response = await self._upstreams.post(
                upstream, PATHS[kind], sent, _client_auth(request)
            )
            if response.status == 400 and token_ids:
                raw = await read_body(upstream, response)
                if b"return_token_ids" not in raw:
                    return await self._answer(
                        request, call, response.status, response.content_type, raw, rendering
                    )
                # A hosted API rejects vLLM's field: learn that, ask again, record text only.
                # Said once: calls in flight together all learn it.
                if self._upstreams.returns_token_ids(upstream):
                    log.warning(
                        "upstream %s returns no token ids: its calls are not trainable", upstream
                    )
                self._upstreams.mark_without_token_ids(upstream)
                sent, asks = call.upstream_body(token_ids=False)
                call.asks = asks
                rendering = _rendering(call)
                response = await self._upstreams.post(
                    upstream, PATHS[kind], sent, _client_auth(request)
                )
            if response.status >= 400 or not call.stream:
                raw = await read_body(upstream, response)
                return await self._answer(
                    request, call, response.status, response.content_type, raw, rendering
                )
        except ArtProxyError as exc:
            await self._failed(request, call, exc)
            raise
        return await relay_stream(request, call, response, rendering, self._recorder, self._shadow)

    async def _answer_best_of(
        self, request: web.Request, call: CallInProgress, n: int
    ) -> web.StreamResponse:
        """Sample `n` candidates in one upstream call, answer with the best (best_of.py)."""
        upstream = call.assignment.upstream
        sent, call.asks = call.upstream_body(token_ids=self._upstreams.returns_token_ids(upstream))
        rendering = _rendering(call)
        try:
            response = await self._upstreams.post(
                upstream, PATHS["chat"], BestOf.upstream_body(sent, n), _client_auth(request)
            )
            raw = await read_body(upstream, response)
            outcome = Outcome.of_answer(upstream, response.status, raw, "chat")
            if outcome.response is None:  # the upstream's refusal, answered as it is
                return await self._answer(
                    request, call, response.status, response.content_type, raw, rendering
                )
            chosen = await self._best_of.choose(call, outcome.response, n)
        except ArtProxyError as exc:
            await self._failed(request, call, exc)
            raise
        await self._recorder.record(
            call, Outcome("ok", 200, response=chosen, untrainable=BEST_OF_ANSWER)
        )
        if not call.stream:
            return _json(rendering.whole(chosen))
        return await answer_as_stream(request, call, chosen, rendering)

    async def _failed(self, request: web.Request, call: CallInProgress, exc: ArtProxyError) -> None:
        """Log and record a call the upstream or the proxy failed (a store that is down has
        nothing to record it in: the error says so)."""
        log.warning("%s %s: %s", request.method, request.path, exc.message)
        if not isinstance(exc, StoreUnavailable):
            await self._recorder.record(call, Outcome("failed", exc.status, error=exc.message))

    async def _translate(
        self, raw: bytes, kind: CallKind, dialect: Dialect
    ) -> Translated | Rejection:
        """The body to send upstream, from the client's in its dialect."""
        if dialect == "openai":
            parsed = parse_body(raw, kind)
            return parsed if isinstance(parsed, Rejection) else Translated(parsed)
        loaded = load_body(raw)
        if isinstance(loaded, Rejection):
            return loaded
        try:
            if dialect == "responses":
                done = await responses.translate(loaded, self._stored_call)
                chat, continues = done.chat, done.continues
            else:
                chat, continues = anthropic.translate(loaded), None
        except BadRequest as exc:
            return Rejection(exc, loaded, messages_valid=False)
        checked = check_body(chat, "chat")
        if isinstance(checked, Rejection):  # what the client sent inside the items, e.g. a role
            return Rejection(checked.error, loaded, messages_valid=False)
        return Translated(chat, client=loaded, continues=continues)

    async def _reject(
        self, request: web.Request, kind: CallKind, dialect: Dialect, rejection: Rejection
    ) -> None:
        """Record a request the proxy refused, in the trajectory it would have joined where the
        refusal leaves that knowable (valid attribution headers, valid messages)."""
        log.warning("%s %s refused: %s", request.method, request.path, rejection.error.message)
        try:
            explicit = explicit_attribution(
                request.match_info, request.headers, self._default_split
            )
        except BadRequest:
            explicit = explicit_attribution({}, {}, self._default_split)
        body = rejection.body
        with contextlib.suppress(BadRequest):  # the refused call is erasable with its user's
            explicit = replace(explicit, subject=subject_of(request.headers, body))
        messages = body.get("messages") if body is not None and rejection.messages_valid else None
        assignment = await self._tracker.assign(explicit, messages)
        stored = body if body is not None else {"unreadable_body": rejection.error.message}
        call = CallInProgress(
            kind,
            stored,
            assignment,
            stream=False,
            dialect=dialect,
            client_body=body if dialect != "openai" else None,
            route=request.path,
        )
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
        rendering: Rendering,
    ) -> web.Response:
        """Answer with a whole (non-stream or error) upstream body."""
        outcome = Outcome.of_answer(call.assignment.upstream, status, raw, call.kind)
        await self._recorder.record(call, outcome)
        if outcome.response is None:
            log.warning("%s %s: upstream answered %d", request.method, request.path, status)
            return web.Response(
                body=rendering.failed_answer(raw, status), status=status, content_type=content_type
            )
        answer = _json(rendering.whole(outcome.response))
        await self._shadow.after_answer(request, answer, call, outcome)
        return answer


@dataclass(frozen=True)
class Translated:
    """A request ready to go upstream: its chat (or legacy completions) body, and for another
    dialect the client's own body and the trajectory a `previous_response_id` names."""

    body: JsonObject
    client: JsonObject | None = None
    continues: str | None = None


def _rendering(call: CallInProgress) -> Rendering:
    if call.dialect == "responses":
        return responses_answer.ResponsesRendering(call.id, call.client_body or {})
    if call.dialect == "anthropic":
        return anthropic.AnthropicRendering(call.id, call.client_body or {})
    return ChatRendering(call.asks)


def _json(body: JsonObject) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _loaded_body(request: web.Request) -> JsonObject:
    """A body that is only read (a count): its JSON object, or `BadRequest`."""
    raw = await _read_body(request)
    loaded = raw if isinstance(raw, Rejection) else load_body(raw)
    if isinstance(loaded, Rejection):
        raise loaded.error
    return loaded


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


def _client_auth(request: web.Request) -> str | None:
    """The client's key, for the upstream: Anthropic's SDKs send it as `x-api-key`."""
    authorization = request.headers.get("Authorization")
    if authorization is None and "x-api-key" in request.headers:
        return f"Bearer {request.headers['x-api-key']}"
    return authorization
