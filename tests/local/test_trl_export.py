"""The TRL example (examples/trl_export): an export of calls the bundled model sampled through the
proxy trains a LoRA adapter with TRL's SFTTrainer, on each group's best trajectory's exact tokens.

Two groups of two trajectories, recorded through a real proxy in front of the embedded server,
rewarded at finish: in one the rewards differ (its better trajectory is the data), in the other
they tie (no signal: left out). The export is the CLI's Parquet file.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import aiohttp
import datasets
import openai

from art_proxy.local.server import RunningLocalLlm
from art_proxy.proxy.server import running_proxy
from examples.trl_export.train import best_of_groups, train
from tests.conftest import proxy_settings
from tests.test_export import export

REWARDS = {"differ": (0.2, 0.9), "tie": (0.5, 0.5)}


async def test_the_trl_example_trains_an_adapter_on_each_groups_best_trajectory(
    local_llm: RunningLocalLlm, sqlite_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running_proxy(proxy_settings(sqlite_url, local_llm.base_url)) as proxy:
        async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
            for group, rewards in REWARDS.items():
                for member, reward in enumerate(rewards):
                    trajectory = f"{group}-{member}"
                    messages: list[Any] = [{"role": "user", "content": "Name a colour."}]
                    await client.chat.completions.create(
                        model="SmolLM2-135M-Instruct",
                        messages=messages,
                        max_tokens=8,
                        temperature=1.0,
                        extra_headers={"X-Art-Group": group, "X-Art-Trajectory": trajectory},
                    )
                    finish = f"{proxy.root_url}/art/v1/trajectories/{trajectory}/finish"
                    async with http.post(finish, json={"reward": reward}) as response:
                        assert response.status == 200
        await proxy.parts.settled()
        [best_call] = (await proxy.parts.store.calls(["differ-1"]))["differ-1"]
    data = tmp_path / "calls.parquet"
    exported = await asyncio.to_thread(
        export, "--store", sqlite_url, "--format", "parquet", "--out", str(data)
    )
    assert exported.returncode == 0, exported.stderr
    rows, groups = best_of_groups(datasets.load_dataset("parquet", data_files=str(data))["train"])
    done = await asyncio.to_thread(train, data, tmp_path / "trl", steps=2)

    assert (len(rows), groups) == (1, 1)
    assert best_call.prompt_token_ids and best_call.completion_token_ids
    completion = best_call.completion_token_ids[0]
    assert rows[0]["input_ids"] == best_call.prompt_token_ids + completion
    assert rows[0]["completion_mask"] == [0] * len(best_call.prompt_token_ids) + [1] * len(
        completion
    )
    assert (done.rows, done.groups) == (1, 1) and math.isfinite(done.loss)
    assert (done.adapter / "adapter_config.json").is_file()
    assert (done.adapter / "adapter_model.safetensors").is_file()
