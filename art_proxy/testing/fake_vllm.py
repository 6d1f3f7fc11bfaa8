"""A faithful fake of vLLM's OpenAI server, for tests and as the benchmarks' fast local upstream.

It speaks the wire format of `VLLM_WIRE.md` (token ids, logprobs, stream chunks, tool-call deltas,
errors, `/v1/models`, `/tokenize`, runtime LoRA) through `art_proxy.vllm_api`, the server local-llm
runs too, and answers deterministically: see `fake_engine` for what it generates and
`fake_tokenizer` for the prompt-prefix invariant multi-turn recording relies on.

    async with running_fake_vllm(FakeVllmConfig(reply="42")) as vllm:
        ...  # point the code under test at vllm.base_url, then inspect vllm.requests

Run it standalone: `python -m art_proxy.testing.fake_vllm --port 8000`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from art_proxy.testing.fake_config import FakeVllmConfig, ScriptedCall
from art_proxy.testing.fake_engine import FakeEngine
from art_proxy.testing.fake_tokenizer import FakeTokenizer
from art_proxy.testing.loopback import serving
from art_proxy.vllm_api.app import vllm_app

__all__ = [
    "FakeVllm",
    "FakeVllmConfig",
    "ScriptedCall",
    "create_fake_vllm_app",
    "running_fake_vllm",
]

ENGINE = web.AppKey("fake_vllm_engine", FakeEngine)


@dataclass(frozen=True)
class FakeVllm:
    """A running fake: its URL and live views of what it has received and loaded."""

    base_url: str  # "http://127.0.0.1:PORT/v1"
    config: FakeVllmConfig
    requests: list[dict[str, Any]]  # bodies received on the generation endpoints, in order
    adapters: dict[str, str]  # runtime LoRA adapters, name -> path, in load order
    tokenizer: FakeTokenizer
    sleeps: list[str]  # "sleep 1", "wake_up": sleep-mode calls, in order


SLEEPS = web.AppKey("fake_vllm_sleeps", list)


async def _sleep(request: web.Request) -> web.Response:
    request.app[SLEEPS].append(f"sleep {request.query.get('level', '1')}")
    return web.Response(status=200)


async def _wake_up(request: web.Request) -> web.Response:
    request.app[SLEEPS].append("wake_up")
    return web.Response(status=200)


async def _is_sleeping(request: web.Request) -> web.Response:
    sleeps = request.app[SLEEPS]
    return web.json_response({"is_sleeping": bool(sleeps) and sleeps[-1].startswith("sleep")})


def create_fake_vllm_app(config: FakeVllmConfig | None = None) -> web.Application:
    engine = FakeEngine(config or FakeVllmConfig())
    # Without runtime LoRA the routes do not exist, as in vLLM without the environment variable.
    app = vllm_app(engine, lora_routes=engine.config.allow_runtime_lora)
    app[ENGINE] = engine
    app[SLEEPS] = []
    if engine.config.sleep_mode:
        # Server-level routes beside /v1, as vLLM's dev-mode sleep router adds them.
        app.router.add_post("/sleep", _sleep)
        app.router.add_post("/wake_up", _wake_up)
        app.router.add_get("/is_sleeping", _is_sleeping)
    return app


@asynccontextmanager
async def running_fake_vllm(config: FakeVllmConfig | None = None) -> AsyncIterator[FakeVllm]:
    """Serve a fake on 127.0.0.1 at a free port for the duration of the block."""
    app = create_fake_vllm_app(config)
    engine = app[ENGINE]
    async with serving(app) as root_url:
        yield FakeVllm(
            base_url=f"{root_url}/v1",
            config=engine.config,
            requests=engine.requests,
            adapters=engine.adapters,
            tokenizer=engine.tokenizer,
            sleeps=app[SLEEPS],
        )


def main(argv: Sequence[str] | None = None) -> None:
    defaults = FakeVllmConfig()
    parser = argparse.ArgumentParser(
        prog="python -m art_proxy.testing.fake_vllm",
        description="Serve a deterministic fake of vLLM's OpenAI API (for tests and benchmarks).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default=defaults.model)
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    parser.add_argument("--reply", default=defaults.reply)
    parser.add_argument("--delay-s", type=float, default=defaults.delay_s)
    parser.add_argument("--chunk-delay-s", type=float, default=defaults.chunk_delay_s)
    parser.add_argument(
        "--allow-runtime-lora",
        action=argparse.BooleanOptionalAction,
        default=defaults.allow_runtime_lora,
    )
    args = parser.parse_args(argv)
    config = FakeVllmConfig(
        model=args.model,
        max_model_len=args.max_model_len,
        reply=args.reply,
        delay_s=args.delay_s,
        chunk_delay_s=args.chunk_delay_s,
        allow_runtime_lora=args.allow_runtime_lora,
        # A benchmark sends requests by the million; nobody reads them back.
        record_requests=False,
    )
    web.run_app(
        create_fake_vllm_app(config),
        host=args.host,
        port=args.port,
        access_log=None,
        loop=_new_event_loop(),
    )


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


if __name__ == "__main__":
    main()
