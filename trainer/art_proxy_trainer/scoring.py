"""Scoring sampled tokens: each token's logprob under the distribution it was drawn from.

Token t is scored from the logits at t-1 changed as vLLM 0.32's sampler changed them before drawing
it, in its order: what the call's grammar did not allow there left out (guided decoding,
`grammar.py`); its `logit_bias` added; the repetition, frequency and presence penalties from the
call's prompt and the tokens the call sampled before t; divided by its temperature; what its min_p,
top-k and top-p leave out removed (local-llm's sampler's own filters, which vLLM's match); then
log-softmaxed.

The trainer needs those logprobs only where the loss reads them (sampled tokens, never the prompt or
a tool result), and a full-vocabulary tensor for every position is what runs a GPU out of memory:
8,192 positions of a 152k vocabulary are 5 GB in float32, a copy. So `score_sampled` replaces the
model's output layer for the length of one forward: the layer receives the final hidden states,
picks the positions whose next token is trained, and computes the head, temperature, filters and
log-softmax in float32 (whatever the base's dtype) over chunks of those positions only, each chunk
recomputed in the backward instead of kept. What comes out of the model is then `[B, T, 2]`: each
token's logprob and the entropy of the distribution it was drawn from (0 where untrained).

A model whose head is not a plain linear layer, or whose forward changes the logits after it
(Gemma's soft-capping, Cohere's logit scale), is scored from its full logits by `token_logprobs`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from art_proxy.local.sampling import biased, min_p_filtered, penalized, top_k_top_p_filtered
from art_proxy.wire import MIN_LOGPROB
from art_proxy_trainer.grammar import allowed_mask

# Bytes of float32 logits one chunk of positions may hold (a few copies live at once: the logits,
# the filtered and log-softmaxed ones, the probabilities for the entropy): 64 MiB is ~440
# positions of a 152k vocabulary, ~1,360 of SmolLM2's 49k, and keeps a chunk's GPU work large.
CHUNK_BYTES = 64 * 2**20
# Config fields that change the logits after the output layer: such a model keeps its own head.
_LOGIT_CHANGES = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


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

    def at(self, where: tuple[torch.Tensor, ...], tokens_B_T: torch.Tensor) -> _Filters:
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
            history = _History(
                tokens_B_T, where[0], self.call_start_B_T[where], self.position_B_T[where]
            )
        return _Filters(
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
class _History:
    """What the penalties of N scored positions read: each one's row of `tokens_B_T`, where its
    call's completion starts in that row, and its own index (its output so far ends before it)."""

    tokens_B_T: torch.Tensor
    rows_N: torch.Tensor
    starts_N: torch.Tensor
    positions_N: torch.Tensor

    def chunk(self, part: slice) -> _History:
        return _History(
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
class _Filters:
    """The transforms of N scored positions, one value each (None: off for all)."""

    temperatures_N: torch.Tensor | None
    top_k_N: torch.Tensor | None
    top_p_N: torch.Tensor | None
    min_p_N: torch.Tensor | None = None
    repetition_N: torch.Tensor | None = None
    frequency_N: torch.Tensor | None = None
    presence_N: torch.Tensor | None = None
    history: _History | None = None
    bias_ids_N_M: torch.Tensor | None = None
    bias_N_M: torch.Tensor | None = None
    allowed_N_W: torch.Tensor | None = None  # int32 packed bitmasks (all bits: not constrained)

    def chunk(self, part: slice) -> _Filters:
        def of(value: torch.Tensor | _History | None) -> torch.Tensor | _History | None:
            return (
                None
                if value is None
                else value.chunk(part)
                if isinstance(value, _History)
                else value[part]
            )

        return _Filters(*(of(getattr(self, item.name)) for item in dataclasses.fields(self)))  # type: ignore[arg-type]  # each field keeps its own type

    @property
    def penalized(self) -> bool:
        return self.history is not None and any(
            penalty is not None
            for penalty in (self.repetition_N, self.frequency_N, self.presence_N)
        )


def sampled_logprobs(
    logits_N_V: torch.Tensor, tokens_N: torch.Tensor, filters: _Filters
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


def token_logprobs(
    logits_B_T_V: torch.Tensor,
    tokens_B_T: torch.Tensor,
    transforms: SamplingTransforms = NO_TRANSFORMS,
) -> torch.Tensor:
    """logprobs_B_T[b, t] = log p(tokens[b, t] | tokens[b, :t]) from full logits, every position;
    position 0 has no prediction: 0."""
    rows, length = tokens_B_T.shape
    where = torch.ones(rows, length - 1, dtype=torch.bool, device=tokens_B_T.device).nonzero(
        as_tuple=True
    )
    picked_N, _ = sampled_logprobs(
        logits_B_T_V[:, :-1][where],
        tokens_B_T[:, 1:][where],
        transforms.shifted().at(where, tokens_B_T),
    )
    return torch.nn.functional.pad(picked_N.view(rows, length - 1), (1, 0))


@dataclass(frozen=True)
class _Request:
    """What the replaced output layer scores during one forward."""

    tokens_B_T: torch.Tensor
    mask_B_T: torch.Tensor
    transforms: SamplingTransforms


_REQUEST: contextvars.ContextVar[_Request | None] = contextvars.ContextVar(
    "art_proxy_scoring_request", default=None
)


def _base(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model inside a peft wrapper (itself when unwrapped)."""
    get_base_model: Callable[[], torch.nn.Module] | None = getattr(model, "get_base_model", None)
    return get_base_model() if get_base_model is not None else model


def _output_layer(model: torch.nn.Module) -> object:
    outputs: Callable[[], object] | None = getattr(_base(model), "get_output_embeddings", None)
    return outputs() if outputs is not None else None


def install_sampled_head(model: torch.nn.Module) -> bool:
    """Let `score_sampled` compute this model's head at trained positions only; False when the
    model keeps its full logits (see the module docstring). A forward outside `score_sampled`
    (generation, a test's reference) runs the head as it was."""
    head = _output_layer(model)
    config = getattr(_base(model), "config", None)
    if (
        not isinstance(head, torch.nn.Linear)
        or type(head) is not torch.nn.Linear
        or any(getattr(config, name, None) for name in _LOGIT_CHANGES)
    ):
        return False
    head.forward = functools.partial(_head_forward, head, head.forward)  # type: ignore[method-assign]  # patched on the instance, as recompute_activations patches layers
    return True


def has_sampled_head(model: torch.nn.Module) -> bool:
    forward = getattr(_output_layer(model), "forward", None)
    return isinstance(forward, functools.partial) and forward.func is _head_forward


@dataclass(frozen=True)
class Scored:
    logprobs_B_T: torch.Tensor  # float32; 0 where the mask is 0
    entropy_B_T: torch.Tensor  # float32, no gradient; 0 where the mask is 0


def score_sampled(
    model: torch.nn.Module,
    tokens_B_T: torch.Tensor,
    attention_mask_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    transforms: SamplingTransforms = NO_TRANSFORMS,
) -> Scored:
    """Each trained token's logprob (and its distribution's entropy) under `model`."""
    if not has_sampled_head(_unwrapped(model)):
        logits_B_T_V = model(
            input_ids=tokens_B_T, attention_mask=attention_mask_B_T, use_cache=False
        ).logits
        logprobs_B_T = token_logprobs(logits_B_T_V, tokens_B_T, transforms) * mask_B_T
        return Scored(logprobs_B_T, torch.zeros_like(logprobs_B_T))
    with _requested(_Request(tokens_B_T, mask_B_T, transforms)):
        # No KV cache: nothing is generated, and a recomputed layer would find its own keys in it.
        out_B_T_2: torch.Tensor = model(
            input_ids=tokens_B_T, attention_mask=attention_mask_B_T, use_cache=False
        ).logits
    return Scored(out_B_T_2[..., 0], out_B_T_2[..., 1].detach())


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP wrapper (FSDP2 wraps in place)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


@contextmanager
def _requested(request: _Request) -> Iterator[None]:
    token = _REQUEST.set(request)
    try:
        yield
    finally:
        _REQUEST.reset(token)


def _head_forward(
    head: torch.nn.Linear, original: Callable[[torch.Tensor], torch.Tensor], hidden: torch.Tensor
) -> torch.Tensor:
    request = _REQUEST.get()
    if request is None:
        return original(hidden)
    hidden_B_T_H = hidden
    rows, length = request.tokens_B_T.shape
    # The hidden state at t-1 predicts token t.
    where = (request.mask_B_T[:, 1:] > 0).nonzero(as_tuple=True)
    hidden_N_H = hidden_B_T_H[:, :-1][where]
    tokens_N = request.tokens_B_T[:, 1:][where]
    filters = request.transforms.shifted().at(where, request.tokens_B_T)
    per_chunk = max(1, CHUNK_BYTES // (4 * head.out_features))
    picked: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    for start in range(0, len(tokens_N), per_chunk):
        part = slice(start, start + per_chunk)
        picked_C, entropy_C = _chunk_scores(
            hidden_N_H[part], head.weight, head.bias, tokens_N[part], filters.chunk(part)
        )
        picked.append(picked_C)
        entropies.append(entropy_C)
    out_B_Tm1_2 = hidden_B_T_H.new_zeros((rows, length - 1, 2), dtype=torch.float32)
    if picked:
        out_B_Tm1_2 = out_B_Tm1_2.index_put(
            where, torch.stack([torch.cat(picked), torch.cat(entropies)], dim=-1)
        )
    # Keeps the output connected to the weights when no position is trained (a rank's filler
    # pass must still take part in the gradients' reduction).
    out_B_Tm1_2 = out_B_Tm1_2 + 0.0 * hidden_N_H.sum()
    return torch.nn.functional.pad(out_B_Tm1_2, (0, 0, 1, 0))


def _chunk_scores(
    hidden_C_H: torch.Tensor,
    weight_V_H: torch.Tensor,
    bias_V: torch.Tensor | None,
    tokens_C: torch.Tensor,
    filters: _Filters,
) -> tuple[torch.Tensor, torch.Tensor]:
    def scores(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # The head in float32 whatever the base's dtype: a bf16 head's rounding is exactly the
        # trainer/sampler mismatch the correction is meant to measure, not to add to.
        logits_C_V = torch.nn.functional.linear(
            hidden.float(), weight_V_H.float(), None if bias_V is None else bias_V.float()
        )
        return sampled_logprobs(logits_C_V, tokens_C, filters)

    if not torch.is_grad_enabled():
        return scores(hidden_C_H)
    # Recomputed in the backward: only the chunk's hidden states are kept, never its logits.
    result: tuple[torch.Tensor, torch.Tensor] = checkpoint(scores, hidden_C_H, use_reentrant=False)
    return result
