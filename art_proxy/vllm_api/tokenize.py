"""vLLM's `POST /tokenize` (at the server's root, not under `/v1`): a prompt's ids, not generated from.

The chat form (`messages`, optional `tools`) renders exactly as `/v1/chat/completions` renders the
same messages, generation prompt included, so its ids are a chat call's `prompt_token_ids`; the
completion form (`prompt`) encodes text as `/v1/completions` does. art-proxy asks it for Anthropic's
`/v1/messages/count_tokens`. The options that would render another prompt (`add_generation_prompt`
false, `continue_final_message`, a request's own `chat_template`) are refused here by name.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from art_proxy.vllm_api.engine import InferenceEngine, PromptError
from art_proxy.vllm_api.requests import checked_tools, chosen_model
from art_proxy.wire import ApiError, json_response, read_json_object

# Each with the value that renders the prompt a generation call would see.
_RENDERED_AS_GENERATION = {
    "add_generation_prompt": True,
    "continue_final_message": False,
    "chat_template": None,
}


async def tokenize(engine: InferenceEngine, request: web.Request) -> web.Response:
    body = await read_json_object(request)
    chosen_model(engine, body)
    if "messages" in body:
        ids = _chat_ids(engine, body)
    elif isinstance(body.get("prompt"), str):
        ids = engine.encode(body["prompt"])
    else:
        raise ApiError(400, "Either 'messages' (a list) or 'prompt' (a string) is required.")
    return json_response(
        {
            "count": len(ids),
            "max_model_len": engine.max_model_len,
            "tokens": ids,
            "token_strs": None,
        }
    )


def _chat_ids(engine: InferenceEngine, body: dict[str, Any]) -> list[int]:
    messages = body["messages"]
    if not isinstance(messages, list):
        raise ApiError(400, "'messages' must be a list.", param="messages")
    for name, value in _RENDERED_AS_GENERATION.items():
        if body.get(name, value) != value:
            raise ApiError(400, f"'{name}' is not supported by this server.", param=name)
    try:
        return engine.render(messages, checked_tools(body))
    except PromptError as exc:
        raise ApiError(400, str(exc), param="messages") from exc
