"""The one error hierarchy of art-proxy.

Every error that reaches a client is an `ArtProxyError` rendered as an OpenAI-shaped body,
`{"error": {"message", "type", "param", "code"}}` with `code` equal to the HTTP status, the shape vLLM
uses. The status carries retry meaning: 4xx is the caller's mistake, 429/5xx/504 is what a retry can
fix, which is how the OpenAI SDK decides to retry. Foreign exceptions are translated once, at the
boundary where they occur (`raise UpstreamTimeout(...) from exc`). The servers that stand in for
vLLM raise `art_proxy.wire.ApiError`, an `ArtProxyError` that speaks vLLM's type names.
"""

from __future__ import annotations

import json
from typing import Any


class ArtProxyError(Exception):
    """An error a client receives; a subclass names its status and type once, in its header:
    `class NotFound(ArtProxyError, status=404, type="NotFoundError")`."""

    status: int = 500
    type: str = "InternalServerError"

    def __init_subclass__(
        cls, *, status: int | None = None, type: str | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if type is not None:
            cls.type = type

    def __init__(
        self, message: str, *, param: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if status is not None:
            self.status = status

    def body(self) -> dict[str, Any]:
        """The OpenAI-shaped body, written here only: the proxy's errors and vLLM's alike."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.status,
            }
        }


def error_message(raw: bytes | str, limit: int = 2000) -> str:
    """The message of an OpenAI-shaped error body (the body `ArtProxyError.body` writes, and
    vLLM's), else the body's start: what a client of an upstream says when the call failed."""
    try:
        return str(json.loads(raw)["error"]["message"])[:limit]
    except (ValueError, KeyError, TypeError):
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        return text[:limit]


def exception_text(exc: BaseException, limit: int = 1000) -> str:
    """`Type: message` (the type alone when the message is empty), cut to `limit` characters:
    an exception may carry a whole response body."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


class BadRequest(ArtProxyError, status=400, type="BadRequestError"): ...


class Unauthorized(ArtProxyError, status=401, type="AuthenticationError"): ...


class Forbidden(ArtProxyError, status=403, type="PermissionDeniedError"): ...


class NotFound(ArtProxyError, status=404, type="NotFoundError"): ...


class MethodNotAllowed(ArtProxyError, status=405, type="MethodNotAllowedError"): ...


class Conflict(ArtProxyError, status=409, type="ConflictError"): ...


class BodyTooLarge(ArtProxyError, status=413, type="RequestTooLargeError"): ...


class UpstreamError(ArtProxyError, status=502, type="UpstreamError"):
    """The upstream could not be reached or broke the protocol."""


class StoreUnavailable(ArtProxyError, status=503, type="StoreUnavailableError"):
    """Raised only with `--on-store-error fail`: the call was answered but could not be recorded."""


class UpstreamTimeout(ArtProxyError, status=504, type="UpstreamTimeoutError"): ...


class StoreError(Exception):
    """A database failure inside the store; the proxy decides what it means for the client."""


class JournalError(StoreError):
    """The journal could not take a record (a full or failing disk)."""


class GroupAlreadyConsumed(StoreError):
    """A training step named a group its run already trained on at another step: nothing of the
    step was written (each group feeds exactly one step of a run)."""

    def __init__(self, run: str, step: int, consumed: dict[str, int]) -> None:
        self.run = run
        self.step = step
        self.consumed = consumed  # group id -> the step that consumed it
        listed = ", ".join(f"{group} (step {at})" for group, at in sorted(consumed.items()))
        super().__init__(
            f"step {step} of run {run!r} names groups the run already consumed: {listed}"
        )


class ConfigError(Exception):
    """A setting that cannot work (bad store URL, no upstream): a one-line CLI message."""


class ScenarioFileError(ConfigError):
    """A scenarios file that cannot be run: `FILE:LINE: reason`, before any rollout starts."""
