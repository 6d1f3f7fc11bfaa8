"""`GET /metrics`: Prometheus' text format, read back with prometheus_client's own parser."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy.testing.loopback import serving
from tests.conftest import proxy_settings, trajectories

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(http: aiohttp.ClientSession, proxy: RunningProxy) -> Samples:
    async with http.get(proxy.root_url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def chat(http: aiohttp.ClientSession, proxy: RunningProxy, model: str, **headers: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    url = proxy.base_url + "/chat/completions"
    async with http.post(url, json=body, headers=headers) as response:
        await response.read()
        return response.status


async def test_metrics_count_calls_time_requests_by_route_and_report_the_store(
    sqlite_proxy: RunningProxy, vllm: FakeVllm
) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(2):
            assert await chat(http, sqlite_proxy, vllm.config.model) == 200
        async with http.get(sqlite_proxy.root_url + "/no/such/route") as response:
            assert response.status == 404
        await sqlite_proxy.parts.settled()
        samples = await scrape(http, sqlite_proxy)

    assert samples[("art_proxy_calls_total", (("dialect", "openai"),))] == 2
    assert samples[("art_proxy_failed_calls_total", ())] == 0
    assert samples[("art_proxy_lost_records_total", ())] == 0
    assert samples[("art_proxy_recording", ())] == 1
    assert samples[("art_proxy_store_available", ())] == 1
    assert samples[("art_proxy_journal_backlog_frames", ())] == 0
    assert samples[("art_proxy_journal_ingested_records_total", ())] >= 2
    chat_route = (("method", "POST"), ("route", "/v1/chat/completions"), ("status", "200"))
    assert samples[("art_proxy_request_seconds_count", chat_route)] == 2
    assert samples[("art_proxy_request_seconds_sum", chat_route)] > 0
    unmatched = (("method", "GET"), ("route", "unmatched"), ("status", "404"))
    assert samples[("art_proxy_request_seconds_count", unmatched)] == 1


async def test_metrics_need_no_key_and_say_nothing_of_content(
    sqlite_url: str, vllm: FakeVllm
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, api_key="sk-1", admin_key="admin-1")
    async with running_proxy(settings) as proxy, aiohttp.ClientSession() as http:
        assert await chat(http, proxy, vllm.config.model, Authorization="Bearer sk-1") == 200
        assert await chat(http, proxy, vllm.config.model) == 401
        async with http.get(proxy.root_url + "/metrics") as response:
            assert response.status == 200
            text = await response.text()
    assert "hi" not in text.split() and "sk-1" not in text and "admin-1" not in text
    assert (
        'art_proxy_request_seconds_count{method="POST",route="/v1/chat/completions",status="401"} 1.0'
        in text
    )


async def test_metrics_count_tokens_and_time_calls_by_served_model_and_alias(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    """What vLLM and LiteLLM export: tokens by model, a call's seconds and a stream's first
    chunk; with them requests in flight, the process's own, best-of and alias fallbacks."""
    model = vllm.config.model
    answered = []
    for stream in (False, True):
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "stream": stream,
            "stream_options": {"include_usage": True},
        }
        if not stream:
            del body["stream_options"]
        async with http.post(proxy.base_url + "/chat/completions", json=body) as response:
            assert response.status == 200
            answered.append(await response.text())
    await proxy.parts.settled()
    recorded = [
        call.response["usage"]
        for trajectory in await trajectories(proxy)
        for call in trajectory.calls or []
        if call.response
    ]
    samples = await scrape(http, proxy)
    labels = (("alias", ""), ("model", model))

    assert samples[("art_proxy_prompt_tokens_total", labels)] == sum(
        usage["prompt_tokens"] for usage in recorded
    )
    assert samples[("art_proxy_completion_tokens_total", labels)] == sum(
        usage["completion_tokens"] for usage in recorded
    )
    assert samples[("art_proxy_call_seconds_count", labels)] == 2
    assert samples[("art_proxy_time_to_first_chunk_seconds_count", labels)] == 1
    assert ("art_proxy_requests_in_flight", ()) in samples
    assert ("process_cpu_seconds_total", ()) in samples
    assert samples[("art_proxy_best_of_calls_total", ())] == 0


def answers_any_name() -> web.Application:
    """An OpenAI-compatible upstream that answers whatever model a call names (a hosted API's
    gateway, a server that maps every name to its one model), listing one."""

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": LISTED, "object": "model"}]})

    async def chat_completions(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "hello"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app


LISTED = "the-one-model"


async def test_a_model_name_a_client_made_up_labels_no_series_of_its_own(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    """An upstream that answers any model name grew a series a name: 30 invented names took
    /metrics from 124 lines to 862, an e-mail address among them, on the endpoint every scraper
    reads. Names no upstream lists and no alias names count as `other`."""
    async with (
        serving(answers_any_name()) as upstream,
        running_proxy(proxy_settings(sqlite_url, upstream + "/v1")) as proxy,
    ):
        for model in (LISTED, "alice@example.com", "made-up-1", "made-up-2"):
            assert await chat(http, proxy, model) == 200, model
        await proxy.parts.settled()
        samples = await scrape(http, proxy)
    named = {
        dict(labels)["model"] for name, labels in samples if name == "art_proxy_call_seconds_count"
    }
    assert named == {LISTED, "other"}
    assert samples[("art_proxy_call_seconds_count", (("alias", ""), ("model", "other")))] == 3


async def test_calls_kept_out_of_the_record_count_in_the_token_and_latency_metrics(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    """A call sent with `X-Art-Record: off` is answered and not recorded; a gateway's token and
    latency figures missed it."""
    model = vllm.config.model
    assert await chat(http, proxy, model) == 200
    assert await chat(http, proxy, model, **{"X-Art-Record": "off"}) == 200
    await proxy.parts.settled()
    samples = await scrape(http, proxy)
    labels = (("alias", ""), ("model", model))
    assert samples[("art_proxy_call_seconds_count", labels)] == 2
    assert samples[("art_proxy_prompt_tokens_total", labels)] > 0
    assert len(await trajectories(proxy)) == 1
