"""The APIs agents speak to the proxy, each translated to chat completions for the upstream.

vLLM serves `/v1/responses` and `/v1/messages` too, but neither answers with token ids, so the
proxy speaks those dialects to the agent itself and chat completions (with `return_token_ids` and
logprobs) to the upstream: every call is recorded, stitched, judged and trained as a chat call,
whatever the agent spoke. A dialect is three things:

- `translate`: the client's body to the chat-completions body sent upstream (`BadRequest`, naming
  the field, for what it cannot express: hosted tools, item types it does not know);
- a `Rendering`: the upstream's chat answer back in the client's dialect, whole or as a stream of
  server-sent events (written as the chat chunks arrive, the last event held until the record is
  committed, as `[DONE]` is for chat);
- `error_body`: an error in the dialect's own shape.

`openai` (chat and legacy completions) is the identity dialect: its rendering only cuts the
answer back to what the client asked for (capture.py).
"""

from __future__ import annotations

from typing import Protocol

from art_proxy.errors import ArtProxyError
from art_proxy.records import Dialect, JsonObject


class Rendering(Protocol):
    """How one call's answer reaches its client."""

    def whole(self, response: JsonObject) -> JsonObject:
        """A whole chat answer as the client's answer body."""
        ...

    def chunk(self, chunk: JsonObject, raw: bytes) -> bytes:
        """The events for one upstream chat chunk, parsed from `raw` (b"" when there is nothing
        to send)."""
        ...

    def end(self, response: JsonObject | None) -> bytes:
        """The closing events, sent once the call is recorded: `response` is the whole answer
        rebuilt from the stream, None when the stream failed (its error event was sent)."""
        ...

    def stream_error(self, error: ArtProxyError) -> bytes:
        """An error event, for a stream that is already under way."""
        ...

    def failed_answer(self, raw: bytes, status: int) -> bytes:
        """An upstream's error body (OpenAI-shaped, as vLLM writes it) in the dialect's shape."""
        ...


# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_body(dialect: Dialect, error: ArtProxyError) -> JsonObject:
    """`error` in the dialect's shape: OpenAI's `{"error": {...}}` for openai and responses,
    Anthropic's `{"type": "error", "error": {"type", "message"}}` for anthropic (which has no
    `param`: the field is named in the message)."""
    if dialect != "anthropic":
        return error.body()
    message = error.message
    if error.param and error.param not in message:
        message = f"{error.param}: {message}"
    kind = _ANTHROPIC_ERROR_TYPES.get(error.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def dialect_of_path(path: str) -> Dialect:
    """The dialect a route speaks, for errors raised before its handler runs (auth, 404)."""
    if path.endswith("/v1/messages") or path.endswith("/v1/messages/count_tokens"):
        return "anthropic"
    return "responses" if "/v1/responses" in path else "openai"
