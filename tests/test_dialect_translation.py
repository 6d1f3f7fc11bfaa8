"""Translation of Responses and Messages requests to chat completions, and of chat answers back:
the cases an SDK round trip does not reach (images, roles, item order, blocks a chat template has
no place for)."""

from __future__ import annotations

from typing import Any

import pytest

from art_proxy.errors import BadRequest
from art_proxy.proxy.dialects import anthropic, responses
from art_proxy.records import JsonObject

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}


async def no_calls(call_id: str) -> JsonObject | None:
    return None


async def chat_of(body: JsonObject) -> list[JsonObject]:
    translated = await responses.translate({"model": "m", **body}, no_calls)
    messages: list[JsonObject] = translated.chat["messages"]
    return messages


async def test_responses_items_become_chat_messages() -> None:
    messages = await chat_of(
        {
            "instructions": "Be brief.",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Look:"},
                        {"type": "input_image", "image_url": "https://x/cat.png"},
                    ],
                },
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Checking."}],
                },
                {
                    "type": "function_call",
                    "call_id": "call_1",
                    "name": "f",
                    "arguments": '{"a": 1}',
                },
                {"type": "function_call_output", "call_id": "call_1", "output": "done"},
            ],
        }
    )
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
            ],
        },
        # The reply's text and its calls are one assistant turn, as the model wrote them.
        {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]


async def test_responses_settings_become_chat_fields() -> None:
    translated = await responses.translate(
        {
            "model": "m",
            "input": "Hi",
            "max_output_tokens": 7,
            "temperature": 0.5,
            "top_k": 20,  # vLLM's own, through the SDK's extra_body
            "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": True}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {}}},
            "store": False,
            "metadata": {"run": "1"},
        },
        no_calls,
    )
    assert translated.chat == {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 7,
        "temperature": 0.5,
        "top_k": 20,
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {}}},
    }


async def test_previous_response_rebuilds_its_conversation_without_its_instructions() -> None:
    stored: JsonObject = {
        "trajectory_id": "t1",
        "dialect": "responses",
        "status": "ok",
        "client_request": {"instructions": "Old rules.", "input": "Hi"},
        "request": {
            "messages": [
                {"role": "system", "content": "Old rules."},
                {"role": "user", "content": "Hi"},
            ]
        },
        "response": {"choices": [{"message": {"role": "assistant", "content": "Hello", "x": 1}}]},
    }

    async def lookup(call_id: str) -> JsonObject | None:
        return stored if call_id == "abc" else None

    translated = await responses.translate(
        {"model": "m", "previous_response_id": "resp_abc", "input": "More", "instructions": "New."},
        lookup,
    )
    assert translated.continues == "t1"
    assert translated.chat["messages"] == [
        {"role": "system", "content": "New."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "More"},
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": [{"type": "input_file", "file_id": "f"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input[0].arguments"),
        ({"input": "Hi", "background": True}, "background"),
        ({"input": "Hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "Hi", "previous_response_id": "resp_gone"}, "previous_response_id"),
        ({"input": []}, "input"),
    ],
)
async def test_responses_refusals_name_the_field(body: JsonObject, param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        await chat_of(body)
    assert refused.value.param == param


def test_anthropic_blocks_become_chat_messages() -> None:
    chat = anthropic.translate(
        {
            "model": "m",
            "max_tokens": 9,
            "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "Do it."},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hmm", "signature": "s"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "call_1",
                            "content": [{"type": "text", "text": "done"}],
                        },
                        {"type": "text", "text": "And now?"},
                    ],
                },
            ],
        }
    )
    assert chat == {
        "model": "m",
        "max_tokens": 9,
        "stop": ["END"],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
        ],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Do it."},
            # tool_use input written as vLLM's tool parsers write arguments
            {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
            {"role": "user", "content": "And now?"},
        ],
    }


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use"}]}]},
            "messages[0].content[0].type",
        ),
        ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "maybe"}}, "tool_choice.type"),
    ],
)
def test_anthropic_refusals_name_the_field(fields: dict[str, Any], param: str) -> None:
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "Hi"}],
        **fields,
    }
    with pytest.raises(BadRequest) as refused:
        anthropic.translate(body)
    assert refused.value.param == param


def test_anthropic_stop_reasons() -> None:
    def stop_of(choice: JsonObject) -> tuple[Any, Any]:
        message = anthropic.message_object("c", "m", {"choices": [choice], "usage": {}})
        return message["stop_reason"], message["stop_sequence"]

    text = {"message": {"role": "assistant", "content": "Hi"}}
    assert stop_of({**text, "finish_reason": "stop"}) == ("end_turn", None)
    assert stop_of({**text, "finish_reason": "stop", "stop_reason": "END"}) == (
        "stop_sequence",
        "END",
    )
    assert stop_of({**text, "finish_reason": "length"}) == ("max_tokens", None)
    called = {
        "message": {"role": "assistant", "content": None, "tool_calls": [CALL]},
        "finish_reason": "stop",
    }
    assert stop_of(called) == ("tool_use", None)
