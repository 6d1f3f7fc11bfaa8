"""Errors art-proxy relays or acts on: vLLM's body with `code` = status, an unknown model, a context
overflow and malformed JSON, each with its status and `param`."""

from __future__ import annotations

import aiohttp

from tests.conformance.upstream import (
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


async def test_context_overflow_is_400_with_param_input_tokens(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    max_model_len = (await model_cards(http, upstream))[0]["max_model_len"]

    status, answer = await post(
        http,
        f"{upstream.base_url}/chat/completions",
        chat_body(upstream, max_tokens=max_model_len),
    )

    assert status == 400
    error = assert_vllm_error(answer, 400)
    assert error["type"] == "BadRequestError" and error["param"] == "input_tokens"
    assert "maximum context length" in error["message"]


async def test_malformed_json_is_400(upstream: Upstream, http: aiohttp.ClientSession) -> None:
    for route in ("chat/completions", "completions"):
        status, answer = await post(http, f"{upstream.base_url}/{route}", b'{"messages": [')

        assert status == 400
        assert_vllm_error(answer, 400)
