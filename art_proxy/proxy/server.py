"""Running the proxy: forever from the CLI, or for the length of an `async with` in tests."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from art_proxy import serving
from art_proxy.config import ProxySettings, is_loopback
from art_proxy.errors import ArtProxyError, BadRequest

from .app import create_app
from .parts import PARTS, ProxyParts

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningProxy:
    base_url: str  # ends in /v1, ready for OPENAI_BASE_URL
    root_url: str
    parts: ProxyParts


def warn_if_exposed(settings: ProxySettings) -> None:
    if settings.api_key and not settings.admin_key:
        log.warning(
            "--api-key is set without --admin-key: /art/ and the dashboard are open to %s "
            "(they can read every trajectory and move model aliases)",
            f"anyone who can reach {settings.host}"
            if settings.open_admin
            else "every client on this machine",
        )
    if is_loopback(settings.host):
        return
    missing = []
    if not settings.api_key:
        missing.append("--api-key: anyone who can reach it can call its models")
    if not settings.admin_key and settings.open_admin:
        missing.append("--admin-key: anyone who can reach it can read and change its records")
    elif not settings.admin_key:
        missing.append(
            "--admin-key: /art/ and the dashboard answer clients on this machine only (a "
            "trainer or judge elsewhere needs the key)"
        )
    if missing:
        log.warning(
            "art-proxy binds %s, beyond loopback, without %s",
            settings.host,
            "; without ".join(missing),
        )


class _JsonErrorHandler(RequestHandler):
    """aiohttp's connection handler, answering what its HTTP parser refuses (a header over 8190
    bytes, bare CR or LF, a NUL, two Content-Lengths...) in the proxy's JSON error shape. aiohttp's
    own answer is text/plain and quotes the offending bytes back; this one names the class of
    error only, and the log line keeps no traceback (anyone can send such bytes)."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        log.warning(
            "refused a malformed HTTP request from %s: %s", request.remote, type(exc).__name__
        )
        if request.writer.output_size > 0:  # part of an answer went out: only closing is left
            raise ConnectionError("cannot answer a request whose response has begun")
        error = (
            BadRequest(f"malformed HTTP request ({type(exc).__name__})", status=status)
            if status < 500
            else ArtProxyError("internal error in art-proxy")
        )
        response = web.json_response(error.body(), status=status)
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        # aiohttp logs a traceback for a body it could not decode once the handler has answered
        # (while draining it): a client's fault, which must not flood the log.
        exc = kwargs.get("exc_info")
        log.warning("HTTP connection error: %s", type(exc).__name__ if exc else args[0])


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _JsonErrorHandler(self, loop=self._loop, **self._kwargs)


class _JsonErrorRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer protocol errors as JSON (`_JsonErrorHandler`)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _JsonErrorServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            **self._kwargs,
        )


@asynccontextmanager
async def running_proxy(settings: ProxySettings) -> AsyncIterator[RunningProxy]:
    """Start the proxy on `settings.host:settings.port` (port 0: any free port)."""
    app = create_app(settings)
    runner = _JsonErrorRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        port = runner.addresses[0][1]
        root = f"http://{settings.host}:{port}"
        yield RunningProxy(base_url=f"{root}/v1", root_url=root, parts=app[PARTS])
    finally:
        await runner.cleanup()


def serve(settings: ProxySettings) -> None:
    """Serve until SIGINT/SIGTERM, on uvloop where available."""
    warn_if_exposed(settings)
    serving.run(_serve_until_stopped(settings))


async def _serve_until_stopped(settings: ProxySettings) -> None:
    stop = serving.stop_requested()
    async with running_proxy(settings) as proxy:
        serving.tune_collector()
        upstreams = ", ".join(settings.upstream)
        log.info(
            "art-proxy serving on %s (store %s; upstream %s)",
            proxy.base_url,
            _safe_url(settings.store),
            upstreams,
        )
        key_hint = " (open it once with ?key=<admin key>)" if settings.admin_key else ""
        log.info("dashboard: %s/dashboard%s", proxy.root_url, key_hint)
        await stop.wait()
        log.info("stopping")


def _safe_url(url: str) -> str:
    """A store URL without its password, for logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable store URL>"
