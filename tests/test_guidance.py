"""Guided calls: guidance added to the prompt upstream, recorded where it sits, never trained on.

The proxy runs on loopback in front of the fake vLLM (which renders chat prompts as `/tokenize`
does), over SQLite.
"""

from __future__ import annotations

from urllib.parse import quote

import pytest
from openai import AsyncOpenAI, BadRequestError
from openai.types.chat import (
    ChatCompletionMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionUserMessageParam,
)

from art_proxy.proxy.guidance import guided_messages, located
from art_proxy.proxy.server import RunningProxy
from art_proxy.records import Guidance, JsonObject
from art_proxy.testing.fake_vllm import FakeVllm
from art_proxy_trainer.batch import sequences_from_calls
from tests.conftest import trajectories

GUIDANCE = "Hint: the invoices table holds them; answer with its name."
SYSTEM: ChatCompletionSystemMessageParam = {
    "role": "system",
    "content": "You answer questions about the database.",
}
TASK: ChatCompletionUserMessageParam = {
    "role": "user",
    "content": "Which table holds the invoices?",
}


def guided_client(proxy: RunningProxy, text: str = GUIDANCE) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=proxy.base_url,
        api_key="unused",
        default_headers={"X-Art-Guidance": quote(text, safe="")},
    )


async def tokenized(vllm: FakeVllm, messages: list[ChatCompletionMessageParam]) -> list[int]:
    """The prompt ids the fake renders `messages` to, as a chat call's."""
    import aiohttp

    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{vllm.base_url.removesuffix('/v1')}/tokenize",
            json={"model": "Qwen/Qwen2.5-0.5B-Instruct", "messages": messages},
        ) as response,
    ):
        return list((await response.json())["tokens"])


async def test_the_model_sees_the_guidance_and_the_trainer_never_does(
    sqlite_proxy: RunningProxy, vllm: FakeVllm
) -> None:
    messages: list[ChatCompletionMessageParam] = [SYSTEM, TASK]
    async with guided_client(sqlite_proxy) as openai:
        first = await openai.chat.completions.create(
            model="Qwen/Qwen2.5-0.5B-Instruct", messages=messages
        )
        turn: list[ChatCompletionMessageParam] = [
            *messages,
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "And the customers?"},
        ]
        await openai.chat.completions.create(model="Qwen/Qwen2.5-0.5B-Instruct", messages=turn)
    (trajectory,) = await trajectories(sqlite_proxy)
    calls = trajectory.calls or []

    # Upstream: the guidance after the system message's content, one space between.
    sent = [body for body in vllm.requests if "return_token_ids" in body]
    assert sent[0]["messages"][0]["content"] == f"{SYSTEM['content']} {GUIDANCE}"
    assert sent[0]["messages"][1:] == [TASK]
    # Recorded: the agent's own body, the ids the model saw, where the guidance sits in them.
    assert [call.request["messages"] for call in calls] == [messages, turn]
    assert [call.attribution for call in calls] == ["new", "continuation"]
    assert all(call.trainable and call.stitched == (call.seq == 1) for call in calls)
    unguided = await tokenized(vllm, messages)
    for call in calls:
        assert call.guidance is not None and call.guidance.text == GUIDANCE
        assert call.prompt_token_ids is not None
        start, end = call.guidance.start, call.guidance.end
        assert 0 < start < end
        assert call.prompt_token_ids[:start] == unguided[:start]
    assert calls[0].prompt_token_ids is not None and calls[0].guidance is not None
    assert (
        calls[0].prompt_token_ids[: calls[0].guidance.start]
        + calls[0].prompt_token_ids[calls[0].guidance.end :]
    ) == unguided
    # The trainer: one stitched sequence, on the prompt without the guidance. The breach it
    # guards: trained on the ids the model saw, the sequence would hold the guidance's tokens.
    (sequence,), stats = sequences_from_calls(trajectory.id, calls)
    assert stats.stitch_misses == 0
    assert sequence.tokens[: len(unguided)] == unguided
    guidance_ids = calls[0].prompt_token_ids[calls[0].guidance.start : calls[0].guidance.end]
    assert not _contains(sequence.tokens, guidance_ids)
    assert _contains(calls[0].prompt_token_ids, guidance_ids)


def _contains(ids: list[int], run: list[int]) -> bool:
    return any(ids[i : i + len(run)] == run for i in range(len(ids) - len(run) + 1))


async def test_guidance_goes_to_the_first_user_message_without_a_system_one(
    sqlite_proxy: RunningProxy, vllm: FakeVllm
) -> None:
    async with guided_client(sqlite_proxy) as openai:
        await openai.chat.completions.create(model="Qwen/Qwen2.5-0.5B-Instruct", messages=[TASK])
    sent = [body for body in vllm.requests if "return_token_ids" in body]
    assert sent[0]["messages"] == [{"role": "user", "content": f"{TASK['content']} {GUIDANCE}"}]
    (trajectory,) = await trajectories(sqlite_proxy)
    (call,) = trajectory.calls or []
    assert call.trainable and call.guidance is not None


async def test_a_guidance_header_that_is_not_text_is_refused(sqlite_proxy: RunningProxy) -> None:
    async with guided_client(sqlite_proxy, "x" * 4001) as openai:
        with pytest.raises(BadRequestError) as refused:
            await openai.chat.completions.create(
                model="Qwen/Qwen2.5-0.5B-Instruct", messages=[TASK]
            )
    assert "X-Art-Guidance must be 1 to 4000 characters" in str(refused.value)


def test_guidance_is_located_between_the_shared_prefix_and_suffix() -> None:
    assert located("g", [1, 2, 3, 4], [1, 2, 9, 9, 3, 4]) == Guidance(text="g", start=2, end=4)
    assert located("g", [1, 2], [1, 2, 9]) == Guidance(text="g", start=2, end=3)
    # The tokenizer merged the guidance with the token before it: not told apart, not trained.
    assert located("g", [1, 2, 3, 4], [1, 5, 9, 3, 4]) is None
    assert located("g", [1, 2], [1, 2]) is None


def test_guided_messages_leave_the_agents_messages_as_they_were() -> None:
    messages: list[JsonObject] = [dict(SYSTEM), dict(TASK)]
    guided = guided_messages(messages, "more")
    assert messages == [dict(SYSTEM), dict(TASK)]
    assert guided[0]["content"] == f"{SYSTEM['content']} more"
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert guided_messages(parts, "more")[0]["content"][-1] == {"type": "text", "text": " more"}
