"""The trainer keeps loaded what open trajectories hold: an adapter past `--keep-adapters` is
unloaded only once no open trajectory's lease names it (proxy/leases.py)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from art_proxy.proxy.server import RunningProxy
from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy_trainer.swap import AdapterSwapper

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
