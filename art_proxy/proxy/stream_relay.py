"""The stream half of the relay: chunks to the client as they come, the call's record rebuilt beside.

Every chunk is checked, added to the record being rebuilt (stream_rebuild.py) and written to the
client as it asked for it; `[DONE]` is held back until the record is saved (recording.py), so a
client that saw the end of a stream finds it in the store. A client that leaves mid-stream closes
the upstream response (vLLM then aborts the request) and leaves an `aborted` record of what was
generated; a stream that breaks off or sends what the proxy cannot read ends with an error event,
then `[DONE]`.
"""

from __future__ import annotations

import contextlib
import logging
import time

import aiohttp
import orjson
from aiohttp import web

from art_proxy.errors import StoreUnavailable, UpstreamError
from art_proxy.records import CallStatus, JsonObject

from .best_of import stream_chunks
from .call import CallInProgress, Outcome
from .capture import chunk_problem
from .dialects import Rendering
from .recording import Recorder
from .shadow import ShadowSampler
from .stream_rebuild import StreamRecorder

log = logging.getLogger(__name__)


async def relay_stream(
    request: web.Request,
    call: CallInProgress,
    response: aiohttp.ClientResponse,
    rendering: Rendering,
    recorder: Recorder,
    shadow: ShadowSampler,
) -> web.StreamResponse:
    """Relay an upstream stream to the client, record it, then end it (see the module's doc)."""
    client = await _event_stream(request)
    rebuilt = StreamRecorder(call.kind)
    outcome_status: CallStatus = "ok"
    error: str | None = None
    try:
        outcome_status, error = await _pump(client, response, rebuilt, rendering, call)
    finally:
        response.close()  # an aborted client closes the upstream request too
    if rebuilt.error is not None and outcome_status == "ok":
        outcome_status, error = "upstream_error", str(rebuilt.error.get("message"))
    outcome = Outcome(outcome_status, 200, response=rebuilt.response(), error=error)
    try:
        await recorder.record(call, outcome)
    except StoreUnavailable as exc:
        if outcome_status != "aborted":
            await _write_quietly(client, rendering.stream_error(exc))
            await _write_quietly(client, rendering.end(None))
        return client
    if outcome_status != "aborted":
        finished = outcome.response if outcome_status == "ok" else None
        await _write_quietly(client, rendering.end(finished))
        await shadow.after_answer(request, client, call, outcome)
    return client


async def _pump(
    client: web.StreamResponse,
    response: aiohttp.ClientResponse,
    rebuilt: StreamRecorder,
    rendering: Rendering,
    call: CallInProgress,
) -> tuple[CallStatus, str | None]:
    """Relay chunks until `[DONE]`; returns the call's status and error. A stream that breaks
    off or sends what the proxy cannot read ends with an error event (then `[DONE]`).

    The events of each read from the upstream go to the client in one write: under load a
    read holds many, and a write per event cost more than everything else the relay does
    with it (measured: 64 streams of 256 chunks)."""
    pending = b""
    try:
        async for data in response.content.iter_any():
            if call.first_chunk_at is None:
                call.first_chunk_at = time.perf_counter()
            lines = (pending + data).split(b"\n")
            pending = lines.pop()  # an incomplete line waits for the next read
            out: list[bytes] = []
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return _ABORTED if await _flush(client, out) else ("ok", None)
                chunk = orjson.loads(payload)
                problem = chunk_problem(chunk, rebuilt.kind)
                if problem is not None:
                    error = UpstreamError(f"upstream sent a malformed stream chunk: {problem}")
                    if await _flush(client, out):
                        return _ABORTED
                    return await _stream_failed(client, rendering, error)
                rebuilt.add(chunk)
                rendered = rendering.chunk(chunk, payload)
                if rendered:
                    out.append(rendered)
            if await _flush(client, out):
                return _ABORTED
        error = UpstreamError("upstream stream ended without [DONE]")
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as exc:
        error = UpstreamError(f"upstream stream broke off: {type(exc).__name__}: {exc}")
    return await _stream_failed(client, rendering, error)


async def _stream_failed(
    client: web.StreamResponse, rendering: Rendering, error: UpstreamError
) -> tuple[CallStatus, str | None]:
    log.warning("a stream failed: %s", error.message)
    await _write_quietly(client, rendering.stream_error(error))
    return "failed", error.message


_ABORTED: tuple[CallStatus, str] = ("aborted", "the client closed the connection mid-stream")


async def _flush(client: web.StreamResponse, out: list[bytes]) -> bool:
    """Write the rendered events; True if the client has left."""
    if out:
        try:
            await client.write(b"".join(out))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return True
    return False


async def _write_quietly(client: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
        await client.write(data)


async def answer_as_stream(
    request: web.Request, call: CallInProgress, response: JsonObject, rendering: Rendering
) -> web.StreamResponse:
    """Stream a whole answer, recorded already, as vLLM would have streamed it (best_of.py: the
    chosen candidate, once the choice is made)."""
    client = await _event_stream(request)
    options = call.body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    events = [
        rendering.chunk(chunk, orjson.dumps(chunk))
        for chunk in stream_chunks(response, include_usage)
    ]
    if not await _flush(client, [event for event in events if event]):
        await _write_quietly(client, rendering.end(response))
    return client


async def _event_stream(request: web.Request) -> web.StreamResponse:
    """The client's server-sent-events response, its headers sent."""
    client = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await client.prepare(request)
    return client
