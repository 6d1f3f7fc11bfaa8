"""The local-llm HTTP server: vLLM's OpenAI routes in front of the batching engine.

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
from typing import Any

from aiohttp import web

from art_proxy.local.chat import handle_chat_completions
from art_proxy.local.completions import handle_completions
from art_proxy.local.errors import AdapterExists, AdapterLoadFailed, AdapterNotFound
from art_proxy.local.served import ServedModel
from art_proxy.wire import (
    ApiError,
    json_response,
    model_card,
    read_json_object,
    vllm_app,
)

SERVED = web.AppKey("local_llm_served", ServedModel)
# Stated on every /v1/models entry: the trainer must know which distribution logprobs describe.
LOGPROBS_MODE = "processed_logprobs"


@dataclass(frozen=True)
class RunningLocalLlm:
    base_url: str  # "http://HOST:PORT/v1"
    served: ServedModel


def create_app(served: ServedModel) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        return await handle_chat_completions(served, request)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await handle_completions(served, request)

    async def models(request: web.Request) -> web.StreamResponse:
        return json_response(_models(served))

    async def load(request: web.Request) -> web.StreamResponse:
        return await _load_lora_adapter(served, request)

    async def unload(request: web.Request) -> web.StreamResponse:
        return await _unload_lora_adapter(served, request)

    app = vllm_app(chat=chat, completions=completions, models=models, lora=(load, unload))
    app[SERVED] = served
    return app


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


def _models(served: ServedModel) -> dict[str, Any]:
    def card(name: str, root: str, parent: str | None) -> dict[str, Any]:
        entry = model_card(
            name,
            root=root,
            parent=parent,
            max_model_len=served.max_model_len,
            created=served.created,
        )
        return {**entry, "logprobs_mode": LOGPROBS_MODE}

    cards = [card(served.name, served.root, None)]
    cards += [
        card(name, path, served.name) for name, path in served.engine.adapters.paths().items()
    ]
    return {"object": "list", "data": cards}


async def _load_lora_adapter(served: ServedModel, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise ApiError(
            400, "Both 'lora_name' and 'lora_path' must be provided.", type="InvalidUserInput"
        )
    if name == served.name:
        raise ApiError(
            400, f"The lora adapter '{name}' has the base model's name.", type="InvalidUserInput"
        )
    try:
        await served.engine.load_adapter(name, path, replace=body.get("load_inplace") is True)
    except AdapterExists as exc:
        raise ApiError(400, str(exc), type="InvalidUserInput") from exc
    except AdapterNotFound as exc:
        raise ApiError(404, str(exc)) from exc
    except AdapterLoadFailed as exc:
        raise ApiError(500, str(exc)) from exc
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def _unload_lora_adapter(served: ServedModel, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'lora_name' must be provided.", type="InvalidUserInput")
    try:
        await served.engine.unload_adapter(name)
    except AdapterNotFound as exc:
        raise ApiError(404, str(exc)) from exc
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
