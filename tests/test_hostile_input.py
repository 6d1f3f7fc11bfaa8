"""Hostile input never stops recording and never breaks reading (one test per finding of the
outside test, then a bounded fuzz over every class of it).

Whatever a client or an upstream sends, the proxy answers with an OpenAI-shaped status of its own
(400 for the client's mistake, 502 for the upstream's), records the call (`rejected` or `failed`),
keeps recording the calls after it, and everything it wrote reads back: the API, the dashboard and
`art-proxy export`. Secrets in a body or an upstream URL are never stored or shown.
"""

from __future__ import annotations

import asyncio
import gzip
import random
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from pydantic import ValidationError

from art_proxy.config import ProxySettings
from art_proxy.errors import StoreError
from art_proxy.journal.ingester import Ingester
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import CallRecord
from art_proxy.store.writer import Batch
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from art_proxy.testing.loopback import serving
from tests.conftest import proxy_settings
from tests.store_rows import call_row

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
USER = [{"role": "user", "content": "What is 2 + 2?"}]
CHAT: dict[str, Any] = {"model": MODEL, "messages": USER}
SECRET = "sk-live-4f9a8b7c6d5e4f3a2b1c"


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return value


def with_deep(body: dict[str, Any], field: str, depth: int) -> bytes:
    """`body` as JSON with `field` nested `depth` levels (deeper than orjson itself writes)."""
    deep = b"[" * (depth - 1) + b"1" + b"]" * (depth - 1)
    return orjson.dumps({**body, field: "DEEP"}).replace(b'"DEEP"', deep)


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    async with http.post(url, data=data, headers=all_headers) as response:
        return response.status, await response.read()


def error_of(raw: bytes, status: int) -> dict[str, Any]:
    error: dict[str, Any] = orjson.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    return error


async def all_calls(proxy: RunningProxy) -> list[CallRecord]:
    await proxy.parts.settled()
    store = proxy.parts.store
    calls = await store.calls([t.id for t in await store.trajectories(limit=1000)])
    return [call for trajectory_calls in calls.values() for call in trajectory_calls]


async def assert_reads_back(proxy: RunningProxy, http: aiohttp.ClientSession) -> None:
    """The list, every trajectory, the dashboard and `art-proxy export` read what was written."""
    async with http.get(proxy.root_url + "/art/v1/trajectories?limit=1000") as response:
        assert response.status == 200, await response.text()
        listed = (await response.json())["data"]
    for trajectory in listed:
        async with http.get(proxy.root_url + f"/art/v1/trajectories/{trajectory['id']}") as one:
            assert one.status == 200, await one.text()
    async with http.get(proxy.root_url + "/dashboard") as page:
        assert page.status == 200
    exported = export(proxy.parts.settings.store)
    assert exported.returncode == 0, exported.stderr
    assert len(exported.stdout.splitlines()) == len(listed)
    assert proxy.parts.store.unreadable_rows == 0


def export(store: str) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "art-proxy"), "export", "--store", store]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


async def assert_still_recording(proxy: RunningProxy, http: aiohttp.ClientSession) -> None:
    before = len(await all_calls(proxy))
    status, raw = await post(http, proxy.base_url + "/chat/completions", CHAT)
    assert status == 200, raw
    assert len(await all_calls(proxy)) == before + 1
    async with http.get(proxy.root_url + "/health") as response:
        health = await response.json()
        assert response.status == 200 and health["status"] == "ok"
        assert health["lost_records"] == 0


# --- an upstream that answers what a test tells it to ---------------------------------------------

OK_RESPONSE: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "4"},
            "logprobs": {"content": [{"token": "4", "logprob": -0.1}, {"token": "", "logprob": 0}]},
            "finish_reason": "stop",
            "token_ids": [19, 2],
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    "prompt_token_ids": [1, 2, 3],
}
# Non-stream faults, by the `user` field of the request.
BAD_ANSWERS: dict[str, Any] = {
    "choices-string": {**OK_RESPONSE, "choices": "x"},
    "choices-numbers": {**OK_RESPONSE, "choices": [1, 2]},
    "logprob-missing": {
        **OK_RESPONSE,
        "choices": [{**OK_RESPONSE["choices"][0], "logprobs": {"content": [{"token": "4"}]}}],
    },
    "token-ids-string": {
        **OK_RESPONSE,
        "choices": [{**OK_RESPONSE["choices"][0], "token_ids": "abc"}],
    },
    "error-as-200": {"error": {"message": "engine overloaded", "code": 503}},
    "not-an-object": [1, 2, 3],
}
OK_CHUNKS: list[dict[str, Any]] = [
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        "prompt_token_ids": [1, 2, 3],
    },
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "delta": {"content": "4"},
                "logprobs": {"content": [{"token": "4", "logprob": -0.1}]},
                "finish_reason": "stop",
                "token_ids": [19],
            }
        ],
    },
]
# Stream faults: the second chunk replaced by these.
BAD_CHUNKS: dict[str, Any] = {
    "chunk-index-string": {
        **OK_CHUNKS[1],
        "choices": [{**OK_CHUNKS[1]["choices"][0], "index": "a"}],
    },
    "chunk-not-an-object": "x",
    "chunk-content-number": {
        **OK_CHUNKS[1],
        "choices": [{**OK_CHUNKS[1]["choices"][0], "delta": {"content": 5}}],
    },
}


async def _scripted(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    fault = body.get("user") or ""
    if not body.get("stream"):
        return web.json_response(BAD_ANSWERS.get(fault, OK_RESPONSE))
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunks: list[Any] = [OK_CHUNKS[0], BAD_CHUNKS.get(fault, OK_CHUNKS[1])]
    for chunk in chunks:
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    return response


@asynccontextmanager
async def scripted_upstream() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _scripted)
    async with serving(app) as root:
        yield root + "/v1"


@pytest.fixture
async def scripted_proxy(store_url: str) -> AsyncIterator[RunningProxy]:
    async with (
        scripted_upstream() as upstream,
        running_proxy(proxy_settings(store_url, upstream)) as running,
    ):
        yield running


# --- 1. one request must not stop all recording ----------------------------------------------


async def test_1_a_field_nested_300_deep_is_400_rejected_and_recording_goes_on(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    for field in ("logprobs", "return_token_ids"):
        status, raw = await post(
            http, proxy.base_url + "/chat/completions", with_deep(CHAT, field, 300)
        )
        assert status == 400 and "nested deeper" in error_of(raw, 400)["message"]
    assert vllm.requests == []
    assert [call.status for call in await all_calls(proxy)] == ["rejected", "rejected"]
    await assert_still_recording(proxy, http)
    await assert_reads_back(proxy, http)


async def test_1_the_writer_survives_a_record_it_cannot_write(proxy: RunningProxy) -> None:
    """Whatever a row holds, the writer fails that batch alone and keeps writing the next."""
    store = proxy.parts.store
    status, _ = 0, None
    async with aiohttp.ClientSession() as http:
        status, _ = await post(http, proxy.base_url + "/chat/completions", CHAT)
    assert status == 200
    [call] = await all_calls(proxy)
    fields = {**call.model_dump(), "seq": 1}  # the record as read back, written again
    trajectory_id, at = fields.pop("trajectory_id"), fields.pop("created_at")
    unwritable = {**fields, "id": "unwritable", "request": {"x": nested(300)}}
    with pytest.raises(StoreError):
        await store.write(Batch([call_row(trajectory_id, at, **unwritable)]))
    assert store.writer.running
    fine = {**fields, "id": "fine", "request": CHAT}
    await store.write(Batch([call_row(trajectory_id, at, **fine)]))
    assert len(await all_calls(proxy)) == 2


# --- 2. nothing written may be unreadable ----------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [{"metrics": {"x": "nan"}}, {"reward": "Infinity"}, with_deep({}, "metadata", 300)],
    ids=["nan-metric", "infinite-reward", "nested-metadata"],
)
async def test_2_a_finish_body_that_could_not_be_read_back_is_400_and_changes_nothing(
    proxy: RunningProxy, http: aiohttp.ClientSession, body: dict[str, Any] | bytes
) -> None:
    headers = {"X-Art-Trajectory": "t-1"}
    status, _ = await post(http, proxy.base_url + "/chat/completions", CHAT, headers)
    assert status == 200
    status, raw = await post(http, proxy.root_url + "/art/v1/trajectories/t-1/finish", body)
    assert status == 400, raw
    await proxy.parts.settled()
    trajectory = await proxy.parts.store.trajectory("t-1")
    assert trajectory is not None and trajectory.status == "open"
    await assert_reads_back(proxy, http)


async def test_2_readers_skip_and_count_a_row_they_cannot_read(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """A bad row (written by hand, or by an older version) costs itself, never the whole list."""
    for trajectory in ("good", "bad"):
        headers = {"X-Art-Trajectory": trajectory}
        status, _ = await post(http, sqlite_proxy.base_url + "/chat/completions", CHAT, headers)
        assert status == 200
    await sqlite_proxy.parts.settled()
    path = sqlite_proxy.parts.settings.store.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("UPDATE trajectories SET metrics = '{\"x\": null}' WHERE id = 'bad'")
    store = sqlite_proxy.parts.store
    assert [t.id for t in await store.trajectories()] == ["good"]
    assert store.unreadable_rows == 1
    exported = export(sqlite_proxy.parts.settings.store)
    assert exported.returncode == 0 and len(exported.stdout.splitlines()) == 1
    async with http.get(sqlite_proxy.root_url + "/health") as response:
        assert (await response.json())["unreadable_rows"] == 1


# --- 3. malformed client input is a 400 naming the field, and a rejected call -------------------

TOOL_TURN: dict[str, Any] = {
    "role": "assistant",
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}


def with_tool_turn(**changes: Any) -> dict[str, Any]:
    return {**CHAT, "messages": [*USER, {**TOOL_TURN, **changes}]}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (with_tool_turn(tool_calls="call f"), "messages[1].tool_calls"),
        (with_tool_turn(tool_calls=["f"]), "messages[1].tool_calls[0]"),
        (with_tool_turn(tool_calls=[{"function": "f"}]), "messages[1].tool_calls[0].function"),
        ({**CHAT, "stream": True, "stream_options": "usage"}, "stream_options"),
        (with_deep(CHAT, "tools", 255), None),
        (with_deep(CHAT, "tools", 1000), None),
    ],
    ids=[
        "tool-calls-string",
        "tool-call-string",
        "function-string",
        "stream-options",
        "255",
        "1000",
    ],
)
async def test_3_malformed_client_input_is_400_naming_the_field_and_a_rejected_call(
    proxy: RunningProxy,
    vllm: FakeVllm,
    http: aiohttp.ClientSession,
    body: dict[str, Any] | bytes,
    param: str | None,
) -> None:
    status, raw = await post(http, proxy.base_url + "/chat/completions", body)
    error = error_of(raw, 400)
    assert status == 400 and error["param"] == param and error["type"] == "BadRequestError"
    [call] = await all_calls(proxy)
    assert (call.status, call.http_status, call.error) == ("rejected", 400, error["message"])
    assert vllm.requests == []
    await assert_still_recording(proxy, http)


async def test_3_a_gzip_encoding_on_a_plain_body_is_400_and_a_rejected_call(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    url = sqlite_proxy.base_url + "/chat/completions"
    status, raw = await post(http, url, CHAT, {"Content-Encoding": "gzip"})
    assert status == 400 and error_of(raw, 400)["param"] == "Content-Encoding"
    [call] = await all_calls(sqlite_proxy)
    assert call.status == "rejected"
    # A body really compressed is read as any other.
    status, _ = await post(
        http, url, gzip.compress(orjson.dumps(CHAT)), {"Content-Encoding": "gzip"}
    )
    assert status == 200


# --- 4 and 10. malformed upstream answers are a 502 and a failed call ---------------------------


@pytest.mark.parametrize("fault", sorted(BAD_ANSWERS))
async def test_4_a_malformed_upstream_answer_is_502_and_a_failed_call(
    scripted_proxy: RunningProxy, http: aiohttp.ClientSession, fault: str
) -> None:
    status, raw = await post(
        http, scripted_proxy.base_url + "/chat/completions", {**CHAT, "user": fault}
    )
    assert status == 502 and error_of(raw, 502)["type"] == "UpstreamError"
    [call] = await all_calls(scripted_proxy)
    assert (call.status, call.http_status, call.response) == ("failed", 502, None)
    if fault == "error-as-200":
        assert call.error is not None and "engine overloaded" in call.error
    await assert_still_recording(scripted_proxy, http)
    await assert_reads_back(scripted_proxy, http)


@pytest.mark.parametrize("fault", sorted(BAD_CHUNKS))
async def test_4_a_malformed_stream_chunk_ends_with_an_error_event_then_done(
    scripted_proxy: RunningProxy, http: aiohttp.ClientSession, fault: str
) -> None:
    body = {**CHAT, "stream": True, "user": fault}
    timeout = aiohttp.ClientTimeout(total=10)
    async with http.post(
        scripted_proxy.base_url + "/chat/completions", json=body, timeout=timeout
    ) as response:
        events = [line for line in (await response.read()).split(b"\n\n") if line]
    assert events[-1] == b"data: [DONE]"
    error = orjson.loads(events[-2].removeprefix(b"data: "))["error"]
    assert error["code"] == 502 and "malformed stream chunk" in error["message"]
    [call] = await all_calls(scripted_proxy)
    assert call.status == "failed" and not call.trainable
    await assert_still_recording(scripted_proxy, http)


async def test_10_stream_given_as_a_string_is_400_not_a_stream(
    sqlite_proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    status, raw = await post(
        http, sqlite_proxy.base_url + "/chat/completions", {**CHAT, "stream": "false"}
    )
    assert status == 400 and error_of(raw, 400)["param"] == "stream"
    assert vllm.requests == []


# --- 5 and 6. secrets: upstream URL credentials, keys in a body ------------------------------


def test_5_an_upstream_url_with_credentials_is_refused_without_showing_them() -> None:
    with pytest.raises(ValidationError, match="--upstream-api-key") as refused:
        ProxySettings(upstream=["http://agent:hunter2secret@127.0.0.1:8000/v1"])
    assert "hunter2secret" not in refused.value.errors()[0]["msg"]


def test_5_the_cli_refuses_upstream_credentials_in_one_line() -> None:
    command = [str(Path(sys.executable).parent / "art-proxy"), "serve", "--upstream"]
    done = subprocess.run(
        [*command, "http://agent:hunter2secret@127.0.0.1:8000/v1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "hunter2secret" not in done.stderr and "--upstream-api-key" in done.stderr


async def test_6_keys_in_a_body_are_scrubbed_from_the_store_the_api_and_export(
    sqlite_proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    body = {
        **CHAT,
        "messages": [{"role": "user", "content": f"my key is {SECRET}, keep it"}],
        "api_key": "plain-looking-key",
        "extra_headers": {"Authorization": "Bearer abc123def456ghi789", "X-Trace": "t-1"},
    }
    status, _ = await post(http, sqlite_proxy.base_url + "/chat/completions", body)
    assert status == 200
    assert vllm.requests[0]["api_key"] == "plain-looking-key"  # the upstream gets the body as sent
    [call] = await all_calls(sqlite_proxy)
    assert call.request["api_key"] == "[redacted]"
    assert call.request["extra_headers"] == {"Authorization": "[redacted]", "X-Trace": "t-1"}
    assert call.request["messages"][0]["content"] == "my key is [redacted], keep it"
    path = sqlite_proxy.parts.settings.store.removeprefix("sqlite:///")
    with closing(sqlite3.connect(path)) as connection:
        stored = "\n".join(
            repr(row)
            for table in ("calls", "scenarios", "trajectories")
            for row in connection.execute(f"SELECT * FROM {table}")
        )
    exported = export(sqlite_proxy.parts.settings.store).stdout
    async with http.get(
        sqlite_proxy.root_url + f"/dashboard/trajectories/{call.trajectory_id}"
    ) as page:
        shown = await page.text()
    for where in (stored, exported, shown):
        assert SECRET not in where and "plain-looking-key" not in where
        assert "abc123def456ghi789" not in where


# --- 7. the HTTP parser's own errors are JSON ------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: 1\r\n" % i for i in range(200))
        + b"\r\n",
        b"GET /health HTTP/1.1\rHost: x\r\n\r\n",
        b"GET /health HTTP/1.1\r\nHost: x\x00y\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Encoding: br\r\n"
        b"Content-Length: 2\r\n\r\n{}",
    ],
    ids=["long-header", "many-headers", "bare-cr", "nul", "two-content-lengths", "unknown-coding"],
)
async def test_7_malformed_http_is_a_json_400_that_echoes_nothing(
    sqlite_proxy: RunningProxy, head: bytes
) -> None:
    port = int(sqlite_proxy.root_url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b" 400 " in status_line
    assert b"application/json" in headers
    assert error_of(body, 400)["type"] == "BadRequestError"
    assert b"aaaa" not in body and b"x\x00y" not in body


# --- 8. a store error never shows SQL ---------------------------------------------------------


async def test_8_a_store_error_tells_the_client_nothing_of_the_sql(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(**_: Any) -> None:
        raise StoreError("StatementError: (x) [SQL: SELECT trajectories.id FROM trajectories]")

    monkeypatch.setattr(sqlite_proxy.parts.store, "trajectories", broken)
    async with http.get(sqlite_proxy.root_url + "/art/v1/trajectories") as response:
        assert response.status == 500
        raw = await response.read()
    assert b"SQL" not in raw and b"SELECT" not in raw
    assert "log" in error_of(raw, 500)["message"]


# --- the fuzz: every class above, mixed, a few hundred cases ------------------------------------


def fuzz_cases(rng: random.Random, count: int) -> list[tuple[bytes, dict[str, str]]]:
    """Request bodies (and extra headers) of every malformed class, plus valid ones among them."""
    values: list[Any] = [None, True, 0, -1, 1.5, "", "x", "\x00", [], {}, [1], {"a": 1}, "false"]
    fields = ["model", "messages", "stream", "stream_options", "logprobs", "return_token_ids", "n"]
    cases: list[tuple[bytes, dict[str, str]]] = []
    for _ in range(count):
        kind = rng.randrange(8)
        body: Any = {**CHAT, "messages": [dict(m) for m in USER]}
        headers: dict[str, str] = {}
        if kind == 0:  # a field of the wrong type
            body[rng.choice(fields)] = rng.choice(values)
        elif kind == 1:  # a message of the wrong shape
            body["messages"].append(
                rng.choice(
                    [
                        with_tool_turn(tool_calls=rng.choice(values))["messages"][1],
                        with_tool_turn(tool_calls=[rng.choice(values)])["messages"][1],
                        with_tool_turn(tool_calls=[{"function": rng.choice(values)}])["messages"][
                            1
                        ],
                        {"role": rng.choice(values), "content": "x"},
                        rng.choice(values),
                    ]
                )
            )
        elif kind == 2:  # deep nesting, somewhere
            field = rng.choice([*fields, "tools", "metadata"])
            cases.append((with_deep(body, field, rng.randrange(100, 1100)), {}))
            continue
        elif kind == 3:  # not JSON, or not an object
            raw = rng.choice(
                [
                    b"",
                    b"{",
                    b"[1]",
                    b"null",
                    b"\xff\xfe",
                    bytes(rng.randrange(256) for _ in range(20)),
                ]
            )
            cases.append((raw, {}))
            continue
        elif kind == 4:  # an encoding it does not have
            headers["Content-Encoding"] = rng.choice(["gzip", "deflate"])
        elif kind == 5:  # secrets and NULs in content, secrets in fields
            body["messages"][0]["content"] = f"key {SECRET}\x00 end"
            body["api_key"] = SECRET
        elif kind == 6:  # a bad attribution header
            headers[rng.choice(["X-Art-Split", "X-Art-Trajectory", "X-Art-Group"])] = rng.choice(
                ["nope", "x" * 300, "\tx"]
            )
        else:  # a malformed upstream answer or stream chunk
            fault = rng.choice([*BAD_ANSWERS, *BAD_CHUNKS])
            body = {**body, "user": fault, "stream": fault in BAD_CHUNKS}
        cases.append((orjson.dumps(body), headers))
    return cases


async def test_fuzz_every_class_leaves_the_proxy_recording_and_readable(
    scripted_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    cases = fuzz_cases(random.Random(19), 300)
    limit = asyncio.Semaphore(4)
    statuses: list[int] = []

    async def send(raw: bytes, headers: dict[str, str]) -> None:
        async with limit:
            url = scripted_proxy.base_url + "/chat/completions"
            all_headers = {"Content-Type": "application/json", **headers}
            async with http.post(url, data=raw, headers=all_headers) as response:
                await response.read()
                statuses.append(response.status)

    await asyncio.gather(*(send(raw, headers) for raw, headers in cases))
    assert all(status in (200, 400, 502) for status in statuses), sorted(set(statuses))
    assert {200, 400, 502} <= set(statuses)  # every kind of answer was exercised
    assert scripted_proxy.parts.counters.calls == len(cases)
    assert len(await all_calls(scripted_proxy)) == len(cases)
    await assert_still_recording(scripted_proxy, http)
    await assert_reads_back(scripted_proxy, http)
    exported = export(scripted_proxy.parts.settings.store).stdout
    assert SECRET not in exported


@pytest.mark.parametrize("journal", ["journal", "off"])
async def test_6_keys_in_a_body_never_reach_the_journal_or_the_store_either_way(
    sqlite_url: str,
    vllm: FakeVllm,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    journal: str,
) -> None:
    """Scrubbed before the record is journaled (the journal's frames are kept on disk until
    ingested) as before it is committed without a journal."""
    directory = tmp_path / "journal"
    setting = str(directory) if journal == "journal" else "off"
    monkeypatch.setattr(Ingester, "start", lambda self: None)  # frames stay on disk
    body = {
        **CHAT,
        "messages": [{"role": "user", "content": f"my key is {SECRET}, keep it"}],
        "api_key": "plain-looking-key",
    }
    settings = proxy_settings(sqlite_url, vllm.base_url, journal=setting)
    async with running_proxy(settings) as proxy:
        status, _ = await post(http, proxy.base_url + "/chat/completions", body)
        assert status == 200
        if journal == "journal":
            written = b"".join(path.read_bytes() for path in directory.glob("*/*.frames"))
        else:  # the database and its write-ahead log, where a fresh commit sits
            database = Path(sqlite_url.removeprefix("sqlite:///"))
            written = b"".join(
                path.read_bytes()
                for path in (database, database.with_name(database.name + "-wal"))
                if path.exists()
            )
    assert b"[redacted]" in written  # the record is there, scrubbed
    assert SECRET.encode() not in written and b"plain-looking-key" not in written


@pytest.mark.parametrize("stream", [False, True])
async def test_6_a_key_in_an_answer_with_logprobs_is_scrubbed_and_its_logprobs_kept(
    sqlite_url: str, http: aiohttp.ClientSession, stream: bool
) -> None:
    """An upstream that echoes a key: the stored answer's text is scrubbed; its logprob entries
    (one token each, left out of the search) are kept as the client received them."""
    reply = f"your key is {SECRET} ok"
    async with (
        running_fake_vllm(FakeVllmConfig(reply=reply)) as fake,
        running_proxy(proxy_settings(sqlite_url, fake.base_url)) as proxy,
    ):
        body = {**CHAT, "logprobs": True, "stream": stream}
        status, _ = await post(http, proxy.base_url + "/chat/completions", body)
        assert status == 200
        [call] = await all_calls(proxy)
    assert call.response is not None
    [choice] = call.response["choices"]
    assert choice["message"]["content"] == "your key is [redacted] ok"
    assert call.completion_token_ids is not None
    assert len(choice["logprobs"]["content"]) == len(call.completion_token_ids[0])


# --- 9. the admin routes: a NUL or an offset no store can take --------------------------------

_NUL = "t%00x"
ADMIN_NUL_REQUESTS: list[tuple[str, str, Any]] = [
    ("POST", "/art/v1/forget", {"user": "a\x00b"}),
    ("GET", f"/art/v1/lineage?trajectory={_NUL}", None),
    ("GET", f"/art/v1/trajectories?user={_NUL}", None),
    ("GET", f"/art/v1/trajectories/{_NUL}", None),
    ("GET", f"/art/v1/trajectories/{_NUL}/feedback", None),
    ("POST", "/art/v1/feedback", {"trajectory_id": "a\x00b", "score": 1}),
    ("POST", f"/art/v1/trajectories/{_NUL}/finish", {}),
    ("GET", f"/art/v1/groups?scenario={_NUL}", None),
    ("GET", f"/art/v1/judgments?group={_NUL}", None),
    ("GET", f"/art/v1/alias_moves?alias={_NUL}", None),
    ("PUT", f"/art/v1/aliases/{_NUL}", {"model": "m"}),
    ("GET", f"/art/v1/training_steps?run={_NUL}", None),
    ("GET", "/art/v1/trajectories?offset=99999999999999999999", None),
    ("GET", "/art/v1/groups?offset=99999999999999999999", None),
]


async def test_9_a_nul_in_an_id_or_an_offset_past_the_stores_is_400_on_every_admin_route(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    statuses = {}
    for method, path, body in ADMIN_NUL_REQUESTS:
        async with http.request(method, proxy.root_url + path, json=body) as response:
            statuses[path] = response.status
            error = (await response.json())["error"]
            assert "NUL" in error["message"] or "offset" in error["message"], path
    assert statuses == {path: 400 for _, path, _ in ADMIN_NUL_REQUESTS}
    async with http.get(proxy.root_url + "/art/v1/trajectories") as response:
        assert response.status == 200  # and the proxy goes on answering
