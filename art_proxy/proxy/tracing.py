"""OpenTelemetry: a span for every recorded call, for the backend a team already reads (Langfuse,
Phoenix, Jaeger, Tempo).

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, when the
spans go there by OTLP over HTTP, batched off the request path; the SDK's other `OTEL_*`
variables (headers, service name, sampler) apply as usual. Each span follows the GenAI semantic
conventions for a model call (operation, request and response model, sampling, token usage,
finish reasons, the upstream as the server) and carries the call's trajectory, group, scenario and
attribution, so a trace backend can be joined with the store. Message content is never put on a
span: prompts and replies stay in the store, behind its keys; nor is other text a client wrote
(stop sequences, a model name no upstream lists and no alias names: `other`).

A call that carries a W3C `traceparent` (the Agents SDK's, LangGraph's, any instrumented client's)
gets its span in that trace, under the client's span, and is forwarded upstream with it (and its
`tracestate`), so vLLM's own spans join the same trace; every later call of a trajectory links
to its first call's span, so a backend shows an episode's calls together.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from art_proxy.records import JsonObject

from .tracker import Assignment

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# The headers of W3C Trace Context a client's trace arrives in.
TRACE_HEADERS = ("traceparent", "tracestate")
_PROPAGATOR = TraceContextTextMapPropagator()
# First spans of trajectories kept for their later calls to link to (as many as the open
# trajectories a proxy keeps in memory).
_FIRST_SPANS_KEPT = 20_000
# The call's kind -> the GenAI convention's operation.
_OPERATIONS = {"chat": "chat", "completion": "text_completion"}
# Sampling fields the client set -> their GenAI request attributes.
_SAMPLING = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens",
    "max_completion_tokens": "gen_ai.request.max_tokens",
    "seed": "gen_ai.request.seed",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
}
# Stop sequences are left off: the client's own text (a key, an address) would reach the
# collector. So would a model name it made up, which a span names as `Aliases.label` does.


class CallSpans:
    """Emits one finished span per recorded call."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("art_proxy")
        self._first: OrderedDict[str, SpanContext] = OrderedDict()  # trajectory -> its first

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> CallSpans | None:
        """Spans exported by OTLP where the environment names a collector; None otherwise."""
        if not any(environ.get(name) for name in ENDPOINT_VARIABLES):
            return None
        resource = Resource.create({SERVICE_NAME: environ.get("OTEL_SERVICE_NAME", "art-proxy")})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider)

    def emit(
        self,
        row: Mapping[str, Any],
        assignment: Assignment,
        started: datetime,
        ended: datetime,
        trace: Mapping[str, str] | None = None,
        label: Callable[[str], str] = lambda model: model,
    ) -> None:
        """The span of one call record (`recording.CallRow`), from its arrival to its answer;
        `trace`: the client's Trace Context headers, whose span is its parent; `label`: a model
        name as the span says it (`Aliases.label`)."""
        operation = _OPERATIONS.get(row["kind"], row["kind"])
        request: JsonObject = row["request"]
        requested = request.get("model")
        if isinstance(requested, str):
            requested = label(requested)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "openai",  # the upstream's API: vLLM's OpenAI-compatible one
            "art_proxy.call.id": row["id"],
            "art_proxy.call.seq": row["seq"],
            "art_proxy.trajectory.id": assignment.trajectory_id,
            "art_proxy.group.id": assignment.group_id,
            "art_proxy.scenario.id": assignment.scenario_id,
            "art_proxy.split": assignment.split,
            "art_proxy.attribution": assignment.attribution,
            "art_proxy.dialect": row["dialect"],
            "art_proxy.stream": row["stream"],
            "art_proxy.trainable": row["trainable"],
            "art_proxy.stitched": row["stitched"],
            "http.response.status_code": row["http_status"],
            **_server(row["upstream"]),
            **_sampling(row["sampling"]),
            **_response(row["response"], label),
        }
        if isinstance(requested, str):
            attributes["gen_ai.request.model"] = requested
        served = row["model"]
        if served is not None and served != request.get("model") and label(served) == served:
            attributes["art_proxy.served_model"] = served  # an alias's target
        trajectory = assignment.trajectory_id
        first = self._first.get(trajectory) if trajectory else None
        span = self._tracer.start_span(
            f"{operation} {requested}" if isinstance(requested, str) else operation,
            context=_PROPAGATOR.extract(trace) if trace else None,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            links=[Link(first, {"art_proxy.link": "trajectory's first call"})] if first else [],
            start_time=_ns(started),
        )
        if trajectory and first is None:
            self._first[trajectory] = span.get_span_context()
            while len(self._first) > _FIRST_SPANS_KEPT:
                self._first.popitem(last=False)
        if row["status"] != "ok":
            span.set_attribute("error.type", str(row["http_status"] or row["status"]))
            # Not the error's text: an upstream's 4xx quotes the request (spans carry no text).
            said = (row["status"], row["http_status"])
            span.set_status(Status(StatusCode.ERROR, " ".join(str(s) for s in said if s)))
        span.end(end_time=_ns(ended))

    def shutdown(self) -> None:
        """Export what is batched, then stop."""
        self._provider.shutdown()


def _server(upstream: str) -> dict[str, Any]:
    parts = urlsplit(upstream)
    server: dict[str, Any] = {}
    if parts.hostname:
        server["server.address"] = parts.hostname
    if parts.port:
        server["server.port"] = parts.port
    return server


def _sampling(sampling: Mapping[str, Any]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for field, attribute in _SAMPLING.items():
        value = sampling.get(field)
        if isinstance(value, str):
            value = [value]
        if isinstance(value, bool) or not isinstance(value, int | float | list):
            continue
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            continue
        attributes[attribute] = value
    return attributes


def _response(response: JsonObject | None, label: Callable[[str], str]) -> dict[str, Any]:
    if not response:
        return {}
    attributes: dict[str, Any] = {}
    if isinstance(response.get("id"), str):
        attributes["gen_ai.response.id"] = response["id"]
    if isinstance(response.get("model"), str):
        # The upstream may echo the name the client sent.
        attributes["gen_ai.response.model"] = label(response["model"])
    choices = response.get("choices")
    if isinstance(choices, list):
        reasons = [c.get("finish_reason") for c in choices if isinstance(c, dict)]
        attributes["gen_ai.response.finish_reasons"] = [r for r in reasons if isinstance(r, str)]
    usage = response.get("usage")
    if isinstance(usage, dict):
        for field, attribute in (
            ("prompt_tokens", "gen_ai.usage.input_tokens"),
            ("completion_tokens", "gen_ai.usage.output_tokens"),
        ):
            if isinstance(usage.get(field), int):
                attributes[attribute] = usage[field]
    return attributes


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1e9)
