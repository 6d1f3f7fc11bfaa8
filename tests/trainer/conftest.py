"""A whole stack for the training loop: a tiny random model behind local-llm, and the proxy.

The tiny model is built from a config in the test (seconds on CPU) and shares SmolLM2's tokenizer,
so local-llm serves it through the real chat template and the trainer loads it the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from art_proxy.local.model_loading import load_model, model_files
from art_proxy.local.served import ServedModel
from art_proxy.local.server import RunningLocalLlm, running_local_llm
from art_proxy.proxy.server import RunningProxy, running_proxy
from tests.conftest import proxy_settings

TINY_NAME = "tiny-llama"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("models") / TINY_NAME
    tokenizer = AutoTokenizer.from_pretrained(model_files(None).directory)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,  # local-llm serves 2048 tokens by default
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


@dataclass
class Stack:
    llm: RunningLocalLlm
    proxy: RunningProxy
    store_url: str
    model_dir: Path


@pytest.fixture
async def stack(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[Stack]:
    served = ServedModel.create(
        load_model(str(tiny_model_dir)), served_model_name=TINY_NAME, max_batch_size=32
    )
    store_url = f"sqlite:///{tmp_path / 'art.db'}"
    async with (
        running_local_llm(served) as llm,
        running_proxy(proxy_settings(store_url, llm.base_url)) as proxy,
    ):
        yield Stack(llm, proxy, store_url, tiny_model_dir)
