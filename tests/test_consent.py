"""Consent: a call the policy or its caller keeps out is answered, and nothing of it is kept.

The proxy runs on loopback in front of the fake vLLM, over SQLite and PostgreSQL, with its journal
in the test's directory. Each unrecorded call carries a marker in its prompt; afterwards no
trajectory names it, no journal file, and no log line holds it, and a recorded call beside it is
recorded as usual. The OpenAI and Anthropic SDKs speak to the proxy as they would to the vendors,
the header set as their `default_headers` / `extra_headers`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings, trajectories

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
OFF = {"X-Art-Record": "off"}
ON = {"X-Art-Record": "on"}
CLIENT_LOGGERS = ("openai", "anthropic", "httpx", "httpcore")


def marked(marker: str) -> list[Any]:
    return [{"role": "user", "content": f"my account number is {marker}"}]


def journal_holds(journal: Path, marker: str) -> bool:
    needle = marker.encode()
    return any(needle in path.read_bytes() for path in journal.rglob("*") if path.is_file())


async def recorded_text(proxy: RunningProxy) -> str:
    """Every recorded call's request and response, as one text to search."""
    return repr(
        [(call.request, call.response) for t in await trajectories(proxy) for call in t.calls or []]
    )


async def calls_in_every_form(base_url: str, headers: dict[str, str], marker: str) -> None:
    """The marker sent as chat (whole and streamed), legacy completions, Responses and Messages."""
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="unused", default_headers=headers
    ) as client:
        await client.chat.completions.create(model=MODEL, messages=marked(marker))
        stream = await client.chat.completions.create(
            model=MODEL, messages=marked(marker), stream=True
        )
        async for _ in stream:
            pass
        await client.completions.create(model=MODEL, prompt=f"account {marker}", max_tokens=8)
        await client.responses.create(model=MODEL, input=f"account {marker}")
    async with anthropic.AsyncAnthropic(
        base_url=base_url.removesuffix("/v1"), api_key="unused", default_headers=headers
    ) as claude:
        await claude.messages.create(model=MODEL, max_tokens=16, messages=marked(marker))


async def test_a_call_that_says_off_is_answered_and_nothing_of_it_is_kept(
    store_url: str, vllm: FakeVllm, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = tmp_path / "journal"
    settings = proxy_settings(
        store_url, vllm.base_url, journal=str(journal), log_level="debug", shadow_fraction=1.0
    )
    with caplog.at_level(logging.DEBUG):
        async with running_proxy(settings) as proxy:
            await calls_in_every_form(proxy.base_url, OFF | {"X-Art-Split": "prod"}, "SECRET-4417")
            in_journal = journal_holds(journal, "SECRET-4417")
            await calls_in_every_form(proxy.base_url, {}, "KEPT-0001")
            recorded = await recorded_text(proxy)
            counters = proxy.parts.counters

    assert not in_journal
    assert "SECRET-4417" not in recorded and "KEPT-0001" in recorded
    assert not journal_holds(journal, "SECRET-4417")
    # The SDKs' own loggers aside: a client logs what it sends, at debug.
    leaked = {
        r.name
        for r in caplog.records
        if "SECRET-4417" in r.getMessage() and not r.name.startswith(CLIENT_LOGGERS)
    }
    assert leaked == set(), leaked
    assert (counters.unrecorded_calls, counters.calls, counters.shadow_calls) == (5, 5, 0)


@pytest.mark.parametrize(
    ("policy", "sent", "kept"),
    [
        ("all", {}, True),
        ("all", ON, True),
        ("all", {"X-Art-Record": " Off "}, False),
        ("consented", {}, False),
        ("consented", ON, True),
        ("consented", OFF, False),
        ("none", ON, False),
        ("none", {}, False),
    ],
)
async def test_the_record_policy_and_the_callers_consent_decide_together(
    sqlite_url: str,
    vllm: FakeVllm,
    http: aiohttp.ClientSession,
    policy: str,
    sent: dict[str, str],
    kept: bool,
) -> None:
    async with running_proxy(proxy_settings(sqlite_url, vllm.base_url, record=policy)) as proxy:
        async with http.post(
            f"{proxy.base_url}/chat/completions",
            json={"model": MODEL, "messages": marked("M-1")},
            headers=sent,
        ) as response:
            assert response.status == 200
            answer = await response.json()
        listed = await trajectories(proxy)

    assert answer["choices"][0]["message"]["content"]
    assert len(listed) == (1 if kept else 0)


async def test_a_consent_header_that_is_neither_on_nor_off_is_refused_and_not_recorded(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    async with http.post(
        f"{sqlite_proxy.base_url}/chat/completions",
        json={"model": MODEL, "messages": marked("M-2")},
        headers={"X-Art-Record": "maybe"},
    ) as response:
        status, body = response.status, await response.json()

    assert status == 400
    assert body["error"]["type"] == "BadRequestError"  # as vLLM names it
    assert "X-Art-Record must be on or off" in body["error"]["message"]
    assert await trajectories(sqlite_proxy) == []


async def test_a_later_recorded_turn_carries_the_conversation_its_client_sends(
    sqlite_url: str, vllm: FakeVllm
) -> None:
    """What the docs say of consent per call: the proxy keeps nothing of a call sent `off`, but
    the next call of the conversation carries its client's whole history, the earlier turn's
    words included, and is recorded unless it says `off` too."""
    async with (
        running_proxy(proxy_settings(sqlite_url, vllm.base_url)) as proxy,
        openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client,
    ):
        history = marked("UNRECORDED-TURN-5512")
        reply = await client.chat.completions.create(
            model=MODEL, messages=history, extra_headers=OFF
        )
        history += [reply.choices[0].message.model_dump(exclude_none=True), *marked("next")]
        await client.chat.completions.create(model=MODEL, messages=history, extra_headers=OFF)
        kept_out = await recorded_text(proxy)
        await client.chat.completions.create(model=MODEL, messages=history)
        recorded = await recorded_text(proxy)
    assert "UNRECORDED-TURN-5512" not in kept_out
    assert "UNRECORDED-TURN-5512" in recorded


async def test_a_call_that_says_off_is_answered_whatever_subject_headers_it_carries(
    sqlite_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Nothing of it is kept, so nothing is filed under a subject: its subject headers are not
    read (a recorded call with an unreadable one is refused)."""
    body = {"model": MODEL, "messages": marked("OFF-SUBJECT-7301")}
    async with http.post(
        f"{sqlite_proxy.base_url}/chat/completions",
        json=body,
        headers={**OFF, "X-Art-User": " ", "X-Art-Tenant": "tab\tbed"},
    ) as response:
        assert response.status == 200, await response.text()
    assert await trajectories(sqlite_proxy) == []
