"""The engine seam: what a server standing in for vLLM needs from the engine behind it.

The server parses and checks a request (`requests`), then hands the engine a `ChatRequest` or a
`CompletionRequest` and gets back a `Generation`: whole choices for a plain answer, or a stream of
`ChoiceDelta`s, choice by choice, that the server frames as SSE chunks. A chat engine has already
read its replies for tool calls (a delta's `text` None holds markup back, `tool_calls` carries the
fragments a step completes), since how it does so is its own: local-llm parses Hermes markup, the
fake knows which ids it wrote. Errors a client sees are `wire.ApiError`s; `PromptError` and
`EngineFailure` are the two an engine raises for the server to word.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

FinishReason = Literal["stop", "length", "tool_calls"]


class PromptError(ValueError):
    """Messages or tools the chat template cannot render (400, param "messages")."""


class EngineFailure(Exception):
    """Generation failed: a 500, or an error event once a stream has begun."""


class TokenLogprob(NamedTuple):
    """One generated id's logprob; a tuple, since one is made per token (a frozen dataclass
    takes four times as long to make)."""

    logprob: float  # of the sampled id; may be -inf
    top: tuple[tuple[int, float], ...]  # the `top_logprobs` asked for, (id, logprob), best first


class PromptLogprob(NamedTuple):
    """A prompt id's logprob after the ids before it (vLLM's `prompt_logprobs`): raw, the
    model's own distribution, whatever the request samples with."""

    logprob: float
    rank: int  # 1 for the likeliest id
    top: tuple[tuple[int, float], ...]  # the top k asked for, (id, logprob), best first


# One entry per prompt id; the first is None (nothing comes before it).
PromptLogprobs = tuple[PromptLogprob | None, ...]


@dataclass(slots=True)  # not frozen: one is made per token, and frozen makes one 4x slower
class ChoiceDelta:
    """One step of one choice: its new ids, their logprobs, and what they say."""

    index: int  # the choice's index within its request
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]  # one per id; () when the request asked for none
    # The text released, "" for a partial character or a possible stop string; chat only: None
    # while tool-call markup is held back (the chunk has no `content` key then).
    text: str | None
    finish_reason: FinishReason | None = None  # set on the choice's last delta only
    stop_reason: str | int | None = None  # the stop string or stop id that ended it; None for EOS
    tool_calls: tuple[dict[str, Any], ...] = ()  # chat: the tool-call fragments this step completes
    prompt_logprobs: PromptLogprobs | None = None  # on a choice's first delta, when asked for


@dataclass(frozen=True, slots=True)
class ChoiceOutput:
    """A whole choice, for a response that is not streamed."""

    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]  # one per id; () when the request asked for none
    text: str | None  # chat: the message content, None when the reply is only tool calls
    finish_reason: FinishReason
    stop_reason: str | int | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()  # chat: the message's parsed tool calls
    prompt_logprobs: PromptLogprobs | None = None  # when the request asked for them


class Generation(Protocol):
    """An answer under way; `cancel` (a client that went away) lets the engine drop it."""

    @property
    def choices(self) -> int: ...

    def deltas(self) -> AsyncIterator[ChoiceDelta]:
        """Every choice's deltas until all have finished; raises `EngineFailure`."""
        ...

    async def collect(self) -> list[ChoiceOutput]:
        """Every choice, whole, in index order; raises `EngineFailure`."""
        ...

    def cancel(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ChatRequest:
    body: dict[str, Any]  # as received: an engine reads its own fields (sampling, tool_choice)
    model: str  # the name the response echoes
    adapter: str | None  # None = the base model
    messages: list[Any]
    tools: list[dict[str, Any]] | None  # each with a named `function`
    n: int
    max_tokens: int | None
    max_tokens_param: str  # the field it came from, which errors name
    logprobs: bool
    top_logprobs: int
    tokens_as_ids: bool
    return_token_ids: bool
    stream: bool
    include_usage: bool
    continue_final: bool = False  # `continue_final_message`: the answer goes on with the last one


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    body: dict[str, Any]
    model: str
    adapter: str | None
    prompts: list[list[int]]  # one group of `n` choices each, choice `prompt_index * n + i`
    n: int
    max_tokens: int
    logprobs: int | None  # the legacy integer: None = no logprobs object
    return_token_ids: bool
    stream: bool
    include_usage: bool
    prompt_logprobs: int | None = None  # the top k per prompt id besides its own; None = none


class InferenceEngine(Protocol):
    """What an engine supplies; everything else about the wire is the server's."""

    @property
    def name(self) -> str:
        """The base model's served name."""
        ...

    @property
    def root(self) -> str:
        """Where the base model's weights came from (`/v1/models` `root`)."""
        ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def created(self) -> int: ...

    @property
    def vocab_size(self) -> int:
        """Prompt ids at or above it are refused."""
        ...

    def adapter_paths(self) -> Mapping[str, str]:
        """Loaded LoRA adapters, name -> path, in load order."""
        ...

    def screen(self, body: dict[str, Any]) -> None:
        """Sees each generation request's body before it is parsed (the fake keeps it; local-llm
        refuses sampling fields it cannot honour with an `ApiError`)."""
        ...

    def render(
        self,
        messages: list[Any],
        tools: list[dict[str, Any]] | None,
        *,
        continue_final: bool = False,
    ) -> list[int]:
        """A chat prompt's ids, generation prompt included (or, with `continue_final`, the last
        message left open, for the answer to go on writing it: vLLM's `continue_final_message`);
        raises `PromptError`."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def piece(self, token_id: int) -> tuple[str, list[int]]:
        """The id decoded alone, special tokens kept, and its UTF-8 bytes."""
        ...

    async def chat(self, request: ChatRequest, prompt_ids: list[int], limit: int) -> Generation:
        """Start `request.n` choices of at most `limit` ids each."""
        ...

    async def complete(self, request: CompletionRequest, limits: list[int]) -> Generation:
        """Start `request.n` choices per prompt, at most `limits[p]` ids for prompt p."""
        ...

    async def load_adapter(self, name: str, path: str, *, replace: bool) -> None: ...

    async def unload_adapter(self, name: str) -> None: ...
