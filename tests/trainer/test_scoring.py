"""The trainer scores trained tokens only, in float32, in chunks, and adapts to the memory it has.

The output layer computes logits only at the positions whose next token is trained, so a batch
never holds a full-vocabulary tensor for every position (8,192 positions of a 152k vocabulary are
5 GB a copy in float32). Each test compares against the full-logits computation it replaces.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from peft import PeftModel
from transformers import LlamaForCausalLM

from art_proxy.config import TrainerConfig
from art_proxy_trainer import scoring
from art_proxy_trainer import step as step_module
from art_proxy_trainer.batch import TrainingBatch, TrajectorySample, build_batch
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.policy import Policy, base_dtype
from art_proxy_trainer.sampled import SamplingTransforms, sampled_logprobs
from art_proxy_trainer.scoring import has_sampled_head, score_sampled, token_logprobs
from art_proxy_trainer.step import train_step
from tests.trainer.memory_faults import out_of_memory_past
from tests.trainer.models import tiny_llama
from tests.trainer.records import call

CONFIG = TrainerConfig(learning_rate=1e-2)


def _model(dtype: torch.dtype = torch.float32) -> PeftModel:
    base = tiny_llama()
    torch.nn.Module.to(base, dtype)
    model = lora_model(base, CONFIG)
    with torch.no_grad():  # a trained adapter, not LoRA's zero start
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.3)
    return model.eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, SamplingTransforms]:
    """tokens, attention, loss mask (two rows, the second padded) and per-position transforms."""
    generator = torch.Generator().manual_seed(3)
    tokens_B_T = torch.randint(0, 128, (2, 16), generator=generator)
    attention_B_T = torch.ones(2, 16, dtype=torch.int64)
    attention_B_T[1, 12:] = 0
    mask_B_T = torch.zeros(2, 16)
    mask_B_T[0, 5:] = 1.0
    mask_B_T[1, 7:12] = 1.0
    transforms = SamplingTransforms(
        torch.full((2, 16), 0.7),
        torch.where(torch.arange(16) % 2 == 0, 20, 0).expand(2, 16).clone(),
        torch.full((2, 16), 0.9),
    )
    return tokens_B_T, attention_B_T, mask_B_T, transforms


def _every_change(transforms: SamplingTransforms) -> SamplingTransforms:
    """`transforms` with min_p, the three penalties and a logit bias besides, each call's
    completion starting where its row's loss mask does (5 and 7)."""
    position_B_T = torch.arange(16).expand(2, 16).clone()
    call_start_B_T = position_B_T.clone()
    call_start_B_T[0, 5:] = 5
    call_start_B_T[1, 7:] = 7
    bias_ids_B_T_M = torch.tensor([3, 40, -1]).expand(2, 16, 3).clone()
    return replace(
        transforms,
        min_p_B_T=torch.full((2, 16), 0.02),
        repetition_B_T=torch.full((2, 16), 1.3),
        frequency_B_T=torch.full((2, 16), 0.4),
        presence_B_T=torch.full((2, 16), 0.6),
        call_start_B_T=call_start_B_T,
        position_B_T=position_B_T,
        bias_ids_B_T_M=bias_ids_B_T_M,
        bias_B_T_M=torch.tensor([2.0, -3.0, 0.0]).expand(2, 16, 3).clone(),
    )


def _lora_grads(model: PeftModel) -> dict[str, torch.Tensor]:
    return {
        name: p.grad.clone()
        for name, p in model.named_parameters()
        if p.grad is not None and "lora_" in name
    }


@pytest.mark.parametrize("changes", ["sampling", "every change"])
def test_the_sampled_head_scores_trained_tokens_as_the_full_logits_do(
    monkeypatch: pytest.MonkeyPatch, changes: str
) -> None:
    model = _model()
    assert has_sampled_head(model)
    tokens_B_T, attention_B_T, mask_B_T, transforms = _batch()
    if changes == "every change":  # penalties read each chunk's own positions' history
        transforms = _every_change(transforms)
    # No KV cache: a recomputed layer would find its own keys in it.
    logits = model(input_ids=tokens_B_T, attention_mask=attention_B_T, use_cache=False).logits
    expected_B_T = token_logprobs(logits, tokens_B_T, transforms) * mask_B_T
    torch.autograd.backward(expected_B_T.sum())
    expected_grads = _lora_grads(model)
    model.zero_grad()
    # Chunks of 3 positions: the 16 trained positions take six, each recomputed in the backward.
    monkeypatch.setattr(scoring, "CHUNK_BYTES", 3 * 4 * 128)
    scored = score_sampled(model, tokens_B_T, attention_B_T, mask_B_T, transforms)
    assert scored.logprobs_B_T.dtype == torch.float32
    torch.testing.assert_close(scored.logprobs_B_T, expected_B_T, atol=1e-5, rtol=1e-5)
    assert (scored.logprobs_B_T[mask_B_T == 0] == 0).all()
    assert (scored.entropy_B_T[mask_B_T > 0] > 0).all() and not scored.entropy_B_T.requires_grad
    torch.autograd.backward(scored.logprobs_B_T.sum())
    for name, grad in _lora_grads(model).items():
        torch.testing.assert_close(grad, expected_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_outside_scoring_the_head_is_the_model_s_own() -> None:
    """Generation and any other forward see ordinary logits."""
    model = _model()
    tokens_B_T, attention_B_T, _, _ = _batch()
    logits = model(input_ids=tokens_B_T, attention_mask=attention_B_T).logits
    assert logits.shape == (2, 16, 128)


@pytest.mark.parametrize("alone", ["top_p", "repetition_penalty"])
def test_a_change_set_alone_is_applied_on_the_logits_device(alone: str) -> None:
    """The breach: a call that sets only top_p (the OpenAI SDK has no top_k) built the missing
    top-k tensor on the default device, not the logits' (a CPU tensor beside CUDA logits); a
    penalty set alone needs the others' neutral values likewise. Here the default device is
    meta, so a tensor made without the logits' device cannot mix in."""
    torch.manual_seed(0)
    logits_N_V = torch.randn(6, 50)
    tokens_B_T = torch.randint(0, 50, (1, 7))
    tokens_N = tokens_B_T[0, 1:]
    top_p = SamplingTransforms(top_p_B_T=torch.full((1, 7), 0.8))
    if alone == "repetition_penalty":
        top_p = SamplingTransforms(
            repetition_B_T=torch.full((1, 7), 1.5),
            call_start_B_T=torch.full((1, 7), 2),
            position_B_T=torch.arange(7)[None],
        )
    where = torch.ones(1, 6, dtype=torch.bool).nonzero(as_tuple=True)
    filters = top_p.shifted().at(where, tokens_B_T)
    expected_N, _ = sampled_logprobs(logits_N_V, tokens_N, filters)
    with torch.device("meta"):
        got_N, _ = sampled_logprobs(logits_N_V, tokens_N, filters)
    assert got_N.device == logits_N_V.device
    torch.testing.assert_close(got_N, expected_N)


def test_a_bfloat16_base_trains_a_float32_adapter_with_a_float32_head() -> None:
    model = _model(torch.bfloat16)
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    tokens_B_T, attention_B_T, mask_B_T, _ = _batch()
    scored = score_sampled(model, tokens_B_T, attention_B_T, mask_B_T)
    assert scored.logprobs_B_T.dtype == torch.float32
    # The reference: the same bf16 hidden states through the head in float32.
    base = model.get_base_model()
    assert isinstance(base, LlamaForCausalLM)
    norm = base.model.norm
    head = base.lm_head
    assert isinstance(head, torch.nn.Linear)
    captured: list[torch.Tensor] = []
    hook = norm.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        model(input_ids=tokens_B_T, attention_mask=attention_B_T)
    finally:
        hook.remove()
    logits = torch.nn.functional.linear(captured[0].float(), head.weight.float())
    expected_B_T = token_logprobs(logits, tokens_B_T) * mask_B_T
    torch.testing.assert_close(scored.logprobs_B_T, expected_B_T, atol=1e-5, rtol=1e-5)
    assert train_step(model, make_optimizer(model, CONFIG), _trajectories_batch(), CONFIG).applied


def test_the_base_is_bfloat16_on_cuda_and_float32_on_a_cpu() -> None:
    assert base_dtype(CONFIG, torch.device("cuda", 0)) == torch.bfloat16
    assert base_dtype(CONFIG, torch.device("cpu")) == torch.float32
    as_fp32 = CONFIG.model_copy(update={"base_dtype": "float32"})
    assert base_dtype(as_fp32, torch.device("cuda", 0)) == torch.float32


# --- memory that adapts ------------------------------------------------------------------------


def _trajectories_batch() -> TrainingBatch:
    """Four trajectories of a group; t3's sequence is much longer than the others."""
    samples = []
    for index, advantage in enumerate([1.0, -1.0, 0.5, -0.5]):
        prompt = list(range(1, 6 + (30 if index == 3 else 0)))
        completion = [7 + index, 8, 9, 10]
        samples.append(
            TrajectorySample(
                f"t{index}",
                [call(0, prompt, completion, [-1.0] * 4, trajectory_id=f"t{index}")],
                advantage,
            )
        )
    return build_batch(samples)


def test_the_micro_batch_that_fit_is_where_the_next_step_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model()
    policy = Policy(model, make_optimizer(model, CONFIG), 0, "m", {"m"})
    ran = out_of_memory_past(monkeypatch, rows=2)
    first = policy.train(_trajectories_batch(), CONFIG)
    assert first.applied and max(ran) <= 2 and policy.micro_batch_tokens
    ran.clear()
    attempts: list[int] = []
    real_accumulate = step_module._accumulate

    def accumulate(*args: object) -> object:
        attempts.append(1)
        return real_accumulate(*args)  # type: ignore[arg-type]  # the real signature

    monkeypatch.setattr(step_module, "_accumulate", accumulate)
    second = policy.train(_trajectories_batch(), CONFIG)
    assert second.applied and len(attempts) == 1  # no size that failed was tried again


def test_a_row_too_long_to_fit_alone_is_left_out_not_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    out_of_memory_past(monkeypatch, length=20)
    result = train_step(model, make_optimizer(model, CONFIG), _trajectories_batch(), CONFIG)
    assert result.applied and result.too_long == ("t3",)
    assert result.metrics is not None and result.metrics.tokens == 12
    after = dict(model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
