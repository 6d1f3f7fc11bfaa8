"""The proxy's aiohttp application: its routes, its middlewares in order (middlewares.py) and the
lifecycle of its parts, the background rounds (housekeeping.py) included.

Every error leaves as an OpenAI-shaped JSON body (aiohttp's own 404/405/413 included).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler

from art_proxy import dashboard
from art_proxy.config import Durability, ProxySettings
from art_proxy.errors import (
    ConfigError,
    StoreError,
)
from art_proxy.journal.directory import journal_directory
from art_proxy.journal.ingester import Ingester
from art_proxy.journal.segments import Journal
from art_proxy.privacy.pii import pii_redactor
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow

from .admin import Admin
from .admin_guard import admin_guard
from .aliases import Aliases
from .best_of import BestOf, best_of_chooser
from .counters import Counters
from .health import health, ready
from .housekeeping import housekeeping, retention
from .lease_publisher import LeasePublisher
from .lookups import Lookups
from .metrics import ProxyMetrics
from .middlewares import auth, errors_as_json, own_records_first, settle_reads
from .parts import PARTS, ProxyParts
from .recording import Recorder
from .relay import Relay
from .shadow import ShadowSampler
from .tracing import CallSpans
from .tracker import TrajectoryTracker
from .upstream import Upstreams
from .upstream_models import check_upstreams, watch_aliases

log = logging.getLogger(__name__)

# How a scenario's group stays open after its newest member started (see tracker.py).
GROUP_WINDOW_S = 60.0
# The same for the tracker's look-up of a conversation that memory does not hold: on the hot path.
LOOKUP_SETTLE_TIMEOUT_S = 1.0
# How long a record the full journal refused waits for the records journaled before it to reach
# the store, before it is counted lost (or answered 503): written ahead of them it would name a
# trajectory the store lacks yet and land out of order.
BEHIND_BACKLOG_TIMEOUT_S = 10.0
# How long a starting proxy waits for what an earlier one left in the journal before it answers
# (a stopping one waits --drain-timeout).
DRAIN_TIMEOUT_S = 10.0


def create_app(settings: ProxySettings) -> web.Application:
    app = web.Application(client_max_size=int(settings.max_body_mb * 1024 * 1024))
    metrics = ProxyMetrics(app)
    app.middlewares.extend(
        [metrics.timed, errors_as_json, auth(settings), admin_guard(settings), own_records_first]
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
                label=aliases.label,
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
            lookups = Lookups(
                upstreams,
                store,
                aliases,
                read_your_writes=functools.partial(settle_reads, journal),
                answered_within_s=settings.upstream_timeout or math.inf,  # 0: no limit
            )
            relay = Relay(
                upstreams,
                tracker,
                recorder,
                aliases,
                shadow,
                best_of,
                stored_call=lookups.readable_call,
                default_split=settings.default_split,
                record_policy=settings.record,
            )
            leases = LeasePublisher(store, tracker)
            admin = Admin(store, tracker, aliases, journal, redactor, proxy_id=leases.proxy_id)
            parts = ProxyParts(
                settings,
                store,
                tracker,
                counters,
                relay,
                lookups,
                admin,
                aliases,
                journal,
                ingester,
                redactor,
                upstreams,
            )
            app[PARTS] = parts
            background = [
                asyncio.create_task(
                    housekeeping(settings.idle_timeout, store, tracker, aliases, journal)
                ),
                asyncio.create_task(watch_aliases(upstreams, aliases)),
                asyncio.create_task(leases.run()),
            ]
            if settings.retain_days > 0:
                background.append(
                    asyncio.create_task(retention(settings.retain_days, store, tracker, journal))
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
                await leases.withdraw()
                await _stop_recording(store, journal, ingester, settings.drain_timeout)
                if spans is not None:
                    await asyncio.to_thread(spans.shutdown)  # exports what is batched

    return lifecycle


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
    store: TrajectoryStore,
    journal: Journal | None,
    ingester: Ingester | None,
    drain_timeout_s: float = DRAIN_TIMEOUT_S,
) -> None:
    """Ingest what the journal holds (for up to `drain_timeout_s`), then close the journal and
    the store."""
    try:
        if ingester is not None:
            await ingester.aclose(drain_timeout_s)
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
    def via(part: Literal["relay", "lookups", "admin"], name: str) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            handler: Handler = getattr(getattr(request.app[PARTS], part), name)
            return await handler(request)

        return handle

    router.add_get("/health", health)
    router.add_get("/ready", ready)
    scenario, group, trajectory, split = (
        "/scenario/{scenario}",
        "/group/{group}",
        "/trajectory/{trajectory}",
        "/split/{split}",  # for an agent that sets only its base URL (no X-Art-Split header)
    )
    attributed = (scenario, scenario + trajectory, scenario + group, scenario + group + trajectory)
    for prefix in ("", *attributed, *(path + split for path in attributed)):
        router.add_post(prefix + "/v1/chat/completions", via("relay", "chat"))
        router.add_post(prefix + "/v1/completions", via("relay", "completion"))
        router.add_post(prefix + "/v1/responses", via("relay", "responses"))
        router.add_post(prefix + "/v1/responses/input_tokens", via("lookups", "input_tokens"))
        router.add_get(prefix + "/v1/responses/{response}", via("lookups", "stored_response"))
        router.add_post(prefix + "/v1/messages", via("relay", "messages"))
        router.add_post(prefix + "/v1/messages/count_tokens", via("lookups", "count_tokens"))
        router.add_get(prefix + "/v1/models", via("lookups", "models"))
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
