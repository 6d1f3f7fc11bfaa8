"""The proxy's aiohttp application: routes, middlewares and the lifecycle of its parts.

Every error leaves as an OpenAI-shaped JSON body (aiohttp's own 404/405/413 included); nothing
unexpected leaks a traceback to the client. Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Middleware

from art_proxy import dashboard
from art_proxy.config import ProxySettings
from art_proxy.errors import (
    ArtProxyError,
    MethodNotAllowed,
    NotFound,
    StoreError,
    Unauthorized,
)
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .admin import Admin
from .aliases import Aliases
from .dialects import dialect_of_path, error_body
from .recording import Counters, Recorder
from .relay import Relay
from .request_body import body_too_large
from .shadow import ShadowSampler
from .tracker import TrajectoryTracker
from .upstream import Upstreams

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# How a scenario's group stays open after its newest member started (see tracker.py).
GROUP_WINDOW_S = 60.0


@dataclass
class ProxyParts:
    settings: ProxySettings
    store: TrajectoryStore
    tracker: TrajectoryTracker
    counters: Counters
    relay: Relay
    admin: Admin
    aliases: Aliases


PARTS = web.AppKey("parts", ProxyParts)


def create_app(settings: ProxySettings) -> web.Application:
    app = web.Application(
        client_max_size=int(settings.max_body_mb * 1024 * 1024),
        middlewares=[_errors, _auth(settings)],
    )
    app.cleanup_ctx.append(_lifecycle(settings))
    _add_routes(app.router)
    return app


def _lifecycle(settings: ProxySettings) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        store = await TrajectoryStore.open(settings.store)
        counters = Counters()
        tracker = TrajectoryTracker(
            store, settings.upstream, group_size=settings.group_size, group_window=GROUP_WINDOW_S
        )
        aliases = Aliases(store)
        try:
            await aliases.reload()
        except StoreError:
            await store.aclose()
            raise
        async with Upstreams(
            settings.upstream,
            api_key=settings.upstream_api_key,
            timeout_s=settings.upstream_timeout,
            pass_client_key=not settings.api_key,
        ) as upstreams:
            recorder = Recorder(store, tracker, settings.on_store_error, counters)
            shadow = ShadowSampler(
                upstreams,
                tracker,
                recorder,
                fraction=settings.shadow_fraction,
                samples=settings.shadow_samples,
                max_in_flight=settings.shadow_max_in_flight,
            )
            relay = Relay(
                upstreams,
                store,
                tracker,
                recorder,
                aliases,
                shadow,
                default_split=settings.default_split,
            )
            admin = Admin(store, tracker, aliases)
            app[PARTS] = ProxyParts(settings, store, tracker, counters, relay, admin, aliases)
            sweeper = asyncio.create_task(
                _housekeeping(settings.idle_timeout, store, tracker, aliases)
            )
            try:
                yield
            finally:
                await shadow.aclose()  # while the store and the upstream session still serve
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
                await store.aclose()

    return lifecycle


def _add_routes(router: web.UrlDispatcher) -> None:
    # Routes exist before the parts do (the router freezes at start-up), so they look them up.
    def via(part: Literal["relay", "admin"], name: str) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            handler: Handler = getattr(getattr(request.app[PARTS], part), name)
            return await handler(request)

        return handle

    router.add_get("/health", _health)
    scenario, group, trajectory = (
        "/scenario/{scenario}",
        "/group/{group}",
        "/trajectory/{trajectory}",
    )
    for prefix in (
        "",
        scenario,
        scenario + trajectory,
        scenario + group,
        scenario + group + trajectory,
    ):
        router.add_post(prefix + "/v1/chat/completions", via("relay", "chat"))
        router.add_post(prefix + "/v1/completions", via("relay", "completion"))
        router.add_post(prefix + "/v1/responses", via("relay", "responses"))
        router.add_get(prefix + "/v1/responses/{response}", via("relay", "stored_response"))
        router.add_post(prefix + "/v1/messages", via("relay", "messages"))
        router.add_get(prefix + "/v1/models", via("relay", "models"))
    router.add_get("/art/v1/trajectories", via("admin", "trajectories"))
    router.add_get("/art/v1/trajectories/{trajectory}", via("admin", "trajectory"))
    router.add_post("/art/v1/trajectories/{trajectory}/finish", via("admin", "finish"))
    router.add_get(
        "/art/v1/trajectories/{trajectory}/feedback", via("admin", "trajectory_feedback")
    )
    router.add_post("/art/v1/feedback", via("admin", "add_feedback"))
    router.add_get("/art/v1/groups", via("admin", "groups"))
    router.add_get("/art/v1/scenarios", via("admin", "scenarios"))
    router.add_get("/art/v1/aliases", via("admin", "aliases"))
    router.add_put("/art/v1/aliases/{alias}", via("admin", "set_alias"))
    router.add_get("/art/v1/alias_moves", via("admin", "alias_moves"))
    router.add_get("/art/v1/training_steps", via("admin", "training_steps"))
    dashboard.add_routes(router, lambda request: request.app[PARTS].store)


async def _health(request: web.Request) -> web.Response:
    parts = request.app[PARTS]
    writer = parts.store.writer
    # A proxy whose store writer stopped answers calls it cannot record: take it out of rotation.
    return web.json_response(
        {
            "status": "ok" if writer.running else "store writer stopped",
            "upstreams": parts.settings.upstream,
            "open_trajectories": parts.tracker.open_count,
            "calls": parts.counters.calls,
            "failed_calls": parts.counters.failed_calls,
            "lost_records": parts.counters.lost_records,
            "stitch_misses": parts.counters.stitch_misses,
            "calls_by_attribution": parts.counters.by_attribution,
            "calls_by_dialect": parts.counters.by_dialect,
            "untrainable_calls": parts.counters.untrainable_calls,
            "shadow_calls": parts.counters.shadow_calls,
            "shadow_samples": parts.counters.shadow_samples,
            "shadow_skipped": parts.counters.shadow_skipped,
            "commits": writer.commits,
            "records_committed": writer.batches,
            "unreadable_rows": parts.store.unreadable_rows,
        },
        status=200 if writer.running else 503,
    )


# Seconds between merges of the store's open groups and aliases into memory (see
# groups.Groups.refresh and aliases.py).
_GROUP_REFRESH_S = 1.0


async def _housekeeping(
    idle_timeout: float, store: TrajectoryStore, tracker: TrajectoryTracker, aliases: Aliases
) -> None:
    """Finish idle trajectories and keep the tracker's view of groups and the aliases current,
    off the hot path."""
    period = (
        min(_GROUP_REFRESH_S, max(idle_timeout / 4, 0.05)) if idle_timeout > 0 else _GROUP_REFRESH_S
    )
    since = utcnow()
    while True:
        await asyncio.sleep(period)
        try:
            started = utcnow()
            tracker.groups.refresh(await store.active_groups(since - timedelta(seconds=period)))
            since = started
            await aliases.reload()
            if idle_timeout > 0:
                finished = await store.finish_idle(utcnow() - timedelta(seconds=idle_timeout))
                if finished:
                    tracker.forget(finished)
                    log.info("finished %d idle trajectories", len(finished))
        except StoreError as exc:
            log.error("housekeeping failed (will retry): %s", exc)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
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


def _translate_http(request: web.Request, exc: web.HTTPException) -> ArtProxyError:
    if exc.status == 404:
        return NotFound(f"no route {request.method} {request.path}")
    if exc.status == 405:
        return MethodNotAllowed(f"{request.method} is not allowed on {request.path}")
    if exc.status == 413:
        return body_too_large(request.client_max_size)
    return ArtProxyError(exc.reason, status=exc.status)


def _auth(settings: ProxySettings) -> Middleware:
    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if dashboard.is_dashboard_path(path):  # the admin key, by header or session cookie
            return await dashboard.guard_dashboard(
                request, handler, settings.admin_key, _bearer_matches
            )
        key = settings.admin_key if path.startswith("/art/") else settings.api_key
        if key and path != "/health" and not _bearer_matches(request, key):
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
