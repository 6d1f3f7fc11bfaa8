"""Subjects: each trajectory is recorded under the user and tenant whose conversation it is.

From `X-Art-User` / `X-Art-Tenant`, else the request's own user field as the vendors define it
(OpenAI's `safety_identifier` and `user`, Anthropic's `metadata.user_id`), sent by the SDKs
themselves; filterable in the admin API, `art-proxy export` and the dashboard. Over SQLite and
PostgreSQL, the proxy in front of the fake vLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from multidict import CIMultiDict
from yarl import URL

from art_proxy.ids import new_id
from art_proxy.proxy import lookups
from art_proxy.proxy.server import RunningProxy
from tests.conftest import trajectories
from tests.test_export import export

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def task(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


async def test_the_subject_comes_from_the_headers_else_the_vendors_user_fields(
    proxy: RunningProxy,
) -> None:
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        await client.chat.completions.create(
            model=MODEL,
            messages=task("headers"),
            user="body-user",
            extra_headers={"X-Art-User": "alice", "X-Art-Tenant": "acme"},
        )
        await client.chat.completions.create(
            model=MODEL, messages=task("safety"), safety_identifier="bob", user="not-bob"
        )
        await client.chat.completions.create(model=MODEL, messages=task("legacy"), user="carol")
        await client.responses.create(model=MODEL, input="responses", safety_identifier="dave")
        await client.chat.completions.create(model=MODEL, messages=task("long"), user="x" * 300)
        await client.chat.completions.create(model=MODEL, messages=task("nobody"))
    async with anthropic.AsyncAnthropic(base_url=proxy.root_url, api_key="unused") as claude:
        await claude.messages.create(
            model=MODEL, max_tokens=16, messages=task("claude"), metadata={"user_id": "erin"}
        )
    by_opening = {
        (t.calls or [])[0].request["messages"][0]["content"]: (t.user_id, t.tenant_id)
        for t in await trajectories(proxy)
    }

    hashed, _ = by_opening.pop("long")
    assert hashed is not None and hashed.startswith("blake2b:") and len(hashed) < 200
    assert by_opening == {
        "headers": ("alice", "acme"),
        "safety": ("bob", None),
        "legacy": ("carol", None),
        "responses": ("dave", None),
        "nobody": (None, None),
        "claude": ("erin", None),
    }


async def test_a_later_call_stays_in_the_subject_that_opened_its_trajectory(
    proxy: RunningProxy,
) -> None:
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers={"X-Art-User": "alice"}
    ) as client:
        messages = task("two turns")
        reply = await client.chat.completions.create(model=MODEL, messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), *task("more")]
        await client.chat.completions.create(model=MODEL, messages=messages)

    [trajectory] = await trajectories(proxy)
    assert (trajectory.call_count, trajectory.user_id) == (2, "alice")


async def test_a_subject_header_the_store_cannot_keep_is_refused(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    for bad in ("", "x" * 201, "tab\tbed"):
        async with http.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": MODEL, "messages": task("bad subject")},
            headers={"X-Art-User": bad},
        ) as response:
            assert response.status == 400
            body = await response.json()
            assert "X-Art-User must be 1 to 200 printable characters" in body["error"]["message"]


async def test_the_api_export_and_dashboard_filter_by_user_and_tenant(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        for user, tenant in (("alice", "acme"), ("bob", "acme"), ("carol", "globex")):
            await client.chat.completions.create(
                model=MODEL,
                messages=task(f"task of {user}"),
                extra_headers={"X-Art-User": user, "X-Art-Tenant": tenant},
            )
    await proxy.parts.settled()
    listed = {}
    for query in ("user=alice", "tenant=acme", "user=nobody"):
        async with http.get(f"{proxy.root_url}/art/v1/trajectories?{query}") as response:
            listed[query] = sorted(t["user_id"] for t in (await response.json())["data"])
    exported = await asyncio.to_thread(
        export, "--store", proxy.parts.settings.store, "--tenant", "acme"
    )
    async with http.get(f"{proxy.root_url}/dashboard?user=carol") as response:
        page = await response.text()

    assert listed == {"user=alice": ["alice"], "tenant=acme": ["alice", "bob"], "user=nobody": []}
    assert exported.returncode == 0, exported.stderr
    users = sorted(
        json.loads(line)["trajectory"]["user_id"] for line in exported.stdout.splitlines()
    )
    assert users == ["alice", "bob"]
    assert "task of carol" in page and "task of alice" not in page
    assert "user <code>carol</code>" in page


async def test_two_users_whose_conversations_read_alike_stay_in_their_own_trajectories(
    proxy: RunningProxy,
) -> None:
    """The fake answers a question the same way every time: bob's second call extends alice's
    first call and reply word for word, and still is not stitched into her trajectory."""
    first: list[Any] = task("same question")
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        reply = await client.chat.completions.create(
            model=MODEL, messages=first, extra_headers={"X-Art-User": "alice"}
        )
        follow_up = [*first, reply.choices[0].message.model_dump(exclude_none=True), *task("more")]
        await client.chat.completions.create(
            model=MODEL, messages=follow_up, extra_headers={"X-Art-User": "bob"}
        )
        await client.chat.completions.create(
            model=MODEL, messages=follow_up, extra_headers={"X-Art-User": "alice"}
        )
    recorded = sorted((t.user_id, t.call_count) for t in await trajectories(proxy))

    assert recorded == [("alice", 2), ("bob", 1)]


async def test_a_call_naming_another_subjects_trajectory_is_refused_not_joined(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    alice = {"X-Art-User": "alice", "X-Art-Tenant": "acme"}
    async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
        opened = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=task("alice's secret"), extra_headers=alice
        )
        started = await client.responses.create(
            model=MODEL, input="alice's question", extra_headers=alice
        )
    await proxy.parts.settled()
    [theirs] = [t.id for t in await trajectories(proxy) if t.calls and "secret" in str(t.calls)]
    body = {"model": MODEL, "messages": task("bob's words")}
    bob = {"X-Art-User": "bob"}
    header = await http.post(
        f"{proxy.base_url}/chat/completions", json=body, headers={**bob, "X-Art-Trajectory": theirs}
    )
    url = await http.post(
        f"{proxy.root_url}/scenario/s/trajectory/{theirs}/v1/chat/completions",
        json=body,
        headers={"X-Art-User": "bob", "X-Art-Tenant": "globex"},
    )
    # A stored response is alice's too: to another subject it is not there (nothing is told of
    # it), and continuing from it would copy her conversation into his.
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers=bob
    ) as client:
        with pytest.raises(openai.BadRequestError, match="not found"):
            await client.responses.create(
                model=MODEL, input="bob's follow-up", previous_response_id=started.id
            )
    for reader in (bob, {"X-Art-User": "alice", "X-Art-Tenant": "globex"}, {}):
        read = await http.get(f"{proxy.base_url}/responses/{started.id}", headers=reader)
        assert read.status == 404, reader
    unrecorded = {"model": MODEL, "input": "and?", "previous_response_id": started.id}
    off = {**bob, "X-Art-Record": "off"}  # not recorded, still not his to continue
    async with http.post(f"{proxy.base_url}/responses", json=unrecorded, headers=off) as r:
        assert r.status == 400
    # Hers, and her tenant's application's, which names no user (a retrieve has no user field).
    for reader in (alice, {"X-Art-Tenant": "acme"}):
        read = await http.get(f"{proxy.base_url}/responses/{started.id}", headers=reader)
        assert read.status == 200, reader
    # Continued so, the call is hers, in her trajectory or (finished, as here) a new one: it
    # holds her conversation.
    [asked] = [t.id for t in await trajectories(proxy) if "alice's question" in str(t.calls)]
    async with http.post(f"{proxy.root_url}/art/v1/trajectories/{asked}/finish", json={}) as r:
        assert r.status == 200, await r.text()
    app = {"model": MODEL, "input": "the app goes on", "previous_response_id": started.id}
    async with http.post(
        f"{proxy.base_url}/responses", json=app, headers={"X-Art-Tenant": "acme"}
    ) as response:
        assert response.status == 200, await response.text()

    for refused in (header, url):
        assert refused.status == 409
        error = (await refused.json())["error"]
        assert "belongs to another user or tenant" in error["message"]
    assert opened.http_response.status_code == 200
    by_user: dict[str | None, list[str]] = {}
    for trajectory in await trajectories(proxy):
        for call in trajectory.calls or []:
            by_user.setdefault(trajectory.user_id, []).append(json.dumps(call.request))
    assert not any("bob" in request for request in by_user["alice"])
    assert any("bob's follow-up" in request for request in by_user["bob"])
    assert not any("alice" in request for request in by_user["bob"])
    assert any("the app goes on" in request for request in by_user["alice"])
    assert None not in by_user  # nothing of hers under no one


async def test_a_subject_header_sent_twice_is_refused_not_read_as_the_first(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Behind a gateway that appends its own X-Art-Tenant, the first value was the client's:
    taken, one tenant read another's answers."""
    for name in ("X-Art-Tenant", "X-Art-User"):
        twice = CIMultiDict([(name, "client-said"), (name, "gateway-said")])
        async with http.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": MODEL, "messages": task("whose?")},
            headers=twice,
        ) as response:
            assert response.status == 400, name
            assert f"{name} sent 2 times" in (await response.json())["error"]["message"]


async def test_a_tenant_header_alone_does_not_read_a_tenantless_users_answer(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    alice = {"X-Art-User": "alice"}
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers=alice
    ) as client:
        started = await client.responses.create(model=MODEL, input="alice's own question")
    readers: list[dict[str, str]] = [
        alice,
        {},
        {"X-Art-Tenant": "globex"},
        {"X-Art-Tenant": "globex", **alice},
    ]
    statuses = []
    for reader in readers:
        async with http.get(f"{proxy.base_url}/responses/{started.id}", headers=reader) as read:
            statuses.append(read.status)
    assert statuses == [200, 200, 404, 404]


async def test_another_subjects_response_id_reads_as_a_made_up_one_in_time_too(
    proxy: RunningProxy, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh id not in the store is awaited (it may be another proxy's, on its way); another
    subject's was refused at once, which told that it exists. Both now take the wait."""
    monkeypatch.setattr(lookups, "OTHER_PROXY_WAIT_S", 0.5)
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers={"X-Art-User": "alice"}
    ) as client:
        started = await client.responses.create(model=MODEL, input="alice's question")
    waited = {}
    for name, response_id in (("hers", started.id), ("made up", f"resp_{new_id()}")):
        began = time.monotonic()
        async with http.get(
            f"{proxy.base_url}/responses/{response_id}", headers={"X-Art-User": "bob"}
        ) as read:
            assert read.status == 404
            assert (await read.json())["error"]["message"] == f"no response with id {response_id!r}"
        waited[name] = time.monotonic() - began
    assert min(waited.values()) >= 0.5, waited


async def test_a_nul_in_a_response_id_is_no_response_not_a_server_error(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """PostgreSQL refuses a NUL in text: looked up, the id was a 500."""
    read = await http.get(URL(f"{proxy.base_url}/responses/resp_0%00x", encoded=True))
    assert read.status == 404, await read.text()
    body = {"model": MODEL, "input": "go on", "previous_response_id": "resp_0\x00x"}
    async with http.post(f"{proxy.base_url}/responses", json=body) as continued:
        assert continued.status == 400, await continued.text()
        assert "not found" in (await continued.json())["error"]["message"]


async def test_continuing_another_subjects_response_reads_as_a_made_up_id_in_text_and_time(
    proxy: RunningProxy, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`previous_response_id` of another subject's answer: its conversation was looked up and
    the body's later fields checked before the owner was, so a body with a bad field after it
    answered that field's error (the id exists) where a made-up id answered "not found"; and it
    was refused at once where a made-up fresh id is awaited. Both now answer alike, as late."""
    monkeypatch.setattr(lookups, "OTHER_PROXY_WAIT_S", 0.5)
    async with openai.AsyncOpenAI(
        base_url=proxy.base_url, api_key="unused", default_headers={"X-Art-User": "alice"}
    ) as client:
        started = await client.responses.create(model=MODEL, input="alice's question")
    bob = {"X-Art-User": "bob"}
    answers: dict[tuple[str, str, str], tuple[int, str, float]] = {}
    for name, response_id in (("hers", started.id), ("made up", f"resp_{new_id()}")):
        for body_name, extra in (("good", {"input": "go on"}), ("bad input", {"input": []})):
            for path in ("/responses", "/responses/input_tokens"):
                body = {"model": MODEL, "previous_response_id": response_id, **extra}
                began = time.monotonic()
                async with http.post(f"{proxy.base_url}{path}", json=body, headers=bob) as sent:
                    message = (await sent.json())["error"]["message"]
                    answers[name, body_name, path] = (
                        sent.status,
                        message.replace(response_id, "ID"),
                        time.monotonic() - began,
                    )
    for (name, body_name, path), (status, message, waited) in answers.items():
        assert (status, message) == answers["made up", body_name, path][:2], (name, path)
        assert status == 400 and message == "previous response with id 'ID' not found"
        assert waited >= 0.5, (name, body_name, path, waited)
