"""Sampling one token per row, with the logprobs of the distribution it was drawn from.

The logprobs are "processed" (vLLM's `--logprobs-mode processed_logprobs`): after temperature,
top-k and top-p, so a recorded logprob is exactly pi_old of the sampled token, which is what GRPO's
importance ratio needs. A `logit_bias` is added to the raw logits first, as vLLM does. Greedy rows
(temperature 0) report the distribution after the bias and before anything else, as vLLM does,
since dividing by zero defines none. Each request with a `seed` draws from its own `torch.Generator`, so
its tokens do not depend on which other requests share the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from art_proxy.vllm_api.engine import PromptLogprob, PromptLogprobs, TokenLogprob


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int  # ids a choice may generate, its stop id included
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # 1 = off
    top_k: int = 0  # 0 = off
    seed: int | None = None  # None = the process's random state
    stop: tuple[str, ...] = ()  # strings that end a choice; cut from its text, its ids kept
    stop_token_ids: tuple[int, ...] = ()  # ids that end a choice besides EOS
    ignore_eos: bool = False  # EOS does not end the choice (benchmarks, tests)
    top_logprobs: int = 0  # runners-up reported per token (0 = only the sampled one)
    prompt_logprobs: int | None = None  # each prompt id's raw logprob and this many runners-up
    logit_bias: tuple[tuple[int, float], ...] = ()  # (id, bias) added to the raw logits


@dataclass(frozen=True, slots=True)
class Sampled:
    token_ids_B: list[int]
    logprobs_B: list[TokenLogprob]


def sample(
    logits_B_V: torch.Tensor,
    params_B: Sequence[SamplingParams],
    generators_B: Sequence[torch.Generator | None],
) -> Sampled:
    logprobs_B_V = processed_logprobs(logits_B_V, params_B)
    # Inverse-CDF sampling: one uniform draw per row. (vLLM's exponential race needs a draw per
    # vocabulary entry, which costs more than a forward pass of a small model on a CPU.)
    # Drawn on the CPU, where each request's generator lives, whatever device the logits are on.
    uniform_B = torch.cat([torch.rand(1, generator=generator) for generator in generators_B])
    uniform_B = uniform_B.to(logprobs_B_V.device)
    cdf_B_V = logprobs_B_V.double().exp().cumsum(dim=-1)
    # side="right": the first id whose cumulative mass exceeds the draw, so never a masked id.
    drawn_B = torch.searchsorted(
        cdf_B_V, (uniform_B.double() * cdf_B_V[:, -1])[:, None], right=True
    )
    drawn_B = drawn_B[:, 0].clamp(max=logprobs_B_V.shape[-1] - 1)
    greedy_B = torch.tensor(
        [params.temperature == 0 for params in params_B], device=logprobs_B_V.device
    )
    ids_B = torch.where(greedy_B, logprobs_B_V.argmax(dim=-1), drawn_B)
    token_ids_B: list[int] = ids_B.tolist()
    chosen_B = logprobs_B_V.gather(1, ids_B[:, None])[:, 0].tolist()
    k = max(params.top_logprobs for params in params_B)
    ids: list[list[int]] = []
    values: list[list[float]] = []
    if k:
        top_values_B_K, top_ids_B_K = logprobs_B_V.topk(k, dim=-1)
        values, ids = top_values_B_K.tolist(), top_ids_B_K.tolist()
    logprobs_B = []
    for row, params in enumerate(params_B):
        n = params.top_logprobs
        top = tuple(zip(ids[row][:n], values[row][:n], strict=True)) if n else ()
        logprobs_B.append(TokenLogprob(chosen_B[row], top))
    return Sampled(token_ids_B, logprobs_B)


def prompt_logprobs(logits_T_V: torch.Tensor, ids: Sequence[int], k: int) -> PromptLogprobs:
    """vLLM's `prompt_logprobs` of a prompt: each id's logprob after the ids before it (raw, no
    temperature or filter), its rank, and the `k` likeliest ids there. `logits_T_V`: the forward
    pass at each of the prompt's positions; the last, which predicts past the prompt, is unused."""
    logprobs_N_V = torch.log_softmax(logits_T_V[: len(ids) - 1].float(), dim=-1)
    targets_N = torch.tensor(ids[1:], dtype=torch.long, device=logits_T_V.device)
    chosen_N = logprobs_N_V.gather(1, targets_N[:, None])[:, 0]
    ranks_N = (logprobs_N_V > chosen_N[:, None]).sum(dim=-1) + 1
    top_ids: list[list[int]] = [[] for _ in range(len(targets_N))]
    top_values: list[list[float]] = [[] for _ in range(len(targets_N))]
    if k:
        top_values_N_K, top_ids_N_K = logprobs_N_V.topk(k, dim=-1)
        top_values, top_ids = top_values_N_K.tolist(), top_ids_N_K.tolist()
    return (
        None,
        *(
            PromptLogprob(logprob, rank, tuple(zip(top_ids[n], top_values[n], strict=True)))
            for n, (logprob, rank) in enumerate(
                zip(chosen_N.tolist(), ranks_N.tolist(), strict=True)
            )
        ),
    )


def processed_logprobs(
    logits_B_V: torch.Tensor, params_B: Sequence[SamplingParams]
) -> torch.Tensor:
    """log_softmax of the logits after each row's logit bias, temperature, top-k and top-p
    (greedy: after the bias only)."""
    logits_B_V = logits_B_V.float()
    device = logits_B_V.device
    if any(p.logit_bias for p in params_B):
        width = max(len(p.logit_bias) for p in params_B)
        padding = [(-1, 0.0)] * width
        pairs_B_M = [list(p.logit_bias) + padding[len(p.logit_bias) :] for p in params_B]
        ids_B_M = torch.tensor([[i for i, _ in row] for row in pairs_B_M], device=device)
        bias_B_M = torch.tensor([[b for _, b in row] for row in pairs_B_M], device=device)
        logits_B_V = biased(logits_B_V, ids_B_M, bias_B_M)
    temperatures_B = torch.tensor([p.temperature or 1.0 for p in params_B], device=device)
    scaled_B_V = logits_B_V / temperatures_B[:, None]
    # Greedy rows report the raw distribution: no filter applies to them.
    top_k_B = torch.tensor([p.top_k if p.temperature > 0 else 0 for p in params_B], device=device)
    top_p_B = torch.tensor([p.top_p if p.temperature > 0 else 1.0 for p in params_B], device=device)
    return torch.log_softmax(top_k_top_p_filtered(scaled_B_V, top_k_B, top_p_B), dim=-1)


def top_k_top_p_filtered(
    scaled_N_V: torch.Tensor, top_k_N: torch.Tensor, top_p_N: torch.Tensor
) -> torch.Tensor:
    """Tempered logits with what top-k and then top-p leave out set to -inf, row by row (top_k
    <= 0 or >= the vocabulary: off; top_p >= 1: off). The trainer scores its tokens through this
    too, so pi_theta is the distribution the sampler drew from. Which ids are kept is decided
    without gradient; the kept logits keep theirs."""
    with torch.no_grad():
        left_out_N_V = torch.zeros_like(scaled_N_V, dtype=torch.bool)
        vocabulary = scaled_N_V.shape[-1]
        k_rows_R = ((top_k_N > 0) & (top_k_N < vocabulary)).nonzero()[:, 0]
        if len(k_rows_R):
            k_R = top_k_N[k_rows_R]
            best_R_K = scaled_N_V[k_rows_R].topk(int(k_R.max()), dim=-1).values
            kth_R = best_R_K.gather(-1, (k_R - 1)[:, None])
            left_out_N_V[k_rows_R] = scaled_N_V[k_rows_R] < kth_R
        p_rows_R = (top_p_N < 1.0).nonzero()[:, 0]
        if len(p_rows_R):
            after_k_R_V = scaled_N_V[p_rows_R].masked_fill(left_out_N_V[p_rows_R], float("-inf"))
            left_out_N_V[p_rows_R] |= _outside_top_p(after_k_R_V, top_p_N[p_rows_R])
    if not left_out_N_V.any():
        return scaled_N_V
    return scaled_N_V.masked_fill(left_out_N_V, float("-inf"))


def _outside_top_p(logits_R_V: torch.Tensor, top_p_R: torch.Tensor) -> torch.Tensor:
    """Ids outside the smallest set of best ids whose probability reaches top_p (at least one)."""
    sorted_R_V, order_R_V = logits_R_V.sort(dim=-1, descending=True)
    probs_R_V = sorted_R_V.softmax(dim=-1)
    before_R_V = probs_R_V.cumsum(dim=-1) - probs_R_V  # mass of the ids ranked above each one
    outside_sorted_R_V = before_R_V >= top_p_R[:, None]
    return torch.empty_like(outside_sorted_R_V).scatter_(-1, order_R_V, outside_sorted_R_V)


def biased(logits_N_V: torch.Tensor, ids_N_M: torch.Tensor, bias_N_M: torch.Tensor) -> torch.Tensor:
    """vLLM's `logit_bias`: each row's biases added to its ids' logits (`ids_N_M` padded with -1,
    whose bias is 0); vLLM has clamped each bias to [-100, 100] already."""
    bias_N_M = torch.where(ids_N_M >= 0, bias_N_M, 0.0)
    return logits_N_V.scatter_add(-1, ids_N_M.clamp(min=0).long(), bias_N_M.to(logits_N_V.dtype))


def penalized(
    logits_N_V: torch.Tensor,
    prompt_seen_N_V: torch.Tensor,
    output_counts_N_V: torch.Tensor,
    repetition_N: torch.Tensor,
    frequency_N: torch.Tensor,
    presence_N: torch.Tensor,
) -> torch.Tensor:
    """vLLM 0.32's penalties in its order (`apply_penalties`): the repetition penalty divides a
    positive logit of an id seen in the prompt or the output so far and multiplies a negative one;
    then the frequency penalty is subtracted once per time the id was output, the presence penalty
    once if it was. `prompt_seen_N_V` is boolean, `output_counts_N_V` counts per id."""
    output_seen_N_V = output_counts_N_V > 0
    with torch.no_grad():
        penalty_N_V = torch.where(
            prompt_seen_N_V | output_seen_N_V, repetition_N.float()[:, None], 1.0
        )
        scaling_N_V = torch.where(logits_N_V > 0, 1.0 / penalty_N_V, penalty_N_V)
    logits_N_V = logits_N_V * scaling_N_V
    logits_N_V = logits_N_V - frequency_N.float()[:, None] * output_counts_N_V.float()
    return logits_N_V - presence_N.float()[:, None] * output_seen_N_V.float()


def min_p_filtered(scaled_N_V: torch.Tensor, min_p_N: torch.Tensor) -> torch.Tensor:
    """vLLM's `min_p` (after temperature, before top-k and top-p): an id whose probability is
    under min_p times the row's most likely id's is left out (-inf); min_p 0 leaves every id."""
    with torch.no_grad():
        probs_N_V = scaled_N_V.softmax(dim=-1)
        threshold_N = probs_N_V.amax(dim=-1) * min_p_N.float()
        left_out_N_V = probs_N_V < threshold_N[:, None]
    return scaled_N_V.masked_fill(left_out_N_V, float("-inf"))
