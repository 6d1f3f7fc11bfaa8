"""What one local-llm server serves, as the engine behind vLLM's routes (`vllm_api.engine`).

The base model's names and context, the batching engine, the tokenizer and chat template; each
request's sampling fields (`request_params`) and, for chat with tools, its Hermes tool calls
(`tool_calls`). Engine errors become vLLM's statuses here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.engine import Engine
from art_proxy.local.errors import (
    AdapterExists,
    AdapterLoadFailed,
    AdapterNotFound,
    ModelLoadError,
)
from art_proxy.local.model_loading import LoadedModel
from art_proxy.local.request_params import check_supported, sampling_params
from art_proxy.local.sampling import SamplingParams
from art_proxy.local.tool_calls import ToolCallReading, reads_tool_calls
from art_proxy.vllm_api.engine import ChatRequest, CompletionRequest, Generation
from art_proxy.vllm_api.requests import model_not_found
from art_proxy.wire import ApiError


@dataclass
class ServedModel:
    name: str
    root: str  # where the weights came from: /v1/models `root`
    max_model_len: int
    engine: Engine
    tokenizer: PreTrainedTokenizerBase
    renderer: ChatRenderer
    created: int = field(default_factory=lambda: int(time.time()))
    _pieces: dict[int, tuple[str, list[int]]] = field(default_factory=dict, repr=False)

    @classmethod
    def create(
        cls,
        loaded: LoadedModel,
        *,
        served_model_name: str | None = None,
        max_model_len: int = 0,
        max_batch_size: int = 32,
    ) -> ServedModel:
        """A fresh engine (not started yet) over `loaded`; max_model_len 0 = the model's."""
        if loaded.context_len and max_model_len > loaded.context_len:
            raise ModelLoadError(
                f"--max-model-len {max_model_len} exceeds the model's context of "
                f"{loaded.context_len} tokens"
            )
        limit = max_model_len or loaded.context_len
        if limit <= 0:
            raise ModelLoadError("the model states no context length: pass --max-model-len")
        return cls(
            name=served_model_name or loaded.default_name,
            root=loaded.source,
            max_model_len=limit,
            engine=Engine(loaded.model, loaded.tokenizer, max_batch_size=max_batch_size),
            tokenizer=loaded.tokenizer,
            renderer=ChatRenderer(loaded.tokenizer),
        )

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def adapter_paths(self) -> Mapping[str, str]:
        return self.engine.adapters.paths()

    def screen(self, body: dict[str, Any]) -> None:
        check_supported(body)

    def render(
        self,
        messages: list[Any],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        return self.renderer.render(messages, tools, continue_final=continue_final)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer(text)["input_ids"]
        return ids

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        """The id decoded alone, special tokens kept, and its UTF-8 bytes (vLLM's `token`, `bytes`)."""
        cached = self._pieces.get(token_id)
        if cached is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            assert isinstance(text, str)  # one sequence of ids decodes to one string
            cached = (text, list(text.encode("utf-8", "replace")))
            self._pieces[token_id] = cached
        return cached

    async def chat(self, request: ChatRequest, prompt_ids: list[int], limit: int) -> Generation:
        if request.body.get("prompt_logprobs") is not None:
            raise ApiError(
                400,
                "'prompt_logprobs' is served by art-proxy local-llm on /v1/completions only.",
                param="prompt_logprobs",
            )
        reading = reads_tool_calls(request)
        params = sampling_params(
            request.body,
            max_tokens=limit,
            vocab_size=self.vocab_size,
            top_logprobs=request.top_logprobs,
        )
        generation = self._submit([prompt_ids], params, request.n, request.adapter, request.model)
        return ToolCallReading(generation) if reading else generation

    async def complete(self, request: CompletionRequest, limits: list[int]) -> Generation:
        # One limit for the batch, the tightest prompt's: the engine takes one SamplingParams
        # per request (vLLM cuts each prompt to its own room).
        if request.prompt_logprobs is not None and request.stream:
            raise ApiError(
                400,
                "'prompt_logprobs' is served by art-proxy local-llm without 'stream' only.",
                param="prompt_logprobs",
            )
        params = sampling_params(
            request.body,
            max_tokens=min(limits),
            vocab_size=self.vocab_size,
            top_logprobs=request.logprobs or 0,
            prompt_logprobs=request.prompt_logprobs,
        )
        return self._submit(request.prompts, params, request.n, request.adapter, request.model)

    def _submit(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        n: int,
        adapter: str | None,
        model: str,
    ) -> Generation:
        try:
            return self.engine.submit(prompts, params, n=n, adapter=adapter)
        except AdapterNotFound as exc:  # unloaded since the request was parsed
            raise model_not_found(model) from exc

    async def load_adapter(self, name: str, path: str, *, replace: bool) -> None:
        if name == self.name:
            raise ApiError(
                400,
                f"The lora adapter '{name}' has the base model's name.",
                type="InvalidUserInput",
            )
        try:
            await self.engine.load_adapter(name, path, replace=replace)
        except AdapterExists as exc:
            raise ApiError(400, str(exc), type="InvalidUserInput") from exc
        except AdapterNotFound as exc:
            raise ApiError(404, str(exc)) from exc
        except AdapterLoadFailed as exc:
            raise ApiError(500, str(exc)) from exc

    async def unload_adapter(self, name: str) -> None:
        try:
            await self.engine.unload_adapter(name)
        except AdapterNotFound as exc:
            raise ApiError(404, str(exc)) from exc
