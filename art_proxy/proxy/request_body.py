"""What the proxy accepts as a generation request, checked before anything reads the body.

The proxy validates the fields it reads or rewrites itself (`model`, `messages` and their tool
calls, `stream`, `stream_options`, `logprobs`, `return_token_ids`, `prompt`), strictly: `"stream":
"false"` is not a boolean. Everything else is the upstream's to judge, and passes through as sent.
A body that fails is a `BadRequest` naming the field (`messages[2].tool_calls[0].function`), and the
relay records it as a `rejected` call.

Nesting is bounded too: orjson (the store's JSON writer) refuses values nested deeper than 254
levels, pydantic (the API's) the same, and a stored request sits a few levels down in an exported
line. A request nested deeper than `MAX_DEPTH` could be forwarded but never stored or read back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from art_proxy.errors import ArtProxyError, BadRequest, BodyTooLarge
from art_proxy.records import CallKind, JsonObject

# Levels of nesting a request may have (a tool's JSON schema rarely needs 20).
MAX_DEPTH = 128
# orjson's own limit (it raises beyond it); see `within_depth`.
_ORJSON_MAX_DEPTH = 254


class _Lenient(BaseModel):
    """Strict about the fields named, silent about the rest (vLLM accepts many more)."""

    model_config = ConfigDict(strict=True, extra="allow")


class _Function(_Lenient):
    name: str | None = None


class _ToolCall(_Lenient):
    function: _Function | None = None


class _Message(_Lenient):
    role: str
    tool_calls: list[_ToolCall] | None = None


class _Generation(_Lenient):
    model: str | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    return_token_ids: bool | None = None


class _ChatBody(_Generation):
    messages: list[_Message] = Field(min_length=1)
    logprobs: bool | None = None


class _CompletionBody(_Generation):
    prompt: Any
    logprobs: int | None = None


_BODIES: dict[CallKind, type[_Generation]] = {"chat": _ChatBody, "completion": _CompletionBody}


@dataclass(frozen=True)
class Rejection:
    """Why a body was refused, and what of it can still be recorded and attributed."""

    error: ArtProxyError
    body: JsonObject | None  # None: not a storable JSON object
    messages_valid: bool


def body_too_large(max_bytes: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body is larger than {max_bytes / (1024 * 1024):g} MiB")


def load_body(raw: bytes) -> JsonObject | Rejection:
    """The request body as a JSON object the proxy can store, or why it is not one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Rejection(BadRequest(f"request body is not valid JSON: {exc}"), None, False)
    if not isinstance(body, dict):
        return Rejection(BadRequest("request body must be a JSON object"), None, False)
    return _within_max_depth(body)


def parse_body(raw: bytes, kind: CallKind) -> JsonObject | Rejection:
    """The request body as a JSON object the proxy can read and store, or why it is not one."""
    body = load_body(raw)
    return body if isinstance(body, Rejection) else _validated(body, kind)


def check_body(body: JsonObject, kind: CallKind) -> JsonObject | Rejection:
    """`parse_body` for a body the proxy built itself (a dialect's translation)."""
    checked = _within_max_depth(body)
    return checked if isinstance(checked, Rejection) else _validated(checked, kind)


def _within_max_depth(body: JsonObject) -> JsonObject | Rejection:
    if not within_depth(body, MAX_DEPTH):
        error = BadRequest(f"request body is nested deeper than {MAX_DEPTH} levels")
        return Rejection(error, None, False)
    return body


def _validated(body: JsonObject, kind: CallKind) -> JsonObject | Rejection:
    try:
        _BODIES[kind].model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        param = _param(errors[0]["loc"])
        error = BadRequest(f"{param} {_reason(errors[0]['type'], errors[0]['msg'])}", param=param)
        messages_valid = kind == "chat" and all(e["loc"][:1] != ("messages",) for e in errors)
        return Rejection(error, body, messages_valid)
    return body


def within_depth(value: Any, depth: int) -> bool:
    """Whether `value` nests at most `depth` levels, measured by orjson at C speed: wrapped in
    `254 - depth` lists, a deeper value passes orjson's limit and makes it raise. The wrapping
    lists are made once per depth (building them took 80 us a call; the event loop is the only
    caller, and nothing awaits between filling the innermost one and emptying it)."""
    outer, innermost = _wrappers(depth)
    innermost.append(value)
    try:
        orjson.dumps(outer)
    except orjson.JSONEncodeError:
        return False
    finally:
        innermost.clear()
    return True


@functools.cache
def _wrappers(depth: int) -> tuple[list[Any], list[Any]]:
    """`_ORJSON_MAX_DEPTH - depth` nested lists: the outermost, and the innermost (empty)."""
    innermost: list[Any] = []
    outer = innermost
    for _ in range(_ORJSON_MAX_DEPTH - depth - 1):
        outer = [outer]
    return outer, innermost


def _param(loc: tuple[int | str, ...]) -> str:
    """`("messages", 2, "tool_calls", 0, "function")` -> `messages[2].tool_calls[0].function`."""
    param = ""
    for part in loc:
        param += f"[{part}]" if isinstance(part, int) else ("." if param else "") + part
    return param


# pydantic's error types, as a person would say what the field must be.
_MUST_BE = {
    "model_type": "must be an object",
    "dict_type": "must be an object",
    "list_type": "must be a list",
    "string_type": "must be a string",
    "bool_type": "must be a boolean (true or false)",
    "int_type": "must be an integer",
    "missing": "is required",
    "too_short": "must not be empty",
}


def _reason(error_type: str, message: str) -> str:
    return _MUST_BE.get(error_type, message)
