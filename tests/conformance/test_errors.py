"""Errors art-proxy relays or acts on: vLLM's body with `code` = status, an unknown model, a context
overflow, two greedy choices and malformed JSON, each with its status and `param`."""

from __future__ import annotations

import aiohttp

from tests.conformance.upstream import (
    GREEDY,
    Upstream,
    assert_vllm_error,
    chat_body,
    model_cards,
)
from tests.wire_client import post


async def test_unknown_model_is_404_not_found_error_with_param_model(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    requests = {
        "chat/completions": chat_body(upstream, model="no-such-model"),
        "completions": {"model": "no-such-model", "prompt": "Hi", "max_tokens": 1},
    }
    for route, body in requests.items():
        status, answer = await post(http, f"{upstream.base_url}/{route}", body)

        assert status == 404
        error = assert_vllm_error(answer, 404)
        assert error["type"] == "NotFoundError" and error["param"] == "model"


async def test_max_tokens_past_the_context_is_cut_to_it_and_over_it_is_400(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    max_model_len = (await model_cards(http, upstream))[0]["max_model_len"]
    url = f"{upstream.base_url}/chat/completions"

    # Prompt + max_tokens past the context: answered, the reply cut where the context ends.
    status, answer = await post(http, url, chat_body(upstream, max_tokens=max_model_len))
    assert status == 200, answer
    assert answer["usage"]["total_tokens"] <= max_model_len

    for field in ("max_tokens", "max_completion_tokens"):
        body = {**chat_body(upstream), field: max_model_len + 1}
        status, answer = await post(http, url, body)

        assert status == 400
        error = assert_vllm_error(answer, 400)
        assert error["type"] == "BadRequestError" and error["param"] == field
        assert f"cannot be greater than max_model_len={max_model_len}" in error["message"]


async def test_a_prompt_over_the_context_is_400_with_param_input_tokens(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    max_model_len = (await model_cards(http, upstream))[0]["max_model_len"]
    url = f"{upstream.base_url}/completions"
    short = {"model": upstream.model, "prompt": "The sky is", "max_tokens": 1, **GREEDY}
    status, answer = await post(http, url, {**short, "return_token_ids": True})
    assert status == 200, answer
    ids = answer["choices"][0]["prompt_token_ids"]
    too_long = (ids * (max_model_len // len(ids) + 2))[: max_model_len + 1]

    status, answer = await post(http, url, {**short, "prompt": too_long})

    assert status == 400
    error = assert_vllm_error(answer, 400)
    assert error["type"] == "BadRequestError" and error["param"] == "input_tokens"
    assert f"maximum context length is {max_model_len} tokens" in error["message"]


async def test_more_than_one_greedy_choice_is_400(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    chat = chat_body(upstream, n=2, temperature=0)
    requests = {
        "chat/completions": chat,
        "chat/completions (stream)": {**chat, "stream": True},
        "completions": {"model": upstream.model, "prompt": "Hi", "n": 2, "temperature": 0},
    }
    for name, body in requests.items():
        route = name.removesuffix(" (stream)")
        status, answer = await post(http, f"{upstream.base_url}/{route}", body)

        assert status == 400, name
        error = assert_vllm_error(answer, 400)
        assert error["message"] == "n must be 1 when using greedy sampling, got 2.", name


async def test_malformed_json_is_400(upstream: Upstream, http: aiohttp.ClientSession) -> None:
    for route in ("chat/completions", "completions"):
        status, answer = await post(http, f"{upstream.base_url}/{route}", b'{"messages": [')

        assert status == 400
        assert_vllm_error(answer, 400)
