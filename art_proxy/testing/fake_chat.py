"""The fake vLLM's chat replies: text, or a tool call it writes as markup and reports parsed.

A tool call is generated as `<tool_call>` markup (what Qwen emits); the response reports it parsed, as
vLLM's hermes parser does, and a stream holds the markup back: its ids travel in `"delta": {}` chunks
while the arguments go out as fragments, so the ids of all chunks concatenated equal the non-stream
`token_ids`. A named `tool_choice` generates the bare arguments JSON (vLLM's guided decoding) and keeps
finish reason "stop"; as in vLLM, its re-rendered markup then no longer extends the previous prompt.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from art_proxy.testing.fake_generation import FakeGeneration
from art_proxy.vllm_api.engine import ChatRequest, ChoiceOutput
from art_proxy.wire import ApiError

if TYPE_CHECKING:
    from art_proxy.testing.fake_config import FakeVllmConfig, ScriptedCall
    from art_proxy.testing.fake_tokenizer import FakeTokenizer
    from art_proxy.vllm_api.engine import FinishReason

ToolMode = Literal["text", "markup", "named"]


class ChatEngine(Protocol):
    """What a chat reply needs of the fake engine (fake_engine.py FakeEngine), which calls this module to
    answer a chat request."""

    config: FakeVllmConfig
    tokenizer: FakeTokenizer

    def reply_text(self, choice_index: int, *, after_tool_result: bool = False) -> str: ...

    def scripted_call(self, messages: list[Any]) -> ScriptedCall | None: ...

    def generate(
        self, body_ids: tuple[int, ...], limit: int, finish: FinishReason, top_logprobs: int | None
    ) -> ChoiceOutput: ...


@dataclass(frozen=True, slots=True)
class _Reply:
    """What every choice of one request says."""

    tool_mode: ToolMode
    tool: dict[str, Any] | None  # the function called (None in text mode)
    after_tool_result: bool  # the last message is a tool result
    arguments: str | None  # the tool call's arguments, from `tool_script` (None: from the reply)


@dataclass(frozen=True, slots=True)
class _ToolCall:
    id: str
    name: str
    arguments: str
    # Ids before the arguments (the markup header); 0 for a named tool_choice.
    header_len: int
    arguments_len: int


def chat_generation(engine: ChatEngine, chat: ChatRequest, limit: int) -> FakeGeneration:
    """`chat.n` choices of at most `limit` ids, with their tool calls parsed."""
    last = chat.messages[-1]
    after_tool_result = isinstance(last, dict) and last.get("role") == "tool"
    scripted = engine.scripted_call(chat.messages)
    tool_mode, tool = _tool_choice(engine, chat, after_tool_result, scripted)
    arguments = json.dumps(scripted.arguments) if scripted and tool_mode == "markup" else None
    reply = _Reply(tool_mode, tool, after_tool_result, arguments)
    choices = [_generate(engine, chat, reply, index, limit) for index in range(chat.n)]
    outputs = [output for output, _ in choices]

    def saying(index: int, start: int, end: int) -> tuple[str | None, tuple[dict[str, Any], ...]]:
        output, call = choices[index]
        if call is None:
            return engine.tokenizer.decode(output.token_ids[start:end]), ()
        return None, _tool_fragments(engine, call, output.token_ids, start, end)

    return FakeGeneration(outputs, engine.config, saying)


def _tool_choice(
    engine: ChatEngine,
    chat: ChatRequest,
    after_tool_result: bool,
    scripted: ScriptedCall | None,
) -> tuple[ToolMode, dict[str, Any] | None]:
    if chat.tools is None:
        return "text", None
    functions: list[dict[str, Any]] = [tool["function"] for tool in chat.tools]
    choice = chat.body.get("tool_choice")
    if choice is None or choice == "auto":
        if scripted is not None:
            return "markup", _named_function(functions, scripted.name)
        if engine.config.tool_call and not after_tool_result:
            return "markup", functions[0]
        return "text", None
    if choice == "none":
        return "text", None
    if choice == "required":  # the model picks a tool: the script's, else the first
        return "markup", _named_function(functions, scripted.name) if scripted else functions[0]
    named = choice.get("function") if isinstance(choice, dict) else None
    name = named.get("name") if isinstance(named, dict) else None
    for function in functions:
        if name is not None and function["name"] == name:
            return "named", function
    raise ApiError(400, f"Invalid 'tool_choice': {json.dumps(choice)}.", param="tool_choice")


def _named_function(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for function in functions:
        if function["name"] == name:
            return function
    raise ApiError(400, f"tool_script calls {name!r}, which is not offered.", param="tools")


def _arguments(function: dict[str, Any], value: str) -> str:
    """`{"<first required parameter>": value}`, or `{}` when the tool requires none."""
    parameters = function.get("parameters")
    required = parameters.get("required") if isinstance(parameters, dict) else None
    if isinstance(required, list) and required and isinstance(required[0], str):
        return json.dumps({required[0]: value}, ensure_ascii=False)
    return "{}"


def _generate(
    engine: ChatEngine, chat: ChatRequest, reply: _Reply, index: int, limit: int
) -> tuple[ChoiceOutput, _ToolCall | None]:
    tokenizer = engine.tokenizer
    top_logprobs = chat.top_logprobs if chat.logprobs else None
    text = engine.reply_text(index, after_tool_result=reply.after_tool_result)
    if reply.tool_mode == "text" or reply.tool is None:
        return engine.generate(tokenizer.encode(text), limit, "stop", top_logprobs), None
    name = reply.tool["name"]
    arguments = reply.arguments if reply.arguments is not None else _arguments(reply.tool, text)
    if reply.tool_mode == "markup":
        header, argument_ids, trailer = tokenizer.tool_call_segments(name, arguments)
        body_ids = (*header, *argument_ids, *trailer)
        output = engine.generate(body_ids, limit, "tool_calls", top_logprobs)
        content = None
    else:
        header, argument_ids = (), tokenizer.encode(arguments)
        output = engine.generate(argument_ids, limit, "stop", top_logprobs)
        content = ""
    if output.finish_reason == "length":
        return output, None  # cut markup does not parse: vLLM returns it as plain text
    call = _ToolCall(
        f"chatcmpl-tool-{uuid.uuid4().hex}", name, arguments, len(header), len(argument_ids)
    )
    message_part = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    return replace(output, text=content, tool_calls=(message_part,)), call


def _tool_fragments(
    engine: ChatEngine, call: _ToolCall, ids: tuple[int, ...], start: int, end: int
) -> tuple[dict[str, Any], ...]:
    """The parsed part of ids[start:end]: the call's head once, argument text, or nothing."""
    arguments_start = call.header_len
    arguments_end = call.header_len + call.arguments_len
    first = max(call.header_len - 1, 0)
    function: dict[str, Any] = {}
    fragment: dict[str, Any] = {"index": 0}
    if start <= first < end:
        fragment |= {"id": call.id, "type": "function"}
        function["name"] = call.name
    text = engine.tokenizer.decode(ids[max(start, arguments_start) : min(end, arguments_end)])
    if text:
        function["arguments"] = text
    if not function:
        return ()
    fragment["function"] = function
    return (fragment,)
