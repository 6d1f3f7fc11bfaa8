"""OpenTelemetry spans of recorded calls, exported by OTLP to a collector running in the test."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from art_proxy.proxy.server import running_proxy
from art_proxy.proxy.tracing import CallSpans
from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy.testing.loopback import serving
from tests.conftest import proxy_settings, trajectories

SECRET_PROMPT = "my card number is 4111 1111 1111 1111"


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    assert kind is not None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind)


@pytest.fixture
async def collector() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An OTLP/HTTP trace receiver: each span received, as its name, kind and attributes."""
    spans: list[dict[str, Any]] = []

    async def traces(request: web.Request) -> web.Response:
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            service = {a.key: _value(a.value) for a in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: _value(a.value) for a in span.attributes}
                    spans.append(
                        {
                            "name": span.name,
                            "kind": span.kind,
                            "service": service.get("service.name"),
                            "status": span.status.code,
                            "seconds": (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9,
                            "attributes": attributes,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "links": [link.span_id.hex() for link in span.links],
                            "raw": export.SerializeToString(),
                        }
                    )
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    async with serving(app) as base_url:
        yield base_url, spans


async def test_each_recorded_call_is_a_genai_span_with_its_trajectory_and_no_content(
    sqlite_url: str,
    vllm: FakeVllm,
    collector: tuple[str, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint, spans = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    body = {
        "model": vllm.config.model,
        "messages": [{"role": "user", "content": SECRET_PROMPT}],
        "max_tokens": 5,
        "temperature": 0.7,
    }
    async with running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy:
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                async with http.post(proxy.base_url + "/chat/completions", json=body) as r:
                    assert r.status == 200
            missing = {**body, "model": "no-such-model"}
            async with http.post(proxy.base_url + "/chat/completions", json=missing) as r:
                assert r.status == 404
        recorded = await trajectories(proxy)
    # The proxy's stop exported what was batched.
    assert len(spans) == 3
    ok = [s for s in spans if s["attributes"]["http.response.status_code"] == 200]
    assert len(ok) == 2
    first = ok[0]
    attributes = first["attributes"]
    assert first["name"] == f"chat {vllm.config.model}" and first["kind"] == 3  # CLIENT
    assert first["service"] == "art-proxy" and first["seconds"] > 0
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == vllm.config.model
    assert attributes["gen_ai.request.temperature"] == 0.7
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["gen_ai.response.finish_reasons"]
    assert attributes["server.address"] == "127.0.0.1"
    ids = {call.id for t in recorded for call in t.calls or []}
    assert {s["attributes"]["art_proxy.call.id"] for s in ok} <= ids
    by_call = {call.id: t for t in recorded for call in t.calls or []}
    trajectory = by_call[attributes["art_proxy.call.id"]]
    assert attributes["art_proxy.trajectory.id"] == trajectory.id
    assert attributes["art_proxy.group.id"] == trajectory.group_id
    assert attributes["art_proxy.trainable"] is True
    [failed] = [s for s in spans if s not in ok]
    assert failed["status"] == 2 and failed["attributes"]["error.type"] == "404"  # ERROR
    for span in spans:
        assert b"4111" not in span["raw"]  # no message content leaves the proxy


def test_tracing_is_off_unless_a_collector_is_named() -> None:
    assert CallSpans.from_environment({}) is None
    assert CallSpans.from_environment({"OTEL_SERVICE_NAME": "x"}) is None


async def test_a_calls_span_joins_the_clients_trace_and_a_trajectory_links_to_its_first(
    sqlite_url: str,
    vllm: FakeVllm,
    collector: tuple[str, list[dict[str, Any]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An agent framework's trace (W3C `traceparent`) holds the proxy's span of its call; the
    calls of one trajectory link to its first call's span."""
    endpoint, spans = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    trace_id, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {
        "traceparent": f"00-{trace_id}-{client_span}-01",
        "X-Art-Trajectory": "traced",
    }
    body = {"model": vllm.config.model, "messages": [{"role": "user", "content": "hi"}]}
    settings = proxy_settings(sqlite_url, vllm.base_url)
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        for _ in range(2):
            async with http.post(
                proxy.base_url + "/chat/completions", json=body, headers=headers
            ) as r:
                assert r.status == 200
    first, second = spans
    assert first["trace_id"] == second["trace_id"] == trace_id
    assert first["parent"] == second["parent"] == client_span
    assert first["links"] == [] and second["links"] == [first["span_id"]]


async def test_an_upstream_error_that_quotes_the_prompt_leaves_no_text_in_the_span(
    sqlite_url: str, collector: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's 400s quote the request (a pydantic error's `input=...`): the error text is the
    record's, scrubbed there; the span says only that the call failed, and how."""
    endpoint, spans = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)

    async def chat(request: web.Request) -> web.Response:
        quoted = (await request.json())["messages"][0]
        error = {"object": "error", "message": f"invalid: input={quoted!r}", "code": 400}
        return web.json_response({**error, "type": "BadRequestError"}, status=400)

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    body = {"model": "m", "messages": [{"role": "user", "content": SECRET_PROMPT}]}
    async with (
        serving(app) as upstream,
        aiohttp.ClientSession() as http,
        running_proxy(proxy_settings(sqlite_url, upstream + "/v1")) as proxy,
        http.post(proxy.base_url + "/chat/completions", json=body) as response,
    ):
        assert response.status == 400

    [failed] = spans
    assert failed["status"] == 2 and failed["attributes"]["error.type"] == "400"  # ERROR
    assert b"4111" not in failed["raw"]


async def test_a_model_name_or_stop_sequence_the_client_wrote_never_reaches_the_collector(
    sqlite_url: str, collector: tuple[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The requested model and the stop sequences went on spans as the client sent them, before
    any scrubbing: a full `sk-` key and an e-mail address reached the collector. A model name no
    upstream lists and no alias names is `other`; stop sequences are left off."""
    endpoint, spans = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    from tests.test_metrics import answers_any_name

    secret, address = "sk-proj-" + "a1B2" * 10, "alice@example.com"
    body = {
        "model": address,
        "messages": [{"role": "user", "content": "hi"}],
        "stop": [secret],
    }
    async with (
        serving(answers_any_name()) as upstream,
        aiohttp.ClientSession() as http,
        running_proxy(proxy_settings(sqlite_url, upstream + "/v1")) as proxy,
        http.post(proxy.base_url + "/chat/completions", json=body) as response,
    ):
        assert response.status == 200
    [span] = spans
    assert span["attributes"]["gen_ai.request.model"] == "other"
    assert span["name"] == "chat other"
    assert secret.encode() not in span["raw"] and address.encode() not in span["raw"]


async def test_the_clients_traceparent_reaches_the_upstream(sqlite_url: str) -> None:
    """vLLM traces a request under the `traceparent` it is sent: without it, its own spans could
    not join the agent's trace."""
    from tests.test_metrics import answers_any_name

    seen: list[dict[str, str]] = []
    upstream_app = answers_any_name()

    @web.middleware
    async def keep_headers(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.endswith("/chat/completions"):
            seen.append(dict(request.headers))
        response: web.StreamResponse = await handler(request)
        return response

    upstream_app.middlewares.append(keep_headers)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    body = {"model": "the-one-model", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        serving(upstream_app) as upstream,
        aiohttp.ClientSession() as http,
        running_proxy(proxy_settings(sqlite_url, upstream + "/v1")) as proxy,
        http.post(
            proxy.base_url + "/chat/completions",
            json=body,
            headers={"traceparent": parent, "tracestate": "vendor=1"},
        ) as response,
    ):
        assert response.status == 200
    assert [(h.get("traceparent"), h.get("tracestate")) for h in seen] == [(parent, "vendor=1")]
