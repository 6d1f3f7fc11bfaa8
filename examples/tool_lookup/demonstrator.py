"""A stand-in for a prompted frontier model: an OpenAI-compatible server that does the task right.

It answers as a hosted chat API would (text and tool calls, no token ids; it refuses vLLM's
`return_token_ids` as OpenAI's API refuses a field it does not know), so the proxy records its
calls exactly as it records a hosted model's: as text, not trainable by GRPO, and usable as
demonstrations for a warm start (`art-proxy train --sft store --sft-model demonstrator`). Scripted,
so the example runs without an API key: asked a code word, it calls the first tool it is offered
with the city; shown the tool's result, it answers with it.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from examples.tool_lookup.codes import city_asked

MODEL = "demonstrator"  # the model name its calls are recorded under


def reply(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message for this conversation."""
    last = messages[-1] if messages else {}
    question = next(
        (str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    city = city_asked(question)
    if last.get("role") == "tool":
        return {"role": "assistant", "content": f"The code word of {city} is {last['content']}."}
    if city is None or not tools:
        return {"role": "assistant", "content": "I can only look up code words of cities."}
    name = tools[0]["function"]["name"]
    call = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"city": city})},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def _chat(request: web.Request) -> web.Response:
    body = await request.json()
    if "return_token_ids" in body:
        error = {"message": "Unrecognized request argument supplied: return_token_ids"}
        return web.json_response({"error": {**error, "type": "invalid_request_error"}}, status=400)
    message = reply(body.get("messages") or [], body.get("tools") or [])
    return web.json_response(
        {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        }
    )


async def _models(_request: web.Request) -> web.Response:
    entry = {"id": MODEL, "object": "model", "created": 0, "owned_by": "example"}
    return web.json_response({"object": "list", "data": [entry]})


@asynccontextmanager
async def running_demonstrator(port: int) -> AsyncIterator[str]:
    """The demonstrator on 127.0.0.1:`port`; yields its base URL (`.../v1`)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()
