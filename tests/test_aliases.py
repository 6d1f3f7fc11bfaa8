"""Model aliases: agents call a stable name, the upstream serves the adapter the alias points at.

The trainer loads `<alias>@<step>` into every upstream, then moves the alias with
`PUT /art/v1/aliases/{alias}`; from then on the proxy sends the alias's calls upstream as the
adapter. The record keeps what the client asked for and what was served.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from art_proxy.proxy import upstream_models
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import TrainingStep
from art_proxy.store.trajectory_store import utcnow
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings
from tests.wire_client import admin_get, post, stream_events

BASE = "Qwen/Qwen2.5-0.5B-Instruct"
ALIAS = "email-agent"
ADMIN_KEY = "sk-admin-alias-5e7a1c"


async def load_adapter(http: aiohttp.ClientSession, vllm: FakeVllm, name: str, path: Path) -> None:
    """What the trainer does before it moves an alias: load the adapter into the upstream."""
    status, body = await post(
        http, f"{vllm.base_url}/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
    )
    assert status == 200, body


async def put_alias(
    http: aiohttp.ClientSession,
    proxy: RunningProxy,
    body: Any,
    alias: str = ALIAS,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with http.put(
        f"{proxy.root_url}/art/v1/aliases/{alias}", json=body, headers=headers or {}
    ) as response:
        return response.status, await response.json()


def chat_body(content: str = "Sort my inbox") -> dict[str, Any]:
    return {"model": ALIAS, "messages": [{"role": "user", "content": content}], "max_tokens": 8}


async def test_alias_rewrites_model_for_chat_and_completions_stream_and_not(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await load_adapter(http, vllm, f"{ALIAS}@1", tmp_path)
    status, _ = await put_alias(http, proxy, {"model": f"{ALIAS}@1", "step": 1, "reason": "swap"})
    assert status == 200

    completion = {"model": ALIAS, "prompt": "Sort my inbox", "max_tokens": 8}
    answered = [
        await post(http, f"{proxy.base_url}/chat/completions", chat_body()),
        await post(http, f"{proxy.base_url}/completions", completion),
    ]
    streamed = [
        await stream_events(http, f"{proxy.base_url}/chat/completions", chat_body()),
        await stream_events(http, f"{proxy.base_url}/completions", completion),
    ]

    assert [request["model"] for request in vllm.requests] == [f"{ALIAS}@1"] * 4
    assert [body["model"] for status, body in answered] == [f"{ALIAS}@1"] * 2
    assert all(status == 200 for status, _ in answered)
    assert {event["model"] for events in streamed for event in events[:-1]} == {f"{ALIAS}@1"}
    # Nothing but the model changes on the way up.
    sent = vllm.requests[0]
    assert sent["messages"] == chat_body()["messages"] and sent["max_tokens"] == 8


async def test_alias_at_step_0_names_the_base_model_the_alias_hides(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """`ALIAS@0`: the base model under the alias (what `art-proxy eval --model base` runs), even
    for an alias named after the base model, which otherwise hides it."""
    base = vllm.config.model
    for alias in (ALIAS, base):
        await load_adapter(http, vllm, f"{alias}@1", tmp_path)
        status, _ = await put_alias(http, proxy, {"model": f"{alias}@1", "step": 1}, alias)
        assert status == 200
        for model, upstream in ((alias, f"{alias}@1"), (f"{alias}@0", base)):
            status, body = await post(
                http, f"{proxy.base_url}/chat/completions", {**chat_body(), "model": model}
            )
            assert status == 200, body
            assert vllm.requests[-1]["model"] == upstream
    status, body = await post(
        http, f"{proxy.base_url}/chat/completions", {**chat_body(), "model": "not-an-alias@0"}
    )
    assert status == 404 and vllm.requests[-1]["model"] == "not-an-alias@0"  # no alias: as sent


async def test_the_record_keeps_the_clients_model_and_the_served_one(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await load_adapter(http, vllm, f"{ALIAS}@3", tmp_path)
    await put_alias(http, proxy, {"model": f"{ALIAS}@3", "step": 3})
    headers = {"X-Art-Trajectory": "t-alias"}
    async with http.post(
        f"{proxy.base_url}/chat/completions", json=chat_body(), headers=headers
    ) as response:
        assert response.status == 200
    async with http.post(
        f"{proxy.base_url}/chat/completions", json={**chat_body(), "model": BASE}, headers=headers
    ) as response:
        assert response.status == 200

    calls = (await admin_get(http, proxy, "/trajectories/t-alias"))["calls"]
    assert [(c["request"]["model"], c["model"]) for c in calls] == [
        (ALIAS, f"{ALIAS}@3"),
        (BASE, BASE),
    ]


async def test_alias_moves_are_recorded_with_previous_model_step_reason_and_evidence(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await put_alias(http, proxy, {"model": BASE})
    await put_alias(http, proxy, {"model": f"{ALIAS}@1", "step": 1, "reason": "swap"})
    note = "val 0.71 >= 0.62 (email-agent@1)"
    status, moved = await put_alias(
        http, proxy, {"model": f"{ALIAS}@2", "step": 2, "reason": "promote", "note": note}
    )
    assert status == 200
    assert (moved["model"], moved["previous"], moved["step"]) == (f"{ALIAS}@2", f"{ALIAS}@1", 2)

    moves = (await admin_get(http, proxy, f"/alias_moves?alias={ALIAS}"))["data"]
    assert [(m["model"], m["previous"], m["step"], m["reason"], m["note"]) for m in moves] == [
        (f"{ALIAS}@2", f"{ALIAS}@1", 2, "promote", note),
        (f"{ALIAS}@1", BASE, 1, "swap", None),
        (BASE, None, None, "manual", None),
    ]
    assert len((await admin_get(http, proxy, "/alias_moves?limit=1"))["data"]) == 1
    listed = (await admin_get(http, proxy, "/aliases"))["data"]
    assert [(a["alias"], a["model"], a["step"]) for a in listed] == [(ALIAS, f"{ALIAS}@2", 2)]


async def test_aliases_survive_a_proxy_restart(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await load_adapter(http, vllm, f"{ALIAS}@1", tmp_path)
    settings = proxy_settings(store_url, vllm.base_url)
    async with running_proxy(settings) as first:
        await put_alias(http, first, {"model": f"{ALIAS}@1", "step": 1})
    async with running_proxy(settings) as second:
        status, body = await post(http, f"{second.base_url}/chat/completions", chat_body())
    assert status == 200 and body["model"] == f"{ALIAS}@1"


async def test_a_second_proxy_on_the_store_follows_a_move_within_seconds(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await load_adapter(http, vllm, f"{ALIAS}@1", tmp_path)
    settings = proxy_settings(store_url, vllm.base_url)
    async with running_proxy(settings) as mover, running_proxy(settings) as follower:
        await put_alias(http, mover, {"model": f"{ALIAS}@1", "step": 1})
        deadline = time.monotonic() + 5.0
        while follower.parts.aliases.resolve(ALIAS) != f"{ALIAS}@1":
            assert time.monotonic() < deadline, "the second proxy never saw the move"
            await asyncio.sleep(0.05)
        status, body = await post(http, f"{follower.base_url}/chat/completions", chat_body())
    assert status == 200 and body["model"] == f"{ALIAS}@1"


async def test_models_lists_each_alias_the_upstream_lacks(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await put_alias(http, proxy, {"model": BASE})
    await put_alias(http, proxy, {"model": BASE}, alias=BASE)  # the upstream lists it already
    async with http.get(f"{proxy.base_url}/models") as response:
        cards = (await response.json())["data"]
    assert [card["id"] for card in cards] == [BASE, ALIAS]
    assert cards[1] == {"id": ALIAS, "object": "model", "owned_by": "art-proxy", "root": BASE}


@pytest.mark.parametrize(
    "body",
    [
        {"model": ""},
        {"step": 3},
        {"model": "m", "reason": "whim"},
        {"model": "m", "extra": 1},
        {"model": "m", "note": "x" * 501},
        ["m"],
    ],
)
async def test_a_bad_alias_body_is_an_openai_shaped_400(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession, body: Any
) -> None:
    status, answer = await put_alias(http, sqlite_proxy, body)
    assert status == 400
    assert answer["error"]["type"] == "BadRequestError" and answer["error"]["code"] == 400
    assert (await admin_get(http, sqlite_proxy, "/aliases"))["data"] == []


async def test_alias_routes_need_the_admin_key(
    sqlite_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(sqlite_url, vllm.base_url, admin_key=ADMIN_KEY)
    async with running_proxy(settings) as proxy:
        status, _ = await put_alias(http, proxy, {"model": BASE})
        assert status == 401
        for path in ("/aliases", "/alias_moves", "/training_steps"):
            async with http.get(f"{proxy.root_url}/art/v1{path}") as response:
                assert response.status == 401
        status, _ = await put_alias(
            http, proxy, {"model": BASE}, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert status == 200


async def test_training_steps_are_read_back_oldest_first_per_run(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    store = proxy.parts.store
    for run, step in (("run-a", 1), ("run-b", 1), ("run-a", 2)):
        await store.record_step(
            TrainingStep(
                run=run, step=step, status="applied", metrics={"loss": 0.5}, created_at=utcnow()
            )
        )
    steps = (await admin_get(http, proxy, "/training_steps?run=run-a"))["data"]
    assert [(s["run"], s["step"], s["metrics"]) for s in steps] == [
        ("run-a", 1, {"loss": 0.5}),
        ("run-a", 2, {"loss": 0.5}),
    ]
    assert len((await admin_get(http, proxy, "/training_steps"))["data"]) == 3
    assert len((await admin_get(http, proxy, "/training_steps?limit=1"))["data"]) == 1


async def served_by(
    http: aiohttp.ClientSession, proxy: RunningProxy, trajectory: str, content: str
) -> str:
    """What served one call of `trajectory` to the alias (the model the upstream was sent)."""
    headers = {"X-Art-Trajectory": trajectory}
    async with http.post(
        f"{proxy.base_url}/chat/completions", json=chat_body(content), headers=headers
    ) as response:
        assert response.status == 200, await response.text()
        return str((await response.json())["model"])


async def test_a_trajectory_keeps_the_adapter_of_its_first_call_across_two_alias_moves(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """An episode is one policy's: `kept`'s calls stay on step 1's adapter while the alias
    moves to 2 and 3; a trajectory begun after a move gets the alias's target then."""
    served: dict[str, list[str]] = {"kept": [], "later": [], "last": []}
    for step in (1, 2, 3):
        await load_adapter(http, vllm, f"{ALIAS}@{step}", tmp_path)
        status, _ = await put_alias(http, proxy, {"model": f"{ALIAS}@{step}", "step": step})
        assert status == 200
        served["kept"].append(await served_by(http, proxy, "kept", f"turn {step}"))
        if step >= 2:
            served["later"].append(await served_by(http, proxy, "later", f"turn {step}"))
    served["last"].append(await served_by(http, proxy, "last", "turn 1"))
    await proxy.parts.settled()
    leases = await admin_get(http, proxy, "/leases")
    async with http.get(f"{proxy.root_url}/health") as response:
        health = await response.json()

    assert served == {
        "kept": [f"{ALIAS}@1"] * 3,
        "later": [f"{ALIAS}@2"] * 2,
        "last": [f"{ALIAS}@3"],
    }
    assert [(lease["model"], lease["trajectories"]) for lease in leases["data"]] == [
        (f"{ALIAS}@1", 1),
        (f"{ALIAS}@2", 1),
        (f"{ALIAS}@3", 1),
    ]
    assert health["leases"] == {
        "held": {f"{ALIAS}@1": 1, f"{ALIAS}@2": 1, f"{ALIAS}@3": 1},
        "broken": 0,
    }


async def test_a_lease_on_an_adapter_no_longer_served_moves_to_the_alias(
    store_url: str,
    vllm: FakeVllm,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upstream lost step 1's adapter (a restart, an operator): the trajectory on it goes on
    with what the alias serves, and the break is counted."""
    monkeypatch.setattr(upstream_models, "WATCH_PERIOD_S", 0.05)
    async with running_proxy(proxy_settings(store_url, vllm.base_url)) as proxy:
        for step in (1, 2):
            await load_adapter(http, vllm, f"{ALIAS}@{step}", tmp_path)
        await put_alias(http, proxy, {"model": f"{ALIAS}@1", "step": 1})
        first = await served_by(http, proxy, "moved", "turn 1")
        await put_alias(http, proxy, {"model": f"{ALIAS}@2", "step": 2})
        status, _ = await post(
            http, f"{vllm.base_url}/unload_lora_adapter", {"lora_name": f"{ALIAS}@1"}
        )
        assert status == 200
        await asyncio.sleep(0.5)  # the proxy's watch asks the upstream what it serves
        second = await served_by(http, proxy, "moved", "turn 2")
        broken = proxy.parts.tracker.lease_counters.broken
    assert (first, second, broken) == (f"{ALIAS}@1", f"{ALIAS}@2", 1)
