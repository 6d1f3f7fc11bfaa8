"""The hot path: a generation call, from the client's body to its answer, as one script of stages.

`_generate` and `_forward` read top to bottom, each stage in a module of its own that takes what it
needs and hands its result on: translate the dialect (translation.py, dialects/), attribute the
call to a trajectory (attribution.py, tracker.py; whose it is and whether it is recorded:
privacy/subjects.py, privacy/consent.py), forward it (forwarding.py, upstream.py), capture its
tokens and record it (call.py, capture.py, recording.py; a stream's chunk by chunk in
stream_relay.py), answer in the client's dialect (answering.py). Non-stream: the upstream body is
parsed once, recorded whole, and the client gets it back cut to what it asked for. Stream: every
chunk is written to the client as it arrives, and `[DONE]` waits for the record. Upstream 4xx/5xx
answers pass through unchanged. A `model` that names an alias goes upstream as the alias's target
(aliases.py), and the answer names the served model, as OpenAI's does. Once an answer is wholly
sent, the shadow sampler may sample the call again (shadow.py).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace

from aiohttp import web

from art_proxy.config import RecordPolicy
from art_proxy.errors import ArtProxyError, BadRequest, StoreUnavailable
from art_proxy.privacy.consent import records_call
from art_proxy.privacy.subjects import subject_of
from art_proxy.records import CallKind, Dialect, Split

from .aliases import Aliases
from .answering import answer_whole, json_answer, rendering_of
from .attribution import explicit_attribution
from .best_of import BEST_OF_ANSWER, BestOf, asked_candidates
from .call import CallInProgress, Outcome
from .forwarding import forward
from .guidance import guidance_of
from .recording import Recorder
from .request_body import Rejection
from .shadow import ShadowSampler
from .stream_relay import answer_as_stream, relay_stream
from .tracing import TRACE_HEADERS
from .tracker import Assignment, TrajectoryTracker
from .translation import StoredCall, Translated, read_body, subject_of_call, translate
from .upstream import PATHS, Upstreams, client_auth
from .upstream import read_body as read_upstream_body

log = logging.getLogger(__name__)


class Relay:
    def __init__(
        self,
        upstreams: Upstreams,
        tracker: TrajectoryTracker,
        recorder: Recorder,
        aliases: Aliases,
        shadow: ShadowSampler,
        best_of: BestOf,
        *,
        stored_call: StoredCall,
        default_split: Split = "train",
        record_policy: RecordPolicy = RecordPolicy.all,
    ) -> None:
        self._upstreams = upstreams
        self._tracker = tracker
        self._recorder = recorder
        self._aliases = aliases
        self._shadow = shadow
        self._best_of = best_of
        self._stored_call = stored_call
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

    async def _generate(
        self, request: web.Request, kind: CallKind, dialect: Dialect
    ) -> web.StreamResponse:
        # 1. translate the dialect
        recorded = records_call(self._record_policy, request.headers)
        raw = await read_body(request)
        translated = (
            raw
            if isinstance(raw, Rejection)
            else await translate(raw, kind, dialect, self._stored_call, request.headers)
        )
        if not recorded:
            if isinstance(translated, Rejection):
                raise translated.error
            if translated.owner is not None:  # kept out, still not another's to continue
                subject_of_call(translated, request.headers)
            unrecorded = self._tracker.unrecorded(self._default_split)
            return await self._forward(
                request, self._call(request, kind, dialect, translated, unrecorded, recorded=False)
            )
        # 2. attribute it to a trajectory
        if not isinstance(translated, Rejection):
            try:
                explicit = replace(
                    explicit_attribution(request.match_info, request.headers, self._default_split),
                    subject=subject_of_call(translated, request.headers),
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
        # 3-6. forward, capture, record, answer
        return await self._forward(request, call)

    async def _forward(self, request: web.Request, call: CallInProgress) -> web.StreamResponse:
        """Send `call` upstream, then capture, record and answer what came back."""
        try:
            forwarded = await forward(self._upstreams, call, client_auth(request))
            if forwarded.raw is not None:
                response = forwarded.response
                return await answer_whole(
                    request,
                    call,
                    response.status,
                    response.content_type,
                    forwarded.raw,
                    self._recorder,
                    self._shadow,
                )
        except ArtProxyError as exc:
            await self._failed(request, call, exc)
            raise
        rendering = rendering_of(call)
        return await relay_stream(
            request, call, forwarded.response, rendering, self._recorder, self._shadow
        )

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
        target = aliases.resolve(model, assignment.trajectory_id)  # its canary's arm, if any
        return self._tracker.lease(assignment, model, target, aliases.is_served)

    async def _answer_best_of(
        self, request: web.Request, call: CallInProgress, n: int
    ) -> web.StreamResponse:
        """Sample `n` candidates in one upstream call, answer with the best (best_of.py)."""
        upstream = call.assignment.upstream
        sent, call.asks = call.upstream_body(token_ids=self._upstreams.returns_token_ids(upstream))
        try:
            response = await self._upstreams.post(
                upstream, PATHS["chat"], BestOf.upstream_body(sent, n), client_auth(request)
            )
            raw = await read_upstream_body(upstream, response)
            outcome = Outcome.of_answer(upstream, response.status, raw, "chat")
            if outcome.response is None:  # the upstream's refusal, answered as it is
                return await answer_whole(
                    request,
                    call,
                    response.status,
                    response.content_type,
                    raw,
                    self._recorder,
                    self._shadow,
                )
            chosen = await self._best_of.choose(call, outcome.response, n)
        except ArtProxyError as exc:
            await self._failed(request, call, exc)
            raise
        await self._recorder.record(
            call, Outcome("ok", 200, response=chosen, untrainable=BEST_OF_ANSWER)
        )
        rendering = rendering_of(call)
        if not call.stream:
            return json_answer(rendering.whole(chosen))
        return await answer_as_stream(request, call, chosen, rendering)

    async def _failed(self, request: web.Request, call: CallInProgress, exc: ArtProxyError) -> None:
        """Log and record a call the upstream or the proxy failed (a store that is down has
        nothing to record it in: the error says so)."""
        log.warning("%s %s: %s", request.method, request.path, exc.message)
        if not isinstance(exc, StoreUnavailable):
            await self._recorder.record(call, Outcome("failed", exc.status, error=exc.message))

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
        # The refused call is erasable with its user's, whatever else of the request is wrong.
        explicit = replace(explicit, subject=subject_of(request.headers, body, refused=True))
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
