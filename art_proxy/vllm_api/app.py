"""vLLM's routes over an engine: generation, `/tokenize`, `/v1/models`, `/health`, `/metrics`
(vLLM's request metrics, server_metrics.py), and runtime LoRA.

Runtime LoRA routes exist only where asked for (vLLM needs `VLLM_ALLOW_RUNTIME_LORA_UPDATING`;
without it they are 404). Unknown routes and methods answer in FastAPI's shape, as vLLM does.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from art_proxy.vllm_api.chat import chat_completions
from art_proxy.vllm_api.completions import completions
from art_proxy.vllm_api.engine import InferenceEngine
from art_proxy.vllm_api.server_metrics import ServerMetrics
from art_proxy.vllm_api.tokenize import tokenize
from art_proxy.wire import MAX_BODY_BYTES, ApiError, json_response, model_card, read_json_object


def vllm_app(
    engine: InferenceEngine, *, lora_routes: bool, logprobs_mode: str | None = None
) -> web.Application:
    """`logprobs_mode`, when set, is stated on every `/v1/models` entry (vLLM states none)."""

    metrics = ServerMetrics()

    async def chat(request: web.Request) -> web.StreamResponse:
        return await chat_completions(engine, request, metrics)

    async def complete(request: web.Request) -> web.StreamResponse:
        return await completions(engine, request, metrics)

    async def count(request: web.Request) -> web.StreamResponse:
        return await tokenize(engine, request)

    async def models(request: web.Request) -> web.StreamResponse:
        return json_response(_models(engine, logprobs_mode))

    async def load(request: web.Request) -> web.StreamResponse:
        return await _load_lora_adapter(engine, request)

    async def unload(request: web.Request) -> web.StreamResponse:
        return await _unload_lora_adapter(engine, request)

    app = web.Application(middlewares=[_errors_middleware], client_max_size=MAX_BODY_BYTES)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", metrics.scrape)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/tokenize", count)
    if lora_routes:
        app.router.add_post("/v1/load_lora_adapter", load)
        app.router.add_post("/v1/unload_lora_adapter", unload)
    return app


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status in (404, 405):
            return web.json_response({"detail": exc.reason}, status=exc.status)
        raise


async def _health(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200)


def _models(engine: InferenceEngine, logprobs_mode: str | None) -> dict[str, Any]:
    """The base model first, then the adapters in load order, each with the base as parent."""

    def card(name: str, root: str, parent: str | None) -> dict[str, Any]:
        entry = model_card(
            name,
            root=root,
            parent=parent,
            max_model_len=engine.max_model_len,
            created=engine.created,
        )
        return entry if logprobs_mode is None else {**entry, "logprobs_mode": logprobs_mode}

    cards = [card(engine.name, engine.root, None)]
    cards += [card(name, path, engine.name) for name, path in engine.adapter_paths().items()]
    return {"object": "list", "data": cards}


async def _load_lora_adapter(engine: InferenceEngine, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    name, path = body.get("lora_name"), body.get("lora_path")
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise ApiError(
            400, "Both 'lora_name' and 'lora_path' must be provided.", type="InvalidUserInput"
        )
    await engine.load_adapter(name, path, replace=body.get("load_inplace") is True)
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def _unload_lora_adapter(engine: InferenceEngine, request: web.Request) -> web.StreamResponse:
    body = await read_json_object(request)
    name = body.get("lora_name")
    if not isinstance(name, str) or not name:
        raise ApiError(400, "'lora_name' must be provided.", type="InvalidUserInput")
    await engine.unload_adapter(name)
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")
