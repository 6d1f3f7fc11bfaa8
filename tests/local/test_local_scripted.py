"""Replies scripted id by id (the sampler is replaced), for what SmolLM2 will not do on cue: call a
tool, or fail in the middle of a stream. The rest of the server runs for real."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import aiohttp
import pytest
import torch

from art_proxy.local import engine as engine_module
from art_proxy.local.model_loading import LoadedModel
from art_proxy.local.sampling import Sampled, SamplingParams
from art_proxy.local.server import RunningLocalLlm
from art_proxy.vllm_api.engine import TokenLogprob
from tests.local.wire_client import USER, chat
from tests.wire_client import stream_events

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
REPLY = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

Sampler = Callable[
    [torch.Tensor, Sequence[SamplingParams], Sequence[torch.Generator | None]], Sampled
]


def _script(ids: list[int], *, fail_at: int | None = None) -> Sampler:
    """A sampler that answers ids[0], ids[1], ... (one row at a time), raising at step fail_at."""
    steps = iter(range(len(ids)))

    def sample(
        logits_B_V: torch.Tensor,
        params_B: Sequence[SamplingParams],
        generators_B: Sequence[torch.Generator | None],
    ) -> Sampled:
        step = next(steps)
        if step == fail_at:
            raise RuntimeError("injected failure")
        return Sampled([ids[step]], [TokenLogprob(-0.5, ())])

    return sample


@pytest.fixture
def reply_ids(smollm2: LoadedModel) -> list[int]:
    ids: list[int] = smollm2.tokenizer(REPLY)["input_ids"]
    eos = smollm2.tokenizer.eos_token_id
    assert isinstance(eos, int)
    return [*ids, eos]


async def test_a_tool_call_reply_is_parsed_into_tool_calls(
    local_llm: RunningLocalLlm,
    http: aiohttp.ClientSession,
    reply_ids: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "sample", _script(reply_ids))
    body = await chat(
        http, local_llm.base_url, tools=[WEATHER_TOOL], max_tokens=64, return_token_ids=True
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["token_ids"] == reply_ids
    message = choice["message"]
    assert message["content"] == "Let me check.\n"
    (call,) = message["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


async def test_a_streamed_tool_call_keeps_every_id_and_sends_the_call_whole(
    local_llm: RunningLocalLlm,
    http: aiohttp.ClientSession,
    reply_ids: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "sample", _script(reply_ids))
    events = await stream_events(
        http,
        f"{local_llm.base_url}/chat/completions",
        {"messages": USER, "tools": [WEATHER_TOOL], "max_tokens": 64, "return_token_ids": True},
    )
    chunks = [event["choices"][0] for event in events[1:-1]]
    assert [i for chunk in chunks for i in chunk["token_ids"]] == reply_ids
    assert "".join(chunk["delta"].get("content", "") for chunk in chunks) == "Let me check.\n"
    assert any(chunk["delta"] == {} for chunk in chunks)  # markup held back, its ids still sent
    (fragment,) = [f for chunk in chunks for f in chunk["delta"].get("tool_calls", [])]
    assert fragment["index"] == 0 and fragment["type"] == "function"
    assert fragment["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert chunks[-1]["finish_reason"] == "tool_calls"


async def test_a_failure_mid_stream_is_an_error_event_and_the_server_recovers(
    local_llm: RunningLocalLlm,
    http: aiohttp.ClientSession,
    reply_ids: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(engine_module, "sample", _script(reply_ids, fail_at=3))
    events = await stream_events(
        http, f"{local_llm.base_url}/chat/completions", {"messages": USER, "max_tokens": 16}
    )
    assert events[-1] == "[DONE]"
    assert [len(event["choices"]) for event in events[1:-2]] == [1, 1, 1]
    error = events[-2]["error"]
    assert error["code"] == 500 and "injected failure" in error["message"]
    assert local_llm.served.engine.active_rows == 0

    monkeypatch.undo()
    body = await chat(http, local_llm.base_url)
    assert body["choices"][0]["message"]["content"]
