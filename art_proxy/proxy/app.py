"""The proxy's aiohttp application: routes, middlewares and the lifecycle of its parts.

Every error leaves as an OpenAI-shaped JSON body (aiohttp's own 404/405/413 included); nothing
unexpected leaks a traceback to the client. Keys are compared in constant time and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Middleware

from art_proxy import dashboard
from art_proxy.config import Durability, ProxySettings
from art_proxy.errors import (
    ArtProxyError,
    ConfigError,
    MethodNotAllowed,
    NotFound,
    StoreError,
    Unauthorized,
)
from art_proxy.journal.directory import journal_directory
from art_proxy.journal.ingester import Ingester
from art_proxy.journal.segments import Journal
from art_proxy.privacy.erasure import deleted_text
from art_proxy.privacy.pii import pii_redactor
from art_proxy.privacy.retention import PERIOD_S, expire
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .admin import Admin
from .admin_guard import admin_guard
from .aliases import Aliases
from .best_of import BestOf, best_of_chooser
from .dialects import dialect_of_path, error_body
from .health import health
from .metrics import ProxyMetrics
from .parts import PARTS, ProxyParts
from .recording import Counters, Recorder
from .relay import Relay
from .request_body import body_too_large
from .shadow import ShadowSampler
from .tracing import CallSpans
from .tracker import TrajectoryTracker
from .upstream import Upstreams
from .upstream_models import check_upstreams, watch_aliases

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# How a scenario's group stays open after its newest member started (see tracker.py).
GROUP_WINDOW_S = 60.0
# How long a read of the store through the proxy (/art/v1, a stored response) waits for the
# journal's records before it to be ingested; past it the read goes ahead (the store is down).
SETTLE_TIMEOUT_S = 10.0
# The same for the tracker's look-up of a conversation that memory does not hold: on the hot path.
LOOKUP_SETTLE_TIMEOUT_S = 1.0
# How long a record the full journal refused waits for the records journaled before it to reach
# the store, before it is counted lost (or answered 503): written ahead of them it would name a
# trajectory the store lacks yet and land out of order.
BEHIND_BACKLOG_TIMEOUT_S = 10.0
# How long a stopping proxy goes on ingesting; what is left waits in the journal for the next start.
DRAIN_TIMEOUT_S = 10.0


def create_app(settings: ProxySettings) -> web.Application:
    app = web.Application(client_max_size=int(settings.max_body_mb * 1024 * 1024))
    metrics = ProxyMetrics(app)
    app.middlewares.extend(
        [metrics.timed, _errors, _auth(settings), admin_guard(settings), _own_records_first]
    )
    app.cleanup_ctx.append(_lifecycle(settings))
    _add_routes(app.router)
    app.router.add_get("/metrics", metrics.scrape)
    return app


def _lifecycle(settings: ProxySettings) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        # Loaded first (seconds: spaCy): a missing install fails before anything is opened.
        redactor = (
            await asyncio.to_thread(pii_redactor, settings.pii_spacy_model)
            if settings.redact_pii
            else None
        )
        directory = journal_directory(settings.journal, settings.store)
        # With a journal, calls need no store to be answered and recorded: one that cannot be
        # reached now is caught up with (schema first) once it answers.
        store = await TrajectoryStore.open(
            settings.store,
            unreachable_ok=directory is not None,
            # The journal lets go of a record once the store has committed it.
            power_safe=settings.durability is Durability.power,
        )
        if not store.migrated:
            log.error(
                "STORE UNAVAILABLE at start (%s): calls are answered and journaled in %s, and "
                "go to the store when it answers",
                store.engine.url.render_as_string(hide_password=True),
                directory,
            )
        try:
            chooser = best_of_chooser(settings, store, redactor)  # a bad check: said here
            journal = (
                Journal.open(
                    directory,
                    settings.store,
                    settings.durability,
                    max_backlog_bytes=int(settings.journal_max_mb * 2**20),
                )
                if directory is not None
                else None
            )
        except BaseException:
            await store.aclose()
            raise
        ingester = None
        if journal is not None:
            ingester = Ingester(journal, store)
            ingester.start()
            # What an earlier proxy left goes in before the first call is answered: a call of
            # one of its trajectories is looked up in the store, and would start again at seq 0.
            if not await _journaled_records_stored(journal, ingester, DRAIN_TIMEOUT_S):
                log.warning(
                    "serving before the %d records an earlier proxy left are in the store: "
                    "calls of their trajectories may start new ones meanwhile",
                    journal.backlog_frames,
                )
        counters = Counters()
        tracker = TrajectoryTracker(
            store,
            settings.upstream,
            group_size=settings.group_size,
            group_window=GROUP_WINDOW_S,
            own_records_stored=functools.partial(
                _journaled_records_stored, journal, ingester, LOOKUP_SETTLE_TIMEOUT_S
            ),
        )
        aliases = Aliases(store)
        try:
            if store.migrated:  # else housekeeping reads them once the store answers
                await aliases.reload()
        except StoreError:
            await _stop_recording(store, journal, ingester)
            raise
        async with Upstreams(
            settings.upstream,
            api_key=settings.upstream_api_key,
            timeout_s=settings.upstream_timeout,
            pass_client_key=not settings.api_key,
        ) as upstreams:
            try:
                served = await check_upstreams(upstreams)
            except ConfigError:
                await _stop_recording(store, journal, ingester)
                raise
            if len(served) == len(upstreams.urls):
                aliases.check_served(list(served.values()), utcnow())
            spans = CallSpans.from_environment()
            recorder = Recorder(
                store,
                tracker,
                settings.on_store_error,
                counters,
                journal,
                journaled_before_stored=functools.partial(
                    _journaled_records_stored, journal, ingester, BEHIND_BACKLOG_TIMEOUT_S
                ),
                spans=spans,
            )
            shadow = ShadowSampler(
                upstreams,
                tracker,
                recorder,
                fraction=settings.shadow_fraction,
                samples=settings.shadow_samples,
                max_in_flight=settings.shadow_max_in_flight,
            )
            best_of = BestOf(
                tracker,
                recorder,
                chooser,
                candidates=settings.best_of,
                fraction=settings.best_of_fraction,
                timeout_s=settings.best_of_timeout,
            )
            relay = Relay(
                upstreams,
                store,
                tracker,
                recorder,
                aliases,
                shadow,
                best_of,
                default_split=settings.default_split,
                record_policy=settings.record,
                read_your_writes=functools.partial(_settle_reads, journal),
            )
            admin = Admin(store, tracker, aliases, journal, redactor)
            parts = ProxyParts(
                settings,
                store,
                tracker,
                counters,
                relay,
                admin,
                aliases,
                journal,
                ingester,
                redactor,
            )
            app[PARTS] = parts
            background = [
                asyncio.create_task(
                    _housekeeping(settings.idle_timeout, store, tracker, aliases, journal)
                ),
                asyncio.create_task(watch_aliases(upstreams, aliases)),
            ]
            if settings.retain_days > 0:
                background.append(
                    asyncio.create_task(_retention(settings.retain_days, store, tracker, journal))
                )
            try:
                yield
            finally:
                await shadow.aclose()  # while the store and the upstream session still serve
                await best_of.aclose()
                for task in background:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await _stop_recording(store, journal, ingester)
                if spans is not None:
                    await asyncio.to_thread(spans.shutdown)  # exports what is batched

    return lifecycle


async def _settle_reads(journal: Journal | None) -> None:
    """What a read of the store on a client's behalf (/art/v1, the dashboard: `_own_records_first`;
    a stored response: relay.py) awaits first: the calls recorded before it, ingested, if they
    come within `SETTLE_TIMEOUT_S`."""
    if journal is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(journal.settled(), SETTLE_TIMEOUT_S)


async def _journaled_records_stored(
    journal: Journal | None, ingester: Ingester | None, timeout_s: float
) -> bool:
    """Wait until this proxy's records journaled so far are in the store, when any are pending
    and the store takes them (for at most `timeout_s`; not at all during an outage); whether they
    are. Before the tracker asks the store about a conversation memory has no more (its bound),
    and before a record the full journal refused is written to the store directly."""
    if journal is None or ingester is None or journal.backlog_frames == 0:
        return True
    if ingester.state.unavailable_since is not None:
        return False
    try:
        await asyncio.wait_for(journal.settled(), timeout_s)
    except TimeoutError:
        return False
    return True


async def _stop_recording(
    store: TrajectoryStore, journal: Journal | None, ingester: Ingester | None
) -> None:
    """Ingest what the journal holds (for a while), then close the journal and the store."""
    try:
        if ingester is not None:
            await ingester.aclose(DRAIN_TIMEOUT_S)
        if journal is not None:
            left = journal.close()
            if left:
                log.error(
                    "stopping with %d records not yet in the store: they stay in the journal "
                    "%s and are ingested when a proxy of this store starts there",
                    left,
                    journal.directory,
                )
    finally:
        await store.aclose()


def _add_routes(router: web.UrlDispatcher) -> None:
    # Routes exist before the parts do (the router freezes at start-up), so they look them up.
    def via(part: Literal["relay", "admin"], name: str) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            handler: Handler = getattr(getattr(request.app[PARTS], part), name)
            return await handler(request)

        return handle

    router.add_get("/health", health)
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
        router.add_post(prefix + "/v1/responses/input_tokens", via("relay", "input_tokens"))
        router.add_get(prefix + "/v1/responses/{response}", via("relay", "stored_response"))
        router.add_post(prefix + "/v1/messages", via("relay", "messages"))
        router.add_post(prefix + "/v1/messages/count_tokens", via("relay", "count_tokens"))
        router.add_get(prefix + "/v1/models", via("relay", "models"))
    router.add_get("/art/v1/trajectories", via("admin", "trajectories"))
    router.add_get("/art/v1/trajectories/{trajectory}", via("admin", "trajectory"))
    router.add_post("/art/v1/trajectories/{trajectory}/finish", via("admin", "finish"))
    router.add_get(
        "/art/v1/trajectories/{trajectory}/feedback", via("admin", "trajectory_feedback")
    )
    router.add_post("/art/v1/feedback", via("admin", "add_feedback"))
    router.add_post("/art/v1/forget", via("admin", "forget"))
    router.add_get("/art/v1/lineage", via("admin", "lineage"))
    router.add_get("/art/v1/groups", via("admin", "groups"))
    router.add_get("/art/v1/scenarios", via("admin", "scenarios"))
    router.add_get("/art/v1/aliases", via("admin", "aliases"))
    router.add_get("/art/v1/leases", via("admin", "leases"))
    router.add_put("/art/v1/aliases/{alias:.+}", via("admin", "set_alias"))
    router.add_get("/art/v1/alias_moves", via("admin", "alias_moves"))
    router.add_get("/art/v1/judgments", via("admin", "judgments"))
    router.add_get("/art/v1/training_steps", via("admin", "training_steps"))
    dashboard.add_routes(
        router,
        lambda request: request.app[PARTS].store,
        lambda request: request.app[PARTS].redactor,
    )


# Seconds between merges of the store's open groups and aliases into memory (see
# groups.Groups.refresh and aliases.py).
_GROUP_REFRESH_S = 1.0
_REPORT_EVERY_S = 10.0  # housekeeping's failures, logged at most this often


async def _housekeeping(
    idle_timeout: float,
    store: TrajectoryStore,
    tracker: TrajectoryTracker,
    aliases: Aliases,
    journal: Journal | None,
) -> None:
    """Finish idle trajectories and keep the tracker's view of groups and the aliases current,
    off the hot path."""
    period = (
        min(_GROUP_REFRESH_S, max(idle_timeout / 4, 0.05)) if idle_timeout > 0 else _GROUP_REFRESH_S
    )
    since = utcnow()
    reported = 0.0  # when a failure was last logged: an outage fails every round
    while True:
        await asyncio.sleep(period)
        try:
            started = utcnow()
            tracker.groups.refresh(await store.active_groups(since - timedelta(seconds=period)))
            since = started
            await aliases.reload()
            # While records wait in the journal the store's idea of "idle" is stale.
            if idle_timeout > 0 and (journal is None or journal.backlog_frames == 0):
                finished = await store.finish_idle(utcnow() - timedelta(seconds=idle_timeout))
                if finished:
                    tracker.forget(finished)
                    log.info("finished %d idle trajectories", len(finished))
        except Exception as exc:  # a StoreError, mostly; whatever it is, the loop goes on
            if time.monotonic() - reported >= _REPORT_EVERY_S:
                reported = time.monotonic()
                log.error("housekeeping failed (will retry): %s: %s", type(exc).__name__, exc)


async def _retention(
    retain_days: float, store: TrajectoryStore, tracker: TrajectoryTracker, journal: Journal | None
) -> None:
    """`--retain-days`: delete what aged past it now, then every `retention.PERIOD_S`."""
    while True:
        try:
            deleted = await expire(
                store,
                retain_days,
                journal.directory if journal is not None else None,
                on_deleted=tracker.forget,
            )
            if any(deleted.values()):
                log.info("retention deleted %s", deleted_text(deleted))
        except Exception as exc:  # a StoreError, mostly: the next round tries again
            log.error("retention failed (will retry): %s: %s", type(exc).__name__, exc)
        await asyncio.sleep(PERIOD_S)


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


@web.middleware
async def _own_records_first(request: web.Request, handler: Handler) -> web.StreamResponse:
    """/art/v1 and the dashboard read and change recorded calls: they see every call this proxy
    answered before them (read-your-writes), once its journal has them in the store."""
    if request.path.startswith("/art/") or dashboard.is_dashboard_path(request.path):
        await _settle_reads(request.app[PARTS].journal)
    return await handler(request)


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
        if key and path not in ("/health", "/metrics") and not _bearer_matches(request, key):
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
