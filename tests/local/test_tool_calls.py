"""The Hermes tool-call parser reads `<tool_call>` markup as vLLM's `hermes` parser does, and its
streaming form sends the same content and calls as the non-stream parse."""

from __future__ import annotations

import json

import pytest

from art_proxy.local.tool_calls import ToolCallStream, parse_tool_calls

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_a_call_becomes_an_openai_tool_call_with_null_content() -> None:
    parsed = parse_tool_calls(CALL)
    assert parsed.content is None
    (call,) = parsed.tool_calls
    assert call.id.startswith("chatcmpl-tool-")
    assert call.as_message_part() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }


def test_text_before_the_first_call_is_the_content() -> None:
    second = CALL.replace("Paris", "Oslo")
    parsed = parse_tool_calls(f"Let me check.\n{CALL}\n{second}")
    assert parsed.content == "Let me check.\n"
    assert [json.loads(c.arguments)["city"] for c in parsed.tool_calls] == ["Paris", "Oslo"]


def test_an_unclosed_last_call_parses_when_its_json_is_whole() -> None:
    parsed = parse_tool_calls(CALL.removesuffix("</tool_call>"))
    assert [call.name for call in parsed.tool_calls] == ["get_weather"]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>{"name": "f"}</tool_call>',  # no arguments
        "plain text",
    ],
)
def test_text_that_does_not_parse_stays_content(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.content == text
    assert parsed.tool_calls == []


@pytest.mark.parametrize(
    "text", [f"Let me check. {CALL}", CALL, "no call < here", "<tool_call>{broken</tool_call>"]
)
def test_streaming_any_split_gives_the_non_stream_result(text: str) -> None:
    expected = parse_tool_calls(text)
    for size in (1, 3, 7):
        stream = ToolCallStream()
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        content, calls = "", []
        for number, piece in enumerate(pieces):
            out = stream.feed(piece, final=number == len(pieces) - 1)
            content += out.content
            calls += [call for _, call in out.tool_calls]
        assert content == (expected.content or "")
        assert [(c.name, c.arguments) for c in calls] == [
            (c.name, c.arguments) for c in expected.tool_calls
        ]
        assert stream.called == bool(expected.tool_calls)
