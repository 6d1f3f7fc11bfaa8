"""Explicit groups: a rollout runner names the group, whatever the group window would do.

Each batch of rollouts of one scenario is one group and the next batch, seconds later, a new one:
`X-Art-Group: <id>` or the URL prefix `/scenario/{scenario}/group/{group}[/trajectory/{id}]/v1`.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.testing.fake_vllm import FakeVllm
from tests.conftest import proxy_settings

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
TASK = [{"role": "user", "content": "Sort my inbox"}]


async def chat(
    http: aiohttp.ClientSession,
    base_url: str,
    headers: dict[str, str] | None = None,
    messages: list[dict[str, Any]] | None = None,
    status: int = 200,
) -> dict[str, Any]:
    async with http.post(
        f"{base_url}/chat/completions",
        json={"model": MODEL, "messages": messages or TASK},
        headers=headers or {},
    ) as response:
        assert response.status == status, await response.text()
        body: dict[str, Any] = await response.json()
        return body


async def groups_by_id(http: aiohttp.ClientSession, proxy: RunningProxy) -> dict[str, Any]:
    async with http.get(f"{proxy.root_url}/art/v1/groups") as response:
        return {group["id"]: group for group in (await response.json())["data"]}


async def trajectories(http: aiohttp.ClientSession, proxy: RunningProxy) -> list[Any]:
    async with http.get(f"{proxy.root_url}/art/v1/trajectories") as response:
        listed: list[Any] = (await response.json())["data"]
        return listed


async def test_two_batches_of_one_scenario_with_different_group_headers_are_two_groups(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    for batch in ("batch-1", "batch-2"):
        for _ in range(3):
            await chat(http, proxy.base_url, {"X-Art-Scenario": "inbox", "X-Art-Group": batch})
    groups = await groups_by_id(http, proxy)
    assert {group_id: g["size"] for group_id, g in groups.items()} == {"batch-1": 3, "batch-2": 3}
    assert {g["scenario_id"] for g in groups.values()} == {"inbox"}


async def test_the_url_prefix_names_the_group_with_or_without_a_trajectory(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    root = f"{proxy.root_url}/scenario/inbox/group/batch-7"
    await chat(http, f"{root}/v1")
    await chat(http, f"{root}/trajectory/rollout-2/v1")
    await chat(http, f"{root}/trajectory/rollout-2/v1", messages=[*TASK, *TASK])

    assert {group_id: g["size"] for group_id, g in (await groups_by_id(http, proxy)).items()} == {
        "batch-7": 2
    }
    listed = await trajectories(http, proxy)
    assert {(t["group_id"], t["scenario_id"]) for t in listed} == {("batch-7", "inbox")}
    assert {t["id"]: t["call_count"] for t in listed}["rollout-2"] == 2


async def test_a_group_without_a_scenario_gives_its_members_the_groups_scenario(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    settings = proxy_settings(store_url, vllm.base_url)
    async with running_proxy(settings) as first:
        await chat(http, first.base_url, {"X-Art-Scenario": "inbox", "X-Art-Group": "batch-1"})
        other_opening = [{"role": "user", "content": "Sort my inbox, it is Tuesday"}]
        await chat(http, first.base_url, {"X-Art-Group": "batch-1"}, messages=other_opening)
    async with running_proxy(settings) as second:  # knows the group only from the store
        await chat(http, second.base_url, {"X-Art-Group": "batch-1"}, messages=other_opening)
        listed = await trajectories(http, second)
    assert [(t["scenario_id"], t["group_id"]) for t in listed] == [("inbox", "batch-1")] * 3


async def test_a_scenario_that_contradicts_the_groups_is_a_conflict(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    await chat(http, proxy.base_url, {"X-Art-Scenario": "inbox", "X-Art-Group": "batch-1"})
    answer = await chat(
        http, proxy.base_url, {"X-Art-Scenario": "calendar", "X-Art-Group": "batch-1"}, status=409
    )
    assert answer["error"]["param"] == "group"


async def test_an_existing_trajectory_keeps_its_group_and_calls_never_cross_groups(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    first = {"X-Art-Group": "batch-1", "X-Art-Trajectory": "rollout-1"}
    reply = await chat(http, proxy.base_url, first)
    await chat(http, proxy.base_url, {**first, "X-Art-Group": "batch-2"})
    # The same conversation continued under another group is a new trajectory of that group.
    continued = [*TASK, reply["choices"][0]["message"], {"role": "user", "content": "and?"}]
    await chat(http, proxy.base_url, {"X-Art-Group": "batch-3"}, messages=continued)

    listed = {t["id"]: t for t in await trajectories(http, proxy)}
    assert (listed["rollout-1"]["group_id"], listed["rollout-1"]["call_count"]) == ("batch-1", 2)
    assert sorted(t["group_id"] for t in listed.values()) == ["batch-1", "batch-3"]


async def test_a_group_id_longer_than_the_store_holds_is_a_400(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    answer = await chat(http, proxy.base_url, {"X-Art-Group": "g" * 65}, status=400)
    assert "group id" in answer["error"]["message"]


async def test_the_url_prefix_names_the_split_and_a_bogus_one_is_a_400(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """For an agent that sets only its base URL: the split in the path, over any header."""
    root = f"{proxy.root_url}/scenario/quiz/group/g1/trajectory/t1/split/eval/v1"
    await chat(http, root, headers={"X-Art-Split": "train"})
    await proxy.parts.settled()
    [recorded] = await proxy.parts.store.trajectories(group="g1")
    assert recorded.split == "eval"
    bogus = f"{proxy.root_url}/scenario/quiz/split/everything/v1"
    body = await chat(http, bogus, status=400)
    assert body["error"]["message"].startswith("the URL's split must be one of")
