"""Chat and completions request bodies, read and checked by vLLM's rules (`wire` reads a field).

Each body is shown to the engine first (`InferenceEngine.screen`). What the engine alone decides it
reads from `body` itself: the sampling fields beyond the ones below, and what a `tool_choice` other
than "none" asks for.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from art_proxy.vllm_api.engine import ChatRequest, CompletionRequest, InferenceEngine
from art_proxy.wire import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    MAX_LOGPROBS,
    ApiError,
    bool_field,
    chat_max_tokens,
    choice_count,
    include_usage,
    int_field,
    read_json_object,
)


async def read_chat(engine: InferenceEngine, request: web.Request) -> ChatRequest:
    return _parse_chat(engine, await _read_body(engine, request))


async def read_completion(engine: InferenceEngine, request: web.Request) -> CompletionRequest:
    return _parse_completion(engine, await _read_body(engine, request))


async def _read_body(engine: InferenceEngine, request: web.Request) -> dict[str, Any]:
    body = await read_json_object(request)
    engine.screen(body)
    return body


def _parse_chat(engine: InferenceEngine, body: dict[str, Any]) -> ChatRequest:
    model, adapter = chosen_model(engine, body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    logprobs = bool_field(body, "logprobs")
    top_logprobs = int_field(body, "top_logprobs", 0, minimum=0, maximum=MAX_LOGPROBS) or 0
    if top_logprobs and not logprobs:
        raise ApiError(
            400, "when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs"
        )
    max_tokens, max_tokens_param = chat_max_tokens(body)
    stream = bool_field(body, "stream")
    continue_final = bool_field(body, "continue_final_message")
    if continue_final and body.get("add_generation_prompt", True):
        # vLLM's rule: the prompt either opens an answer or leaves the last message open.
        raise ApiError(
            400,
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            param="continue_final_message",
        )
    if continue_final and not (
        isinstance(messages[-1], dict) and messages[-1].get("role") == "assistant"
    ):
        raise ApiError(
            400,
            "`continue_final_message` needs the last message to be the assistant's.",
            param="continue_final_message",
        )
    return ChatRequest(
        body=body,
        model=model,
        adapter=adapter,
        messages=messages,
        tools=checked_tools(body),
        n=choice_count(body),
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        tokens_as_ids=bool_field(body, "return_tokens_as_token_ids"),
        return_token_ids=bool_field(body, "return_token_ids"),
        stream=stream,
        include_usage=include_usage(body, stream),
        continue_final=continue_final,
    )


def _parse_completion(engine: InferenceEngine, body: dict[str, Any]) -> CompletionRequest:
    model, adapter = chosen_model(engine, body)
    stream = bool_field(body, "stream")
    return CompletionRequest(
        body=body,
        model=model,
        adapter=adapter,
        prompts=_prompts(engine, body.get("prompt")),
        n=choice_count(body),
        max_tokens=int_field(body, "max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS, minimum=1)
        or COMPLETIONS_DEFAULT_MAX_TOKENS,
        logprobs=int_field(body, "logprobs", None, minimum=0, maximum=MAX_LOGPROBS),
        return_token_ids=bool_field(body, "return_token_ids"),
        stream=stream,
        include_usage=include_usage(body, stream),
        prompt_logprobs=int_field(body, "prompt_logprobs", None, minimum=0, maximum=MAX_LOGPROBS),
    )


def chosen_model(engine: InferenceEngine, body: dict[str, Any]) -> tuple[str, str | None]:
    """The name the response echoes and the adapter it names (None: the base, also when omitted)."""
    model = body.get("model")
    if model is None or model == engine.name:
        return engine.name, None
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string.", param="model")
    if model in engine.adapter_paths():
        return model, model
    raise model_not_found(model)


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", param="model")


def checked_tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none"):
            raise ApiError(400, "When using `tool_choice`, `tools` must be set.", param="tools")
        return None
    if not isinstance(tools, list) or not tools:
        raise ApiError(400, "'tools' must be a non-empty list when given.", param="tools")
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(400, "Each tool needs a 'function' with a string 'name'.", param="tools")
    return tools


def _prompts(engine: InferenceEngine, prompt: Any) -> list[list[int]]:
    """Text, a list of ids, or a list of either: one list of prompt ids per prompt."""
    if isinstance(prompt, str) and prompt:
        return [engine.encode(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(_is_token_id(item) for item in prompt):
            return [_known_ids(engine, prompt)]
        prompts = []
        for item in prompt:
            if isinstance(item, str) and item:
                prompts.append(engine.encode(item))
            elif isinstance(item, list) and item and all(_is_token_id(i) for i in item):
                prompts.append(_known_ids(engine, item))
            else:
                break
        else:
            return prompts
    raise ApiError(
        400,
        "'prompt' must be a non-empty string, list of token ids, or list of either.",
        param="prompt",
    )


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _known_ids(engine: InferenceEngine, ids: list[int]) -> list[int]:
    vocab_size = engine.vocab_size
    for token_id in ids:
        if not 0 <= token_id < vocab_size:
            raise ApiError(400, f"Token id {token_id} is out of vocabulary.", param="prompt")
    return ids
