"""Every bad input and every fault has one answer: a status with retry meaning, an OpenAI-shaped
error body (`{"error": {"message", "type", "param", "code"}}`, code == status), and a store that
tells what happened: a `rejected` call for a request the proxy refused before the upstream, a
`failed`, `upstream_error` or `aborted` call for a call that reached the upstream. Real HTTP on loopback, real SQLite and PostgreSQL stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sqlite3
import time
from typing import Any

import aiohttp
import asyncpg
import orjson
import pytest
from aiohttp import web
from sqlalchemy.engine import make_url

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import CallRecord
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from tests.conftest import proxy_settings

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
USER = [{"role": "user", "content": "What is 2 + 2?"}]
CHAT: dict[str, Any] = {"model": MODEL, "messages": USER}
# Long enough that a slow stream is still running when the client leaves.
LONG_REPLY = " ".join(f"word{i}" for i in range(60))


async def post(
    http: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any] | list[Any] | bytes,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    async with http.post(url, data=data, headers=all_headers) as response:
        return response.status, await response.read()


def assert_openai_error(status: int, raw: bytes, expected: int, error_type: str) -> str:
    """The body is exactly OpenAI's error shape with `code` equal to the status; returns the message."""
    assert status == expected, raw
    body = orjson.loads(raw)
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == expected
    assert error["type"] == error_type
    assert isinstance(error["message"], str) and error["message"]
    message: str = error["message"]
    return message


async def recorded_calls(proxy: RunningProxy) -> list[CallRecord]:
    calls: list[CallRecord] = []
    await proxy.parts.settled()
    for trajectory in await proxy.parts.store.trajectories():
        whole = await proxy.parts.store.trajectory(trajectory.id)
        assert whole is not None and whole.calls is not None
        calls.extend(whole.calls)
    return calls


async def only_call(proxy: RunningProxy) -> CallRecord:
    calls = await recorded_calls(proxy)
    assert len(calls) == 1, f"expected one recorded call, got {len(calls)}"
    return calls[0]


async def wait_for_one_call(proxy: RunningProxy, timeout_s: float = 2.0) -> CallRecord:
    """The call a handler records after the client has already gone."""
    deadline = time.monotonic() + timeout_s
    while not (calls := await recorded_calls(proxy)):
        assert time.monotonic() < deadline, "the call was never recorded"
        await asyncio.sleep(0.02)
    assert len(calls) == 1
    return calls[0]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def sse_payloads(raw: bytes) -> list[bytes]:
    return [line[5:].strip() for line in raw.splitlines() if line.startswith(b"data:")]


# --- requests the proxy rejects before any upstream call -------------------------------------


async def assert_one_rejected_call(proxy: RunningProxy, status: int, error: str) -> CallRecord:
    """The proxy recorded exactly one call, refused with `status` before any upstream call."""
    call = await only_call(proxy)
    assert (call.status, call.http_status) == ("rejected", status)
    assert call.error is not None and error in call.error
    assert not call.trainable and call.response is None
    assert (proxy.parts.counters.calls, proxy.parts.counters.failed_calls) == (1, 1)
    return call


async def test_malformed_json_is_400_and_recorded_as_a_rejected_call(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    status, raw = await post(http, proxy.base_url + "/chat/completions", b'{"model": "m", "mess')
    message = assert_openai_error(status, raw, 400, "BadRequestError")
    assert "not valid JSON" in message
    call = await assert_one_rejected_call(proxy, 400, "not valid JSON")
    assert call.request == {"unreadable_body": message}
    assert vllm.requests == []


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", [USER[0]], None),
        ("/chat/completions", {"model": MODEL}, "messages"),
        ("/chat/completions", {"model": MODEL, "messages": []}, "messages"),
        ("/chat/completions", {"model": MODEL, "messages": "hello"}, "messages"),
        ("/chat/completions", {"model": MODEL, "messages": [{"content": "x"}]}, "messages[0].role"),
        ("/completions", {"model": MODEL, "messages": USER}, "prompt"),
    ],
    ids=["array", "no-messages", "empty-messages", "string-messages", "no-role", "no-prompt"],
)
async def test_body_that_is_not_a_generation_request_is_400_and_recorded_as_rejected(
    sqlite_proxy: RunningProxy,
    vllm: FakeVllm,
    http: aiohttp.ClientSession,
    path: str,
    body: dict[str, Any] | list[Any],
    param: str | None,
) -> None:
    status, raw = await post(http, sqlite_proxy.base_url + path, body)
    message = assert_openai_error(status, raw, 400, "BadRequestError")
    assert orjson.loads(raw)["error"]["param"] == param
    if param is not None:
        assert message.startswith(param)
    await assert_one_rejected_call(sqlite_proxy, 400, message)
    assert vllm.requests == []


async def test_body_over_max_body_mb_is_413(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, max_body_mb=0.5)
    async with running_proxy(settings) as proxy:
        big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 600_000}]}
        status, raw = await post(http, proxy.base_url + "/chat/completions", big)
        message = assert_openai_error(status, raw, 413, "RequestTooLargeError")
        assert "0.5 MiB" in message
        # A body under the limit still goes through.
        status, _ = await post(http, proxy.base_url + "/chat/completions", CHAT)
        assert status == 200
        calls = await recorded_calls(proxy)
        assert sorted((call.status, call.http_status) for call in calls) == [
            ("ok", 200),
            ("rejected", 413),
        ]
    assert len(vllm.requests) == 1


async def test_unknown_path_is_404_json(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    async with http.get(sqlite_proxy.root_url + "/v2/nothing/here") as response:
        assert response.content_type == "application/json"
        message = assert_openai_error(response.status, await response.read(), 404, "NotFoundError")
    assert "/v2/nothing/here" in message


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/chat/completions"),
        ("DELETE", "/v1/models"),
        ("GET", "/art/v1/trajectories/x/finish"),
    ],
)
async def test_wrong_method_is_405_json(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, method: str, path: str
) -> None:
    async with http.request(method, sqlite_proxy.root_url + path) as response:
        assert response.content_type == "application/json"
        raw = await response.read()
        message = assert_openai_error(response.status, raw, 405, "MethodNotAllowedError")
    assert method in message


async def test_invalid_x_art_split_is_400_and_recorded_as_rejected_in_the_default_split(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    status, raw = await post(
        http, proxy.base_url + "/chat/completions", CHAT, headers={"X-Art-Split": "test"}
    )
    message = assert_openai_error(status, raw, 400, "BadRequestError")
    assert "X-Art-Split" in message
    call = await assert_one_rejected_call(proxy, 400, "X-Art-Split")
    assert call.request == CHAT
    await proxy.parts.settled()
    [trajectory] = await proxy.parts.store.trajectories()
    assert trajectory.split == "train"
    assert vllm.requests == []


async def test_call_to_a_finished_explicit_trajectory_is_409(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    url = proxy.base_url + "/chat/completions"
    status, _ = await post(http, url, CHAT, headers={"X-Art-Trajectory": "run-1"})
    assert status == 200
    status, _ = await post(http, proxy.root_url + "/art/v1/trajectories/run-1/finish", {})
    assert status == 200

    status, raw = await post(http, url, CHAT, headers={"X-Art-Trajectory": "run-1"})
    message = assert_openai_error(status, raw, 409, "ConflictError")
    assert "run-1" in message
    # Through the URL prefix too.
    status, raw = await post(
        http, proxy.root_url + "/scenario/s/trajectory/run-1/v1/chat/completions", CHAT
    )
    assert_openai_error(status, raw, 409, "ConflictError")

    await proxy.parts.settled()
    trajectory = await proxy.parts.store.trajectory("run-1")
    assert trajectory is not None and trajectory.calls is not None
    assert trajectory.status == "finished"
    assert [call.status for call in trajectory.calls] == ["ok"]
    assert len(vllm.requests) == 1


# --- the upstream fails ------------------------------------------------------------------------


async def test_upstream_refused_is_502_and_recorded_as_failed_call(
    store_url: str, http: aiohttp.ClientSession
) -> None:
    upstream = f"http://127.0.0.1:{closed_port()}/v1"
    async with running_proxy(proxy_settings(store_url, upstream)) as proxy:
        status, raw = await post(http, proxy.base_url + "/chat/completions", CHAT)
        message = assert_openai_error(status, raw, 502, "UpstreamError")
        assert upstream in message and "refused" in message

        call = await only_call(proxy)
        assert call.status == "failed"
        assert call.http_status == 502
        assert call.error == message
        assert call.response is None and not call.trainable
        assert call.request == CHAT
        assert proxy.parts.counters.failed_calls == 1


async def test_upstream_timeout_is_504_and_recorded_as_failed_call(
    store_url: str, http: aiohttp.ClientSession
) -> None:
    async with (
        running_fake_vllm(FakeVllmConfig(delay_s=0.6)) as slow,
        running_proxy(proxy_settings(store_url, slow.base_url, upstream_timeout=0.1)) as proxy,
    ):
        started = time.monotonic()
        status, raw = await post(http, proxy.base_url + "/chat/completions", CHAT)
        assert time.monotonic() - started < 0.5
        message = assert_openai_error(status, raw, 504, "UpstreamTimeoutError")
        assert "did not answer in time" in message

        call = await only_call(proxy)
        assert call.status == "failed"
        assert call.http_status == 504
        assert call.error == message


async def test_unknown_model_404_passes_through_unchanged_and_is_recorded_as_upstream_error(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    body = {**CHAT, "model": "no-such-model"}
    direct_status, direct_raw = await post(http, vllm.base_url + "/chat/completions", body)
    assert direct_status == 404

    status, raw = await post(http, proxy.base_url + "/chat/completions", body)
    assert (status, raw) == (direct_status, direct_raw)

    call = await only_call(proxy)
    assert call.status == "upstream_error"
    assert call.http_status == 404
    assert call.error == direct_raw.decode()
    assert call.model == "no-such-model"


async def test_context_overflow_400_passes_through_unchanged_and_is_recorded_as_upstream_error(
    store_url: str, http: aiohttp.ClientSession
) -> None:
    async with (
        running_fake_vllm(FakeVllmConfig(max_model_len=4)) as small,
        running_proxy(proxy_settings(store_url, small.base_url)) as proxy,
    ):
        direct_status, direct_raw = await post(http, small.base_url + "/chat/completions", CHAT)
        assert direct_status == 400
        assert b"maximum context length" in direct_raw

        status, raw = await post(http, proxy.base_url + "/chat/completions", CHAT)
        assert (status, raw) == (direct_status, direct_raw)

        call = await only_call(proxy)
        assert call.status == "upstream_error"
        assert call.http_status == 400
        assert call.error == direct_raw.decode()
        assert not call.trainable


async def test_mid_stream_upstream_error_reaches_client_then_done_and_is_recorded_as_upstream_error(
    store_url: str, http: aiohttp.ClientSession
) -> None:
    async with (
        running_fake_vllm(FakeVllmConfig(fail_mid_stream=True)) as failing,
        running_proxy(proxy_settings(store_url, failing.base_url)) as proxy,
    ):
        status, raw = await post(
            http, proxy.base_url + "/chat/completions", {**CHAT, "stream": True}
        )
        assert status == 200
        payloads = sse_payloads(raw)
        assert payloads[-1] == b"[DONE]"
        error = orjson.loads(payloads[-2])["error"]
        assert error["code"] == 500 and "fail_mid_stream" in error["message"]
        assert all(b'"error"' not in payload for payload in payloads[:-2])

        call = await only_call(proxy)
        assert call.status == "upstream_error"
        assert call.error == error["message"]
        assert call.stream and not call.trainable


async def test_client_gone_mid_stream_is_recorded_as_aborted_with_the_partial_tokens(
    store_url: str,
) -> None:
    config = FakeVllmConfig(reply=LONG_REPLY, chunk_delay_s=0.02)
    async with (
        running_fake_vllm(config) as slow,
        running_proxy(proxy_settings(store_url, slow.base_url)) as proxy,
    ):
        full_length = len(slow.tokenizer.encode(LONG_REPLY)) + 1  # EOS
        async with aiohttp.ClientSession() as http:
            response = await http.post(
                proxy.base_url + "/chat/completions", json={**CHAT, "stream": True}
            )
            received = 0
            async for line in response.content:
                received += line.startswith(b"data:")
                if received == 3:
                    break
            response.close()

        call = await wait_for_one_call(proxy)
        assert call.status == "aborted"
        assert call.http_status == 200
        assert call.error is not None and "client" in call.error
        assert not call.trainable
        assert call.prompt_token_ids
        assert call.completion_token_ids is not None
        partial = call.completion_token_ids[0]
        assert 0 < len(partial) < full_length
        assert partial == list(slow.tokenizer.encode(LONG_REPLY)[: len(partial)])


async def test_client_gone_mid_stream_closes_the_upstream_request(
    sqlite_url: str,
) -> None:
    """The proxy hangs up on the upstream, which is what makes vLLM abort the generation."""
    upstream_saw_hang_up = asyncio.Event()

    async def endless_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for position in range(500):
                chunk = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": MODEL,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": "x"},
                            "logprobs": None,
                            "finish_reason": None,
                            "token_ids": [position],
                        }
                    ],
                }
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
                await asyncio.sleep(0.01)
        except ConnectionResetError:
            upstream_saw_hang_up.set()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", endless_stream)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        upstream = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        async with running_proxy(proxy_settings(sqlite_url, upstream)) as proxy:
            async with aiohttp.ClientSession() as http:
                response = await http.post(
                    proxy.base_url + "/chat/completions", json={**CHAT, "stream": True}
                )
                await response.content.readuntil(b"\n\n")
                response.close()
            await asyncio.wait_for(upstream_saw_hang_up.wait(), timeout=2.0)
            call = await wait_for_one_call(proxy)
            assert call.status == "aborted"
    finally:
        await runner.cleanup()


# --- the store fails -----------------------------------------------------------------------------


async def break_calls_table(store_url: str) -> None:
    """Make every insert of a call fail, from a connection of our own, as a lost database would."""
    url = make_url(store_url)
    if url.get_backend_name() == "sqlite":
        assert url.database is not None
        with contextlib.closing(sqlite3.connect(url.database)) as connection:
            connection.execute("ALTER TABLE calls RENAME TO calls_gone")
            connection.commit()
        return
    connection = await asyncpg.connect(store_url)
    try:
        await connection.execute("ALTER TABLE calls RENAME TO calls_gone")
    finally:
        await connection.close()


# Without a journal (--journal off) each answer waits for the store's commit, and the store-error
# policy decides what a failed one means; with one, see test_durability.py.


async def test_store_unavailable_with_serve_policy_answers_200_and_counts_the_lost_record(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    async with running_proxy(proxy_settings(store_url, vllm.base_url, journal="off")) as proxy:
        await break_calls_table(store_url)
        status, raw = await post(http, proxy.base_url + "/chat/completions", CHAT)
        assert status == 200
        assert orjson.loads(raw)["choices"][0]["message"]["content"] == vllm.config.reply

        async with http.get(proxy.root_url + "/health") as response:
            health = await response.json()
        assert health["lost_records"] == 1
        assert health["calls"] == 1
        # The call's batch was one transaction: no trajectory without its call.
        await proxy.parts.settled()
        assert await proxy.parts.store.trajectories() == []


async def test_store_unavailable_with_fail_policy_is_503_store_unavailable_error(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(store_url, vllm.base_url, on_store_error="fail", journal="off")
    async with running_proxy(settings) as proxy:
        await break_calls_table(store_url)
        status, raw = await post(http, proxy.base_url + "/chat/completions", CHAT)
        message = assert_openai_error(status, raw, 503, "StoreUnavailableError")
        assert "could not be recorded" in message
        assert proxy.parts.counters.lost_records == 1
        await proxy.parts.settled()
        assert await proxy.parts.store.trajectories() == []


async def test_store_unavailable_with_fail_policy_ends_a_stream_with_an_error_event(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, on_store_error="fail", journal="off")
    async with running_proxy(settings) as proxy:
        await break_calls_table(sqlite_url)
        status, raw = await post(
            http, proxy.base_url + "/chat/completions", {**CHAT, "stream": True}
        )
        assert status == 200  # the stream had started before the record failed
        payloads = sse_payloads(raw)
        assert payloads[-1] == b"[DONE]"
        error = orjson.loads(payloads[-2])["error"]
        assert error["code"] == 503 and error["type"] == "StoreUnavailableError"
        assert proxy.parts.counters.lost_records == 1


async def test_ready_is_503_while_no_upstream_answers_and_health_stays_200(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    """One /health served liveness and readiness and answered 200 while the upstream was down:
    a Ready pod answered its clients 502s. /ready (the readiness probe, no key needed) asks the
    upstreams; /health (liveness) stays 200, as restarting the proxy would not help."""
    upstream = running_fake_vllm(FakeVllmConfig())
    vllm = await upstream.__aenter__()
    settings = proxy_settings(sqlite_url, vllm.base_url, api_key="k", admin_key="a")
    async with running_proxy(settings) as proxy:
        async with http.get(f"{proxy.root_url}/ready") as answered:
            assert answered.status == 200, await answered.text()
            assert (await answered.json())["upstreams"] == {vllm.base_url: "ok"}
        await upstream.__aexit__(None, None, None)
        async with http.get(f"{proxy.root_url}/ready") as down:
            assert down.status == 503
            assert (await down.json())["status"] == "no upstream answers"
        async with http.get(f"{proxy.root_url}/health") as alive:
            assert alive.status == 200
