"""`/health`: whether the proxy answers and records, with its counters and its journal's state;
`/ready`: whether it should be sent calls now.

While the store is down calls are still answered and recorded (in the journal), so the status says
so with 200 and the proxy stays in a load balancer's rotation; 503 only when calls go unrecorded.
`/health` is the liveness probe (the process works: restarting it would not help an upstream
that is down). `/ready` is the readiness probe: 503 also while no upstream answers `/models`
(asked then, each within `READY_UPSTREAM_TIMEOUT_S`), which a Ready pod would answer with 502s.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from art_proxy.journal.ingester import age_s
from art_proxy.records import JsonObject

from .aliases import ServedModels
from .counters import Counters
from .parts import PARTS, ProxyParts
from .upstream_models import served_models

# How long /ready waits for an upstream's model list: a probe's own timeout is a second or so.
READY_UPSTREAM_TIMEOUT_S = 2.0


def journal_health(parts: ProxyParts) -> dict[str, object] | None:
    journal, ingester = parts.journal, parts.ingester
    if journal is None or ingester is None:
        return None
    state = ingester.state
    return {
        "directory": str(journal.slot),
        "durability": journal.durability.value,
        "store": "available" if state.unavailable_since is None else "unavailable",
        "store_unavailable_s": age_s(state.unavailable_since) if state.unavailable_since else 0.0,
        "store_error": state.last_error if state.unavailable_since else None,
        "backlog_frames": journal.backlog_frames,
        "backlog_bytes": journal.backlog_bytes,
        "oldest_frame_age_s": round(age_s(state.oldest_pending_at), 3),
        "ingested": state.ingested,
        "rejected_records": state.rejected,
        "torn_frames": journal.stats.torn_frames,
        "damaged_spans": journal.stats.damaged_spans,
        "damaged_records": journal.stats.damaged_records,
    }


def health_status(parts: ProxyParts) -> tuple[str, bool]:
    """What /health says, and whether calls are recorded (else 503: out of rotation)."""
    if parts.ingester is None:
        running = parts.store.writer.running
        return ("ok" if running else "store writer stopped"), running
    if not parts.ingester.running:
        return "journal ingester stopped", False
    if parts.ingester.state.unavailable_since is not None:
        # Calls are still answered and recorded (in the journal): stay in rotation.
        return "store unavailable: journaling", True
    return "ok", True


async def health(request: web.Request) -> web.Response:
    parts = request.app[PARTS]
    writer = parts.store.writer
    status, recording = health_status(parts)
    return web.json_response(
        {
            "status": status,
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
            "unrecorded_calls": parts.counters.unrecorded_calls,
            "best_of": best_of_health(parts.counters),
            "commits": writer.commits,
            "records_committed": writer.batches,
            "records_erased_on_arrival": writer.erased_on_arrival,
            "unreadable_rows": parts.store.unreadable_rows,
            "leases": {
                "held": parts.tracker.held_leases(),
                "broken": parts.tracker.lease_counters.broken,
            },
            "alias_fallbacks": {
                alias: {"target": fallback.target, "served": fallback.served}
                for alias, fallback in parts.aliases.fallbacks.items()
            },
            "journal": journal_health(parts),
        },
        status=200 if recording else 503,
    )


def best_of_health(counters: Counters) -> JsonObject:
    """Best-of-N's counts, and what it adds to a call it answers: the mean seconds spent choosing
    and the judge's mean cost."""
    calls = counters.best_of_calls
    return {
        "calls": calls,
        "candidates": counters.best_of_candidates,
        "unjudged": counters.best_of_unjudged,
        "mean_choose_ms": round(1000 * counters.best_of_choose_seconds / calls, 2)
        if calls
        else None,
        "mean_judge_cost_usd": counters.best_of_judge_cost_usd / calls if calls else None,
    }


async def ready(request: web.Request) -> web.Response:
    """200 while calls are recorded and some upstream answers; 503 saying why otherwise."""
    parts = request.app[PARTS]
    status, recording = health_status(parts)
    urls = parts.settings.upstream
    answers = await asyncio.gather(*(_asked(parts, url) for url in urls))
    upstreams = dict(zip(urls, answers, strict=True))
    answering = any(answer == "ok" for answer in upstreams.values())
    reasons = [] if recording else [status]
    if not answering:
        reasons.append("no upstream answers")
    return web.json_response(
        {"status": "; ".join(reasons) or "ready", "upstreams": upstreams},
        status=200 if not reasons else 503,
    )


async def _asked(parts: ProxyParts, url: str) -> str:
    """ "ok", or why `url` did not list its models."""
    if parts.upstreams is None:
        return "not started"
    try:
        async with asyncio.timeout(READY_UPSTREAM_TIMEOUT_S):
            answer = await served_models(parts.upstreams, url)
    except TimeoutError:
        return f"no answer within {READY_UPSTREAM_TIMEOUT_S:g} s"
    return "ok" if isinstance(answer, ServedModels) else answer
