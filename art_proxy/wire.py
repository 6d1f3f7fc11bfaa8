"""The OpenAI wire as vLLM speaks it: its errors, request-field rules, model cards, SSE framing.

Shared by the servers that stand in for vLLM (`art_proxy.vllm_api`, under the test fake and under
`art-proxy local-llm`), so both answer the same malformed request the same way; the proxy's dialects
frame their events with the same `sse`. `ApiError` is the proxy's `ArtProxyError` with vLLM's own
type names (`InvalidUserInput`, `RateLimitError`, ...) and any status. See `VLLM_WIRE.md`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from aiohttp import web

from art_proxy.errors import ArtProxyError

# vLLM's default `--max-logprobs`: asking for more top logprobs is a 400.
MAX_LOGPROBS = 20
# vLLM sends -inf logprobs as this number, since JSON has no infinity.
MIN_LOGPROB = -9999.0
# vLLM sets no body limit; agent histories easily pass aiohttp's 1 MiB default.
MAX_BODY_BYTES = 256 * 1024 * 1024
# `/v1/completions` without `max_tokens`: OpenAI's legacy default, which vLLM keeps.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

_STATUS_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    429: "RateLimitError",
    503: "ServiceUnavailableError",
}


class ApiError(ArtProxyError):
    """An error in vLLM's words: the status chosen per error, the type named after it unless given."""

    def __init__(
        self, status: int, message: str, *, type: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message, param=param, status=status)
        self.type = type or _STATUS_TYPES.get(status, "InternalServerError")

    def response(self) -> web.Response:
        return web.Response(
            status=self.status, body=orjson.dumps(self.body()), content_type="application/json"
        )


def completion_limit(
    prompt_len: int, max_tokens: int | None, max_model_len: int, *, param: str = "max_tokens"
) -> int:
    """How many ids a choice may generate: `max_tokens` (None: no limit) cut to the context left.

    vLLM 0.32's rules: `max_tokens` above the context is a 400 naming `param` (the field the
    request used), a prompt longer than the context is a 400 on `input_tokens`, a prompt that
    fills it exactly leaves 0 tokens, which is a 400 too; otherwise a `max_tokens` that runs past
    the context is cut to it (the choice ends with `finish_reason: "length"`), not refused.
    """
    if max_tokens is not None and max_tokens > max_model_len:
        raise ApiError(
            400,
            f"{param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter={param}, value={max_tokens})",
            param=param,
        )
    if prompt_len > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains {prompt_len} input tokens, which exceeds this limit even without "
            "any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_len})",
            param="input_tokens",
        )
    room = max_model_len - prompt_len
    if room == 0:
        raise ApiError(
            400,
            "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)",
            param="max_tokens",
        )
    return room if max_tokens is None else min(max_tokens, room)


def model_card(
    name: str, *, root: str, parent: str | None, max_model_len: int, created: int
) -> dict[str, Any]:
    """One `/v1/models` entry; `parent` is None for a base model, the base's name for an adapter."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        # vLLM states the context length on base models only.
        "max_model_len": max_model_len if parent is None else None,
        "permission": [
            {
                "id": f"modelperm-{name}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


# -- request bodies ------------------------------------------------------------------------


async def read_json_object(request: web.Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"JSON decode error: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.")
    return body


def int_field(
    body: dict[str, Any],
    name: str,
    default: int | None,
    *,
    minimum: int,
    maximum: int | None = None,
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    # JSON true is a Python int; vLLM's pydantic models reject it for integer fields.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer.", param=name)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ApiError(400, f"'{name}' must be {bound}, got {value}.", param=name)
    return value


def float_field(
    body: dict[str, Any], name: str, default: float, *, minimum: float, maximum: float
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"'{name}' must be a number.", param=name)
    if not minimum <= value <= maximum:
        raise ApiError(
            400, f"'{name}' must be between {minimum} and {maximum}, got {value}.", param=name
        )
    return float(value)


def bool_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be a boolean.", param=name)
    return value


def chat_max_tokens(body: dict[str, Any]) -> tuple[int | None, str]:
    """A chat request's token limit and the field it came from (`max_completion_tokens` first)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = int_field(body, name, None, minimum=1)
        if value is not None:
            return value, name
    return None, "max_tokens"


# vLLM raises a temperature above 0 and under this to it, before it reads greedy decoding
# (vllm/sampling_params.py `_MAX_TEMP`): a tiny temperature samples, at this one; only 0 is greedy.
LOWEST_TEMPERATURE = 1e-2


def vllm_temperature(asked: float) -> float:
    """The temperature vLLM samples at when `asked` is asked for (0: greedy)."""
    return max(asked, LOWEST_TEMPERATURE) if asked > 0 else 0.0


# vLLM clamps each `logit_bias` value to this bound (SamplingParams.from_optional; OpenAI documents
# [-100, 100]).
LOGIT_BIAS_BOUND = 100.0


def vllm_logit_bias(asked: float) -> float:
    """The bias vLLM adds to a token's logit when `asked` is asked for."""
    return max(-LOGIT_BIAS_BOUND, min(LOGIT_BIAS_BOUND, asked))


def choice_count(body: dict[str, Any]) -> int:
    """`n`; more than one greedy choice is a 400 in vLLM (they would all be the same)."""
    n = int_field(body, "n", 1, minimum=1) or 1
    temperature = body.get("temperature")
    greedy = isinstance(temperature, int | float) and vllm_temperature(temperature) == 0
    if n > 1 and greedy and not isinstance(temperature, bool):
        raise ApiError(400, f"n must be 1 when using greedy sampling, got {n}.")
    return n


def include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise ApiError(
            400, "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options")
    return bool_field(options, "include_usage")


def json_response(payload: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/json")


# -- server-sent events --------------------------------------------------------------------


@asynccontextmanager
async def event_stream(request: web.Request) -> AsyncIterator[web.StreamResponse]:
    """An open `text/event-stream` response; a client that hangs up ends the block quietly."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    # Nothing is left to answer then, and a client leaving is no error.
    with contextlib.suppress(ConnectionResetError):
        yield response


# The last event of an OpenAI stream, after an error event too: the OpenAI SDK waits for it.
DONE = b"data: [DONE]\n\n"


def sse(event: str | None, data: dict[str, Any]) -> bytes:
    """One server-sent event; `event` None writes the bare `data:` line chat completions uses."""
    line = b"data: " + orjson.dumps(data) + b"\n\n"
    return line if event is None else b"event: " + event.encode() + b"\n" + line


async def send_event(response: web.StreamResponse, payload: dict[str, Any]) -> None:
    await response.write(sse(None, payload))


async def close_event_stream(response: web.StreamResponse) -> None:
    await response.write(DONE)
    await response.write_eof()
