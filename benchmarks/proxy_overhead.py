"""What art-proxy adds to a call, next to a direct call and to LiteLLM's proxy.

One run starts a fake vLLM (`art_proxy.testing.fake_vllm`), a bare aiohttp relay in front of it
(`bare_relay.py`: bytes in, bytes out, the floor any aiohttp proxy meets on this machine),
art-proxy recording into SQLite in a temp dir, and LiteLLM's proxy pointed at the same fake; each
is a subprocess, so none shares the load generator's event loop. LiteLLM lives in its own venv
(`.venv-litellm`, made on first use) so that its pins never touch `.venv`. Against each target the
run measures sequential latency, throughput at 16 and 64 concurrent requests (rounds in which the
targets take turns, the best round counting, and the CPU a call of each server's process),
streaming time to first byte and the streaming relay's throughput (64 concurrent streams of 256
chunks, each chunk with its token id and logprob, as vLLM sends them when asked), then checks the
issue's targets. art-proxy's rounds and its streaming relay end once its records are in the store,
not with its last answer: what it costs to record a call is part of what it costs. The servers and
the load generator share the machine's cores, so absolute figures are this machine's; the targets
are stated as differences and ratios. Traffic stays on 127.0.0.1; every phase is bounded in count
and in time.

    .venv/bin/python benchmarks/proxy_overhead.py [--requests 500] [--skip-litellm]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import signal
import sys
import tempfile
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any

from art_proxy.testing.fake_vllm import FakeVllmConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.overhead_load import run_targets
from benchmarks.overhead_report import print_report
from benchmarks.overhead_targets import (
    STREAM_CHUNKS,
    STREAM_CONCURRENCY,
    Report,
    Servers,
    TargetUnavailable,
    Workload,
    console,
    ensure_litellm,
    start_servers,
)

# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--requests",
        type=int,
        default=500,
        help="sequential calls per target; each concurrency level sends 4x, streams 1/2x "
        "(default: 500)",
    )
    parser.add_argument(
        "--streams",
        type=int,
        default=2 * STREAM_CONCURRENCY,
        help=f"streams of {STREAM_CHUNKS} chunks in the streaming relay phase "
        f"(default: {2 * STREAM_CONCURRENCY})",
    )
    parser.add_argument(
        "--skip-litellm",
        action="store_true",
        help="measure only direct, the bare relay and art-proxy",
    )
    args = parser.parse_args(argv)
    if args.requests < 2 or args.streams < 1:
        parser.error("--requests must be at least 2 and --streams at least 1")
    return args


def run_async(coro: Coroutine[Any, Any, Report]) -> Report:
    async def cancelled_on_sigterm() -> Report:
        # As asyncio does for Ctrl-C: cancel the main task, so every `async with` closes.
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await coro

    try:
        import uvloop
    except ImportError:
        return asyncio.run(cancelled_on_sigterm())
    report: Report = uvloop.run(cancelled_on_sigterm())
    return report


@contextlib.contextmanager
def stopped_on_exit(servers: Servers) -> Iterator[Servers]:
    """Stops the servers however the block ends; SIGTERM outside the event loop acts as Ctrl-C."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield servers
    finally:
        servers.stop_all()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    workload = Workload(
        FakeVllmConfig().model, f"sk-{secrets.token_hex(32)}", args.requests, args.streams
    )
    litellm: Path | None = None
    skipped: dict[str, str] = {}
    if args.skip_litellm:
        skipped["LiteLLM"] = "--skip-litellm"
    else:
        try:
            litellm = ensure_litellm()
        except TargetUnavailable as exc:
            skipped["LiteLLM"] = f"could not install it: {exc}"
    try:
        with tempfile.TemporaryDirectory(prefix="proxy-overhead-") as tmp:
            workdir = Path(tmp)
            with stopped_on_exit(Servers(workdir)) as servers:
                urls = start_servers(servers, workdir, workload, litellm)
                console.print(f"started {', '.join(urls)}; waiting until they are ready ...")
                report = run_async(run_targets(servers, urls, workload))
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("interrupted: every server stopped, temp dir removed")
        raise SystemExit(130) from None
    report.skipped |= skipped
    print_report(report, args.requests)


if __name__ == "__main__":
    main()
