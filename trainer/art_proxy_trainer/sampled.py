"""The distribution a call's tokens were drawn from, as vLLM read its sampling parameters
(temperature, top-k, top-p, min_p, the penalties, the logit bias, the grammar), so that the trainer
scores each token from the same one: `SampledFrom` is a call's, `SamplingTransforms` every
position's as tensors (built by batch.py), and `sampled_logprobs` a token's logprob and entropy
under them, the logits changed in vLLM's order (scoring.py's docstring)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from art_proxy.local.sampling import biased, min_p_filtered, penalized, top_k_top_p_filtered
from art_proxy.records import CallRecord
from art_proxy.wire import MIN_LOGPROB, vllm_logit_bias, vllm_temperature
from art_proxy_trainer.bitmask import allowed_mask


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
            sorted((int(token), vllm_logit_bias(float(value))) for token, value in bias.items())
        )
        if isinstance(bias, dict)
        else (),
    )
    temperature = vllm_temperature(_number(sampling.get("temperature"), 1.0))
    if temperature == 0:
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


@dataclass(frozen=True)
class SamplingTransforms:
    """Per position, what the sampler did to the logits before drawing that position's token
    (None: nothing, for every position). Penalties need each position's history: `call_start_B_T`
    is where the completion of the call that sampled it starts in its row (its prompt is the row
    before that, its output so far the tokens from there to the position) and `position_B_T` the
    position's own index, which stays right when the tensors are cut or shifted."""

    temperatures_B_T: torch.Tensor | None = None
    top_k_B_T: torch.Tensor | None = None  # 0 = off
    top_p_B_T: torch.Tensor | None = None  # 1 = off
    min_p_B_T: torch.Tensor | None = None  # 0 = off
    repetition_B_T: torch.Tensor | None = None  # 1 = off
    frequency_B_T: torch.Tensor | None = None  # 0 = off
    presence_B_T: torch.Tensor | None = None  # 0 = off
    call_start_B_T: torch.Tensor | None = None  # int64; set with any penalty
    position_B_T: torch.Tensor | None = None  # int64; set with any penalty
    bias_ids_B_T_M: torch.Tensor | None = None  # int64 ids a logit_bias changes, -1 padding
    bias_B_T_M: torch.Tensor | None = None  # float32, each id's bias
    # Guided decoding: a row of `allowed_K_W` per constrained position (-1: not constrained),
    # the packed bitmask of the ids its grammar allowed (grammar.GrammarReplay.allowed).
    allowed_index_B_T: torch.Tensor | None = None  # int64
    allowed_K_W: torch.Tensor | None = None  # int32, shared by every position (never cut)

    def to(self, device: torch.device) -> SamplingTransforms:
        return self._each(lambda tensor: tensor.to(device), whole=lambda t: t.to(device))

    def rows(self, rows: slice | torch.Tensor, length: int) -> SamplingTransforms:
        return self._each(lambda tensor: tensor[rows, :length])

    def at(self, where: tuple[torch.Tensor, ...], tokens_B_T: torch.Tensor) -> Filters:
        """The transforms of the positions `where` indexes (a `nonzero(as_tuple=True)`) in rows
        of `tokens_B_T`."""

        def of(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor[where]

        allowed_N_W = None
        if self.allowed_index_B_T is not None and self.allowed_K_W is not None:
            index_N = self.allowed_index_B_T[where]
            # A position no grammar constrained allows every id: all bits set (-1).
            allowed_N_W = self.allowed_K_W[index_N.clamp(min=0)].where(index_N[:, None] >= 0, -1)
        history = None
        if self.call_start_B_T is not None and self.position_B_T is not None:
            history = History(
                tokens_B_T, where[0], self.call_start_B_T[where], self.position_B_T[where]
            )
        return Filters(
            of(self.temperatures_B_T),
            of(self.top_k_B_T),
            of(self.top_p_B_T),
            of(self.min_p_B_T),
            of(self.repetition_B_T),
            of(self.frequency_B_T),
            of(self.presence_B_T),
            history,
            of(self.bias_ids_B_T_M),
            of(self.bias_B_T_M),
            allowed_N_W,
        )

    def shifted(self) -> SamplingTransforms:
        """The transforms of the token each position's logits predict (logits at t-1 predict t)."""
        return self._each(lambda tensor: tensor[:, 1:])

    def _each(
        self,
        change: Callable[[torch.Tensor], torch.Tensor],
        whole: Callable[[torch.Tensor], torch.Tensor] = lambda tensor: tensor,
    ) -> SamplingTransforms:
        """`change` applied to every per-position tensor, `whole` to the shared table."""

        def changed(name: str) -> torch.Tensor | None:
            tensor: torch.Tensor | None = getattr(self, name)
            if tensor is None:
                return None
            return whole(tensor) if name == "allowed_K_W" else change(tensor)

        return SamplingTransforms(*(changed(item.name) for item in dataclasses.fields(self)))


NO_TRANSFORMS = SamplingTransforms()


@dataclass(frozen=True)
class History:
    """What the penalties of N scored positions read: each one's row of `tokens_B_T`, where its
    call's completion starts in that row, and its own index (its output so far ends before it)."""

    tokens_B_T: torch.Tensor
    rows_N: torch.Tensor
    starts_N: torch.Tensor
    positions_N: torch.Tensor

    def chunk(self, part: slice) -> History:
        return History(
            self.tokens_B_T, self.rows_N[part], self.starts_N[part], self.positions_N[part]
        )

    def seen(self, vocabulary: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids in each position's prompt, bool; times each id was output before it, float32)."""
        with torch.no_grad():
            tokens_N_T = self.tokens_B_T[self.rows_N]
            index_T = torch.arange(tokens_N_T.shape[1], device=tokens_N_T.device)
            in_prompt_N_T = index_T < self.starts_N[:, None]
            in_output_N_T = ~in_prompt_N_T & (index_T < self.positions_N[:, None])
            # Ids outside the span go to one column past the vocabulary, then dropped.
            rows = len(self.rows_N)
            prompt_N_V = torch.zeros(
                rows, vocabulary + 1, dtype=torch.bool, device=tokens_N_T.device
            )
            prompt_N_V.scatter_(1, tokens_N_T.where(in_prompt_N_T, vocabulary), True)
            counts_N_V = torch.zeros(rows, vocabulary + 1, device=tokens_N_T.device)
            counts_N_V.scatter_add_(
                1, tokens_N_T.where(in_output_N_T, vocabulary), in_output_N_T.float()
            )
        return prompt_N_V[:, :vocabulary], counts_N_V[:, :vocabulary]


@dataclass(frozen=True)
class Filters:
    """The transforms of N scored positions, one value each (None: off for all)."""

    temperatures_N: torch.Tensor | None
    top_k_N: torch.Tensor | None
    top_p_N: torch.Tensor | None
    min_p_N: torch.Tensor | None = None
    repetition_N: torch.Tensor | None = None
    frequency_N: torch.Tensor | None = None
    presence_N: torch.Tensor | None = None
    history: History | None = None
    bias_ids_N_M: torch.Tensor | None = None
    bias_N_M: torch.Tensor | None = None
    allowed_N_W: torch.Tensor | None = None  # int32 packed bitmasks (all bits: not constrained)

    def chunk(self, part: slice) -> Filters:
        def of(value: torch.Tensor | History | None) -> torch.Tensor | History | None:
            return (
                None
                if value is None
                else value.chunk(part)
                if isinstance(value, History)
                else value[part]
            )

        return Filters(*(of(getattr(self, item.name)) for item in dataclasses.fields(self)))  # type: ignore[arg-type]  # each field keeps its own type

    @property
    def penalized(self) -> bool:
        return self.history is not None and any(
            penalty is not None
            for penalty in (self.repetition_N, self.frequency_N, self.presence_N)
        )


def sampled_logprobs(
    logits_N_V: torch.Tensor, tokens_N: torch.Tensor, filters: Filters
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprob of each token, entropy of its distribution) from the logits that predict it, in
    float32, changed in vLLM's order (the module docstring). The entropy carries no gradient: it
    is a measurement."""
    logits_N_V = logits_N_V.float()
    if filters.allowed_N_W is not None:
        allowed_N_V = allowed_mask(filters.allowed_N_W, logits_N_V.shape[-1])
        logits_N_V = logits_N_V.masked_fill(~allowed_N_V, float("-inf"))
    if filters.bias_ids_N_M is not None and filters.bias_N_M is not None:
        logits_N_V = biased(logits_N_V, filters.bias_ids_N_M, filters.bias_N_M)
    if filters.penalized:
        assert filters.history is not None  # penalized says so
        prompt_seen_N_V, output_counts_N_V = filters.history.seen(logits_N_V.shape[-1])
        off_N = logits_N_V.new_zeros(len(tokens_N))
        logits_N_V = penalized(
            logits_N_V,
            prompt_seen_N_V,
            output_counts_N_V,
            off_N + 1 if filters.repetition_N is None else filters.repetition_N,
            off_N if filters.frequency_N is None else filters.frequency_N,
            off_N if filters.presence_N is None else filters.presence_N,
        )
    if filters.temperatures_N is not None:
        logits_N_V = logits_N_V / filters.temperatures_N.unsqueeze(-1)
    if filters.min_p_N is not None:
        logits_N_V = min_p_filtered(logits_N_V, filters.min_p_N)
    filtered = any(
        left_out is not None
        for left_out in (filters.top_k_N, filters.top_p_N, filters.min_p_N, filters.allowed_N_W)
    )
    if filters.top_k_N is not None or filters.top_p_N is not None:
        shape = logits_N_V.shape[:1]
        device = logits_N_V.device
        top_k_N = (
            torch.zeros(shape, dtype=torch.int64, device=device)
            if filters.top_k_N is None
            else filters.top_k_N
        )
        top_p_N = torch.ones(shape, device=device) if filters.top_p_N is None else filters.top_p_N
        logits_N_V = top_k_top_p_filtered(logits_N_V, top_k_N, top_p_N)
    logprobs_N_V = torch.log_softmax(logits_N_V, dim=-1)
    picked_N = logprobs_N_V.gather(-1, tokens_N.unsqueeze(-1)).squeeze(-1)
    if filtered:
        # vLLM writes the logprob of an id its filters left out (-inf) as MIN_LOGPROB; so does
        # the trainer for a sampled id the new weights' min_p, top-k or top-p leave out (its
        # ratio is then 0, its gradient none), or that a grammar did not allow.
        picked_N = picked_N.clamp(min=MIN_LOGPROB)
    with torch.no_grad():
        kept_N_V = logprobs_N_V.isfinite()
        entropy_N = -(logprobs_N_V.exp() * logprobs_N_V.where(kept_N_V, 0.0)).sum(-1)
    return picked_N, entropy_N
