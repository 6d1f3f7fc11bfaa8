"""Logprobs in vLLM's two shapes: chat's entry per id, and the completions API's legacy object."""

from __future__ import annotations

from typing import Any

from art_proxy.vllm_api.engine import InferenceEngine, PromptLogprobs, TokenLogprob
from art_proxy.wire import MIN_LOGPROB


def wire_logprob(logprob: float) -> float:
    """JSON has no -inf: vLLM sends this floor instead."""
    return max(logprob, MIN_LOGPROB)


def chat_logprobs(
    engine: InferenceEngine,
    ids: tuple[int, ...],
    logprobs: tuple[TokenLogprob, ...],
    *,
    as_id: bool,
) -> dict[str, Any]:
    """`{"content": [...]}`, one entry per id (EOS included); `as_id` is the request's
    `return_tokens_as_token_ids`, which writes each token as `token_id:N`."""
    content = []
    for token_id, logprob in zip(ids, logprobs, strict=True):
        entry = _chat_entry(engine, token_id, logprob.logprob, as_id=as_id)
        entry["top_logprobs"] = [
            _chat_entry(engine, top_id, top_logprob, as_id=as_id)
            for top_id, top_logprob in logprob.top
        ]
        content.append(entry)
    return {"content": content}


def _chat_entry(
    engine: InferenceEngine, token_id: int, logprob: float, *, as_id: bool
) -> dict[str, Any]:
    if as_id:
        token = f"token_id:{token_id}"
        return {"token": token, "logprob": wire_logprob(logprob), "bytes": list(token.encode())}
    text, raw = engine.piece(token_id)
    return {"token": text, "logprob": wire_logprob(logprob), "bytes": raw}


def legacy_logprobs(
    engine: InferenceEngine,
    ids: tuple[int, ...],
    logprobs: tuple[TokenLogprob, ...],
    text_offset: int,
) -> dict[str, Any]:
    """Per id its text offset, logprob and piece, and a dict of the sampled piece and the top k."""
    result: dict[str, list[Any]] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    for token_id, logprob in zip(ids, logprobs, strict=True):
        piece = engine.piece(token_id)[0]
        ranked = {piece: wire_logprob(logprob.logprob)}
        for top_id, top_logprob in logprob.top:
            ranked.setdefault(engine.piece(top_id)[0], wire_logprob(top_logprob))
        result["text_offset"].append(text_offset)
        result["token_logprobs"].append(wire_logprob(logprob.logprob))
        result["tokens"].append(piece)
        result["top_logprobs"].append(ranked)
        text_offset += len(piece)
    return result


def prompt_logprob_entries(
    engine: InferenceEngine, ids: list[int], scored: PromptLogprobs
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs`: None for the first id, then per id a dict keyed by token id,
    the id itself first (its logprob, rank and text), then the top k not already in it."""
    entries: list[dict[str, dict[str, Any]] | None] = []
    for token_id, entry in zip(ids, scored, strict=True):
        if entry is None:
            entries.append(None)
            continue
        ranked = {str(token_id): _prompt_entry(engine, token_id, entry.logprob, entry.rank)}
        for rank, (top_id, top_logprob) in enumerate(entry.top, start=1):
            ranked.setdefault(str(top_id), _prompt_entry(engine, top_id, top_logprob, rank))
        entries.append(ranked)
    return entries


def _prompt_entry(
    engine: InferenceEngine, token_id: int, logprob: float, rank: int
) -> dict[str, Any]:
    return {
        "logprob": wire_logprob(logprob),
        "rank": rank,
        "decoded_token": engine.piece(token_id)[0],
    }
