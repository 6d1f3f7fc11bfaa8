"""Chat messages (and tools) to prompt ids, through the tokenizer's own chat template.

Messages are normalized the way vLLM prepares them for a template: text parts joined into one
string, tool-call arguments parsed from their JSON string. A template that knows about tools gets
them as `tools=`. One that does not (SmolLM2's) would drop them silently, and the model could never
call one; for those the template runs behind `tool_aware_template`'s preamble, which describes the
tools in the system message in the Hermes format that `tool_calls.py` parses and writes earlier
tool calls back as the same markup. `art-proxy up --engine vllm` gives vLLM the same template.
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
        self._template: str | None = template if isinstance(template, str) else None
        self._tool_aware = self._template is not None and not knows_tools(self._template)
        if self._template is not None and self._tool_aware:
            self._template = tool_aware_template(self._template)

    def render(
        self,
        messages: Sequence[Any],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        """The prompt ids, generation prompt included (with `continue_final`: the last message
        left open instead)."""
        prepared = [_normalized(message) for message in messages]
        template_tools: list[dict[Any, Any] | Callable[..., Any]] | None = None
        if tools:
            template_tools = list(tools)
        try:
            if continue_final and self._tool_aware:
                return self._render_open(prepared, template_tools)
            result = self._tokenizer.apply_chat_template(
                prepared,
                tools=template_tools,
                chat_template=self._template,
                add_generation_prompt=not continue_final,
                continue_final_message=continue_final,
                tokenize=True,
                return_dict=False,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError) as exc:
            raise PromptError(f"The chat template cannot render these messages: {exc}") from exc
        return _ids_of(result)

    def _render_open(
        self,
        prepared: list[dict[str, Any]],
        tools: list[dict[Any, Any] | Callable[..., Any]] | None,
    ) -> list[int]:
        """The conversation with its last message left open, tool calls included. transformers'
        own continue_final_message marks the end of the message's content, which the preamble
        follows with the calls; the preamble marks the end of the whole message instead, and the
        text is cut there as transformers cuts it."""
        if not prepared:
            raise PromptError("continue_final_message needs a message to continue.")
        text = self._tokenizer.apply_chat_template(
            prepared,
            tools=tools,
            chat_template=self._template,
            add_generation_prompt=False,
            tokenize=False,
            open_message_tag=_OPEN_MESSAGE_TAG,
        )
        if not isinstance(text, str) or _OPEN_MESSAGE_TAG not in text:
            raise PromptError("The chat template does not show the final message to continue.")
        return _ids_of(
            self._tokenizer.encode(text[: text.rindex(_OPEN_MESSAGE_TAG)], add_special_tokens=False)
        )


def knows_tools(template: str) -> bool:
    """Whether a chat template has a place for tools (else it would drop them silently)."""
    return "tools" in template


def tool_aware_template(template: str) -> str:
    """`template`, which has no place for tools, behind a preamble that puts them where the
    model sees them: the tools (name, description, parameters) described in the system message
    in the Hermes format, and earlier tool calls written into the assistant's content as the
    `<tool_call>` markup the model is asked to write. local-llm renders through it and
    `up --engine vllm` gives it to vLLM as its chat template, so both engines show the model the
    same tokens, and the trainer (which renders with local-llm's renderer) learns them."""
    head, tail = _TOOL_PROMPT.format(tools="\0").split("\0")
    literals = {
        "@HEAD@": head,
        "@TAIL@": tail,
        "@START@": f"{TOOL_CALL_START}\n",
        "@END@": f"\n{TOOL_CALL_END}",
    }
    preamble = _TOOL_PREAMBLE
    for placeholder, text in literals.items():
        # A JSON string is a Jinja string literal with the same escapes.
        preamble = preamble.replace(placeholder, json.dumps(text, ensure_ascii=False))
    return preamble + template


# Where ChatRenderer's continue_final cuts the rendered conversation: after the last message.
_OPEN_MESSAGE_TAG = "<|art-proxy-open-message|>"
# Jinja run before the model's own template; it rebinds `messages` to what that template can
# show. Arguments arrive parsed (vLLM parses them, as does `_normalized`); `tojson` is
# json.dumps with ensure_ascii off in transformers' template environment, which both engines use.
_TOOL_PREAMBLE = """\
{%- set _art = namespace(messages=[], text='', calls=[], args=none, kept={}, listing=[], fn={}, \
described={}) -%}
{%- for message in messages -%}
{%- set _art.text = message['content'] if message['content'] is string else '' -%}
{%- set _art.calls = [] -%}
{%- for call in message.get('tool_calls') or [] -%}
{%- set _art.args = call['function']['arguments'] -%}
{%- set _art.calls = _art.calls + [@START@ ~ '{"name": ' ~ (call['function']['name'] | tojson) \
~ ', "arguments": ' ~ (_art.args if _art.args is string else (_art.args | tojson)) ~ '}' ~ @END@] -%}
{%- endfor -%}
{%- if _art.calls -%}
{%- set _art.text = (([_art.text] if _art.text else []) + _art.calls) | join('\\n') -%}
{%- endif -%}
{%- if loop.last and open_message_tag is defined -%}
{%- set _art.text = _art.text ~ open_message_tag -%}
{%- endif -%}
{%- set _art.kept = dict(message | items | rejectattr('0', 'equalto', 'tool_calls') | list) -%}
{%- set _art.messages = _art.messages + [dict(_art.kept, content=_art.text)] -%}
{%- endfor -%}
{%- if tools -%}
{%- set _art.listing = [] -%}
{%- for tool in tools -%}
{%- set _art.fn = tool['function'] if tool.get('function') else tool -%}
{%- set _art.described = {'name': _art.fn['name']} -%}
{%- if _art.fn.get('description') is not none -%}
{%- set _art.described = dict(_art.described, description=_art.fn['description']) -%}
{%- endif -%}
{%- if _art.fn.get('parameters') is not none -%}
{%- set _art.described = dict(_art.described, parameters=_art.fn['parameters']) -%}
{%- endif -%}
{%- set _art.listing = _art.listing + [{'type': 'function', 'function': _art.described} | tojson] -%}
{%- endfor -%}
{%- set _art.text = @HEAD@ ~ (_art.listing | join('\\n')) ~ @TAIL@ -%}
{%- if _art.messages and _art.messages[0]['role'] == 'system' -%}
{%- set _art.kept = _art.messages[0] -%}
{%- set _art.text = (_art.kept['content'] ~ '\\n\\n' ~ _art.text) if _art.kept['content'] \
else _art.text -%}
{%- set _art.messages = [dict(_art.kept, content=_art.text)] + _art.messages[1:] -%}
{%- else -%}
{%- set _art.messages = [{'role': 'system', 'content': _art.text}] + _art.messages -%}
{%- endif -%}
{%- endif -%}
{%- set messages = _art.messages -%}
"""


def _normalized(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise PromptError("Each message must be an object with a string 'role'.")
    prepared = dict(message)
    prepared["content"] = _content_text(message.get("content"))
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise PromptError("'tool_calls' must be a list.")
    if calls:
        prepared["tool_calls"] = [
            {**call, "function": {"name": name, "arguments": arguments}}
            for call, (name, arguments) in zip(calls, map(_parsed_call, calls), strict=True)
        ]
    else:
        prepared.pop("tool_calls", None)
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


def _ids_of(result: Any) -> list[int]:
    """apply_chat_template's ids, whichever container this transformers version returns."""
    if isinstance(result, Mapping):
        result = result["input_ids"]
    if isinstance(result, list) and len(result) == 1 and isinstance(result[0], list):
        result = result[0]
    if not isinstance(result, list) or not all(isinstance(i, int) for i in result):
        raise PromptError(f"The chat template gave {type(result).__name__}, not token ids.")
    return result
