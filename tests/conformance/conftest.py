"""The conformance suite: what art-proxy relies on from vLLM's OpenAI server, checked on any upstream.

Without configuration every test runs twice: against the fake vLLM (`art_proxy.testing`, in-process)
and against `art-proxy local-llm` (SmolLM2-135M on CPU, in-process). Against a real vLLM, on a GPU
machine, start it with runtime LoRA, processed logprobs and the hermes tool parser, as
`art-proxy up --vllm` does:

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve Qwen/Qwen2.5-0.5B-Instruct --port 8000 \\
        --enable-lora --max-lora-rank 16 --max-loras 4 --logprobs-mode processed_logprobs \\
        --generation-config vllm \\
        --enable-auto-tool-choice --tool-call-parser hermes

then run the suite against it alone:

    ART_CONFORMANCE_URL=http://127.0.0.1:8000/v1 \\
    ART_CONFORMANCE_ADAPTER=/path/to/a/lora/adapter/of/that/model \\
        .venv/bin/python -m pytest tests/conformance

`ART_CONFORMANCE_MODEL` names the model (default: the first `/v1/models` entry).
`ART_CONFORMANCE_ADAPTER` is a PEFT LoRA directory for that model, rank <= 16 (any will do, e.g.
`get_peft_model(model, LoraConfig(r=8)).save_pretrained(DIR)`); without it the LoRA tests are
skipped. A model that answers text when offered a tool skips the tool-call tests: the shape of a
call is checked when one is made.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm
from tests.conformance.upstream import Upstream

CONFORMANCE_URL = os.environ.get("ART_CONFORMANCE_URL", "").rstrip("/")

if not CONFORMANCE_URL:
    # local-llm needs the `[local]` extra (torch, peft), which a GPU box running vLLM may lack.
    from tests.local.conftest import MAX_MODEL_LEN, lora_adapter, smollm2  # noqa: F401


@pytest.fixture(params=["vllm"] if CONFORMANCE_URL else ["fake-vllm", "local-llm"])
async def upstream(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Upstream]:
    if request.param == "vllm":
        yield await _real_vllm(CONFORMANCE_URL)
    elif request.param == "fake-vllm":
        async with running_fake_vllm(FakeVllmConfig()) as fake:
            # The fake checks only that an adapter path exists.
            yield Upstream(fake.base_url, fake.config.model, str(tmp_path), can_call_tools=True)
    else:
        from art_proxy.local.served import ServedModel
        from art_proxy.local.server import running_local_llm

        served = ServedModel.create(
            request.getfixturevalue("smollm2"), max_model_len=MAX_MODEL_LEN, max_batch_size=8
        )
        adapter = str(request.getfixturevalue("lora_adapter"))
        async with running_local_llm(served) as local:
            # SmolLM2-135M does not call tools within the few tokens this suite can afford on CPU.
            yield Upstream(local.base_url, served.name, adapter, can_call_tools=False)


async def _real_vllm(base_url: str) -> Upstream:
    model = os.environ.get("ART_CONFORMANCE_MODEL")
    if model is None:
        async with aiohttp.ClientSession() as http, http.get(f"{base_url}/models") as response:
            assert response.status == 200, f"{base_url}/models answered {response.status}"
            model = (await response.json())["data"][0]["id"]
            assert isinstance(model, str)
    return Upstream(base_url, model, os.environ.get("ART_CONFORMANCE_ADAPTER"), can_call_tools=True)
