"""Runtime LoRA on local-llm answers as vLLM does (VLLM_WIRE.md "Models and runtime LoRA"), and an
adapter really changes generation, alone or sharing a batch with base-model rows."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from art_proxy.local.server import RunningLocalLlm
from tests.local.wire_client import chat
from tests.wire_client import post

GREEDY = {"temperature": 0, "max_tokens": 8, "return_token_ids": True}


async def _load(
    http: aiohttp.ClientSession, local: RunningLocalLlm, name: str, path: Path | str
) -> tuple[int, Any]:
    return await post(
        http, f"{local.base_url}/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
    )


async def test_an_adapter_loads_serves_and_unloads(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, lora_adapter: Path
) -> None:
    base = await chat(http, local_llm.base_url, **GREEDY)
    assert await _load(http, local_llm, "policy@1", lora_adapter) == (
        200,
        "Success: LoRA adapter 'policy@1' added successfully.",
    )
    tuned = await chat(http, local_llm.base_url, model="policy@1", **GREEDY)
    assert tuned["model"] == "policy@1"
    assert tuned["choices"][0]["token_ids"] != base["choices"][0]["token_ids"]

    async with http.get(f"{local_llm.base_url}/models") as response:
        cards = (await response.json())["data"]
    assert [(c["id"], c["parent"], c["root"]) for c in cards] == [
        ("SmolLM2-135M-Instruct", None, local_llm.served.root),
        ("policy@1", "SmolLM2-135M-Instruct", str(lora_adapter)),
    ]
    assert cards[0]["owned_by"] == "vllm" and cards[0]["max_model_len"] == 512

    status, text = await post(
        http, f"{local_llm.base_url}/unload_lora_adapter", {"lora_name": "policy@1"}
    )
    assert (status, text) == (200, "Success: LoRA adapter 'policy@1' removed successfully.")
    status, error = await post(
        http,
        f"{local_llm.base_url}/chat/completions",
        {"model": "policy@1", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert status == 404 and error["error"]["param"] == "model"
    # With the adapter gone the base model answers exactly as before.
    again = await chat(http, local_llm.base_url, **GREEDY)
    assert again["choices"][0]["token_ids"] == base["choices"][0]["token_ids"]


async def test_base_and_adapter_rows_share_a_batch_without_mixing(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, lora_adapter: Path
) -> None:
    assert (await _load(http, local_llm, "a", lora_adapter))[0] == 200
    alone_base = await chat(http, local_llm.base_url, **GREEDY)
    alone_tuned = await chat(http, local_llm.base_url, model="a", **GREEDY)
    engine = local_llm.served.engine
    peak_before = engine.stats.peak_rows
    together = await asyncio.gather(
        chat(http, local_llm.base_url, **GREEDY),
        chat(http, local_llm.base_url, model="a", **GREEDY),
    )
    assert engine.stats.peak_rows > peak_before
    assert together[0]["choices"][0]["token_ids"] == alone_base["choices"][0]["token_ids"]
    assert together[1]["choices"][0]["token_ids"] == alone_tuned["choices"][0]["token_ids"]


async def test_a_duplicate_name_is_400_and_a_missing_path_404(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, lora_adapter: Path, tmp_path: Path
) -> None:
    assert (await _load(http, local_llm, "dup", lora_adapter))[0] == 200
    status, body = await _load(http, local_llm, "dup", lora_adapter)
    assert status == 400
    assert body["error"]["type"] == "InvalidUserInput"
    assert "has already been loaded" in body["error"]["message"]

    status, body = await _load(http, local_llm, "ghost", tmp_path / "nowhere")
    assert status == 404 and body["error"]["type"] == "NotFoundError"
    status, body = await post(
        http, f"{local_llm.base_url}/unload_lora_adapter", {"lora_name": "ghost"}
    )
    assert status == 404 and body["error"]["code"] == 404


async def test_a_corrupt_adapter_is_500_and_the_server_keeps_serving(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, lora_adapter: Path, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "adapter_config.json").write_text((lora_adapter / "adapter_config.json").read_text())
    (corrupt / "adapter_model.safetensors").write_bytes(b"not a safetensors file" * 8)
    base = await chat(http, local_llm.base_url, **GREEDY)

    status, body = await _load(http, local_llm, "corrupt", corrupt)
    assert status == 500 and body["error"]["code"] == 500

    async with http.get(f"{local_llm.base_url}/models") as response:
        assert [card["id"] for card in (await response.json())["data"]] == ["SmolLM2-135M-Instruct"]
    after = await chat(http, local_llm.base_url, **GREEDY)
    assert after["choices"][0]["token_ids"] == base["choices"][0]["token_ids"]
    assert (await _load(http, local_llm, "good", lora_adapter))[0] == 200
