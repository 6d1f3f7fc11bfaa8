"""local-llm generates what it reports: ids, text and processed logprobs agree with the model, a
stream and a non-stream call agree, concurrent requests share batches, and a client that leaves
frees its rows. Real SmolLM2 on loopback HTTP; completions stay short for a 2-core CPU."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
import torch

from art_proxy.local.model_loading import LoadedModel
from art_proxy.local.sampling import SamplingParams, processed_logprobs
from art_proxy.local.server import RunningLocalLlm
from tests.local.wire_client import USER, chat
from tests.wire_client import post, stream_events

IDS_AND_LOGPROBS = {"return_token_ids": True, "logprobs": True}


def _decode(loaded: LoadedModel, ids: list[int]) -> str:
    text = loaded.tokenizer.decode(ids, skip_special_tokens=True)
    assert isinstance(text, str)
    return text


async def test_token_ids_decode_to_the_returned_text(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, smollm2: LoadedModel
) -> None:
    body = await chat(http, local_llm.base_url, max_tokens=12, seed=1, **IDS_AND_LOGPROBS)
    choice = body["choices"][0]
    ids = choice["token_ids"]
    assert len(ids) == len(choice["logprobs"]["content"]) == body["usage"]["completion_tokens"]
    assert _decode(smollm2, ids) == choice["message"]["content"]
    assert body["prompt_token_ids"] == smollm2.tokenizer.apply_chat_template(
        USER, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if choice["finish_reason"] == "stop":
        assert ids[-1] == smollm2.tokenizer.eos_token_id  # EOS is kept, with its own logprob


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
async def test_logprobs_are_those_of_the_distribution_sampled_from(
    local_llm: RunningLocalLlm,
    http: aiohttp.ClientSession,
    smollm2: LoadedModel,
    temperature: float,
    top_p: float,
) -> None:
    body = await chat(
        http,
        local_llm.base_url,
        max_tokens=8,
        seed=7,
        temperature=temperature,
        top_p=top_p,
        **IDS_AND_LOGPROBS,
    )
    prompt_ids, ids = body["prompt_token_ids"], body["choices"][0]["token_ids"]
    reported = [entry["logprob"] for entry in body["choices"][0]["logprobs"]["content"]]
    with torch.inference_mode():
        logits_T_V = smollm2.model(torch.tensor([prompt_ids + ids])).logits[0]
    # The logits at position t predict the id at t + 1.
    logits_G_V = logits_T_V[len(prompt_ids) - 1 : len(prompt_ids) + len(ids) - 1]
    params = [SamplingParams(max_tokens=8, temperature=temperature, top_p=top_p)] * len(ids)
    logprobs_G_V = processed_logprobs(logits_G_V, params)
    expected = logprobs_G_V.gather(1, torch.tensor(ids)[:, None])[:, 0]
    assert torch.allclose(torch.tensor(reported), expected, atol=1e-3)
    if temperature == 1.0 and top_p == 1.0:
        raw = torch.log_softmax(logits_G_V, dim=-1).gather(1, torch.tensor(ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(reported), raw, atol=1e-3)


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 42}])
async def test_stream_ids_equal_the_non_stream_ids(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, sampling: dict[str, Any]
) -> None:
    fields = {"messages": USER, "max_tokens": 10, **IDS_AND_LOGPROBS, **sampling}
    body = await chat(http, local_llm.base_url, **fields)
    events = await stream_events(
        http,
        f"{local_llm.base_url}/chat/completions",
        {**fields, "stream_options": {"include_usage": True}},
    )
    assert events[-1] == "[DONE]"
    role, *chunks, usage = events[:-1]
    assert role["prompt_token_ids"] == body["prompt_token_ids"]
    assert all("prompt_token_ids" not in chunk for chunk in chunks)
    ids = [i for chunk in chunks for i in chunk["choices"][0]["token_ids"]]
    choice = body["choices"][0]
    assert ids == choice["token_ids"]
    assert (
        "".join(chunk["choices"][0]["delta"]["content"] for chunk in chunks)
        == (choice["message"]["content"])
    )
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == len(ids)


async def test_n_choices_each_carry_their_own_ids(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, smollm2: LoadedModel
) -> None:
    body = await chat(http, local_llm.base_url, n=2, seed=3, max_tokens=10, **IDS_AND_LOGPROBS)
    first, second = body["choices"]
    assert [first["index"], second["index"]] == [0, 1]
    for choice in body["choices"]:
        assert _decode(smollm2, choice["token_ids"]) == choice["message"]["content"]
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    assert first["token_ids"] != second["token_ids"]
    total = len(first["token_ids"]) + len(second["token_ids"])
    assert body["usage"]["completion_tokens"] == total
    # The shared prompt was prefilled once for both choices.
    assert local_llm.served.engine.stats.prefills == 1


async def test_concurrent_requests_run_in_shared_batches(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    requests = 8
    bodies = await asyncio.gather(
        *(
            chat(
                http,
                local_llm.base_url,
                messages=[{"role": "user", "content": f"Count to {i}."}],
                max_tokens=8,
                temperature=0,
            )
            for i in range(requests)
        )
    )
    assert all(body["choices"][0]["message"]["content"] for body in bodies)
    stats = local_llm.served.engine.stats
    assert stats.rows_admitted == requests
    assert stats.prefills < requests
    assert stats.peak_rows > 1
    assert stats.decode_steps < requests * 8


async def test_a_stop_string_cuts_the_text_but_keeps_the_ids(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, smollm2: LoadedModel
) -> None:
    greedy = {"temperature": 0, "max_tokens": 12, "return_token_ids": True}
    free = await chat(http, local_llm.base_url, **greedy)
    text = free["choices"][0]["message"]["content"]
    stop = text.split()[1]  # the second word: a stop string the model is known to produce
    body = await chat(http, local_llm.base_url, stop=[stop], **greedy)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == stop
    assert choice["message"]["content"] == text[: text.index(stop)]
    assert stop in _decode(smollm2, choice["token_ids"])


async def test_completions_return_ids_inside_each_choice(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession, smollm2: LoadedModel
) -> None:
    status, body = await post(
        http,
        f"{local_llm.base_url}/completions",
        {"prompt": ["The sky is", "Grass is"], "n": 2, "logprobs": 2, "return_token_ids": True},
    )
    assert status == 200, body
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2, 3]
    for choice in body["choices"]:
        ids = choice["token_ids"]
        # 16 is the default max_tokens; EOS may come first.
        assert len(ids) == 16 or ids[-1] == smollm2.tokenizer.eos_token_id
        assert _decode(smollm2, choice["token_ids"]) == choice["text"]
        assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    prompt_ids = [choice["prompt_token_ids"] for choice in body["choices"]]
    assert prompt_ids[0] == prompt_ids[1] != prompt_ids[2] == prompt_ids[3]
    assert body["usage"]["prompt_tokens"] == len(prompt_ids[0]) + len(prompt_ids[2])


async def test_a_client_that_leaves_a_stream_frees_its_rows(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    engine = local_llm.served.engine
    # ignore_eos: only the client leaving can end this choice before its 400th token.
    body = {"messages": USER, "max_tokens": 400, "stream": True, "ignore_eos": True}
    async with http.post(f"{local_llm.base_url}/chat/completions", json=body) as response:
        assert response.status == 200
        await response.content.readuntil(b"\n\n")  # the role chunk
        await response.content.readuntil(b"\n\n")  # a first token: the rows are generating
        assert engine.active_rows == 1
        response.close()
    for _ in range(200):
        if engine.active_rows == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.active_rows == 0
    assert engine.stats.tokens_generated < 400
