"""A call's last stage: the answer in the client's dialect (chat as it is, or a Responses
`response`, or an Anthropic `message`), whole; a stream's is written chunk by chunk by
stream_relay.py with the same renderings."""

from __future__ import annotations

import logging

import orjson
from aiohttp import web

from art_proxy.records import JsonObject

from .call import CallInProgress, Outcome
from .dialects import Rendering, anthropic, responses_answer
from .dialects.openai import ChatRendering
from .recording import Recorder
from .shadow import ShadowSampler

log = logging.getLogger(__name__)


def rendering_of(call: CallInProgress) -> Rendering:
    """How `call`'s answer is written back in the dialect the client spoke."""
    if call.dialect == "responses":
        return responses_answer.ResponsesRendering(call.id, call.client_body or {})
    if call.dialect == "anthropic":
        return anthropic.AnthropicRendering(call.id, call.client_body or {})
    return ChatRendering(call.asks)


def json_answer(body: JsonObject) -> web.Response:
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def answer_whole(
    request: web.Request,
    call: CallInProgress,
    status: int,
    content_type: str,
    raw: bytes,
    recorder: Recorder,
    shadow: ShadowSampler,
) -> web.Response:
    """Capture a whole (non-stream or error) upstream answer, record it, and answer with it;
    once it is sent, the shadow sampler may sample the call again."""
    rendering = rendering_of(call)
    outcome = Outcome.of_answer(call.assignment.upstream, status, raw, call.kind)
    await recorder.record(call, outcome)
    if outcome.response is None:
        log.warning("%s %s: upstream answered %d", request.method, request.path, status)
        return web.Response(
            body=rendering.failed_answer(raw, status), status=status, content_type=content_type
        )
    answer = json_answer(rendering.whole(outcome.response))
    await shadow.after_answer(request, answer, call, outcome)
    return answer
