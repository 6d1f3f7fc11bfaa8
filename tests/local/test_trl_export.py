"""Training with TRL on what the proxy recorded of the bundled model: the TRL example
(examples/trl_export) trains a LoRA adapter with SFTTrainer on each group's best trajectory's exact
tokens; `export --format trl --pairs` is a preference dataset DPOTrainer takes a step on.

Two groups of two trajectories, recorded through a real proxy in front of the embedded server,
rewarded at finish: in one the rewards differ (its better trajectory is the data), in the other
they tie (no signal: left out).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import aiohttp
import datasets
import openai
from trl.data_utils import is_conversational

from art_proxy.local.server import RunningLocalLlm
from art_proxy.proxy.server import RunningProxy, running_proxy
from examples.trl_export.train import best_of_groups, train
from tests.conftest import proxy_settings
from tests.test_export import export

REWARDS = {"differ": (0.2, 0.9), "tie": (0.5, 0.5)}


async def _record_groups(proxy: RunningProxy, http: aiohttp.ClientSession) -> None:
    """REWARDS' groups, each member one call of the same prompt sampled with a seed of its own
    (the replies differ, and every run samples the same ones)."""
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
                    seed=member + 1,
                    extra_headers={"X-Art-Group": group, "X-Art-Trajectory": trajectory},
                )
                finish = f"{proxy.root_url}/art/v1/trajectories/{trajectory}/finish"
                async with http.post(finish, json={"reward": reward}) as response:
                    assert response.status == 200
    await proxy.parts.settled()


async def test_the_trl_example_trains_an_adapter_on_each_groups_best_trajectory(
    local_llm: RunningLocalLlm, sqlite_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running_proxy(proxy_settings(sqlite_url, local_llm.base_url)) as proxy:
        await _record_groups(proxy, http)
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


async def test_a_trl_pair_export_trains_a_dpo_step(
    local_llm: RunningLocalLlm, sqlite_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The group whose rewards differ gives its prompt's pair (the better reply chosen); the tie
    gives none. TRL's DPOTrainer reads the file as it is, conversational, and takes a step."""
    async with running_proxy(proxy_settings(sqlite_url, local_llm.base_url)) as proxy:
        await _record_groups(proxy, http)
        calls = await proxy.parts.store.calls(["differ-0", "differ-1"])
    replies = {
        t: (c[0].response or {})["choices"][0]["message"]["content"] for t, c in calls.items()
    }
    data = tmp_path / "pairs.jsonl"
    exported = await asyncio.to_thread(
        export, "--store", sqlite_url, "--format", "trl", "--pairs", "--out", str(data)
    )
    assert exported.returncode == 0, exported.stderr
    pairs = datasets.load_dataset("json", data_files=str(data), split="train")
    assert len(pairs) == 1 and is_conversational(pairs[0])
    assert pairs[0]["chosen"][0]["content"] == replies["differ-1"]
    assert pairs[0]["rejected"][0]["content"] == replies["differ-0"]

    chosen = pairs.select_columns(["prompt", "chosen", "rejected"])
    loss = await asyncio.to_thread(_one_step, "dpo", chosen, tmp_path / "dpo")
    assert math.isfinite(loss)


async def test_a_trl_kto_export_trains_a_kto_step_as_it_is(
    local_llm: RunningLocalLlm, sqlite_url: str, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """KTOTrainer failed on `--format trl` as exported (the null labels of unrewarded rows),
    though the docs said it took it as it is. `--kto`: the rows it learns from, and only the
    columns it reads; the tie's rows (advantage 0) and an unrewarded call's are left out."""
    async with running_proxy(proxy_settings(sqlite_url, local_llm.base_url)) as proxy:
        await _record_groups(proxy, http)
        async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
            await client.chat.completions.create(
                model="SmolLM2-135M-Instruct",
                messages=[{"role": "user", "content": "Name a shape."}],
                max_tokens=4,
            )  # a trajectory nobody rewarded
        await proxy.parts.settled()
    data = tmp_path / "kto.jsonl"
    exported = await asyncio.to_thread(
        export, "--store", sqlite_url, "--format", "trl", "--kto", "--out", str(data)
    )
    assert exported.returncode == 0, exported.stderr
    rows = datasets.load_dataset("json", data_files=str(data), split="train")
    assert rows.column_names == ["prompt", "completion", "label"]
    assert sorted(rows["label"]) == [False, True] and is_conversational(rows[0])
    loss = await asyncio.to_thread(_one_step, "kto", rows, tmp_path / "kto", 2)  # as exported
    assert math.isfinite(loss)


def _one_step(kind: str, rows: datasets.Dataset, out: Path, batch_size: int = 1) -> float:
    """One step of TRL's `kind` trainer ("dpo", "kto") on `rows`, a LoRA on the bundled model:
    its loss."""
    from peft import LoraConfig
    from trl.trainer.dpo_config import DPOConfig
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.kto_config import KTOConfig
    from trl.trainer.kto_trainer import KTOTrainer

    from art_proxy.local.model_loading import model_files

    config_class, trainer_class = {"dpo": (DPOConfig, DPOTrainer), "kto": (KTOConfig, KTOTrainer)}[
        kind
    ]
    config = config_class(
        output_dir=str(out),
        max_steps=1,
        per_device_train_batch_size=batch_size,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = trainer_class(
        model=str(model_files(None).directory),
        args=config,
        train_dataset=rows,
        peft_config=LoraConfig(
            r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"
        ),
    )
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return float(losses[-1])
