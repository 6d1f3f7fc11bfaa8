"""`/metrics`: the proxy's counters and state in Prometheus' text format, for a scraper to alert on.

The counters are read at scrape time from what `/health` reports (a collector, not a second set
of counters kept in step with the first): calls by dialect and attribution, failed calls, lost and
rejected records, stitch misses, untrainable and shadow calls, best-of's calls and candidates, the
aliases falling back to the base model, the store's commits, the journal's backlog and its oldest
frame's age, whether the store is reachable and calls are recorded; by served model and alias,
tokens in and out and each call's seconds to its last byte and first chunk (call_metrics.py). A
middleware times every request by route (the route's pattern, so the series stay few), method and
status, and counts those in flight; the process's own (CPU, memory, open files) come with them.
A running canary's arms (their shares, scored and pending trajectories, mean live rewards, and the
interval on their difference) are its decider's newest look in the store (records.CanaryLook),
read at scrape time; a store that does not answer leaves them out of that scrape.
Each application has its own registry: two proxies in one process share no series. Like
`/health`, it needs no key: it holds counts, never content.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator, Mapping, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from art_proxy.errors import StoreError
from art_proxy.records import CanaryLook

from .call_metrics import CALL_BUCKETS
from .health import best_of_health, health_status, journal_health
from .parts import PARTS, ProxyParts

log = logging.getLogger(__name__)
# How long a scrape waits for the store's canary looks before it answers without them.
_LOOKS_TIMEOUT_S = 2.0

# /health's journal fields -> (metric, help, counter or gauge).
_JOURNAL: Mapping[str, tuple[str, str, bool]] = {
    "backlog_frames": ("journal_backlog_frames", "Records journaled, not yet in the store.", False),
    "backlog_bytes": ("journal_backlog_bytes", "Bytes of the journal's backlog.", False),
    "oldest_frame_age_s": (
        "journal_oldest_frame_age_seconds",
        "Age of the oldest record waiting in the journal.",
        False,
    ),
    "store_unavailable_s": (
        "store_unavailable_seconds",
        "How long the store has been unreachable (0 while it is reachable).",
        False,
    ),
    "ingested": ("journal_ingested_records", "Journaled records written to the store.", True),
    "rejected_records": (
        "journal_rejected_records",
        "Records the store refused as invalid, kept aside in the journal directory.",
        True,
    ),
    "torn_frames": ("journal_torn_frames", "Frames cut short by a crash, skipped.", True),
    "damaged_records": (
        "journal_damaged_records",
        "Records lost to damage inside a journal segment.",
        True,
    ),
}


class ProxyMetrics:
    """The application's registry: its request timer, and the parts read when scraped."""

    def __init__(self, app: web.Application) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Histogram(
            "art_proxy_request_seconds",
            "Time to answer a request, to its last byte for a stream.",
            ["route", "method", "status"],
            buckets=CALL_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "art_proxy_requests_in_flight",
            "Requests being answered now (a stream until its last byte).",
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(_PartsCollector(app))
        self._canaries = _CanaryCollector()
        self.registry.register(self._canaries)

    @web.middleware
    async def timed(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        self.in_flight.inc()
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:  # a redirect; errors are answered by `_errors` inside
            status = exc.status
            raise
        finally:
            self.in_flight.dec()
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            self.requests.labels(route, request.method, str(status)).observe(
                time.perf_counter() - started
            )

    async def scrape(self, request: web.Request) -> web.Response:
        parts = request.app.get(PARTS)
        self._canaries.looks = await _canary_looks(parts) if parts is not None else []
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class _PartsCollector(Collector):
    def __init__(self, app: web.Application) -> None:
        self._app = app

    def collect(self) -> Iterator[Metric]:
        parts = self._app.get(PARTS)
        if parts is None:  # scraped before start-up finished
            return
        counters = parts.counters
        yield _labelled(
            "calls", "Model calls answered, by API dialect.", "dialect", counters.by_dialect
        )
        yield _labelled(
            "calls_by_attribution",
            "Model calls by how they were tied to a trajectory.",
            "attribution",
            counters.by_attribution,
        )
        for name, value, text in (
            ("failed_calls", counters.failed_calls, "Calls answered with an error."),
            ("lost_records", counters.lost_records, "Answered calls whose record was lost."),
            ("stitch_misses", counters.stitch_misses, "Calls that did not extend their turn."),
            ("untrainable_calls", counters.untrainable_calls, "Calls recorded as untrainable."),
            ("shadow_calls", counters.shadow_calls, "Served calls sampled again."),
            ("shadow_samples", counters.shadow_samples, "Extra samples of shadowed calls."),
            ("shadow_skipped", counters.shadow_skipped, "Calls drawn to shadow, skipped."),
            ("unrecorded_calls", counters.unrecorded_calls, "Calls answered, not recorded."),
            ("store_commits", parts.store.writer.commits, "Transactions the store committed."),
            ("records_committed", parts.store.writer.batches, "Records the store committed."),
            (
                "records_erased_on_arrival",
                parts.store.writer.erased_on_arrival,
                "Records of an erased subject that arrived after its erasure, dropped.",
            ),
            ("unreadable_rows", parts.store.unreadable_rows, "Stored rows that failed to parse."),
            (
                "leases_broken",
                parts.tracker.lease_counters.broken,
                "Trajectories moved off their leased adapter: no upstream served it any more.",
            ),
        ):
            yield _counter(name, text, value)
        yield from counters.by_model.collect()
        best_of = best_of_health(counters)
        for field, text in (
            ("calls", "Calls answered best-of-N."),
            ("candidates", "Candidates sampled for best-of-N calls, each recorded."),
            ("unjudged", "Best-of-N calls whose chooser failed or ran out of time."),
        ):
            yield _counter(f"best_of_{field}", text, best_of[field])
        yield _counter(
            "best_of_choose_seconds",
            "Seconds spent choosing among best-of-N candidates, summed.",
            counters.best_of_choose_seconds,
        )
        fallbacks = GaugeMetricFamily(
            "art_proxy_alias_fallback",
            "1 for each alias whose target an upstream does not serve, served meanwhile by the "
            "model labelled `served`.",
            labels=["alias", "target", "served"],
        )
        for alias, fallback in sorted(parts.aliases.fallbacks.items()):
            fallbacks.add_metric([alias, fallback.target, fallback.served], 1.0)
        yield fallbacks
        _, recording = health_status(parts)
        yield _gauge("recording", "1 while answered calls are recorded, else 0.", recording)
        yield _gauge(
            "open_trajectories", "Trajectories not finished yet.", parts.tracker.open_count
        )
        journal = journal_health(parts)
        available = journal is None or journal["store"] == "available"
        yield _gauge("store_available", "1 while the store takes writes, else 0.", available)
        for field, (name, text, counter) in _JOURNAL.items():
            reading = journal.get(field) if journal else None
            if isinstance(reading, int | float):
                yield (_counter if counter else _gauge)(name, text, reading)


async def _canary_looks(parts: ProxyParts) -> list[CanaryLook]:
    """The newest look at each running canary (none where its decider has not looked yet)."""
    running = [record for record in parts.aliases.records if record.canary is not None]
    try:
        async with asyncio.timeout(_LOOKS_TIMEOUT_S):
            newest = [
                await parts.store.canary_looks(record.alias, since=record.canary_since, limit=1)
                for record in running
            ]
    except (StoreError, SQLAlchemyError, OSError, TimeoutError) as exc:
        log.warning("/metrics without the canaries' arms: the store did not answer (%s)", exc)
        return []
    return [looks[0] for looks in newest if looks]


class _CanaryCollector(Collector):
    """The running canaries' newest looks, set by the scrape that collects them."""

    def __init__(self) -> None:
        self.looks: Sequence[CanaryLook] = ()

    def collect(self) -> Iterator[Metric]:
        arm_labels = ["alias", "arm", "model"]
        fraction = GaugeMetricFamily(
            "art_proxy_canary_fraction",
            "The share of an alias's new trajectories its canary's candidate serves.",
            labels=["alias", "candidate", "target"],
        )
        scored = GaugeMetricFamily(
            "art_proxy_canary_scored_trajectories",
            "Trajectories of a canary's arm with a live reward, since the canary began.",
            labels=arm_labels,
        )
        pending = GaugeMetricFamily(
            "art_proxy_canary_pending_trajectories",
            "Finished trajectories of a canary's arm still awaiting a reward.",
            labels=arm_labels,
        )
        reward = GaugeMetricFamily(
            "art_proxy_canary_reward",
            "A canary arm's mean live reward since the canary began.",
            labels=arm_labels,
        )
        bounds = GaugeMetricFamily(
            "art_proxy_canary_difference",
            "The candidate's mean live reward minus the target's, and the anytime-valid "
            "interval's bounds (`bound` low and high, once each arm has enough scored).",
            labels=["alias", "bound"],
        )
        for look in self.looks:
            fraction.add_metric(
                [look.alias, look.candidate.model, look.target.model], look.fraction
            )
            for arm, live in (("candidate", look.candidate), ("target", look.target)):
                labels = [look.alias, arm, live.model]
                scored.add_metric(labels, live.count)
                pending.add_metric(labels, live.pending)
                if live.mean is not None:
                    reward.add_metric(labels, live.mean)
            bounds.add_metric([look.alias, "estimate"], look.difference)
            for bound, value in (("low", look.low), ("high", look.high)):
                if value is not None:
                    bounds.add_metric([look.alias, bound], value)
        yield from (fraction, scored, pending, reward, bounds)


def _counter(name: str, text: str, value: float) -> Metric:
    return CounterMetricFamily(f"art_proxy_{name}", text, value=value)


def _gauge(name: str, text: str, value: float) -> Metric:
    return GaugeMetricFamily(f"art_proxy_{name}", text, value=float(value))


def _labelled(name: str, text: str, label: str, values: Mapping[str, int]) -> Metric:
    family = CounterMetricFamily(f"art_proxy_{name}", text, labels=[label])
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family
