"""The distribution a call's tokens were drawn from, as vLLM read its sampling parameters:
temperature, top-k, top-p, min_p, the penalties and the logit bias. The trainer scores each token
from the same distribution (batch.py turns these into per-position transforms, scoring.py applies
them)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from art_proxy.records import CallRecord


@dataclass(frozen=True)
class SampledFrom:
    """The changes of the logits a call's tokens were drawn from (each field's default: none)."""

    temperature: float = 1.0
    top_k: int = 0  # 0 = off (vLLM's -1 too)
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, bias) pairs

    @property
    def penalized(self) -> bool:
        return (self.repetition_penalty, self.frequency_penalty, self.presence_penalty) != (
            1.0,
            0.0,
            0.0,
        )


NOT_FILTERED = SampledFrom()
# vLLM's bounds on a logit bias (SamplingParams.from_optional clamps each one to them).
_LOGIT_BIAS_BOUND = 100.0
# vLLM reads a temperature under this as greedy decoding (vllm/sampling_params.py).
_GREEDY_BELOW = 1e-5


def sampled_from(call: CallRecord) -> SampledFrom:
    """What the call asked for, as vLLM reads it. Greedy decoding (temperature 0) reports the
    distribution before temperature, min_p, top-k and top-p (vLLM turns those off for it); a logit
    bias and the penalties change it still."""
    sampling = call.sampling
    bias = sampling.get("logit_bias")
    changes = SampledFrom(
        repetition_penalty=_number(sampling.get("repetition_penalty"), 1.0),
        frequency_penalty=_number(sampling.get("frequency_penalty"), 0.0),
        presence_penalty=_number(sampling.get("presence_penalty"), 0.0),
        logit_bias=tuple(
            sorted(
                (int(token), max(-_LOGIT_BIAS_BOUND, min(_LOGIT_BIAS_BOUND, float(value))))
                for token, value in bias.items()
            )
        )
        if isinstance(bias, dict)
        else (),
    )
    temperature = _number(sampling.get("temperature"), 1.0)
    if temperature < _GREEDY_BELOW:
        return changes
    top_k = _number(sampling.get("top_k"), 0)
    top_p = _number(sampling.get("top_p"), 1.0)
    return replace(
        changes,
        temperature=temperature,
        top_k=max(int(top_k), 0),
        top_p=min(top_p, 1.0) if top_p > 0 else 1.0,
        min_p=max(_number(sampling.get("min_p"), 0.0), 0.0),
    )


def _number(value: object, default: float) -> float:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
    )
