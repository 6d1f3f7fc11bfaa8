"""A faithful fake of vLLM's OpenAI server, for tests and as the benchmarks' fast local upstream.

It speaks the wire format of `VLLM_WIRE.md` (token ids, logprobs, stream chunks, tool-call deltas,
errors, `/v1/models`, runtime LoRA) and answers deterministically: see `fake_engine` for what it
generates and `fake_tokenizer` for the prompt-prefix invariant multi-turn recording relies on.

    async with running_fake_vllm(FakeVllmConfig(reply="42")) as vllm:
        ...  # point the code under test at vllm.base_url, then inspect vllm.requests

Run it standalone: `python -m art_proxy.testing.fake_vllm --port 8000`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from art_proxy.testing.fake_chat import handle_chat_completions
from art_proxy.testing.fake_completions import handle_completions
from art_proxy.testing.fake_engine import (
    FakeEngine,
    FakeVllmConfig,
    ScriptedCall,
)
from art_proxy.testing.fake_tokenizer import FakeTokenizer
from art_proxy.testing.loopback import serving
from art_proxy.wire import (
    ApiError,
    json_response,
    model_card,
    read_json_object,
    vllm_app,
)

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


def create_fake_vllm_app(config: FakeVllmConfig | None = None) -> web.Application:
    engine = FakeEngine(config or FakeVllmConfig())

    async def chat(request: web.Request) -> web.StreamResponse:
        return await handle_chat_completions(engine, request)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await handle_completions(engine, request)

    async def models(request: web.Request) -> web.StreamResponse:
        return json_response(_models(engine))

    async def load(request: web.Request) -> web.StreamResponse:
        return await _load_lora_adapter(engine, request)

    async def unload(request: web.Request) -> web.StreamResponse:
        return await _unload_lora_adapter(engine, request)

    # Without runtime LoRA the routes do not exist, as in vLLM without the environment variable.
    lora = (load, unload) if engine.config.allow_runtime_lora else None
    app = vllm_app(chat=chat, completions=completions, models=models, lora=lora)
    app[ENGINE] = engine
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
        )


def _models(engine: FakeEngine) -> dict[str, Any]:
    base = engine.config.model
    cards = [_model_card(engine, base, root=base, parent=None)]
    cards += [
        _model_card(engine, name, root=path, parent=base) for name, path in engine.adapters.items()
    ]
    return {"object": "list", "data": cards}


def _model_card(engine: FakeEngine, name: str, *, root: str, parent: str | None) -> dict[str, Any]:
    return model_card(
        name,
        root=root,
        parent=parent,
        max_model_len=engine.config.max_model_len,
        created=engine.created,
    )


async def _load_lora_adapter(engine: FakeEngine, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise ApiError(
            400, "Both 'lora_name' and 'lora_path' must be provided.", type="InvalidUserInput"
        )
    if name in engine.adapters and not body.get("load_inplace"):
        raise ApiError(
            400,
            f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
            "in place, set 'load_inplace' to True.",
            type="InvalidUserInput",
        )
    if not await asyncio.to_thread(os.path.exists, path):
        raise ApiError(404, f"Loading lora {name} failed: No adapter found for {path}")
    # In place keeps the adapter's position in /v1/models, as vLLM's registry does.
    engine.adapters[name] = path
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def _unload_lora_adapter(engine: FakeEngine, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'lora_name' must be provided.", type="InvalidUserInput")
    if engine.adapters.pop(name, None) is None:
        raise ApiError(404, f"The lora adapter '{name}' cannot be found.")
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


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
