"""Token capture: ask the upstream for token ids and logprobs, keep them, hide them from the client.

The upstream request always asks for `return_token_ids` (vLLM >= 0.10.2), sampling `logprobs` and,
for streams, the usage chunk. The client's response is then put back to what the client asked for:
fields it did not request are removed (ids) or nulled (logprobs, as OpenAI sends them). A stream is
relayed chunk by chunk while `stream_rebuild.StreamRecorder` rebuilds the full non-stream-shaped
response for the store, so a streamed call and a non-stream call are recorded the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from art_proxy.guided_decoding import Unreplayable, constraint
from art_proxy.records import CallKind, JsonObject

# Request fields recorded as the call's sampling parameters (the rest of the body is kept whole).
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
)


@dataclass(frozen=True)
class ClientAsks:
    """What the client itself requested, so the response can be cut back to it."""

    logprobs: bool
    token_ids: bool
    usage_chunk: bool


def upstream_body(
    body: JsonObject, kind: CallKind, *, token_ids: bool
) -> tuple[JsonObject, ClientAsks]:
    """The body sent upstream: the client's, plus the fields that capture needs."""
    logprobs = body.get("logprobs")
    stream_options = body.get("stream_options") or {}
    asks = ClientAsks(
        logprobs=bool(logprobs) if kind == "chat" else logprobs is not None,
        token_ids=bool(body.get("return_token_ids")),
        usage_chunk=bool(isinstance(stream_options, dict) and stream_options.get("include_usage")),
    )
    sent = dict(body)
    if kind == "chat":
        sent["logprobs"] = True
    elif logprobs is None:
        sent["logprobs"] = 0  # legacy completions: 0 still returns the sampled token's logprob
    if token_ids:
        sent["return_token_ids"] = True
    if body.get("stream"):
        sent["stream_options"] = {**stream_options, "include_usage": True}
    return sent, asks


def unreproduced_sampling(body: JsonObject) -> str | None:
    """Why the trainer could not score this request's tokens with the distribution they were
    sampled from; None when it can. It reproduces every sampling field vLLM 0.32 takes (the logit
    changes `SAMPLING_FIELDS` records; and from the request, `allowed_token_ids`, `bad_words`,
    `min_tokens` and guided decoding), except the guided decoding it cannot replay."""
    guided = constraint(body)
    return guided.reason if isinstance(guided, Unreplayable) else None


def sampling_of(body: JsonObject) -> JsonObject:
    return {name: body[name] for name in SAMPLING_FIELDS if name in body}


def strip_response(response: JsonObject, asks: ClientAsks) -> JsonObject:
    """A non-stream response as the client asked for it (a shallow copy; the original is stored)."""
    stripped = dict(response)
    if not asks.token_ids:
        stripped.pop("prompt_token_ids", None)
    stripped["choices"] = [_strip_choice(choice, asks) for choice in response.get("choices", [])]
    return stripped


def strip_chunk(chunk: JsonObject, asks: ClientAsks) -> JsonObject | None:
    """A stream chunk as the client asked for it; None when the whole chunk must not be sent,
    `chunk` itself when all of it may be."""
    choices = chunk.get("choices")
    if not choices and "usage" in chunk and not asks.usage_chunk and "error" not in chunk:
        return None
    if asks.token_ids and asks.logprobs and (asks.usage_chunk or "usage" not in chunk):
        return chunk
    stripped = dict(chunk)
    if not asks.token_ids:
        stripped.pop("prompt_token_ids", None)
    if not asks.usage_chunk:
        stripped.pop("usage", None)
    if choices:
        stripped["choices"] = [_strip_choice(choice, asks) for choice in choices]
    return stripped


def _strip_choice(choice: JsonObject, asks: ClientAsks) -> JsonObject:
    if asks.token_ids and asks.logprobs:
        return choice
    stripped = dict(choice)
    if not asks.token_ids:
        stripped.pop("token_ids", None)
        stripped.pop("prompt_token_ids", None)
    if not asks.logprobs and "logprobs" in stripped:
        stripped["logprobs"] = None
    return stripped


def response_problem(response: JsonObject, kind: CallKind) -> str | None:
    """What makes a whole upstream answer unusable, in a few words; None when nothing does.

    Only what the proxy reads is checked (the choices, their ids, logprobs and replies): the rest
    is relayed as the upstream sent it. Checked before anything is recorded, so a malformed
    answer is a failed call, never a record that cannot be read back.
    """
    if not isinstance(response.get("choices"), list):
        return "choices is not a list"
    return _choices_problem(response, kind, "message")


def chunk_problem(chunk: Any, kind: CallKind) -> str | None:
    """`response_problem` for one stream chunk (its choices, if any, carry a `delta`)."""
    if not isinstance(chunk, dict):
        return "a chunk is not a JSON object"
    usage = chunk.get("usage")
    if usage is not None and not isinstance(usage, dict):
        return "usage is not an object"
    return _choices_problem(chunk, kind, "delta")


def _choices_problem(body: JsonObject, kind: CallKind, reply_key: str) -> str | None:
    choices = body.get("choices")
    if choices is not None and not isinstance(choices, list):
        return "choices is not a list"
    if not _ids_or_none(body.get("prompt_token_ids")):
        return "prompt_token_ids is not a list of integers"
    for position, choice in enumerate(choices or []):
        problem = _choice_problem(choice, kind, reply_key)
        if problem is not None:
            return f"choices[{position}]{problem}"
    return None


def _choice_problem(choice: Any, kind: CallKind, reply_key: str) -> str | None:
    if not isinstance(choice, dict):
        return " is not an object"
    if type(choice.get("index", 0)) is not int:
        return ".index is not an integer"
    for key in ("token_ids", "prompt_token_ids"):
        if not _ids_or_none(choice.get(key)):
            return f".{key} is not a list of integers"
    logprobs = choice.get("logprobs")
    if logprobs is not None:
        if not isinstance(logprobs, dict):
            return ".logprobs is not an object"
        if kind == "chat":
            entries = logprobs.get("content")
            if entries is not None and not (
                isinstance(entries, list)
                and all(isinstance(e, dict) and _is_number(e.get("logprob")) for e in entries)
            ):
                return ".logprobs.content has an entry without a numeric logprob"
        else:
            values = logprobs.get("token_logprobs")
            if values is not None and not (
                isinstance(values, list) and all(v is None or _is_number(v) for v in values)
            ):
                return ".logprobs.token_logprobs is not a list of numbers"
    if kind == "completion":
        return None if _text_or_none(choice.get("text")) else ".text is not a string"
    reply = choice.get(reply_key)
    if reply is None:
        return None
    if not isinstance(reply, dict):
        return f".{reply_key} is not an object"
    for key in ("content", "reasoning", "reasoning_content"):
        if not _text_or_none(reply.get(key)):
            return f".{reply_key}.{key} is not a string"
    tool_calls = reply.get("tool_calls")
    if tool_calls is not None and not (
        isinstance(tool_calls, list) and all(_is_tool_call(call) for call in tool_calls)
    ):
        return f".{reply_key}.tool_calls is not a list of tool calls"
    return None


def _is_tool_call(call: Any) -> bool:
    if not isinstance(call, dict) or type(call.get("index", 0)) is not int:
        return False
    function = call.get("function")
    if function is None:
        return True
    return (
        isinstance(function, dict)
        and _text_or_none(function.get("name"))
        and _text_or_none(function.get("arguments"))
    )


def _text_or_none(value: Any) -> bool:
    return value is None or isinstance(value, str)


def _ids_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(type(i) is int for i in value))


def _is_number(value: Any) -> bool:
    return type(value) is float or type(value) is int


@dataclass(frozen=True)
class Tokens:
    """What a response says about tokens; trainable only when every choice has ids and logprobs."""

    prompt_token_ids: list[int] | None
    completion_token_ids: list[list[int]] | None
    logprobs: list[list[float]] | None
    untrainable: str | None  # why not trainable; None: trainable

    @property
    def trainable(self) -> bool:
        return self.untrainable is None


NO_TOKENS = Tokens(None, None, None, "no answer")


def tokens_of(response: JsonObject, kind: CallKind) -> Tokens:
    choices = response.get("choices") or []
    if kind == "chat":
        prompt_ids = response.get("prompt_token_ids")
    else:  # completions carry prompt ids per choice; a recorded call keeps the first prompt
        prompt_ids = choices[0].get("prompt_token_ids") if choices else None
    completion_ids: list[list[int]] = []
    logprobs: list[list[float]] = []
    for choice in choices:
        ids = choice.get("token_ids")
        if ids is None:
            return Tokens(prompt_ids, None, None, "the upstream returned no token ids")
        completion_ids.append(list(ids))
        logprobs.append(_sampled_logprobs(choice.get("logprobs"), kind))
    aligned = (
        prompt_ids is not None
        and bool(choices)
        and all(len(lp) == len(ids) for lp, ids in zip(logprobs, completion_ids, strict=True))
    )
    untrainable = None
    if not aligned:
        untrainable = "no prompt ids, or a logprob missing for some id"
    elif not _all_ids_captured(response, completion_ids):
        untrainable = "stream lost tokens (ids short of usage.completion_tokens)"
    return Tokens(prompt_ids, completion_ids, logprobs if aligned else None, untrainable)


def _all_ids_captured(response: JsonObject, completion_ids: list[list[int]]) -> bool:
    """Whether the ids add up to the tokens the upstream says it generated (all choices). A
    stream can lose chunks, ids and logprobs together (vLLM issue 27482, a tool parser holding
    text back): such a call has holes in its context and must not be trained on."""
    usage = response.get("usage")
    generated = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if type(generated) is not int:
        return True  # nothing to check against
    return generated == sum(len(ids) for ids in completion_ids)


def _sampled_logprobs(logprobs: Any, kind: CallKind) -> list[float]:
    if not isinstance(logprobs, dict):
        return []
    if kind == "chat":
        return [float(entry["logprob"]) for entry in logprobs.get("content") or []]
    return [float(value) for value in logprobs.get("token_logprobs") or [] if value is not None]
