"""Logprobs in vLLM's two shapes: chat's entry per id, and the completions API's legacy object."""

from __future__ import annotations

from typing import Any

from art_proxy.vllm_api.engine import InferenceEngine, TokenLogprob
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
