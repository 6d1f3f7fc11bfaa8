"""Which grammar vLLM 0.32 constrains a chat call with, read from the request (the trainer replays
it; tests/test_real_vllm.py checks each replayable kind against vLLM itself)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from art_proxy.guided_decoding import Grammar, Unreplayable, constraint

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCTION: dict[str, Any] = {"name": "get_weather", "parameters": SCHEMA}
TOOL = {"type": "function", "function": FUNCTION}
STRICT_TOOL = {"type": "function", "function": {**FUNCTION, "strict": True}}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


TAG = {
    "type": "structural_tag",
    "format": {"type": "tag", "begin": "<w>", "content": {"type": "any_text"}, "end": "</w>"},
}
LEGACY_TAG = {
    "type": "structural_tag",
    "structures": [{"begin": "<w>", "schema": {"type": "object"}, "end": "</w>"}],
    "triggers": ["<w>"],
}


def _tools(tools: list[Any], choice: Any, *, parallel: bool | None = None) -> str:
    return json.dumps({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel})


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, None),
        ({"tools": [TOOL], "tool_choice": "auto"}, None),
        ({"tools": [STRICT_TOOL], "tool_choice": "none"}, None),
        ({"response_format": {"type": "text"}}, None),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            Grammar("json_schema", json.dumps(SCHEMA)),
        ),
        (
            {"response_format": {"type": "json_object"}},
            Grammar("json_schema", '{"type": "object"}'),
        ),
        (
            {"structured_outputs": {"json": json.dumps(SCHEMA)}},
            Grammar("json_schema", json.dumps(SCHEMA)),
        ),
        (
            {"structured_outputs": {"choice": ['say "yes"', "no\n"]}},
            Grammar("ebnf", 'root ::= "say \\"yes\\"" | "no\\n"'),
        ),
        # vLLM's hermes structural tag, from the call's tools and tool choice.
        (
            {"tools": [TOOL], "tool_choice": "required"},
            Grammar("hermes_tools", _tools([TOOL], "required")),
        ),
        (
            {"tools": [TOOL], "tool_choice": NAMED, "parallel_tool_calls": False},
            Grammar("hermes_tools", _tools([TOOL], NAMED, parallel=False)),
        ),
        ({"tools": [STRICT_TOOL]}, Grammar("hermes_tools", _tools([STRICT_TOOL], "auto"))),
        # What vLLM constrains otherwise, or hands to another backend: recorded, not trained.
        # Under "auto", strict tools with structured output: a tool call or the output.
        (
            {"tools": [STRICT_TOOL], "response_format": {"type": "json_object"}},
            Grammar(
                "hermes_tools",
                json.dumps(
                    {
                        "tools": [STRICT_TOOL],
                        "tool_choice": "auto",
                        "parallel_tool_calls": None,
                        "output": {"kind": "json_schema", "spec": '{"type": "object"}'},
                    }
                ),
            ),
        ),
        # One call at most: vLLM puts the count in the grammar, free tools or not ...
        (
            {"tools": [TOOL], "parallel_tool_calls": False},
            Grammar("hermes_tools", _tools([TOOL], "auto", parallel=False)),
        ),
        # ... unless structured output under "auto" keeps its own.
        (
            {
                "tools": [TOOL],
                "parallel_tool_calls": False,
                "response_format": {"type": "json_object"},
            },
            Grammar("json_schema", '{"type": "object"}'),
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "schema": {
                            "type": "object",
                            "properties": {"n": {"type": "number", "multipleOf": 3}},
                        }
                    },
                }
            },
            # The engine's backend compiles it (xgrammar drops multipleOf; llguidance keeps it).
            Grammar(
                "json_schema",
                json.dumps(
                    {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 3}}}
                ),
            ),
        ),
        # Strict tools with an output xgrammar cannot read: vLLM leaves the tools free.
        (
            {
                "tools": [STRICT_TOOL],
                "structured_outputs": {"json": {"type": "integer", "multipleOf": 3}},
            },
            Grammar("json_schema", '{"type": "integer", "multipleOf": 3}'),
        ),
        ({"structured_outputs": {"regex": "[a-z]+"}}, Grammar("regex", "[a-z]+")),
        (
            {"structured_outputs": {"grammar": '# EBNF\nroot ::= "a"'}},
            Grammar("ebnf", '# EBNF\nroot ::= "a"'),
        ),
        (
            {"structured_outputs": {"grammar": 'start: "a" // not ::= here'}},
            Grammar("lark", 'start: "a" // not ::= here'),
        ),
        (
            {"structured_outputs": {"structural_tag": json.dumps(TAG)}},
            Grammar("structural_tag", json.dumps(TAG)),
        ),
        (
            {"response_format": LEGACY_TAG},
            Grammar("structural_tag", json.dumps(LEGACY_TAG)),
        ),
        # vLLM 0.32 ignores the removed `guided_*` fields and samples unconstrained.
        ({"guided_regex": "[a-z]+"}, None),
    ],
    ids=[
        "none",
        "auto-tools",
        "tool-choice-none",
        "text",
        "json-schema",
        "json-object",
        "structured-json",
        "choice",
        "required-tool",
        "named-tool",
        "strict-tools",
        "strict-tools-and-json",
        "one-call",
        "one-call-and-json",
        "llguidance-schema",
        "strict-tools-and-llguidance-schema",
        "regex",
        "ebnf-grammar",
        "lark-grammar",
        "structural-tag",
        "legacy-structural-tag-format",
        "removed-guided-field",
    ],
)
def test_the_grammar_of_a_request_is_the_one_vllm_applies(
    body: dict[str, Any], expected: Grammar | Unreplayable | None
) -> None:
    assert constraint(body) == expected
