"""The fake vLLM speaks vLLM's wire format: one test per item of VLLM_WIRE.md's checklist, plus the
multi-turn prefix invariant the proxy relies on. Real HTTP on loopback, nothing mocked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from art_proxy.testing import fake_tokenizer
from art_proxy.testing.fake_tokenizer import IM_END_ID
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from tests.wire_client import choice_chunks, post, stream_events

USER = [{"role": "user", "content": "What is the capital of France?"}]
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
IDS_AND_LOGPROBS = {"return_token_ids": True, "logprobs": True}


@pytest.fixture
async def vllm() -> AsyncIterator[FakeVllm]:
    async with running_fake_vllm() as fake:
        yield fake


async def chat(http: aiohttp.ClientSession, vllm: FakeVllm, **fields: Any) -> dict[str, Any]:
    status, body = await post(
        http, f"{vllm.base_url}/chat/completions", {"messages": USER, **fields}
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def chat_stream(http: aiohttp.ClientSession, vllm: FakeVllm, **fields: Any) -> list[Any]:
    return await stream_events(
        http, f"{vllm.base_url}/chat/completions", {"messages": USER, **fields}
    )


# -- 1 to 6: non-stream chat -----------------------------------------------------------------


async def test_non_stream_chat_has_every_vllm_key_with_nulls_included(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, vllm)

    assert {"id", "object", "created", "model", "choices", "usage", "prompt_logprobs"} <= set(body)
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["prompt_logprobs"] is None and body["prompt_token_ids"] is None
    choice = body["choices"][0]
    assert set(choice) == {
        "index",
        "message",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    }
    assert choice["logprobs"] is None and choice["stop_reason"] is None
    assert choice["finish_reason"] == "stop"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Hello from the fake.",
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    assert set(body["usage"]) >= {"prompt_tokens", "total_tokens", "completion_tokens"}


async def test_prompt_token_ids_are_top_level_and_token_ids_per_choice(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, vllm, return_token_ids=True)

    assert isinstance(body["prompt_token_ids"], list) and body["prompt_token_ids"]
    assert len(body["prompt_token_ids"]) == body["usage"]["prompt_tokens"]
    assert "prompt_token_ids" not in body["choices"][0]
    assert isinstance(body["choices"][0]["token_ids"], list)
    assert "token_ids" not in body


async def test_token_ids_are_null_when_not_requested(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, vllm)

    assert body["prompt_token_ids"] is None
    assert body["choices"][0]["token_ids"] is None


async def test_eos_is_the_last_token_id_with_its_own_logprob_entry(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    choice = (await chat(http, vllm, **IDS_AND_LOGPROBS))["choices"][0]

    assert choice["token_ids"][-1] == IM_END_ID
    last_entry = choice["logprobs"]["content"][-1]
    assert last_entry["token"] == "<|im_end|>"
    assert last_entry["bytes"] == list(b"<|im_end|>")
    assert "<|im_end|>" not in choice["message"]["content"]


async def test_logprobs_have_exactly_one_entry_per_token_id(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    choice = (await chat(http, vllm, **IDS_AND_LOGPROBS))["choices"][0]

    entries = choice["logprobs"]["content"]
    assert len(entries) == len(choice["token_ids"]) == 9  # 8 pieces and EOS
    assert all(entry["logprob"] < 0 and entry["top_logprobs"] == [] for entry in entries)
    decoded = "".join(vllm.tokenizer.piece(i) for i in choice["token_ids"][:-1])
    assert decoded == choice["message"]["content"]


async def test_top_logprobs_give_k_entries_led_by_the_sampled_token(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    choice = (await chat(http, vllm, top_logprobs=3, **IDS_AND_LOGPROBS))["choices"][0]

    for entry in choice["logprobs"]["content"]:
        top = entry["top_logprobs"]
        assert len(top) == 3
        assert top[0] == {k: entry[k] for k in ("token", "logprob", "bytes")}
        assert len({t["token"] for t in top}) == 3
        assert all(t["logprob"] < entry["logprob"] for t in top[1:])


async def test_return_tokens_as_token_ids_names_tokens_by_id(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    choice = (await chat(http, vllm, return_tokens_as_token_ids=True, **IDS_AND_LOGPROBS))[
        "choices"
    ][0]

    tokens = [entry["token"] for entry in choice["logprobs"]["content"]]
    assert tokens == [f"token_id:{i}" for i in choice["token_ids"]]


async def test_usage_sums_completion_tokens_over_all_choices(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    body = await chat(http, vllm, n=3, **IDS_AND_LOGPROBS)

    choices = body["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert choices[0]["message"]["content"] == "Hello from the fake."
    assert choices[1]["message"]["content"] == "Hello from the fake. (1)"
    assert all(len(c["logprobs"]["content"]) == len(c["token_ids"]) for c in choices)
    usage = body["usage"]
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in choices)
    assert usage["prompt_tokens"] == len(body["prompt_token_ids"])
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


async def test_tool_calls_key_is_absent_when_there_are_none(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    message = (await chat(http, vllm))["choices"][0]["message"]

    assert "tool_calls" not in message


async def test_tool_call_reply_has_null_content_and_finish_reason_tool_calls(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    choice = (await chat(http, vllm, tools=[SEARCH_TOOL], **IDS_AND_LOGPROBS))["choices"][0]

    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"] == {
        "name": "search",
        "arguments": '{"query": "Hello from the fake."}',
    }
    assert choice["token_ids"][-1] == IM_END_ID
    assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])


async def test_a_tool_result_gets_a_text_answer(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    first = (await chat(http, vllm, tools=[SEARCH_TOOL]))["choices"][0]["message"]
    messages = [*USER, first, _tool_result(first)]

    status, body = await post(
        http, f"{vllm.base_url}/chat/completions", {"messages": messages, "tools": [SEARCH_TOOL]}
    )

    assert status == 200
    assert body["choices"][0]["message"]["content"] == "Hello from the fake."
    assert "tool_calls" not in body["choices"][0]["message"]


async def test_max_tokens_cuts_the_reply_without_eos_and_finish_reason_length(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    choice = (await chat(http, vllm, max_tokens=3, **IDS_AND_LOGPROBS))["choices"][0]

    assert choice["finish_reason"] == "length"
    assert len(choice["token_ids"]) == 3 and IM_END_ID not in choice["token_ids"]
    assert choice["message"]["content"] == "Hello from"


async def test_sampling_params_and_unknown_fields_are_accepted(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    body = await chat(
        http,
        vllm,
        temperature=0.7,
        top_p=0.9,
        seed=1,
        stop=["\n"],
        response_format={"type": "text"},
        some_future_field={"x": 1},
    )

    assert body["choices"][0]["message"]["content"] == "Hello from the fake."


async def test_requests_records_bodies_sent_to_generation_endpoints_in_order(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    await chat(http, vllm, temperature=0.5)
    await post(http, f"{vllm.base_url}/completions", {"prompt": "Hi"})
    await post(http, f"{vllm.base_url}/chat/completions", {"messages": []})

    assert vllm.requests[0] == {"messages": USER, "temperature": 0.5}
    assert vllm.requests[1] == {"prompt": "Hi"}
    assert vllm.requests[2] == {"messages": []}


# -- 7 to 12: chat streams -------------------------------------------------------------------


async def test_stream_sends_one_role_chunk_per_choice_carrying_prompt_token_ids(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm, n=2, **IDS_AND_LOGPROBS)
    non_stream = await chat(http, vllm, n=2, **IDS_AND_LOGPROBS)

    role_chunks = events[:2]
    for index, chunk in enumerate(role_chunks):
        assert chunk["object"] == "chat.completion.chunk"
        assert chunk["prompt_token_ids"] == non_stream["prompt_token_ids"]
        assert chunk["choices"] == [
            {
                "index": index,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
    assert all("prompt_token_ids" not in event for event in events[2:-1])


async def test_stream_chunks_hold_one_choice_each_with_its_new_ids(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm, n=2, **IDS_AND_LOGPROBS)

    for event in events[2:-1]:
        [choice] = event["choices"]
        assert len(choice["token_ids"]) == 1
        assert len(choice["logprobs"]["content"]) == 1


async def test_stream_concatenated_token_ids_equal_non_stream_token_ids(
    http: aiohttp.ClientSession,
) -> None:
    async with running_fake_vllm(FakeVllmConfig(tokens_per_chunk=3)) as vllm:
        for extra in ({}, {"tools": [SEARCH_TOOL]}):
            fields = {"n": 2, **IDS_AND_LOGPROBS, **extra}
            events = await chat_stream(http, vllm, **fields)
            non_stream = await chat(http, vllm, **fields)
            for choice in non_stream["choices"]:
                chunks = choice_chunks(events, choice["index"])
                streamed_ids = [i for chunk in chunks for i in chunk["token_ids"]]
                streamed_logprobs = [e for c in chunks for e in c["logprobs"]["content"]]
                assert streamed_ids == choice["token_ids"]
                assert streamed_logprobs == choice["logprobs"]["content"]


async def test_stream_text_deltas_concatenate_to_the_non_stream_content(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm)

    text = "".join(chunk["delta"]["content"] for chunk in choice_chunks(events, 0))
    assert text == "Hello from the fake."


async def test_stream_holds_tool_markup_back_in_empty_delta_chunks(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm, tools=[SEARCH_TOOL], **IDS_AND_LOGPROBS)

    chunks = choice_chunks(events, 0)
    empty = [chunk for chunk in chunks if chunk["delta"] == {}]
    assert empty and all(chunk["token_ids"] for chunk in empty)
    assert all("content" not in chunk["delta"] for chunk in chunks)


async def test_stream_finish_chunk_carries_finish_reason_and_the_eos_id(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm, **IDS_AND_LOGPROBS)

    finish = events[-2]["choices"][0]
    assert finish["finish_reason"] == "stop" and finish["stop_reason"] is None
    assert finish["token_ids"] == [IM_END_ID]
    assert finish["delta"] == {"content": ""}
    assert finish["logprobs"]["content"][0]["token"] == "<|im_end|>"
    assert all(c["finish_reason"] is None for c in choice_chunks(events, 0)[:-1])
    assert events[-1] == "[DONE]"


async def test_stream_usage_chunk_has_empty_choices_and_sums_choices(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(
        http, vllm, n=2, stream_options={"include_usage": True}, return_token_ids=True
    )

    usage_event = events[-2]
    assert usage_event["choices"] == []
    streamed = [i for index in (0, 1) for c in choice_chunks(events, index) for i in c["token_ids"]]
    assert usage_event["usage"] == {
        "prompt_tokens": len(events[0]["prompt_token_ids"]),
        "total_tokens": len(events[0]["prompt_token_ids"]) + len(streamed),
        "completion_tokens": len(streamed),
    }
    assert all("usage" not in event for event in events[:-2])


async def test_stream_without_include_usage_has_no_usage_chunk(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm)

    assert all(event["choices"] for event in events[:-1])


async def test_stream_ids_and_logprobs_are_null_when_not_requested(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm)

    assert events[0]["prompt_token_ids"] is None
    for chunk in choice_chunks(events, 0):
        assert chunk["token_ids"] is None and chunk["logprobs"] is None


async def test_mid_stream_error_comes_as_an_error_event_then_done(
    http: aiohttp.ClientSession,
) -> None:
    async with running_fake_vllm(FakeVllmConfig(fail_mid_stream=True)) as vllm:
        events = await chat_stream(http, vllm, return_token_ids=True)

    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[1]["choices"][0]["token_ids"]
    assert events[2]["error"]["code"] == 500
    assert set(events[2]["error"]) == {"message", "type", "param", "code"}
    assert events[3:] == ["[DONE]"]


async def test_tool_call_stream_fragments_name_once_and_split_the_arguments(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm, tools=[SEARCH_TOOL], return_token_ids=True)
    non_stream = await chat(http, vllm, tools=[SEARCH_TOOL])

    chunks = choice_chunks(events, 0)
    fragments = [f for chunk in chunks for f in chunk["delta"].get("tool_calls", [])]
    assert all(fragment["index"] == 0 for fragment in fragments)
    first, rest = fragments[0], fragments[1:]
    assert first["id"].startswith("chatcmpl-tool-") and first["type"] == "function"
    assert first["function"]["name"] == "search"
    assert all(
        set(f) == {"index", "function"} and set(f["function"]) == {"arguments"} for f in rest
    )
    arguments = "".join(f["function"].get("arguments", "") for f in fragments)
    expected = non_stream["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert arguments == expected
    assert len([f for f in fragments if f["function"].get("arguments")]) >= 2
    assert chunks[-1]["finish_reason"] == "tool_calls"


async def test_stream_skips_held_back_markup_when_it_carries_neither_ids_nor_logprobs(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm, tools=[SEARCH_TOOL])

    chunks = choice_chunks(events, 0)
    assert all(chunk["delta"] for chunk in chunks[:-1])
    assert chunks[-1]["finish_reason"] == "tool_calls"


async def test_a_client_hanging_up_mid_stream_leaves_the_server_serving(
    http: aiohttp.ClientSession,
) -> None:
    async with running_fake_vllm(FakeVllmConfig(chunk_delay_s=0.05)) as vllm:
        url = f"{vllm.base_url}/chat/completions"
        async with http.post(url, json={"messages": USER, "stream": True}) as response:
            await response.content.readuntil(b"\n\n")
            response.close()
        await asyncio.sleep(0.1)

        assert (await chat(http, vllm))["choices"][0]["finish_reason"] == "stop"


async def test_tool_without_required_parameters_is_called_with_empty_arguments_in_fragments(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    tool = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}
    events = await chat_stream(http, vllm, tools=[tool])
    body = await chat(http, vllm, tools=[tool])

    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{}"
    fragments = [f for c in choice_chunks(events, 0) for f in c["delta"].get("tool_calls", [])]
    pieces = [f["function"]["arguments"] for f in fragments if "arguments" in f["function"]]
    assert len(pieces) >= 2 and "".join(pieces) == "{}"


async def test_named_tool_choice_calls_that_tool_and_keeps_finish_reason_stop(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    other = {"type": "function", "function": {"name": "other", "parameters": {}}}
    choice = {"type": "function", "function": {"name": "search"}}
    body = await chat(http, vllm, tools=[other, SEARCH_TOOL], tool_choice=choice)

    result = body["choices"][0]
    assert result["finish_reason"] == "stop"
    assert result["message"]["tool_calls"][0]["function"]["name"] == "search"


async def test_tool_choice_none_answers_text(vllm: FakeVllm, http: aiohttp.ClientSession) -> None:
    body = await chat(http, vllm, tools=[SEARCH_TOOL], tool_choice="none")

    assert body["choices"][0]["message"]["content"] == "Hello from the fake."


# -- 13: completions -------------------------------------------------------------------------


async def test_completions_put_prompt_and_completion_ids_inside_each_choice(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    status, body = await post(
        http,
        f"{vllm.base_url}/completions",
        {"prompt": [[1, 2, 3], [4, 5]], "n": 2, "return_token_ids": True},
    )

    assert status == 200 and body["object"] == "text_completion"
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in body["choices"]] == [
        [1, 2, 3],
        [1, 2, 3],
        [4, 5],
        [4, 5],
    ]
    assert all(c["token_ids"][-1] == IM_END_ID for c in body["choices"])
    assert body["choices"][0]["text"] == "Hello from the fake."
    assert "prompt_token_ids" not in body
    usage = body["usage"]
    assert usage["prompt_tokens"] == 5
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])


async def test_completions_max_tokens_defaults_to_16(
    http: aiohttp.ClientSession,
) -> None:
    async with running_fake_vllm(FakeVllmConfig(reply="word " * 40)) as vllm:
        status, body = await post(
            http, f"{vllm.base_url}/completions", {"prompt": "Once", "return_token_ids": True}
        )

    assert status == 200
    assert len(body["choices"][0]["token_ids"]) == 16
    assert body["choices"][0]["finish_reason"] == "length"


async def test_completions_legacy_logprobs_have_one_entry_per_id(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    status, body = await post(
        http,
        f"{vllm.base_url}/completions",
        {"prompt": "Say hi", "logprobs": 2, "return_token_ids": True},
    )

    assert status == 200

    choice = body["choices"][0]
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
    count = len(choice["token_ids"])
    assert all(len(logprobs[key]) == count for key in logprobs)
    assert logprobs["tokens"][-1] == "<|im_end|>"
    assert logprobs["text_offset"][:3] == [0, 5, 6]
    assert all(len(top) == 2 for top in logprobs["top_logprobs"])


async def test_completions_stream_sends_prompt_ids_only_on_each_choice_first_chunk(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    fields = {"prompt": "Say hi", "n": 2, "return_token_ids": True, "logprobs": 0}
    events = await stream_events(http, f"{vllm.base_url}/completions", fields)
    _, non_stream = await post(http, f"{vllm.base_url}/completions", fields)

    assert events[-1] == "[DONE]"
    for expected in non_stream["choices"]:
        chunks = [c for e in events[:-1] for c in e["choices"] if c["index"] == expected["index"]]
        assert chunks[0]["prompt_token_ids"] == expected["prompt_token_ids"]
        assert all(chunk["prompt_token_ids"] is None for chunk in chunks[1:])
        assert [i for c in chunks for i in c["token_ids"]] == expected["token_ids"]
        assert "".join(c["text"] for c in chunks) == expected["text"]
        assert chunks[-1]["finish_reason"] == "stop"
        streamed = [lp for c in chunks for lp in c["logprobs"]["token_logprobs"]]
        assert streamed == expected["logprobs"]["token_logprobs"]


# -- 14 and 15: errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": USER, "n": 0}, "n"),
        ({"messages": USER, "tools": []}, "tools"),
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),
        ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
async def test_bad_requests_are_400_with_the_openai_error_body(
    vllm: FakeVllm, http: aiohttp.ClientSession, body: dict[str, Any] | bytes, param: str | None
) -> None:
    status, error = await post(http, f"{vllm.base_url}/chat/completions", body)

    assert status == 400
    assert error == {
        "error": {
            "message": error["error"]["message"],
            "type": "BadRequestError",
            "param": param,
            "code": 400,
        }
    }


async def test_unknown_model_is_404_with_param_model(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    status, error = await post(
        http, f"{vllm.base_url}/chat/completions", {"messages": USER, "model": "nope"}
    )

    assert status == 404
    assert error["error"]["type"] == "NotFoundError"
    assert error["error"]["param"] == "model" and error["error"]["code"] == 404


@pytest.mark.parametrize(
    ("words", "max_tokens", "param"),
    [(40, None, "input_tokens"), (40, 8, "input_tokens"), (2, 2000, "max_tokens")],
)
async def test_context_overflow_is_400_on_the_field_that_overflows(
    http: aiohttp.ClientSession, words: int, max_tokens: int | None, param: str
) -> None:
    async with running_fake_vllm(FakeVllmConfig(max_model_len=64)) as vllm:
        long = [{"role": "user", "content": "word " * words}]
        fields = {"messages": long, "max_tokens": max_tokens}
        status, error = await post(http, f"{vllm.base_url}/chat/completions", fields)

    assert status == 400
    assert error["error"]["type"] == "BadRequestError"
    assert error["error"]["param"] == param


async def test_omitted_max_tokens_is_bounded_by_the_remaining_context(
    http: aiohttp.ClientSession,
) -> None:
    async with running_fake_vllm(FakeVllmConfig(max_model_len=14)) as vllm:
        body = await chat(
            http, vllm, messages=[{"role": "user", "content": "hi"}], return_token_ids=True
        )

    used = len(body["prompt_token_ids"]) + len(body["choices"][0]["token_ids"])
    assert used == 14 and body["choices"][0]["finish_reason"] == "length"


async def test_error_status_injects_an_error_with_the_same_body_shape(
    http: aiohttp.ClientSession,
) -> None:
    async with running_fake_vllm(FakeVllmConfig(error_status=503)) as vllm:
        status, error = await post(http, f"{vllm.base_url}/chat/completions", {"messages": USER})

    assert status == 503 and error["error"]["code"] == 503


# -- 16 and 17: models, runtime LoRA, adapter names ------------------------------------------


async def test_models_lists_the_base_first_then_adapters_in_load_order(
    vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    for name in ("policy@2", "policy@1"):
        await post(http, f"{vllm.base_url}/load_lora_adapter", _adapter(tmp_path, name))

    async with http.get(f"{vllm.base_url}/models") as response:
        listing = await response.json()

    base, *adapters = listing["data"]
    assert listing["object"] == "list"
    assert base["id"] == vllm.config.model and base["parent"] is None
    assert base["owned_by"] == "vllm" and base["object"] == "model"
    assert base["root"] == vllm.config.model and base["max_model_len"] == 2048
    assert isinstance(base["permission"], list) and isinstance(base["created"], int)
    assert [a["id"] for a in adapters] == ["policy@2", "policy@1"]
    assert all(a["parent"] == vllm.config.model for a in adapters)
    assert adapters[0]["root"] == str(tmp_path / "policy@2")


async def test_load_and_unload_lora_answer_plain_text_200(
    vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    status, text = await post(
        http, f"{vllm.base_url}/load_lora_adapter", _adapter(tmp_path, "policy@1")
    )
    assert (status, text) == (200, "Success: LoRA adapter 'policy@1' added successfully.")

    status, text = await post(
        http, f"{vllm.base_url}/unload_lora_adapter", {"lora_name": "policy@1"}
    )
    assert (status, text) == (200, "Success: LoRA adapter 'policy@1' removed successfully.")
    assert vllm.adapters == {}


async def test_loading_a_loaded_name_is_400_unless_in_place(
    vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    request = _adapter(tmp_path, "policy")
    await post(http, f"{vllm.base_url}/load_lora_adapter", request)

    status, error = await post(http, f"{vllm.base_url}/load_lora_adapter", request)
    assert status == 400
    assert error["error"]["type"] == "InvalidUserInput"
    assert "has already been loaded" in error["error"]["message"]

    status, _ = await post(
        http, f"{vllm.base_url}/load_lora_adapter", {**request, "load_inplace": True}
    )
    assert status == 200


async def test_loading_a_missing_path_and_unloading_an_unknown_name_are_404(
    vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    missing = {"lora_name": "x", "lora_path": str(tmp_path / "absent")}
    status, error = await post(http, f"{vllm.base_url}/load_lora_adapter", missing)
    assert status == 404 and error["error"]["type"] == "NotFoundError"

    status, error = await post(http, f"{vllm.base_url}/unload_lora_adapter", {"lora_name": "x"})
    assert status == 404 and error["error"]["type"] == "NotFoundError"


async def test_lora_routes_are_404_without_runtime_lora(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with running_fake_vllm(FakeVllmConfig(allow_runtime_lora=False)) as vllm:
        status, _ = await post(
            http, f"{vllm.base_url}/load_lora_adapter", _adapter(tmp_path, "policy")
        )

    assert status == 404


async def test_response_model_echoes_the_adapter_name_and_omitted_means_base(
    vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    await post(http, f"{vllm.base_url}/load_lora_adapter", _adapter(tmp_path, "policy@3"))

    assert (await chat(http, vllm, model="policy@3"))["model"] == "policy@3"
    events = await chat_stream(http, vllm, model="policy@3")
    assert {event["model"] for event in events[:-1]} == {"policy@3"}
    _, body = await post(http, f"{vllm.base_url}/completions", {"prompt": "x", "model": "policy@3"})
    assert body["model"] == "policy@3"
    assert (await chat(http, vllm))["model"] == vllm.config.model


async def test_health_is_200_with_an_empty_body(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    async with http.get(vllm.base_url.removesuffix("/v1") + "/health") as response:
        assert response.status == 200
        assert await response.read() == b""


# -- the multi-turn prefix invariant ---------------------------------------------------------


async def test_next_prompt_extends_previous_prompt_and_completion_for_a_text_reply(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    first = await chat(http, vllm, return_token_ids=True)
    reply = first["choices"][0]["message"]
    messages = [*USER, reply, {"role": "user", "content": "And of Spain?"}]

    second = await chat(http, vllm, messages=messages, return_token_ids=True)

    _assert_extends(first, second)


async def test_next_prompt_extends_previous_after_a_reply_cut_by_max_tokens(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    first = await chat(http, vllm, max_tokens=4, return_token_ids=True)
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    messages = [*USER, reply, {"role": "user", "content": "Go on."}]

    second = await chat(http, vllm, messages=messages, return_token_ids=True)

    _assert_extends(first, second)


@pytest.mark.parametrize("echo", ["as_returned", "as_sdk_echoes"])
async def test_next_prompt_extends_previous_after_a_tool_call_and_its_result(
    vllm: FakeVllm, http: aiohttp.ClientSession, echo: str
) -> None:
    first = await chat(http, vllm, tools=[SEARCH_TOOL], return_token_ids=True)
    message = first["choices"][0]["message"]
    if echo == "as_sdk_echoes":
        message = {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]}
    messages = [*USER, message, _tool_result(message)]

    second = await chat(http, vllm, messages=messages, tools=[SEARCH_TOOL], return_token_ids=True)

    _assert_extends(first, second)
    third_messages = [*messages, second["choices"][0]["message"], *USER]
    third = await chat(
        http, vllm, messages=third_messages, tools=[SEARCH_TOOL], return_token_ids=True
    )
    _assert_extends(second, third)


async def test_next_prompt_extends_previous_after_a_streamed_tool_call(
    vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    events = await chat_stream(http, vllm, tools=[SEARCH_TOOL], return_token_ids=True)
    chunks = choice_chunks(events, 0)
    fragments = [f for c in chunks for f in c["delta"].get("tool_calls", [])]
    call = {
        "id": fragments[0]["id"],
        "type": "function",
        "function": {
            "name": fragments[0]["function"]["name"],
            "arguments": "".join(f["function"].get("arguments", "") for f in fragments),
        },
    }
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    messages = [*USER, message, _tool_result(message)]

    second = await chat(http, vllm, messages=messages, tools=[SEARCH_TOOL], return_token_ids=True)

    completion = [i for c in chunks for i in c["token_ids"]]
    prefix = events[0]["prompt_token_ids"] + completion
    assert second["prompt_token_ids"][: len(prefix)] == prefix


async def test_token_ids_are_the_same_across_servers(http: aiohttp.ClientSession) -> None:
    bodies = []
    for _ in range(2):
        async with running_fake_vllm() as vllm:
            bodies.append(await chat(http, vllm, return_token_ids=True))

    assert bodies[0]["prompt_token_ids"] == bodies[1]["prompt_token_ids"]
    assert bodies[0]["choices"][0]["token_ids"] == bodies[1]["choices"][0]["token_ids"]


def _assert_extends(previous: dict[str, Any], following: dict[str, Any]) -> None:
    prefix = previous["prompt_token_ids"] + previous["choices"][0]["token_ids"]
    assert following["prompt_token_ids"][: len(prefix)] == prefix
    assert len(following["prompt_token_ids"]) > len(prefix)


def _tool_result(message: dict[str, Any]) -> dict[str, Any]:
    call_id = message["tool_calls"][0]["id"]
    return {"role": "tool", "tool_call_id": call_id, "content": "Paris is the capital."}


def _adapter(tmp_path: Path, name: str) -> dict[str, Any]:
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    return {"lora_name": name, "lora_path": str(path)}


# -- the fake's own tokenizer --------------------------------------------------------------


def test_words_past_the_tokenizers_bound_are_spelled_out_and_still_decode_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long run of distinct words (the benchmark's "hi <n>" calls) once filled the id space, and
    the next new word's probe for a free id spun for ever, hanging the fake."""
    monkeypatch.setattr(fake_tokenizer, "_MAX_WORD_PIECES", 40)
    tokenizer = fake_tokenizer.FakeTokenizer()
    texts = [f"call number {n} of the run" for n in range(100)]
    encoded = [tokenizer.encode(text) for text in texts]
    assert [tokenizer.decode(ids) for ids in encoded] == texts
    late = tokenizer.encode("1234")  # a word first seen past the bound: one id a character
    assert late == tuple(tokenizer.encode(digit)[0] for digit in "1234")
    assert tokenizer.encode("1234 again")[:4] == late  # spelled the same way every time
    assert tokenizer.encode("5 again")[0] == encoded[5][4]  # a word seen before keeps its id
