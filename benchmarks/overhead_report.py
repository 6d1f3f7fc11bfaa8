"""`proxy_overhead.py`'s report: the table, the issue's targets with PASS/MISS, the key figure last."""

from __future__ import annotations

import os

from rich.markup import escape
from rich.table import Table

from benchmarks.overhead_targets import (
    BARE_RELAY,
    CONCURRENCY,
    LATENCY_ROUNDS,
    LITELLM_VERSION,
    MAX_ADDED_P50_MS,
    MIN_STREAMED_VS_DIRECT,
    MIN_THROUGHPUT_VS_DIRECT,
    MIN_THROUGHPUT_VS_LITELLM,
    STREAM_CONCURRENCY,
    TARGET_CONCURRENCY,
    THROUGHPUT_ROUNDS,
    Report,
    TargetResult,
    console,
)

# ---------------------------------------------------------------- report


def print_report(report: Report, requests: int) -> None:
    results = report.results
    direct = results.get("direct")
    table = Table(title=f"proxy overhead ({os.cpu_count()} cores shared by everything)")
    for column in ("target", "p50 ms", "p90 ms", "added p50 ms"):
        table.add_column(column, justify="right")
    for level in CONCURRENCY:
        table.add_column(f"req/s @{level}", justify="right")
    table.add_column("stream TTFB p50 ms", justify="right")
    table.add_column(f"chunks/s @{STREAM_CONCURRENCY} streams", justify="right")
    table.add_column("failed calls", justify="right")
    for result in results.values():
        added = "" if direct in (None, result) else f"{result.p50_ms - direct.p50_ms:+.2f}"
        table.add_row(
            result.name,
            f"{result.p50_ms:.2f}",
            f"{result.p90_ms:.2f}",
            added,
            *(f"{result.throughput[level]:,.0f}" for level in CONCURRENCY),
            f"{result.ttfb_p50_ms:.2f}",
            f"{result.chunks_per_s:,.0f}",
            str(result.failed_calls),
        )
    console.print(table)
    console.print(
        f"sequential: {requests} calls per target in {LATENCY_ROUNDS} blocks, taking turns; "
        f"concurrent: the best of {THROUGHPUT_ROUNDS} "
        f"rounds of up to {2 * requests} calls; streams: {requests // 2}; "
        f"litellm=={LITELLM_VERSION}"
    )
    for result in results.values():
        if result.cpu_us_per_call is not None:
            console.print(
                f"{result.name}'s process: {result.cpu_us_per_call:,.0f} us of CPU a call "
                f"at {TARGET_CONCURRENCY} in flight"
            )
    for name, why in report.skipped.items():
        console.print(f"[yellow]{name} skipped:[/yellow] {escape(why)}")
    if report.proxy_health:
        health = report.proxy_health
        console.print(
            f"art-proxy recorded {health.get('calls')} calls "
            f"({health.get('records_committed')} committed in {health.get('commits')} commits, "
            f"{health.get('lost_records')} lost, {health.get('failed_calls')} failed)"
        )
    proxy = results.get("art-proxy")
    if proxy is None or direct is None:
        console.print("[red]no art-proxy figure: art-proxy or the fake upstream failed[/red]")
        return
    print_targets(proxy, direct, results.get("LiteLLM"), results.get(BARE_RELAY))


def print_targets(
    proxy: TargetResult,
    direct: TargetResult,
    litellm: TargetResult | None,
    floor: TargetResult | None,
) -> None:
    """The issue's targets, and beside them the bare relay's figures: the floor that any aiohttp
    proxy meets on this machine in the same minutes."""
    level = TARGET_CONCURRENCY
    added_ms = proxy.p50_ms - direct.p50_ms
    table = Table(title="targets (from the issue)")
    for column in ("check", "measured", "target", "verdict"):
        table.add_column(column)
    table.add_row(
        "added p50 latency",
        f"{added_ms:+.2f} ms",
        f"<= {MAX_ADDED_P50_MS:g} ms",
        _verdict(added_ms <= MAX_ADDED_P50_MS),
    )
    key = f"art-proxy: {added_ms:+.2f} ms p50"
    if floor is not None:
        floor_ms = floor.p50_ms - direct.p50_ms
        table.add_row(
            "  the bare relay's added p50 (the floor)", f"{floor_ms:+.2f} ms", "(info)", ""
        )
        key += f" (bare relay {floor_ms:+.2f})"
    key += f", {_ratio(proxy, direct, level):.2f}x direct @{level}"
    floor_ratio = _ratio(floor, direct, level) if floor is not None else None
    if floor_ratio is not None:
        key += f" (bare relay {floor_ratio:.2f}x)"
    if litellm is not None:
        _add_ratio_rows(table, proxy, litellm, MIN_THROUGHPUT_VS_LITELLM)
        key += f", {_ratio(proxy, litellm, level):.0f}x LiteLLM @{level}"
    else:
        table.add_row(f"throughput vs LiteLLM @{level}", "skipped", "", "")
        key += ", LiteLLM skipped"
    _add_ratio_rows(table, proxy, direct, MIN_THROUGHPUT_VS_DIRECT)
    if floor_ratio is not None:
        table.add_row(
            f"  the bare relay vs direct @{level} (the floor)", f"{floor_ratio:.2f}x", "(info)", ""
        )
    added_ttfb = proxy.ttfb_p50_ms - direct.ttfb_p50_ms
    table.add_row("added stream TTFB p50", f"{added_ttfb:+.2f} ms", "(info)", "")
    streamed = proxy.chunks_per_s / direct.chunks_per_s
    table.add_row(
        f"streamed chunks/s vs direct @{STREAM_CONCURRENCY} streams",
        f"{streamed:.2f}x",
        f">= {MIN_STREAMED_VS_DIRECT:g}x",
        _verdict(streamed >= MIN_STREAMED_VS_DIRECT),
    )
    key += f", streams {streamed:.2f}x direct"
    console.print(table)
    console.print(key)  # the key figure, last


def _ratio(proxy: TargetResult, baseline: TargetResult, level: int) -> float:
    return proxy.throughput[level] / baseline.throughput[level]


def _add_ratio_rows(
    table: Table, proxy: TargetResult, baseline: TargetResult, minimum: float
) -> None:
    """Throughput ratios at every level; the one at TARGET_CONCURRENCY is checked."""
    for level in CONCURRENCY:
        ratio = _ratio(proxy, baseline, level)
        checked = level == TARGET_CONCURRENCY
        table.add_row(
            f"throughput vs {baseline.name} @{level}",
            f"{ratio:.2f}x",
            f">= {minimum:g}x" if checked else "(info)",
            _verdict(ratio >= minimum) if checked else "",
        )


def _verdict(passed: bool) -> str:
    return "[green]PASS[/green]" if passed else "[red]MISS[/red]"
