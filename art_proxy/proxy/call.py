"""A call on its way through the proxy: what the relay's stages hand each other, from its arrival
until it is recorded (`CallInProgress`), and how it ended (`Outcome`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime

import orjson

from art_proxy.errors import UpstreamError
from art_proxy.ids import new_id
from art_proxy.records import CallKind, CallStatus, Dialect, JsonObject
from art_proxy.store.trajectory_store import utcnow

from .capture import ClientAsks, response_problem, upstream_body
from .guidance import guided_messages
from .tracker import Assignment


@dataclass
class CallInProgress:
    """What the proxy knows about a call from its arrival until it is recorded."""

    kind: CallKind
    body: JsonObject  # what goes upstream: the client's body, or its chat translation
    assignment: Assignment
    stream: bool
    model: str | None = None  # the served model: an alias's target, else the client's `model`
    asks: ClientAsks = field(default_factory=lambda: ClientAsks(False, False, False))
    dialect: Dialect = "openai"
    client_body: JsonObject | None = None  # the body in the client's dialect, if not openai
    route: str = ""  # the path the client called, for the log
    recorded: bool = True  # False: forwarded and answered, nothing kept (privacy/consent.py)
    guidance: str | None = None  # added to the prompt upstream, not trained on (guidance.py)
    unguided_messages: list[JsonObject] | None = None  # what went upstream, without it
    unguided_prompt_ids: list[int] | None = None  # their ids, by the upstream's /tokenize
    trace: dict[str, str] = field(default_factory=dict)  # the client's traceparent (tracing.py)
    id: str = field(default_factory=new_id)
    created_at: datetime = field(default_factory=utcnow)
    started: float = field(default_factory=time.perf_counter)
    first_chunk_at: float | None = None  # a stream's first chunk from the upstream (perf_counter)

    def upstream_body(self, *, token_ids: bool) -> tuple[JsonObject, ClientAsks]:
        """The body to send upstream (capture's asks added) and what the client itself asked."""
        sent, asks = upstream_body(self.body, self.kind, token_ids=token_ids)
        if self.model is not None and self.model != self.body["model"]:
            sent["model"] = self.model  # an alias: the upstream serves its target
        if self.assignment.restored:
            # The agent echoed replies in another form: the upstream gets them as the model
            # wrote them (the record keeps the agent's body), so this call's prompt extends the
            # tokens the trajectory sampled and stitches into one sequence.
            sent["messages"] = list(sent["messages"])
            for position, message in self.assignment.restored:
                sent["messages"][position] = message
        if self.guidance is not None:
            self.unguided_messages = sent["messages"]
            sent["messages"] = guided_messages(sent["messages"], self.guidance)
        return sent, asks


@dataclass(frozen=True)
class Outcome:
    status: CallStatus
    http_status: int
    response: JsonObject | None = None
    error: str | None = None
    # Why the proxy itself will not have the answer trained on, whatever its tokens (None: no
    # reason of its own), e.g. a best-of answer, which its candidate group trains.
    untrainable: str | None = None

    @classmethod
    def of_answer(cls, upstream: str, status: int, raw: bytes, kind: CallKind) -> Outcome:
        """The outcome of a whole (non-stream or error) upstream answer; `UpstreamError` when a
        2xx body is not a response the proxy can record (an error body sent as 200 included)."""
        if status >= 400:
            return cls("upstream_error", status, error=raw.decode("utf-8", "replace")[:2000])
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise UpstreamError(f"upstream {upstream} sent invalid JSON") from exc
        if not isinstance(parsed, dict):
            raise UpstreamError(f"upstream {upstream} sent a non-object body")
        if "error" in parsed and "choices" not in parsed:
            message = str(parsed["error"])[:2000]
            raise UpstreamError(f"upstream {upstream} answered {status} with an error: {message}")
        problem = response_problem(parsed, kind)
        if problem is not None:
            raise UpstreamError(f"upstream {upstream} sent a malformed response: {problem}")
        return cls("ok", status, response=parsed)
