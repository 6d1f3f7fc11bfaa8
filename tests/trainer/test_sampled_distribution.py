"""The trainer scores every token with exactly the distribution it was sampled from.

Tokens are drawn by local-llm's own sampler (`art_proxy.local.sampling`, the processed logprobs
vLLM's `--logprobs-mode processed_logprobs` reports too) from a tiny Llama with a LoRA adapter,
recorded as the proxy records a call, and scored by the trainer at the same weights: the importance
ratio must be 1 for every token, whatever temperature, top-k, top-p and logit bias the call asked
for. Before
the trainer applied top-k and top-p, top_p 0.9 gave a mean ratio of about 0.9 and top_k 20 about
0.5, with half the tokens clipped.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from peft import PeftModel

from art_proxy.config import TrainerConfig
from art_proxy.local.sampling import SamplingParams, sample
from art_proxy.records import CallRecord
from art_proxy_trainer.batch import TrajectorySample, build_batch
from art_proxy_trainer.lora import lora_model
from art_proxy_trainer.scoring import token_logprobs
from tests.trainer.models import tiny_llama
from tests.trainer.records import call

VOCABULARY = 256
PROMPT = [1, 5, 9, 14]
NEW_TOKENS = 48


def _model() -> PeftModel:
    base = tiny_llama(width=64, vocabulary=VOCABULARY, positions=128)
    model = lora_model(base, TrainerConfig())
    with torch.no_grad():  # a trained adapter, not LoRA's zero start
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    return model.eval()


def _sampled_call(model: PeftModel, sampling: dict[str, Any], seed: int) -> CallRecord:
    params = SamplingParams(
        max_tokens=NEW_TOKENS,
        temperature=sampling.get("temperature", 1.0),
        top_p=sampling.get("top_p", 1.0),
        top_k=sampling.get("top_k", 0),
        logit_bias=tuple(
            sorted(
                (int(token), float(bias)) for token, bias in sampling.get("logit_bias", {}).items()
            )
        ),
    )
    generator = torch.Generator().manual_seed(seed)
    tokens = list(PROMPT)
    completion: list[int] = []
    logprobs: list[float] = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits_V = model(input_ids=torch.tensor([tokens])).logits[0, -1]
            drawn = sample(logits_V[None], [params], [generator])
            completion.append(drawn.token_ids_B[0])
            logprobs.append(drawn.logprobs_B[0].logprob)
            tokens.append(drawn.token_ids_B[0])
    recorded = call(0, PROMPT, completion, logprobs, trajectory_id=f"t{seed}")
    return recorded.model_copy(update={"sampling": sampling})


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.7},
        {"temperature": 0.7, "top_p": 0.9},
        {"top_k": 20},
        {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
        {"temperature": 1.3, "top_p": 0.5},
        # JSON's keys are strings; two ids favoured, one all but banned, before the temperature.
        {"temperature": 0.7, "logit_bias": {"3": 4.0, "7": 2.5, "11": -100}},
        {"logit_bias": {"3": 100, "7": 100}, "top_p": 0.9},
    ],
    ids=["t0.7", "t0.7-p0.9", "k20", "t0.7-k20-p0.9", "t1.3-p0.5", "bias-t0.7", "bias-two-p0.9"],
)
def test_the_ratio_at_the_sampling_weights_is_one_for_every_token(
    sampling: dict[str, Any],
) -> None:
    model = _model()
    calls = [_sampled_call(model, sampling, seed) for seed in range(4)]
    batch = build_batch([TrajectorySample(c.trajectory_id, [c], 1.0) for c in calls])
    with torch.no_grad():
        logits = model(input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T).logits
        scored_B_T = token_logprobs(logits, batch.tokens_B_T, batch.transforms)
    sampled = batch.mask_B_T.bool()
    ratios = (scored_B_T[sampled] - batch.old_logprobs_B_T[sampled]).exp()
    assert len(ratios) == 4 * NEW_TOKENS
    assert ratios.median().item() == pytest.approx(1.0, abs=0.01)
    inside = ((ratios >= 0.8) & (ratios <= 1.28)).float().mean().item()
    assert inside >= 0.99
    assert torch.allclose(ratios, torch.ones_like(ratios), atol=1e-3)
