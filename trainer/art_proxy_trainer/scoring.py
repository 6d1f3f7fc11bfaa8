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
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

from art_proxy_trainer.sampled import NO_TRANSFORMS, Filters, SamplingTransforms, sampled_logprobs

# Bytes of float32 logits one chunk of positions may hold (a few copies live at once: the logits,
# the filtered and log-softmaxed ones, the probabilities for the entropy): 64 MiB is ~440
# positions of a 152k vocabulary, ~1,360 of SmolLM2's 49k, and keeps a chunk's GPU work large.
CHUNK_BYTES = 64 * 2**20
# Config fields that change the logits after the output layer: such a model keeps its own head.
_LOGIT_CHANGES = ("final_logit_softcapping", "logit_scale", "output_multiplier_scale")


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
    filters: Filters,
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
