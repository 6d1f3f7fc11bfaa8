"""`/v1/models` and runtime LoRA: art-proxy finds the base model and its context in the first entry,
loads each policy version as a new adapter name, and relies on the statuses of a refused load.

Adapter names are unique per test, and each test unloads what it loaded: a real vLLM outlives it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from tests.conformance.upstream import Upstream, assert_vllm_error, chat, model_cards
from tests.wire_client import post


async def test_models_lists_the_base_model_first_with_its_context_length(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    base = (await model_cards(http, upstream))[0]

    assert base["id"] == upstream.model and base["object"] == "model"
    assert base["owned_by"] == "vllm" and base["parent"] is None
    assert isinstance(base["root"], str) and base["root"]
    assert isinstance(base["max_model_len"], int) and base["max_model_len"] > 0


def adapter_path(upstream: Upstream) -> str:
    if upstream.adapter_path is None:
        pytest.skip("no LoRA adapter for this upstream: set ART_CONFORMANCE_ADAPTER")
    return upstream.adapter_path


def unique_name() -> str:
    return f"conformance-{uuid.uuid4().hex[:8]}"


async def load(
    http: aiohttp.ClientSession, upstream: Upstream, name: str, path: str
) -> tuple[int, Any]:
    return await post(
        http,
        f"{upstream.base_url}/load_lora_adapter",
        {"lora_name": name, "lora_path": path, "load_inplace": False},
    )


async def unload(http: aiohttp.ClientSession, upstream: Upstream, name: str) -> tuple[int, Any]:
    return await post(http, f"{upstream.base_url}/unload_lora_adapter", {"lora_name": name})


@asynccontextmanager
async def loaded_adapter(http: aiohttp.ClientSession, upstream: Upstream) -> AsyncIterator[str]:
    """A freshly loaded adapter's name; unloaded afterwards unless the test already did."""
    name = unique_name()
    status, answer = await load(http, upstream, name, adapter_path(upstream))
    assert status == 200, answer
    try:
        yield name
    finally:
        await unload(http, upstream, name)


async def test_lora_load_and_unload_answer_plain_text_success(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    name = unique_name()

    loaded = await load(http, upstream, name, adapter_path(upstream))
    unloaded = await unload(http, upstream, name)

    assert loaded == (200, f"Success: LoRA adapter '{name}' added successfully.")
    assert unloaded == (200, f"Success: LoRA adapter '{name}' removed successfully.")
    assert name not in [card["id"] for card in await model_cards(http, upstream)]


async def test_loading_a_loaded_name_again_is_400(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with loaded_adapter(http, upstream) as name:
        status, answer = await load(http, upstream, name, adapter_path(upstream))

    assert status == 400
    error = assert_vllm_error(answer, 400)
    assert error["type"] == "InvalidUserInput" and "has already been loaded" in error["message"]


async def test_loading_a_missing_path_is_404(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    adapter_path(upstream)
    missing = f"/nonexistent/conformance/{uuid.uuid4().hex}"

    status, answer = await load(http, upstream, unique_name(), missing)

    assert status == 404
    assert assert_vllm_error(answer, 404)["type"] == "NotFoundError"


async def test_unloading_an_unknown_adapter_is_404(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    adapter_path(upstream)

    status, answer = await unload(http, upstream, unique_name())

    assert status == 404
    assert assert_vllm_error(answer, 404)["type"] == "NotFoundError"


async def test_a_response_from_an_adapter_echoes_the_adapter_name(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with loaded_adapter(http, upstream) as name:
        body = await chat(http, upstream, model=name, max_tokens=2, return_token_ids=True)

    assert body["model"] == name
    assert body["choices"][0]["token_ids"]


async def test_adapters_are_listed_after_the_base_in_load_order_with_the_base_as_parent(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    async with (
        loaded_adapter(http, upstream) as first,
        loaded_adapter(http, upstream) as second,
    ):
        cards = await model_cards(http, upstream)

    assert cards[0]["id"] == upstream.model and cards[0]["parent"] is None
    adapters = [card for card in cards if card["id"] in (first, second)]
    assert [card["id"] for card in adapters] == [first, second]
    assert cards.index(adapters[0]) > 0
    for card in adapters:
        assert card["parent"] == upstream.model and card["root"] == adapter_path(upstream)
