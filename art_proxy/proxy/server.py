"""Running the proxy: forever from the CLI, or for the length of an `async with` in tests."""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from art_proxy import serving
from art_proxy.config import ProxySettings

from .app import PARTS, ProxyParts, create_app

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunningProxy:
    base_url: str  # ends in /v1, ready for OPENAI_BASE_URL
    root_url: str
    parts: ProxyParts


def warn_if_exposed(settings: ProxySettings) -> None:
    if _is_loopback(settings.host):
        return
    if not settings.api_key or not settings.admin_key:
        log.warning(
            "art-proxy binds %s, beyond loopback, without %s: anyone who can reach it can use it",
            settings.host,
            " and ".join(
                flag
                for flag, key in (
                    ("--api-key", settings.api_key),
                    ("--admin-key", settings.admin_key),
                )
                if not key
            ),
        )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@asynccontextmanager
async def running_proxy(settings: ProxySettings) -> AsyncIterator[RunningProxy]:
    """Start the proxy on `settings.host:settings.port` (port 0: any free port)."""
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None)
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
