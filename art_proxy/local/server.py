"""The local-llm HTTP server: vLLM's OpenAI routes (`vllm_api`) in front of the batching engine.

Routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/health`, and the runtime LoRA
routes `/v1/load_lora_adapter` and `/v1/unload_lora_adapter` (always on here; vLLM needs
`VLLM_ALLOW_RUNTIME_LORA_UPDATING`). Handlers are cancelled when their client disconnects, which
frees the request's rows in the engine.

    async with running_local_llm(served) as local:
        ...  # point an OpenAI client at local.base_url
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from art_proxy.local.served import ServedModel
from art_proxy.vllm_api.app import vllm_app

# Stated on every /v1/models entry: the trainer must know which distribution logprobs describe.
LOGPROBS_MODE = "processed_logprobs"


@dataclass(frozen=True)
class RunningLocalLlm:
    base_url: str  # "http://HOST:PORT/v1"
    served: ServedModel


def create_app(served: ServedModel) -> web.Application:
    return vllm_app(served, lora_routes=True, logprobs_mode=LOGPROBS_MODE)


@asynccontextmanager
async def running_local_llm(
    served: ServedModel, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[RunningLocalLlm]:
    """Serve on host:port (0 = any free port) with the engine running, for the block's duration."""
    served.engine.start()
    # handler_cancellation: a client that disconnects cancels its handler, which frees its rows.
    runner = web.AppRunner(
        create_app(served), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_port = runner.addresses[0][1]
        yield RunningLocalLlm(f"http://{host}:{bound_port}/v1", served)
    finally:
        await runner.cleanup()
        served.engine.close()
