"""Attribution and lifecycle: URL prefix, headers, automatic stitching, groups, finishing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import pytest

from art_proxy.config import ProxySettings
from art_proxy.proxy import groups, open_trajectories
from art_proxy.proxy.attribution import as_sampled
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import ScenarioSplit
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from art_proxy.store.writer import Batch
from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy_integrations import attribution_headers, scenario_base_url
from tests.conftest import proxy_settings
from tests.store_rows import call_row, group_row, scenario_row, trajectory_row
from tests.wire_client import admin_get

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


async def chat(
    http: aiohttp.ClientSession,
    base_url: str,
    messages: list[dict[str, Any]],
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    async with http.post(
        f"{base_url}/chat/completions",
        json={"model": MODEL, "messages": messages},
        headers=headers or {},
    ) as response:
        assert response.status == 200, await response.text()
        body: dict[str, Any] = await response.json()
        return body


def continued(
    messages: list[dict[str, Any]], reply: dict[str, Any], user: str
) -> list[dict[str, Any]]:
    return [*messages, reply["choices"][0]["message"], {"role": "user", "content": user}]


async def test_url_prefix_names_scenario_and_trajectory(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    base = scenario_base_url(proxy.root_url, "inbox-42", trajectory="run-7")
    await chat(http, base, [{"role": "user", "content": "one"}])
    await chat(http, base, [{"role": "user", "content": "an unrelated second call"}])
    trajectory = await admin_get(http, proxy, "/trajectories/run-7")
    assert trajectory["scenario_id"] == "inbox-42"
    assert [call["attribution"] for call in trajectory["calls"]] == ["url", "url"]
    assert trajectory["call_count"] == 2


async def test_url_prefix_wins_over_headers(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    base = scenario_base_url(proxy.root_url, "from-url")
    await chat(
        http,
        base,
        [{"role": "user", "content": "hi"}],
        headers=attribution_headers(scenario="from-header", split="val"),
    )
    listed = await admin_get(http, proxy, "/trajectories?scenario=from-url")
    assert len(listed["data"]) == 1 and listed["data"][0]["split"] == "val"


async def test_headers_attribute_scenario_trajectory_and_split(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    headers = attribution_headers(scenario="email-3", trajectory="t-1", split="val")
    await chat(http, proxy.base_url, [{"role": "user", "content": "hi"}], headers)
    listed = await admin_get(http, proxy, "/trajectories?split=val")
    assert [(t["id"], t["scenario_id"]) for t in listed["data"]] == [("t-1", "email-3")]
    assert (await admin_get(http, proxy, "/trajectories?split=train"))["data"] == []


async def test_same_opening_is_one_scenario_and_different_opening_another(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    for content in ("task A", "task A", "task B"):
        await chat(http, proxy.base_url, [{"role": "user", "content": content}])
    scenarios = (await admin_get(http, proxy, "/scenarios"))["data"]
    assert len(scenarios) == 2
    assert all(s["auto"] and s["id"].startswith("auto-") for s in scenarios)
    groups = (await admin_get(http, proxy, "/groups"))["data"]
    assert sorted(g["size"] for g in groups) == [1, 2]


async def test_group_size_starts_a_new_group_when_full(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    async with running_proxy(proxy_settings(store_url, vllm.base_url, group_size=2)) as proxy:
        for _ in range(5):
            await chat(http, proxy.base_url, [{"role": "user", "content": "same task"}])
        groups = (await admin_get(http, proxy, "/groups"))["data"]
    assert sorted(g["size"] for g in groups) == [1, 2, 2]


def test_the_refresh_forgets_exactly_the_groups_no_trajectory_can_join(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = 1000.0
    monkeypatch.setattr("art_proxy.proxy.groups.time.monotonic", lambda: now)
    held = groups.Groups(None, size=2, window=10.0, max_explicit=10)  # type: ignore[arg-type]
    held.join_automatic(("open", "train"), "t1")
    closed = held.join_automatic(("closed", "train"), "t2")
    held.member_finished(("closed", "train"), "t2")
    held.join_automatic(("full", "train"), "t3")
    held.join_automatic(("full", "train"), "t4")
    held.refresh([])
    assert len(held) == 2  # the full one is gone; the closed one is joinable for its window
    assert held.join_automatic(("closed", "train"), "t5") == closed
    held.member_finished(("closed", "train"), "t5")
    now += 11.0
    held.refresh([])
    assert len(held) == 1  # the closed one's window passed; the open one stays
    now += 1000.0
    held.refresh([])
    assert len(held) == 1
    held.member_finished(("open", "train"), "t1")
    elsewhere = {"id": "g-9", "scenario_id": "other", "split": "train", "size": 1, "open_count": 1}
    held.refresh([elsewhere])  # another proxy's open member: joinable here for a window
    assert held.join_automatic(("other", "train"), "t6") == "g-9"
    held.member_finished(("other", "train"), "t6")
    now += 11.0
    held.refresh([])
    assert len(held) == 0


def test_the_refresh_looks_only_at_the_groups_whose_window_has_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With thousands of new trajectories a second, memory lets go of thousands of open ones a
    second, and their groups wait out the window: a refresh looked at each of them every second."""
    now = 1000.0
    monkeypatch.setattr("art_proxy.proxy.groups.time.monotonic", lambda: now)
    held = groups.Groups(None, size=0, window=60.0, max_explicit=10)  # type: ignore[arg-type]
    for n in range(1000):
        held.join_automatic((f"s{n}", "train"), f"t{n}")
        held.member_finished((f"s{n}", "train"), f"t{n}")
        now += 0.01  # ten seconds of them
    looked_at: list[bool] = []
    joinable = held._joinable
    monkeypatch.setattr(held, "_joinable", lambda group: looked_at.append(joinable(group)))
    now = 1059.0
    held.refresh([])
    assert looked_at == [] and len(held) == 1000  # no window has ended yet
    now = 1064.995
    held.refresh([])
    assert len(looked_at) == 500 and len(held) == 500  # the first five seconds' windows ended


async def test_finish_records_reward_metrics_and_metadata(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await chat(
        http, proxy.base_url, [{"role": "user", "content": "hi"}], {"X-Art-Trajectory": "t-9"}
    )
    async with http.post(
        f"{proxy.root_url}/art/v1/trajectories/t-9/finish",
        json={"reward": 0.75, "metrics": {"steps": 3}, "metadata": {"answer": "42"}},
    ) as response:
        assert response.status == 200
        finished = await response.json()
    assert finished["status"] == "finished" and finished["finish_reason"] == "client"
    assert finished["reward"] == 0.75 and finished["metrics"] == {"steps": 3.0}
    assert finished["metadata"] == {"answer": "42"}
    groups = (await admin_get(http, proxy, "/groups"))["data"]
    assert groups[0]["open_count"] == 0


async def test_finished_trajectory_is_not_continued_automatically(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    messages = [{"role": "user", "content": "hi"}]
    reply = await chat(http, proxy.base_url, messages)
    first = (await admin_get(http, proxy, "/trajectories"))["data"][0]["id"]
    async with http.post(f"{proxy.root_url}/art/v1/trajectories/{first}/finish") as response:
        assert response.status == 200
    await chat(http, proxy.base_url, continued(messages, reply, "again"))
    ids = {t["id"] for t in (await admin_get(http, proxy, "/trajectories"))["data"]}
    assert len(ids) == 2


async def test_idle_trajectories_finish_after_the_timeout(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    async with running_proxy(proxy_settings(store_url, vllm.base_url, idle_timeout=0.3)) as proxy:
        await chat(http, proxy.base_url, [{"role": "user", "content": "hi"}])
        for _ in range(50):
            listed = (await admin_get(http, proxy, "/trajectories"))["data"]
            if listed[0]["status"] == "finished":
                break
            await asyncio.sleep(0.1)
        assert listed[0]["status"] == "finished" and listed[0]["finish_reason"] == "idle"
        assert proxy.parts.tracker.open_count == 0


async def test_two_proxies_on_one_store_stitch_one_conversation(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    """Proxies are stateless: the second call may reach another replica behind a balancer."""
    settings = proxy_settings(store_url, vllm.base_url)
    async with running_proxy(settings) as first, running_proxy(settings) as second:
        messages = [{"role": "user", "content": "load-balanced"}]
        reply = await chat(http, first.base_url, messages)
        messages = continued(messages, reply, "next")
        # Another proxy knows a call once it is ingested (its proxy knows it at once).
        await first.parts.settled()
        reply = await chat(http, second.base_url, messages)
        await second.parts.settled()
        await chat(http, first.base_url, continued(messages, reply, "last"))
        listed = (await admin_get(http, first, "/trajectories"))["data"]
        assert len(listed) == 1
        await first.parts.settled()
        whole = await first.parts.store.trajectory(listed[0]["id"])
    assert whole is not None and whole.calls is not None
    assert [call.seq for call in whole.calls] == [0, 1, 2]
    assert [call.stitched for call in whole.calls] == [False, True, True]


async def test_two_proxies_on_one_store_follow_an_agent_that_writes_its_calls_as_text(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    """smolagents' way: the reply's tool call comes back as text, its result as a user message.
    The proxy that serves the next call recognises it by the last call's messages, whichever
    proxy served that one, and forwards the call as the model wrote it (stitched); of two
    identical runs, each continues its own."""
    settings = proxy_settings(store_url, vllm.base_url)
    tools = [{"type": "function", "function": {"name": "look", "parameters": {}}}]
    opening = [{"role": "user", "content": "re-rendered"}]
    async with running_proxy(settings) as first, running_proxy(settings) as second:
        replies = []
        for _ in range(2):
            async with http.post(
                f"{first.base_url}/chat/completions",
                json={"model": MODEL, "messages": opening, "tools": tools},
            ) as response:
                replies.append((await response.json())["choices"][0]["message"])
        await first.parts.settled()
        for reply in reversed(replies):  # the newer run first: ids, not order, decide
            as_text = f"Calling tools:\n{[dict(call) for call in reply['tool_calls']]!r}"
            echoed = [
                *opening,
                {"role": "assistant", "content": as_text},
                {"role": "user", "content": "Observation: done"},
            ]
            async with http.post(
                f"{second.base_url}/chat/completions",
                json={"model": MODEL, "messages": echoed, "tools": tools},
            ) as response:
                assert response.status == 200, await response.text()
        await second.parts.settled()
        calls = [
            call
            for summary in await first.parts.store.trajectories()
            if (whole := await first.parts.store.trajectory(summary.id)) is not None
            for call in whole.calls or []
        ]
    by_trajectory: dict[str, list[Any]] = {}
    for call in calls:
        by_trajectory.setdefault(call.trajectory_id, []).append(call)
    assert len(by_trajectory) == 2
    for first_call, second_call in (sorted(c, key=lambda c: c.seq) for c in by_trajectory.values()):
        assert (second_call.attribution, second_call.stitched) == ("continuation", True)
        tool_call_id = first_call.response["choices"][0]["message"]["tool_calls"][0]["id"]
        assert tool_call_id in second_call.request["messages"][1]["content"]


async def a_call_before_a_restart(
    http: aiohttp.ClientSession, settings: ProxySettings, headers: dict[str, str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A trajectory's first call through a proxy that then stops: its messages and reply."""
    messages = [{"role": "user", "content": "before restart"}]
    async with running_proxy(settings) as proxy:
        return messages, await chat(http, proxy.base_url, messages, headers)


async def test_explicit_trajectory_survives_a_proxy_restart(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(store_url, vllm.base_url)
    headers = {"X-Art-Trajectory": "long-run"}
    messages, reply = await a_call_before_a_restart(http, settings, headers)
    async with running_proxy(settings) as proxy:
        await chat(http, proxy.base_url, continued(messages, reply, "after"), headers)
        await proxy.parts.settled()
        whole = await proxy.parts.store.trajectory("long-run")
    assert whole is not None and whole.calls is not None
    assert [call.seq for call in whole.calls] == [0, 1]
    assert whole.calls[1].stitched


async def test_two_calls_at_once_naming_a_trajectory_only_the_store_knows_get_two_seqs(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    """After a restart, two calls of one trajectory arrive together: each looked it up in the
    store, and each made its own copy in memory, so both took seq 1 and the store set one aside
    (seen under load in the fuzz test)."""
    settings = proxy_settings(store_url, vllm.base_url)
    headers = {"X-Art-Trajectory": "twice"}
    messages, reply = await a_call_before_a_restart(http, settings, headers)
    async with running_proxy(settings) as proxy:
        await asyncio.gather(
            *(
                chat(http, proxy.base_url, continued(messages, reply, f"after {n}"), headers)
                for n in (1, 2)
            )
        )
        await proxy.parts.settled()
        whole = await proxy.parts.store.trajectory("twice")
        rejected = proxy.parts.ingester.state.rejected if proxy.parts.ingester else 0
    assert whole is not None and whole.calls is not None
    assert sorted(call.seq for call in whole.calls) == [0, 1, 2]
    assert rejected == 0


async def test_trajectory_stays_on_one_upstream(
    sqlite_url: str, http: aiohttp.ClientSession
) -> None:
    from art_proxy.testing.fake_vllm import running_fake_vllm

    async with running_fake_vllm() as one, running_fake_vllm() as two:
        settings = proxy_settings(sqlite_url, [one.base_url, two.base_url])
        async with running_proxy(settings) as proxy:
            for run in range(4):
                messages = [{"role": "user", "content": f"run {run}"}]
                for turn in range(3):
                    reply = await chat(http, proxy.base_url, messages)
                    messages = continued(messages, reply, f"turn {turn}")
        assert len(one.requests) == len(two.requests) == 6
        for fake in (one, two):
            # Each upstream saw whole conversations: every run there has all three turns.
            assert sorted(len(r["messages"]) for r in fake.requests) == [1, 1, 3, 3, 5, 5]


async def test_identical_sibling_conversations_stay_separate_trajectories(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Rollouts that happen to say the same thing still continue their own trajectory each."""

    async def run() -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "same words"}]
        for turn in range(3):
            reply = await chat(http, proxy.base_url, messages)
            messages = continued(messages, reply, f"turn {turn}")

    await asyncio.gather(*(run() for _ in range(4)))
    listed = (await admin_get(http, proxy, "/trajectories"))["data"]
    assert sorted(t["call_count"] for t in listed) == [3, 3, 3, 3]
    assert len({t["group_id"] for t in listed}) == 1


async def test_a_failed_call_leaves_the_trajectory_continuable_by_a_retry(
    store_url: str, http: aiohttp.ClientSession
) -> None:
    from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm

    async with running_fake_vllm(FakeVllmConfig()) as vllm:
        settings = proxy_settings(store_url, vllm.base_url)
        async with running_proxy(settings) as proxy:
            messages = [{"role": "user", "content": "retry me"}]
            reply = await chat(http, proxy.base_url, messages)
            messages = continued(messages, reply, "next")
            bad = {"model": "no-such-model", "messages": messages}
            async with http.post(f"{proxy.base_url}/chat/completions", json=bad) as response:
                assert response.status == 404
            await chat(http, proxy.base_url, messages)
            listed = (await admin_get(http, proxy, "/trajectories"))["data"]
            assert len(listed) == 1 and listed[0]["call_count"] == 3
            await proxy.parts.settled()
            whole = await proxy.parts.store.trajectory(listed[0]["id"])
    assert whole is not None and whole.calls is not None
    assert [c.status for c in whole.calls] == ["ok", "upstream_error", "ok"]
    assert whole.calls[2].stitched


async def test_siblings_on_two_proxies_join_one_group_once_the_store_is_merged(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(store_url, vllm.base_url)
    async with running_proxy(settings) as first, running_proxy(settings) as second:
        await chat(http, first.base_url, [{"role": "user", "content": "shared task"}])
        await first.parts.settled()
        groups = await first.parts.store.active_groups(utcnow() - timedelta(seconds=5))
        second.parts.tracker.groups.refresh(groups)  # what housekeeping does every second
        await chat(http, second.base_url, [{"role": "user", "content": "shared task"}])
        await second.parts.settled()  # first's /art/v1 waits for first's records only
        listed = (await admin_get(http, first, "/groups"))["data"]
    assert [group["size"] for group in listed] == [2]


async def test_trajectories_dropped_from_memory_are_continued_from_the_store(
    proxy: RunningProxy, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(open_trajectories, "MAX_TRAJECTORIES_IN_MEMORY", 2)
    conversations = [[{"role": "user", "content": f"conversation {n}"}] for n in range(5)]
    for index, messages in enumerate(conversations):
        reply = await chat(http, proxy.base_url, messages)
        conversations[index] = continued(messages, reply, "next")
    assert proxy.parts.tracker.open_count == 2
    for messages in conversations:
        await chat(http, proxy.base_url, messages)
    listed = (await admin_get(http, proxy, "/trajectories"))["data"]
    assert sorted(t["call_count"] for t in listed) == [2] * 5


async def test_a_val_run_and_a_train_run_of_one_opening_are_never_siblings(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Else the group takes the lower split, and the trainer trains on validation data."""
    opening = [{"role": "user", "content": "the same question"}]
    splits: tuple[ScenarioSplit, ...] = ("val", "train", "val")
    for split in splits:
        await chat(http, proxy.base_url, opening, attribution_headers(split=split))
    await proxy.parts.settled()
    trajectories = await proxy.parts.store.trajectories()
    groups: dict[str, set[str]] = {}
    for trajectory in trajectories:
        groups.setdefault(trajectory.group_id, set()).add(trajectory.split)
    assert sorted(map(sorted, groups.values())) == [["train"], ["val"]]
    assert len({trajectory.scenario_id for trajectory in trajectories}) == 1


async def test_a_group_mixing_splits_is_offered_to_the_trainer_as_val_only(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    opening = [{"role": "user", "content": "the same question"}]
    splits: tuple[ScenarioSplit, ...] = ("train", "val", "train")
    for number, split in enumerate(splits):
        headers = {**attribution_headers(split=split), "X-Art-Group": "mixed"}
        await chat(http, proxy.base_url, opening, {**headers, "X-Art-Trajectory": f"t{number}"})
        await http.post(
            proxy.root_url + f"/art/v1/trajectories/t{number}/finish", json={"reward": number}
        )
    await proxy.parts.settled()
    [group] = await proxy.parts.store.trainable_groups("run", source="finish")
    assert group.group_id == "mixed" and group.split == "val"


async def test_openings_after_one_assistant_greeting_are_different_scenarios(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    greeting = [
        {"role": "system", "content": "You are the shop's assistant."},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ]
    for request in ("Refund order 17", "Reset my password", "Refund order 17"):
        await chat(http, proxy.base_url, [*greeting, {"role": "user", "content": request}])
    await proxy.parts.settled()
    scenarios = [t.scenario_id for t in await proxy.parts.store.trajectories(oldest_first=True)]
    assert scenarios[0] == scenarios[2] != scenarios[1]
    await proxy.parts.settled()
    [refund, _] = sorted(await proxy.parts.store.scenarios(), key=lambda s: s.id != scenarios[0])
    assert refund.opening[-1] == {"role": "user", "content": "Refund order 17"}


REPLY = {
    "role": "assistant",
    "content": "Let me look.",
    "tool_calls": [
        {
            "id": "call_7",
            "type": "function",
            "function": {"name": "look", "arguments": '{"city": "Lima", "days": 2}'},
        }
    ],
}


def as_text(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


CALLS = "[{'id': 'call_7', 'type': 'function', 'function': {'name': 'look', 'arguments': %s}}]"


@pytest.mark.parametrize(
    ("echoed", "restored"),
    [
        (as_text("Let me look.\nCalling tools:\n" + CALLS % "{'city': 'Lima', 'days': 2}"), True),
        (as_text("Let me look.\nCalling tools:\n" + CALLS % '\'{"city":"Lima","days":2}\''), True),
        (as_text("Calling tools:\n" + CALLS % "{'city': 'Lima', 'days': 2}"), False),  # text lost
        (as_text("Let me look.\nCalling tools:\n" + CALLS % "{'city': 'Lima', 'days': 3}"), False),
        (as_text("Let me look.\nCalling tools:\n" + CALLS % "{'city': 'Lima'"), False),  # cut off
        (as_text("Let me look.\nCalling tools:\n__import__('os').system('true')"), False),
        (as_text("Let me look.\nCalling tools:\n{'id': 'call_7'}"), False),  # not a list
        ({"role": "user", "content": "Calling tools:\n" + CALLS % "{'city': 'Lima'}"}, False),
    ],
    ids=[
        "parsed",
        "json-string",
        "text-lost",
        "other-arguments",
        "cut-off",
        "code",
        "no-list",
        "user",
    ],
)
def test_tool_calls_written_as_text_are_put_back_only_when_they_say_the_reply(
    echoed: dict[str, Any], restored: bool
) -> None:
    """The reply as the model wrote it, only for text that carries the reply's own text and
    calls (ids, names, arguments equal as JSON); a literal, never code, is read."""
    assert as_sampled(REPLY, echoed) == (
        {"role": "assistant", "content": REPLY["content"], "tool_calls": REPLY["tool_calls"]}
        if restored
        else None
    )


async def test_the_next_seq_follows_the_last_recorded_one_not_the_call_count(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    """A trajectory whose first call was lost (the store refused its write) holds calls [1, 2]
    and a call count of 2: a proxy that took the next seq from the count collided with seq 2,
    answered 200 and set the record aside."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    lost_first = trajectory_row("lost-first", "s", "g", at, call_count=2, upstream=vllm.base_url)
    async with TrajectoryStore.opened(store_url) as store:
        await store.write(
            Batch(
                [
                    scenario_row("s", at),
                    group_row("g", "s", at),
                    lost_first,
                    call_row("lost-first", at, seq=1),
                    call_row("lost-first", at, seq=2),
                ]
            )
        )
    async with running_proxy(proxy_settings(store_url, vllm.base_url)) as proxy:
        await chat(
            http,
            proxy.base_url,
            [{"role": "user", "content": "next"}],
            {"X-Art-Trajectory": "lost-first"},
        )
        await proxy.parts.settled()
        whole = await proxy.parts.store.trajectory("lost-first")
    assert whole is not None and whole.calls is not None
    assert [call.seq for call in whole.calls] == [1, 2, 3]
