"""Shadow sampling: learn online from production calls by sampling them again, off the user's path.

A prod call that opens a conversation and is answered without tool calls is, with probability
`fraction`, sent upstream `samples` more times once the user has the whole response (the body is
written and ended first, so the user's latency does not change). Each extra sample is the user's
body, non-stream, to the same upstream and served model, recorded by the same `Recorder` as its
own one-call trajectory in the served call's group and scenario (tracker.shadow_of): a group RULER
can rank with no change to the agent. Tool-calling answers are left alone because a sample that
calls a tool would need the agent to run it.

The work runs in background tasks, at most `max_in_flight` shadowed calls at once; a call drawn
beyond that is skipped and counted, never queued. A failed sample is recorded like any failed
call and never reaches the user. At shutdown running samples are cancelled and not recorded: a
sample cut by the proxy says nothing about the policy, and its trajectory exists only with its call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

import aiohttp
from aiohttp import web

from art_proxy.errors import ArtProxyError, StoreUnavailable
from art_proxy.records import JsonObject

from .attribution import reply_messages
from .call import CallInProgress, Outcome
from .recording import Recorder
from .tracker import TrajectoryTracker
from .upstream import PATHS, Upstreams, read_body

log = logging.getLogger(__name__)

# Roles that mean a conversation is under way: only its opening call is shadowed, since a
# sample of a later turn could not be continued the way the agent continued the served one.
_TURN_ROLES = frozenset({"assistant", "tool", "function"})


class ShadowSampler:
    def __init__(
        self,
        upstreams: Upstreams,
        tracker: TrajectoryTracker,
        recorder: Recorder,
        *,
        fraction: float,
        samples: int,
        max_in_flight: int,
    ) -> None:
        self._upstreams = upstreams
        self._tracker = tracker
        self._recorder = recorder
        self._counters = recorder.counters
        self._fraction = fraction
        self._samples = samples
        self._max_in_flight = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()

    async def after_answer(
        self,
        request: web.Request,
        answer: web.StreamResponse,
        call: CallInProgress,
        outcome: Outcome,
    ) -> None:
        """Shadow `call` if it qualifies and wins the draw, once `answer` has wholly been sent."""
        if not self._wanted(call, outcome):
            return
        # A client that left after the last byte still got its answer: the samples go ahead.
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientConnectionResetError):
            await answer.prepare(request)  # a stream is prepared already: then a no-op
            await answer.write_eof()  # aiohttp's own write_eof after the handler is a no-op
        if len(self._tasks) >= self._max_in_flight:
            self._counters.shadow_skipped += 1
            return
        self._counters.shadow_calls += 1
        # Held only in memory, for these requests: the key goes upstream as the user's did.
        authorization = request.headers.get("Authorization")
        task = asyncio.create_task(
            self._sample_all(call, authorization), name=f"shadow-{call.assignment.trajectory_id}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        """Cancel the samples still running (they are not recorded) and wait for them to stop."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if tasks:
            log.info("stopped %d shadowed calls whose samples were running", len(tasks))

    def _wanted(self, call: CallInProgress, outcome: Outcome) -> bool:
        if not self._fraction or not call.recorded or call.kind != "chat":
            return False
        if call.assignment.split != "prod":
            return False
        if call.assignment.seq != 0 or outcome.status != "ok" or outcome.http_status != 200:
            return False
        messages = call.body.get("messages") or []
        if any(message.get("role") in _TURN_ROLES for message in messages):
            return False
        if outcome.response is None or any(
            reply.get("tool_calls") for reply in reply_messages(outcome.response)
        ):
            return False
        # random() is in [0, 1): a fraction of 1 shadows every qualifying call, 0 none.
        return random.random() < self._fraction

    async def _sample_all(self, served: CallInProgress, authorization: str | None) -> None:
        body = {key: value for key, value in served.body.items() if key != "stream_options"}
        body["stream"] = False
        await asyncio.gather(
            *(self._sample(served, body, authorization) for _ in range(self._samples))
        )

    async def _sample(
        self, served: CallInProgress, body: JsonObject, authorization: str | None
    ) -> None:
        try:
            call = CallInProgress(
                "chat",
                body,
                self._tracker.shadow_of(served.assignment),
                stream=False,
                model=served.model,
            )
            upstream = call.assignment.upstream
            sent, call.asks = call.upstream_body(
                token_ids=self._upstreams.returns_token_ids(upstream)
            )
            try:
                response = await self._upstreams.post(upstream, PATHS["chat"], sent, authorization)
                raw = await read_body(upstream, response)
                outcome = Outcome.of_answer(upstream, response.status, raw, "chat")
            except ArtProxyError as exc:
                outcome = Outcome("failed", exc.status, error=exc.message)
            with contextlib.suppress(StoreUnavailable):  # the recorder counted and logged it
                await self._recorder.record(call, outcome)
            self._counters.shadow_samples += 1
        except Exception:
            # A background task has nobody to raise to: a bug here must not pass silently.
            log.exception("shadow sample of trajectory %s failed", served.assignment.trajectory_id)
