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
    # Two greedy choices are a 400 in vLLM: two choices must be sampled.
    sampled = {**request, "temperature": 1.0, "prompt": "The sky is", "n": 2}
    status, body = await post(http, url, sampled)
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

    # Greedy, the prompt as ids generates what the prompt as text does.
    status, as_text = await post(http, url, {**request, "prompt": "The sky is"})
    assert status == 200, as_text
    status, as_ids = await post(http, url, {**request, "prompt": prompt_ids})
    assert status == 200, as_ids
    assert as_ids["choices"][0]["prompt_token_ids"] == prompt_ids
    assert as_ids["choices"][0]["token_ids"] == as_text["choices"][0]["token_ids"]
