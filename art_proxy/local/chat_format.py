"""Chat messages (and tools) to prompt ids, through the tokenizer's own chat template.

Messages are normalized the way vLLM prepares them for a template: text parts joined into one
string, tool-call arguments parsed from their JSON string. A template that knows about tools gets
them as `tools=`. One that does not (SmolLM2's) would drop them silently, and the model could never
call one; for those, and unlike vLLM, the tools are described in the system message in the Hermes
format that `tool_calls.py` parses, and earlier tool calls are rendered back as the same markup.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jinja2
from transformers import PreTrainedTokenizerBase

from art_proxy.local.tool_calls import TOOL_CALL_END, TOOL_CALL_START
from art_proxy.vllm_api.engine import PromptError

_TOOL_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


class ChatRenderer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        template = tokenizer.chat_template
        self._template_knows_tools = isinstance(template, str) and "tools" in template

    def render(
        self,
        messages: Sequence[Any],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        """The prompt ids, generation prompt included (with `continue_final`: the last message
        left open instead)."""
        if self._template_knows_tools:
            prepared = [_normalized(message, keep_tool_calls=True) for message in messages]
        else:
            prepared = [_normalized(message, keep_tool_calls=False) for message in messages]
            if tools:
                prepared = _with_tool_prompt(prepared, tools)
        template_tools: list[dict[Any, Any] | Callable[..., Any]] | None = None
        if tools and self._template_knows_tools:
            template_tools = list(tools)
        try:
            result = self._tokenizer.apply_chat_template(
                prepared,
                tools=template_tools,
                add_generation_prompt=not continue_final,
                continue_final_message=continue_final,
                tokenize=True,
                return_dict=False,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            raise PromptError(f"The chat template cannot render these messages: {exc}") from exc
        return _ids_of(result)


def _normalized(message: Any, *, keep_tool_calls: bool) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise PromptError("Each message must be an object with a string 'role'.")
    prepared = dict(message)
    content = _content_text(message.get("content"))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise PromptError("'tool_calls' must be a list.")
    parsed_calls = [_parsed_call(call) for call in calls]
    if keep_tool_calls:
        prepared["content"] = content
        if parsed_calls:
            prepared["tool_calls"] = [
                {**call, "function": {"name": name, "arguments": arguments}}
                for call, (name, arguments) in zip(calls, parsed_calls, strict=True)
            ]
        return prepared
    prepared.pop("tool_calls", None)
    markup = [_tool_call_markup(name, arguments) for name, arguments in parsed_calls]
    prepared["content"] = "\n".join([content, *markup] if content else markup) or ""
    return prepared


def _content_text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            text = part.get("text") if isinstance(part, dict) else None
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(text, str)
            ):
                raise PromptError("Only text content parts are supported by this model.")
            texts.append(text)
        return "\n".join(texts)
    raise PromptError("Message 'content' must be a string, a list of parts or null.")


def _parsed_call(call: Any) -> tuple[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(function, dict) or not isinstance(name, str):
        raise PromptError("Each tool call needs a 'function' with a string 'name'.")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise PromptError(f"Tool call arguments are not JSON: {exc}") from exc
    return name, arguments


def _tool_call_markup(name: str, arguments: Any) -> str:
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_START}\n{call}\n{TOOL_CALL_END}"


def _with_tool_prompt(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    listing = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    prompt = _TOOL_PROMPT.format(tools=listing)
    if messages and messages[0]["role"] == "system":
        system = messages[0]
        text = system["content"]
        return [{**system, "content": f"{text}\n\n{prompt}" if text else prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def _ids_of(result: Any) -> list[int]:
    """apply_chat_template's ids, whichever container this transformers version returns."""
    if isinstance(result, Mapping):
        result = result["input_ids"]
    if isinstance(result, list) and len(result) == 1 and isinstance(result[0], list):
        result = result[0]
    if not isinstance(result, list) or not all(isinstance(i, int) for i in result):
        raise PromptError(f"The chat template gave {type(result).__name__}, not token ids.")
    return result
