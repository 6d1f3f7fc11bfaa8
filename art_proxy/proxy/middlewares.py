"""The proxy's middlewares: every error as the dialect's JSON body, the keys checked, and a
client's reads of the store made after the calls this proxy answered before them.

Keys are compared in constant time and never logged; nothing unexpected leaks a traceback to the
client.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from art_proxy import dashboard
from art_proxy.config import ProxySettings
from art_proxy.errors import ArtProxyError, MethodNotAllowed, NotFound, StoreError, Unauthorized
from art_proxy.journal.segments import Journal

from .dialects import dialect_of_path, error_body
from .parts import PARTS
from .request_body import body_too_large

log = logging.getLogger(__name__)

# How long a read of the store through the proxy (/art/v1, a stored response) waits for the
# journal's records before it to be ingested; past it the read goes ahead (the store is down).
SETTLE_TIMEOUT_S = 10.0


async def settle_reads(journal: Journal | None) -> None:
    """What a read of the store on a client's behalf (/art/v1, the dashboard: `own_records_first`;
    a stored response: relay.py) awaits first: the calls recorded before it, ingested, if they
    come within `SETTLE_TIMEOUT_S`."""
    if journal is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(journal.settled(), SETTLE_TIMEOUT_S)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    dialect = dialect_of_path(request.path)
    try:
        return await handler(request)
    except ArtProxyError as exc:
        response = web.json_response(error_body(dialect, exc), status=exc.status)
        if request.content.exception() is not None:
            # A body aiohttp could not decode: the connection's framing is lost, so say it will
            # close rather than let the client reuse it and fail its next request.
            response.force_close()
        return response
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = _translate_http(request, exc)
        if exc.status == 404:
            log.warning("404: %s", error.message)
        return web.json_response(error_body(dialect, error), status=exc.status)
    except StoreError as exc:
        # The reason may quote SQL: it goes to the log, never to the client.
        log.error("store error on %s: %s", request.path, exc)
        error = ArtProxyError("the store failed (the proxy's log has the reason)")
        return web.json_response(error_body(dialect, error), status=500)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        error = ArtProxyError("internal error in art-proxy")
        return web.json_response(error_body(dialect, error), status=500)


@web.middleware
async def own_records_first(request: web.Request, handler: Handler) -> web.StreamResponse:
    """/art/v1 and the dashboard read and change recorded calls: they see every call this proxy
    answered before them (read-your-writes), once its journal has them in the store."""
    if request.path.startswith("/art/") or dashboard.is_dashboard_path(request.path):
        await settle_reads(request.app[PARTS].journal)
    return await handler(request)


def _translate_http(request: web.Request, exc: web.HTTPException) -> ArtProxyError:
    if exc.status == 404:
        return NotFound(f"no route {request.method} {request.path}")
    if exc.status == 405:
        return MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
    if exc.status == 413:
        return body_too_large(request.client_max_size)
    return ArtProxyError(exc.reason, status=exc.status)


def auth(settings: ProxySettings) -> Middleware:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if dashboard.is_dashboard_path(path):  # the admin key, by header or session cookie
            return await dashboard.guard_dashboard(
                request, handler, settings.admin_key, _bearer_matches
            )
        key = settings.admin_key if path.startswith("/art/") else settings.api_key
        if (
            key
            and path not in ("/health", "/ready", "/metrics")
            and not _bearer_matches(request, key)
        ):
            error = Unauthorized(
                "missing or wrong API key (send Authorization: Bearer KEY, or x-api-key: KEY)"
            )
            return web.json_response(error_body(dialect_of_path(path), error), status=401)
        return await handler(request)

    return auth


def _bearer_matches(request: web.Request, key: str) -> bool:
    """The key as a bearer token (OpenAI's SDKs), or as `x-api-key` (Anthropic's)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer":
        return hmac.compare_digest(token.strip().encode(), key.encode())
    anthropic_key = request.headers.get("x-api-key")
    return anthropic_key is not None and hmac.compare_digest(anthropic_key.encode(), key.encode())
