"""The grammar vLLM 0.32 constrains a chat call's output with, read from the call's request.

The trainer must score a constrained call's tokens under the distribution vLLM drew them from: the
model's, restricted at every position to the tokens the grammar allowed there. So it compiles the
same grammar with the same engine (xgrammar, `art_proxy_trainer.grammar`) and replays the sampled
tokens through it. This module says which grammar that is, as vLLM 0.32 decides (its chat request,
tool parsers and structured-output backends):

- A forced tool call (`tool_choice` `"required"` or naming a function), or tools of which one is
  `strict` under `"auto"`, is constrained by a structural tag vLLM builds for its tool parser's
  call format (`VLLM_ENFORCE_STRICT_TOOL_CALLING`, on by default, and `--tool-strict-level auto`).
  The trainer rebuilds the `hermes` parser's, which art-proxy starts vLLM with: one or more
  `<tool_call>` blocks of `{"name": <a tool>, "arguments": <JSON>}` (one for a named tool or
  `parallel_tool_calls: false`), the arguments following the tool's schema when the tool is
  `strict` and free JSON otherwise; under `"auto"` the model may write text until it opens a
  block. `parallel_tool_calls: false` constrains the calls too (one at most), unless structured
  output under `"auto"` keeps its own grammar.
- `response_format` `json_schema`: its schema; `json_object`: `{"type": "object"}`;
  `structural_tag`: the tag as vLLM dumps it (its legacy `structures` and `triggers`, or a
  `format`).
- `structured_outputs` `json` / `json_object` / `choice` (an EBNF grammar of the choices' literals)
  / `regex` / `grammar` (EBNF, or Lark where no line defines
  a rule with `::=`, as vLLM tells them) / `structural_tag`.
- vLLM 0.32 runs one structured-output backend per engine: the one its `auto` choice picked for
  the first constrained request the engine served (xgrammar, unless that request held what
  xgrammar cannot read, such as a JSON schema with `multipleOf`, when it is llguidance), which
  then compiles every later grammar (xgrammar drops the features it lacks). So the trainer
  replays with xgrammar, and with llguidance where xgrammar refuses the sampled tokens; a call
  neither accepts is left out of its batch. Strict tools under `"auto"` with structured output
  are constrained by either grammar: the tool calls (as under `"required"`) or the output, unless
  the output's is one xgrammar cannot read, when the output's alone applies.
- The `guided_*` fields are gone from vLLM 0.32: it ignores them and samples unconstrained, so
  a call that sends them is scored as one without.
- JSON may have any whitespace between tokens (vLLM's default, `any_whitespace`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from art_proxy.records import JsonObject


@dataclass(frozen=True)
class Grammar:
    """A grammar the trainer can replay, as text: a JSON schema, an EBNF or Lark grammar, a
    regex, a structural tag (JSON), or the hermes tool-call tag vLLM builds from the tools."""

    kind: Literal["json_schema", "ebnf", "lark", "regex", "structural_tag", "hermes_tools"]
    spec: str  # hermes_tools: {"tools", "tool_choice", "parallel_tool_calls"} as JSON


@dataclass(frozen=True)
class Unreplayable:
    """Guided decoding the trainer cannot reproduce, and why."""

    reason: str


# String formats xgrammar's JSON-schema converter knows (vLLM sends others to llguidance).
_XGRAMMAR_FORMATS = frozenset(
    [
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    ]
)


def constraint(body: JsonObject) -> Grammar | Unreplayable | None:
    """The grammar the call's output was constrained by; None when it was not constrained."""
    tools = body.get("tools")
    tool_choice = body.get("tool_choice")
    if isinstance(tools, list) and tools and tool_choice != "none":
        forced = tool_choice == "required" or isinstance(tool_choice, dict)
        structured = _structured_output(body)
        # vLLM constrains the tool calls when they are forced, when a tool is strict, and when
        # at most one call may be made (parallel_tool_calls false: its count is in the grammar)
        # unless structured output under "auto" keeps its own grammar.
        single = body.get("parallel_tool_calls") is False
        if forced or any(_strict(tool) for tool in tools) or (single and not structured):
            call: JsonObject = {
                "tools": tools,
                "tool_choice": tool_choice or "auto",
                "parallel_tool_calls": body.get("parallel_tool_calls"),
            }
            if not forced and structured:
                # Under "auto", a tool call or the structured output (an either-or grammar);
                # forced calls leave the structured output out.
                output = _output_constraint(body)
                if not isinstance(output, Grammar) or not _xgrammar_reads(output):
                    return output  # vLLM leaves the tools free: the output's grammar applies
                call["output"] = {"kind": output.kind, "spec": output.spec}
            return Grammar("hermes_tools", json.dumps(call))
    return _output_constraint(body)


def _output_constraint(body: JsonObject) -> Grammar | Unreplayable | None:
    """The grammar of the call's structured output (`structured_outputs`, `response_format`)."""
    structured = body.get("structured_outputs")
    if isinstance(structured, dict):
        return _structured(structured)
    if structured is not None:
        return _reason("structured_outputs")
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        kind = response_format.get("type")
        if kind == "json_object":
            return _json({"type": "object"}, "response_format")
        if kind == "json_schema":
            spec = response_format.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            return (
                _json(schema, "response_format")
                if schema is not None
                else _reason("response_format")
            )
        if kind == "structural_tag":
            return Grammar("structural_tag", json.dumps(response_format))
        if kind not in (None, "text"):
            return _reason("response_format")
    return None


def _structured_output(body: JsonObject) -> bool:
    response_format = body.get("response_format")
    return body.get("structured_outputs") is not None or (
        isinstance(response_format, dict) and response_format.get("type") not in (None, "text")
    )


def _strict(tool: Any) -> bool:
    function = tool.get("function") if isinstance(tool, dict) else None
    return isinstance(function, dict) and function.get("strict") is True


def _reason(what: str, detail: str = "") -> Unreplayable:
    return Unreplayable(f"guided decoding ({what}{': ' + detail if detail else ''})")


def _json(schema: Any, what: str) -> Grammar | Unreplayable:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return _reason(what, "a schema that is not JSON")
    if not isinstance(schema, dict):
        return _reason(what, "a schema that is not an object")
    # vLLM hands the backend the schema as json.dumps writes it.
    return Grammar("json_schema", json.dumps(schema))


def _xgrammar_reads(grammar: Grammar) -> bool:
    """Whether vLLM's check of a request finds xgrammar can compile it (for a JSON schema, its
    list of features xgrammar lacks; a regex or grammar it could not parse fails the call)."""
    return grammar.kind != "json_schema" or not _needs_llguidance(json.loads(grammar.spec))


def _structured(structured: dict[str, Any]) -> Grammar | Unreplayable:
    if structured.get("json") is not None:
        return _json(structured["json"], "structured_outputs json")
    if structured.get("json_object"):
        return _json({"type": "object"}, "structured_outputs json_object")
    choice = structured.get("choice")
    if isinstance(choice, list) and choice and all(isinstance(c, str) for c in choice):
        return Grammar("ebnf", "root ::= " + " | ".join(_ebnf_literal(c) for c in choice))
    regex = structured.get("regex")
    if isinstance(regex, str) and regex and "\x00" not in regex:
        return Grammar("regex", regex)
    grammar = structured.get("grammar")
    if isinstance(grammar, str) and grammar.strip():
        return Grammar("lark" if _lark(grammar) else "ebnf", grammar)
    tag = structured.get("structural_tag")
    if isinstance(tag, str) and tag.strip():
        return Grammar("structural_tag", tag)
    kinds = sorted(k for k, v in structured.items() if v not in (None, False, [], ""))
    return _reason("structured_outputs " + (", ".join(kinds) or "of no kind"))


_COMMENT = re.compile(r"(#|//).*$")


def _lark(grammar: str) -> bool:
    """vLLM's reading of a free grammar: EBNF when a line (comments left out) defines a rule
    with `::=`, else Lark."""
    return not any("::=" in _COMMENT.sub("", line) for line in grammar.split("\n"))


def _ebnf_literal(text: str) -> str:
    """`text` as an EBNF string literal, escaped as vLLM escapes a choice."""
    named = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    escaped = "".join(
        named.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch)
        for ch in text
    )
    return f'"{escaped}"'


def _needs_llguidance(schema: Any) -> bool:
    """Whether vLLM's `auto` backend would compile this JSON schema with llguidance: it uses a
    feature xgrammar 0.2.8 does not support (vLLM 0.32's list)."""
    if isinstance(schema, list):
        return any(_needs_llguidance(item) for item in schema)
    if not isinstance(schema, dict):
        return False
    declared = schema.get("type")
    types = {declared} if isinstance(declared, str) else set(declared or []) - {None}
    names = schema.get("propertyNames")
    patterns = schema.get("patternProperties")
    unsupported = (
        (bool(types & {"integer", "number"}) and "multipleOf" in schema)
        or (
            "array" in types
            and any(k in schema for k in ("uniqueItems", "contains", "minContains", "maxContains"))
        )
        or ("string" in types and "format" in schema and schema["format"] not in _XGRAMMAR_FORMATS)
        or ("string" in types and _bounded_text(schema))
        or (
            "object" in types
            and names is not None
            and (
                (isinstance(names, dict) and _bounded_text(names))
                or "patternProperties" in schema
                or "properties" in schema
                or schema.get("unevaluatedProperties", True) is not True
            )
        )
        or (
            "object" in types
            and isinstance(patterns, dict)
            and ("properties" in schema or len(patterns) > 1)
        )
        or (isinstance(schema.get("allOf"), list) and len(schema["allOf"]) >= 2)
    )
    return unsupported or any(
        _needs_llguidance(value) for value in schema.values() if isinstance(value, dict | list)
    )


def _bounded_text(schema: dict[str, Any]) -> bool:
    """A pattern or format together with a length bound."""
    return ("pattern" in schema or "format" in schema) and (
        "minLength" in schema or "maxLength" in schema
    )
