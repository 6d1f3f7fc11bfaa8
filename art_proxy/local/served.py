"""What one local-llm server serves: the base model's names and context, its engine, its vocabulary.

Shared by the route handlers. A request names the base model (or omits `model`) or a loaded LoRA
adapter; the response echoes that name, as vLLM does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.engine import Engine
from art_proxy.local.errors import ModelLoadError
from art_proxy.local.model_loading import LoadedModel
from art_proxy.local.sampling import TokenLogprob
from art_proxy.wire import MIN_LOGPROB, ApiError


@dataclass(frozen=True)
class ModelChoice:
    name: str  # echoed in the response
    adapter: str | None  # None = the base model


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

    def choose(self, body: dict[str, Any]) -> ModelChoice:
        model = body.get("model")
        if model is None or model == self.name:
            return ModelChoice(self.name, None)
        if not isinstance(model, str):
            raise ApiError(400, "'model' must be a string.", param="model")
        if model in self.engine.adapters.paths():
            return ModelChoice(model, model)
        raise not_found(model)

    def check_token_ids(self, ids: list[int]) -> None:
        vocab = len(self.tokenizer)
        for token_id in ids:
            if not 0 <= token_id < vocab:
                raise ApiError(400, f"Token id {token_id} is out of vocabulary.", param="prompt")

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        """The id decoded alone, special tokens kept, and its UTF-8 bytes (vLLM's `token`, `bytes`)."""
        cached = self._pieces.get(token_id)
        if cached is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            assert isinstance(text, str)  # one sequence of ids decodes to one string
            cached = (text, list(text.encode("utf-8", "replace")))
            self._pieces[token_id] = cached
        return cached

    def logprob_entry(self, token_id: int, logprob: float, *, as_id: bool) -> dict[str, Any]:
        """One chat logprobs entry without its `top_logprobs`."""
        if as_id:
            token = f"token_id:{token_id}"
            return {"token": token, "logprob": wire_logprob(logprob), "bytes": list(token.encode())}
        text, raw = self.piece(token_id)
        return {"token": text, "logprob": wire_logprob(logprob), "bytes": raw}

    def chat_logprobs(
        self, ids: tuple[int, ...], logprobs: tuple[TokenLogprob, ...], *, as_id: bool
    ) -> list[dict[str, Any]]:
        entries = []
        for token_id, logprob in zip(ids, logprobs, strict=True):
            entry = self.logprob_entry(token_id, logprob.logprob, as_id=as_id)
            entry["top_logprobs"] = [
                self.logprob_entry(top_id, top_logprob, as_id=as_id)
                for top_id, top_logprob in logprob.top
            ]
            entries.append(entry)
        return entries


def wire_logprob(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", param="model")
