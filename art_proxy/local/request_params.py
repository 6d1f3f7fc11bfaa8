"""Reading the sampling fields that chat and completions requests share.

An omitted field takes vLLM's default (temperature 1, top_p 1: SmolLM2's generation_config.json sets
neither). A field this server cannot honour with a non-neutral value (penalties, guided decoding,
beam search...) is a 400 rather than silently ignored: a recorder needs the real sampling
distribution, and ignoring such a field would misreport it.
"""

from __future__ import annotations

from typing import Any

from art_proxy.local.sampling import SamplingParams
from art_proxy.wire import (
    ApiError,
    bool_field,
    float_field,
    int_field,
    vllm_logit_bias,
    vllm_temperature,
)

# Fields accepted only with these values (the ones that change nothing).
_NEUTRAL_ONLY: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "min_p": (None, 0),
    "min_tokens": (None, 0),
    "best_of": (None, 1),
    "use_beam_search": (None, False),
    "echo": (None, False),
    "suffix": (None,),
    "response_format": (None, {"type": "text"}),
    "structured_outputs": (None,),
    "guided_json": (None,),
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
}
_MAX_STOP_STRINGS = 16


def check_supported(body: dict[str, Any]) -> None:
    for name, neutral in _NEUTRAL_ONLY.items():
        if name in body and body[name] not in neutral:
            raise ApiError(400, f"'{name}' is not supported by art-proxy local-llm.", param=name)


def sampling_params(
    body: dict[str, Any],
    *,
    max_tokens: int,
    vocab_size: int,
    top_logprobs: int,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """The request's sampling; `max_tokens` is already checked against the context."""
    top_p = float_field(body, "top_p", 1.0, minimum=0.0, maximum=1.0)
    if top_p == 0:
        raise ApiError(400, "'top_p' must be in (0, 1], got 0.", param="top_p")
    top_k = int_field(body, "top_k", 0, minimum=-1) or 0
    seed = int_field(body, "seed", None, minimum=-(2**63))
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=vllm_temperature(
            float_field(body, "temperature", 1.0, minimum=0.0, maximum=100.0)
        ),
        top_p=top_p,
        top_k=max(top_k, 0),  # vLLM reads -1 as "off", like 0
        seed=seed,
        stop=_stop_strings(body.get("stop")),
        stop_token_ids=_stop_token_ids(body.get("stop_token_ids")),
        ignore_eos=bool_field(body, "ignore_eos"),
        top_logprobs=top_logprobs,
        prompt_logprobs=prompt_logprobs,
        logit_bias=_logit_bias(body.get("logit_bias"), vocab_size),
    )


def _logit_bias(bias: Any, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """`logit_bias` as vLLM reads it: token ids (JSON keys are strings) to numbers, each clamped
    to [-100, 100]; an id outside the vocabulary is a 400."""
    if bias is None:
        return ()
    if not isinstance(bias, dict):
        raise ApiError(
            400, "'logit_bias' must be an object of token ids to numbers.", param="logit_bias"
        )
    pairs = []
    for key, value in bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            token = -1
        if not 0 <= token < vocab_size:
            raise ApiError(
                400,
                f"token_id {key} in logit_bias contains out-of-vocab token id.",
                param="logit_bias",
            )
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ApiError(
                400, f"'logit_bias' value of {key} must be a number.", param="logit_bias"
            )
        pairs.append((token, vllm_logit_bias(float(value))))
    return tuple(sorted(pairs))


def _stop_strings(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if (
        isinstance(stop, list)
        and len(stop) <= _MAX_STOP_STRINGS
        and all(isinstance(s, str) for s in stop)
    ):
        return tuple(s for s in stop if s)
    raise ApiError(
        400, f"'stop' must be a string or a list of at most {_MAX_STOP_STRINGS}.", param="stop"
    )


def _stop_token_ids(ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return tuple(ids)
    raise ApiError(400, "'stop_token_ids' must be a list of token ids.", param="stop_token_ids")
