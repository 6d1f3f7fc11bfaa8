"""Completions carry ids inside each choice (no top-level `prompt_token_ids`), and a prompt given as
ids is fed to the model exactly as given."""

from __future__ import annotations

import aiohttp

from tests.conformance.upstream import GREEDY, Upstream, is_token_ids
from tests.wire_client import post


async def test_completions_put_prompt_and_completion_ids_in_each_choice(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    url = f"{upstream.base_url}/completions"
    request = {"model": upstream.model, "max_tokens": 4, "return_token_ids": True, **GREEDY}
    status, body = await post(http, url, {**request, "prompt": "The sky is", "n": 2})
    assert status == 200, body

    assert body["object"] == "text_completion" and "prompt_token_ids" not in body
    choices = body["choices"]
    assert [choice["index"] for choice in choices] == [0, 1]
    prompt_ids = choices[0]["prompt_token_ids"]
    assert is_token_ids(prompt_ids) and prompt_ids
    for choice in choices:
        assert choice["prompt_token_ids"] == prompt_ids
        assert is_token_ids(choice["token_ids"]) and 0 < len(choice["token_ids"]) <= 4
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(prompt_ids)  # one prompt, counted once
    assert usage["completion_tokens"] == sum(len(choice["token_ids"]) for choice in choices)

    status, again = await post(http, url, {**request, "prompt": prompt_ids})
    assert status == 200, again
    assert again["choices"][0]["prompt_token_ids"] == prompt_ids
    assert again["choices"][0]["token_ids"] == choices[0]["token_ids"]
