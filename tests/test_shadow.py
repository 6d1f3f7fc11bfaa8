"""Shadow sampling: a prod call is sampled again after its answer was sent, as siblings in its group.

The proxy runs on loopback in front of the fake vLLM, over SQLite. Where order matters the fake
sits behind a gate that holds every generation request the test did not let through, so a shadow
request can be held while the test watches what the user got.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import TrajectoryRecord
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, create_fake_vllm_app
from art_proxy.testing.loopback import serving
from art_proxy.vllm_api import chat as chat_route
from tests.conftest import proxy_settings
from tests.test_security import run_cli, the_error_line

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TASK = [{"role": "user", "content": "Which table holds the invoices?"}]
PROD = {"X-Art-Split": "prod"}
SHADOW = {"shadow_fraction": 1.0, "shadow_samples": 3}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@dataclass
class Gate:
    """Holds generation requests beyond the `passes` the test hands out, until `opened`."""

    passes: int = 0
    held: int = 0
    opened: asyncio.Event = field(default_factory=asyncio.Event)

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if request.path.endswith("completions"):
            if self.passes:
                self.passes -= 1
            else:
                self.held += 1
                await self.opened.wait()
        return await handler(request)


@asynccontextmanager
async def gated_vllm() -> AsyncIterator[tuple[str, Gate]]:
    gate = Gate()
    app = create_fake_vllm_app(FakeVllmConfig())
    app.middlewares.append(gate.middleware)
    async with serving(app) as root_url:
        try:
            yield f"{root_url}/v1", gate
        finally:
            gate.opened.set()  # what is still held finishes, so the server can stop


async def post_chat(
    http: aiohttp.ClientSession,
    proxy: RunningProxy,
    headers: dict[str, str] | None = None,
    **body: Any,
) -> bytes:
    async with http.post(
        f"{proxy.base_url}/chat/completions",
        json={"model": MODEL, "messages": TASK, **body},
        headers=headers or {},
    ) as response:
        assert response.status == 200, await response.text()
        return await response.read()


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


async def shadows_recorded(proxy: RunningProxy, count: int) -> None:
    await eventually(lambda: proxy.parts.counters.shadow_samples == count)


def served_and_shadows(
    listed: list[TrajectoryRecord],
) -> tuple[list[TrajectoryRecord], list[TrajectoryRecord]]:
    served = [t for t in listed if t.finish_reason != "shadow"]
    return served, [t for t in listed if t.finish_reason == "shadow"]


async def test_a_shadowed_prod_call_gives_its_group_three_finished_siblings_with_token_ids(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    # --default-split prod: an unmodified agent, no header, lands in prod.
    settings = proxy_settings(sqlite_url, vllm.base_url, default_split="prod", **SHADOW)
    async with running_proxy(settings) as proxy:
        async with http.put(
            f"{proxy.root_url}/art/v1/aliases/policy", json={"model": MODEL}
        ) as moved:
            assert moved.status == 200
        await post_chat(http, proxy, model="policy", temperature=0.7)
        await shadows_recorded(proxy, 3)
        await proxy.parts.settled()
        store = proxy.parts.store
        served, shadows = served_and_shadows(await store.trajectories())
        calls = await store.calls([t.id for t in shadows])
        health = await (await http.get(f"{proxy.root_url}/health")).json()

    assert len(served) == 1 and len(shadows) == 3
    (original,) = served
    assert original.status == "open"  # the served trajectory goes on as usual
    assert {(t.group_id, t.scenario_id, t.split) for t in [*served, *shadows]} == {
        (original.group_id, original.scenario_id, "prod")
    }
    for shadow in shadows:
        assert (shadow.status, shadow.call_count) == ("finished", 1)
        assert shadow.metadata == {"shadow_of": original.id}
        (call,) = calls[shadow.id]
        assert (call.attribution, call.status, call.stream, call.trainable) == (
            "shadow",
            "ok",
            False,
            True,
        )
        assert call.completion_token_ids and call.logprobs and call.prompt_token_ids
        assert (call.model, call.sampling) == (MODEL, {"temperature": 0.7})
    # The same body each time, the alias's target upstream, with the proxy's usual asks.
    assert [body["model"] for body in vllm.requests] == [MODEL] * 4
    assert all(body["return_token_ids"] and body["logprobs"] for body in vllm.requests)
    assert all(body["messages"] == TASK for body in vllm.requests)
    assert (health["shadow_calls"], health["shadow_samples"], health["shadow_skipped"]) == (1, 3, 0)


@pytest.fixture
def fixed_fake_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake's response id and creation time fixed, so two answers can match byte for byte."""
    monkeypatch.setattr(chat_route, "uuid", SimpleNamespace(uuid4=lambda: uuid.UUID(int=7)))
    monkeypatch.setattr(chat_route, "time", SimpleNamespace(time=lambda: 1_760_000_000.0))


@pytest.mark.usefixtures("fixed_fake_answers")
async def test_the_user_gets_the_same_bytes_and_gets_them_while_shadow_requests_are_held(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    async with gated_vllm() as (upstream, gate):
        async with running_proxy(proxy_settings(sqlite_url, upstream)) as plain:
            gate.passes = 1
            unshadowed = await post_chat(http, plain, PROD)
        async with running_proxy(proxy_settings(sqlite_url, upstream, **SHADOW)) as proxy:
            gate.passes = 1
            shadowed = await asyncio.wait_for(post_chat(http, proxy, PROD), timeout=5)
            assert not gate.opened.is_set()  # the answer did not wait for a shadow sample
            await eventually(lambda: gate.held == 3)
            gate.opened.set()
            await shadows_recorded(proxy, 3)

    assert shadowed == unshadowed


async def test_a_stream_is_shadowed_after_its_done_line(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    async with (
        gated_vllm() as (upstream, gate),
        running_proxy(proxy_settings(sqlite_url, upstream, **SHADOW)) as proxy,
    ):
        gate.passes = 1
        streamed = await asyncio.wait_for(post_chat(http, proxy, PROD, stream=True), 5)
        assert streamed.endswith(b"data: [DONE]\n\n")
        await eventually(lambda: gate.held == 3)
        gate.opened.set()
        await shadows_recorded(proxy, 3)
        await proxy.parts.settled()
        served, shadows = served_and_shadows(await proxy.parts.store.trajectories())
        await proxy.parts.settled()
        calls = await proxy.parts.store.calls([t.id for t in [*served, *shadows]])

    assert len(served) == 1 and len(shadows) == 3
    assert [call.stream for call in calls[served[0].id]] == [True]
    assert all([c.stream for c in calls[t.id]] == [False] for t in shadows)
    assert all(calls[t.id][0].request.get("stream") is False for t in shadows)
    assert all("stream_options" not in calls[t.id][0].request for t in shadows)


@pytest.mark.parametrize(
    ("overrides", "headers", "body"),
    [
        ({}, {}, {}),
        ({}, PROD, {"messages": [*TASK, {"role": "assistant", "content": "?"}, *TASK]}),
        ({}, PROD, {"tools": [WEATHER_TOOL]}),
        ({"shadow_fraction": 0.0}, PROD, {}),
    ],
    ids=["split-train", "conversation-under-way", "answer-calls-a-tool", "fraction-0"],
)
async def test_calls_that_do_not_qualify_are_not_shadowed(
    sqlite_url: str,
    vllm: FakeVllm,
    http: aiohttp.ClientSession,
    overrides: dict[str, Any],
    headers: dict[str, str],
    body: dict[str, Any],
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, **{**SHADOW, **overrides})
    async with running_proxy(settings) as proxy:
        await post_chat(http, proxy, headers, **body)
        await asyncio.sleep(0.2)  # time enough for shadow requests, were there any
        counters = proxy.parts.counters
        assert (counters.shadow_calls, counters.shadow_skipped) == (0, 0)
    assert len(vllm.requests) == 1


async def test_a_call_beyond_max_in_flight_is_skipped_and_counted(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(sqlite_url, "http://unused", **SHADOW, shadow_max_in_flight=1)
    async with gated_vllm() as (upstream, gate):
        settings = settings.model_copy(update={"upstream": [upstream]})
        async with running_proxy(settings) as proxy:
            gate.passes = 1
            await post_chat(http, proxy, PROD)
            await eventually(lambda: gate.held == 3)
            gate.passes = 1
            await post_chat(http, proxy, PROD, messages=[{"role": "user", "content": "Other"}])
            counters = proxy.parts.counters
            assert (counters.shadow_calls, counters.shadow_skipped) == (1, 1)
            gate.opened.set()
            await shadows_recorded(proxy, 3)
            await proxy.parts.settled()
            served, shadows = served_and_shadows(await proxy.parts.store.trajectories())

    assert len(served) == 2 and len(shadows) == 3
    assert gate.held == 3


async def test_stopping_the_proxy_with_shadow_samples_in_flight_is_clean(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    async with gated_vllm() as (upstream, gate):
        async with running_proxy(proxy_settings(sqlite_url, upstream, **SHADOW)) as proxy:
            gate.passes = 1
            await post_chat(http, proxy, PROD)
            await eventually(lambda: gate.held == 3)
            # Leaving the block stops the proxy while the gate still holds the samples.
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("shadow-")]
        assert proxy.parts.counters.shadow_samples == 0

    store = await TrajectoryStore.open(sqlite_url, writer=False)
    try:
        listed = await store.trajectories()
    finally:
        await store.aclose()
    assert [t.finish_reason for t in listed] == [None]  # a cut sample is not recorded


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--shadow-fraction", "1.5"), ("--shadow-samples", "0"), ("--default-split", "staging")],
)
async def test_bad_shadow_settings_are_a_one_line_error(flag: str, value: str) -> None:
    returncode, _, stderr = await run_cli("serve", flag, value)
    assert returncode != 0
    assert flag in the_error_line(stderr)
