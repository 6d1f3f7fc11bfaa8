"""local-llm's responses and errors have vLLM's exact shapes (VLLM_WIRE.md's checklist)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from art_proxy.local.server import RunningLocalLlm
from tests.local.conftest import MAX_MODEL_LEN
from tests.local.wire_client import USER, chat
from tests.wire_client import post, stream_events

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


async def test_a_non_stream_reply_has_every_key_of_vllm(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, local_llm.base_url)
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "kv_transfer_params",
    ]
    choice = body["choices"][0]
    assert list(choice) == [
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert list(choice["message"]) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
    ]  # no `tool_calls` key without tool calls
    assert body["model"] == "SmolLM2-135M-Instruct"
    assert body["prompt_token_ids"] is None and choice["token_ids"] is None
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_a_stream_sends_role_chunks_then_one_choice_per_chunk(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    events = await stream_events(
        http,
        f"{local_llm.base_url}/chat/completions",
        {"messages": USER, "max_tokens": 4, "n": 2, "return_token_ids": True, "seed": 5},
    )
    assert events[-1] == "[DONE]"
    roles, chunks = events[:2], events[2:-1]
    for index, role in enumerate(roles):
        assert role["choices"] == [
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        assert role["prompt_token_ids"]
    assert all(len(chunk["choices"]) == 1 and "prompt_token_ids" not in chunk for chunk in chunks)
    finishes = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert sorted(choice["index"] for choice in finishes) == [0, 1]
    assert all("stop_reason" in choice for choice in finishes)


async def test_tools_are_shown_to_a_template_without_tool_support(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, local_llm.base_url, tools=[WEATHER_TOOL], return_token_ids=True)
    prompt = local_llm.served.tokenizer.decode(body["prompt_token_ids"])
    assert "<tools>" in prompt and '"get_weather"' in prompt and "<tool_call>" in prompt


@pytest.mark.parametrize(
    ("request_body", "status", "error_type", "param"),
    [
        ({"model": "nope", "messages": USER}, 404, "NotFoundError", "model"),
        ({"messages": USER, "max_tokens": MAX_MODEL_LEN + 1}, 400, "BadRequestError", "max_tokens"),
        ({"messages": []}, 400, "BadRequestError", "messages"),
        ({"messages": USER, "top_logprobs": 2}, 400, "BadRequestError", "top_logprobs"),
        ({"messages": USER, "presence_penalty": 1.0}, 400, "BadRequestError", "presence_penalty"),
        ({"messages": USER, "tools": []}, 400, "BadRequestError", "tools"),
        ({"messages": USER, "stream_options": {}}, 400, "BadRequestError", "stream_options"),
    ],
)
async def test_chat_errors_are_vllm_shaped(
    local_llm: RunningLocalLlm,
    http: aiohttp.ClientSession,
    request_body: dict[str, Any],
    status: int,
    error_type: str,
    param: str,
) -> None:
    got, body = await post(http, f"{local_llm.base_url}/chat/completions", request_body)
    assert got == status
    assert list(body) == ["error"]
    assert body["error"]["type"] == error_type
    assert body["error"]["param"] == param
    assert body["error"]["code"] == status


async def test_a_context_overflow_names_the_maximum_context_length(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    long_prompt = [{"role": "user", "content": "word " * MAX_MODEL_LEN}]
    status, body = await post(
        http, f"{local_llm.base_url}/chat/completions", {"messages": long_prompt}
    )
    assert status == 400
    assert body["error"]["param"] == "input_tokens"
    assert "maximum context length" in body["error"]["message"]


async def test_malformed_json_is_400(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    for route in ("chat/completions", "completions", "load_lora_adapter"):
        status, body = await post(http, f"{local_llm.base_url}/{route}", b'{"messages": [')
        assert status == 400
        assert body["error"]["type"] == "BadRequestError" and body["error"]["code"] == 400


async def test_models_lists_the_base_model_and_health_answers(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    async with http.get(f"{local_llm.base_url}/models") as response:
        listing = await response.json()
    (card,) = listing["data"]
    assert card["id"] == "SmolLM2-135M-Instruct"
    assert card["owned_by"] == "vllm" and card["parent"] is None
    assert card["max_model_len"] == MAX_MODEL_LEN
    assert card["logprobs_mode"] == "processed_logprobs"
    root_url = local_llm.base_url.removesuffix("/v1")
    async with http.get(f"{root_url}/health") as response:
        assert response.status == 200


async def test_a_logit_bias_is_sampled_with_and_reported_as_vllm_does(
    local_llm: RunningLocalLlm, http: aiohttp.ClientSession
) -> None:
    # +100 on two ids: every token is one of them, and each one's reported logprob is of the
    # distribution after the bias (the two share nearly all the mass).
    yes, no = (local_llm.served.encode(word)[0] for word in (" yes", " no"))
    body = await chat(
        http, local_llm.base_url, logit_bias={str(yes): 100, str(no): 100}, logprobs=True
    )
    tokens = body["choices"][0]["logprobs"]["content"]
    assert len(tokens) == 8
    assert {t["token"] for t in tokens} <= {" yes", " no"}
    assert all(t["logprob"] > -20 for t in tokens)
    for bias, message in (
        ({"49152": 1}, "out-of-vocab"),
        ({"-1": 1}, "out-of-vocab"),
        ({str(yes): "high"}, "must be a number"),
        ([yes], "must be an object"),
    ):
        status, error = await post(
            http, f"{local_llm.base_url}/chat/completions", {"messages": USER, "logit_bias": bias}
        )
        assert status == 400 and error["error"]["param"] == "logit_bias", error
        assert message in error["error"]["message"]
