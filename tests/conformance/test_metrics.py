"""`GET /metrics`: the request metrics a gateway operator reads off vLLM, under vLLM's names and
`model_name` label, so one dashboard reads vLLM, local-llm and the fake alike: a call moves the
prompt and generation token counters by exactly its usage, and the latency histograms by one."""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp

from tests.conformance.upstream import Upstream, chat

_SAMPLE = re.compile(r"^(?P<name>[\w:]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_COUNTED = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:time_to_first_token_seconds_count",
)


async def _counts(http: aiohttp.ClientSession, upstream: Upstream) -> dict[str, float]:
    """Each counted metric's value for the base model (0 before its first sample)."""
    root = upstream.base_url.removesuffix("/v1")
    async with http.get(f"{root}/metrics") as response:
        assert response.status == 200
        text = await response.text()
    counts = dict.fromkeys(_COUNTED, 0.0)
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if (
            sample
            and sample["name"] in counts
            and f'model_name="{upstream.model}"' in sample["labels"]
        ):
            counts[sample["name"]] += float(sample["value"])
    return counts


async def test_a_call_moves_the_token_counters_by_its_usage(
    upstream: Upstream, http: aiohttp.ClientSession
) -> None:
    before = await _counts(http, upstream)
    body = await chat(http, upstream)
    usage = body["usage"]
    expected = {
        "vllm:prompt_tokens_total": before["vllm:prompt_tokens_total"] + usage["prompt_tokens"],
        "vllm:generation_tokens_total": before["vllm:generation_tokens_total"]
        + usage["completion_tokens"],
        "vllm:e2e_request_latency_seconds_count": before["vllm:e2e_request_latency_seconds_count"]
        + 1,
        "vllm:time_to_first_token_seconds_count": before["vllm:time_to_first_token_seconds_count"]
        + 1,
    }
    deadline = time.monotonic() + 10  # vLLM records a request's stats just after answering it
    after = await _counts(http, upstream)
    while after != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        after = await _counts(http, upstream)
    assert after == expected
