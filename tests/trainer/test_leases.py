"""The trainer keeps loaded what open trajectories hold: an adapter past `--keep-adapters` is
unloaded only once no open trajectory's lease names it (proxy/leases.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from art_proxy_trainer.swap import AdapterSwapper
from tests.conftest import proxy_settings

BASE = "Qwen/Qwen2.5-0.5B-Instruct"  # what the fake upstream serves


async def test_an_adapter_an_open_trajectory_holds_is_not_unloaded(
    proxy: RunningProxy, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with AdapterSwapper(
        upstreams=[vllm.base_url],
        upstream_api_key=None,
        proxy=proxy.root_url,
        admin_key=None,
        alias=BASE,  # the base model's own name, as an unmodified agent calls it
        keep=1,
    ) as swapper:
        await swapper.check_base_model({BASE})
        swapper.run_tag = "r"
        first = await swapper.swap(1, tmp_path)
        assert first.status == "swapped", first.error
        body = {"model": BASE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with http.post(
            f"{proxy.base_url}/chat/completions", json=body, headers={"X-Art-Trajectory": "held"}
        ) as response:
            assert response.status == 200
            assert (await response.json())["model"] == swapper.adapter_name(1)
        await proxy.parts.settled()
        for step in (2, 3):
            assert (await swapper.swap(step, tmp_path)).status == "swapped"
        loaded = list(vllm.adapters)
        async with http.post(
            f"{proxy.root_url}/art/v1/trajectories/held/finish", json={}
        ) as response:
            assert response.status == 200, await response.text()
        await proxy.parts.settled()
        assert (await swapper.swap(4, tmp_path)).status == "swapped"
        after_finish = list(vllm.adapters)

    # Step 2's adapter went past --keep-adapters 1; step 1's stayed for the open trajectory...
    assert loaded == [swapper.adapter_name(1), swapper.adapter_name(3)]
    # ...until it finished.
    assert after_finish == [swapper.adapter_name(4)]


@contextlib.asynccontextmanager
async def _swapper(proxy: RunningProxy, vllm: FakeVllm, keep: int) -> AsyncIterator[AdapterSwapper]:
    """A trainer's swapper of run `r`, through `proxy`, its base model checked."""
    async with AdapterSwapper(
        upstreams=[vllm.base_url],
        upstream_api_key=None,
        proxy=proxy.root_url,
        admin_key=None,
        alias=BASE,
        keep=keep,
    ) as swapper:
        await swapper.check_base_model({BASE})
        swapper.run_tag = "r"
        yield swapper


async def _answer(
    http: aiohttp.ClientSession, proxy: RunningProxy, trajectory: str, messages: list[Any]
) -> dict[str, Any]:
    body = {"model": BASE, "messages": messages, "max_tokens": 4}
    async with http.post(
        f"{proxy.base_url}/chat/completions", json=body, headers={"X-Art-Trajectory": trajectory}
    ) as response:
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = await response.json()
        return answer


async def _served(
    http: aiohttp.ClientSession, proxy: RunningProxy, trajectory: str, messages: list[Any]
) -> str:
    """The model that served a call of `trajectory`."""
    return str((await _answer(http, proxy, trajectory, messages))["model"])


@pytest.fixture
async def slow_vllm() -> AsyncIterator[FakeVllm]:
    async with running_fake_vllm(FakeVllmConfig(delay_s=2.0)) as fake:
        yield fake


async def test_an_adapter_a_first_call_still_running_holds_is_not_unloaded(
    store_url: str, slow_vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """The lease of a trajectory whose first call is still upstream lives only in the proxy's
    memory (the store learns of the call when it is answered): `GET /art/v1/leases` answers
    with it, so the swaps meanwhile leave its adapter loaded for its next call."""
    async with (
        running_proxy(proxy_settings(store_url, slow_vllm.base_url)) as proxy,
        _swapper(proxy, slow_vllm, keep=1) as swapper,
    ):
        assert (await swapper.swap(1, tmp_path)).status == "swapped"
        first = [{"role": "user", "content": "hi"}]
        calling = asyncio.create_task(_served(http, proxy, "in-flight", first))
        await _eventually(lambda: bool(proxy.parts.tracker.held_leases()))  # the call's lease
        for step in (2, 3):
            assert (await swapper.swap(step, tmp_path)).status == "swapped"
        loaded = list(slow_vllm.adapters)
        assert await calling == swapper.adapter_name(1)
    assert loaded == [swapper.adapter_name(1), swapper.adapter_name(3)]


async def test_a_trajectory_keeps_its_adapter_across_a_restart_of_the_proxy(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """A proxy that meets an open trajectory in the store (a restart, or the second of two
    proxies) keeps it on the adapter that served its calls, not the alias's newest."""
    first = [{"role": "user", "content": "hi"}]
    async with (
        running_proxy(proxy_settings(store_url, vllm.base_url)) as before,
        _swapper(before, vllm, keep=3) as swapper,
    ):
        assert (await swapper.swap(1, tmp_path)).status == "swapped"
        answer = await _answer(http, before, "kept", first)
        assert answer["model"] == swapper.adapter_name(1)
        await before.parts.settled()
    async with (
        running_proxy(proxy_settings(store_url, vllm.base_url)) as after,
        _swapper(after, vllm, keep=3) as swapper,
    ):
        swapper.adopt([swapper.adapter_name(1)])
        assert (await swapper.swap(2, tmp_path)).status == "swapped"
        async with http.get(f"{after.root_url}/art/v1/leases") as response:
            leased = {lease["model"] for lease in (await response.json())["data"]}
        assert swapper.adapter_name(1) in leased
        reply = answer["choices"][0]["message"]
        second = [*first, reply, {"role": "user", "content": "and then?"}]
        assert await _served(http, after, "kept", second) == swapper.adapter_name(1)
        # A new trajectory gets the alias's newest.
        assert await _served(http, after, "fresh", first) == swapper.adapter_name(2)
    assert after.parts.tracker.lease_counters.broken == 0


async def test_a_lease_taken_on_another_proxy_of_the_store_is_seen_before_its_call_is_recorded(
    store_url: str, slow_vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Two proxies on one store: a trajectory's first call is still upstream through the one,
    and the trainer asks the other for the leases. Each proxy publishes its memory's leases
    (lease_publisher.py), so the adapter stays loaded."""
    async with (
        running_proxy(proxy_settings(store_url, slow_vllm.base_url)) as serving,
        running_proxy(proxy_settings(store_url, slow_vllm.base_url)) as trainers,
        _swapper(trainers, slow_vllm, keep=1) as swapper,
    ):
        assert (await swapper.swap(1, tmp_path)).status == "swapped"
        # The serving proxy merges the alias from the store.
        await _eventually(lambda: serving.parts.aliases.resolve(BASE) == swapper.adapter_name(1))
        first = [{"role": "user", "content": "hi"}]
        calling = asyncio.create_task(_served(http, serving, "elsewhere", first))
        while swapper.adapter_name(1) not in await swapper.leased():  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # its lease reaches the store (within PUBLISH_EVERY_S)
        for step in (2, 3):
            assert (await swapper.swap(step, tmp_path)).status == "swapped"
        loaded = list(slow_vllm.adapters)
        assert await calling == swapper.adapter_name(1)
    assert loaded == [swapper.adapter_name(1), swapper.adapter_name(3)]


async def _eventually(holds: Callable[[], bool], timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not holds():  # noqa: ASYNC110 (what it waits for sets no event)
            await asyncio.sleep(0.02)
