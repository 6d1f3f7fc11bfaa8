from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch
from peft import LoraConfig, PeftModel

from art_proxy.config import TrainerConfig
from art_proxy_trainer import scoring
from art_proxy_trainer import step as step_module
from art_proxy_trainer.batch import SequenceStats, TrainingBatch
from art_proxy_trainer.errors import TrainerError
from art_proxy_trainer.lora import lora_model, make_optimizer
from art_proxy_trainer.loss import LossResult, grpo_loss
from art_proxy_trainer.policy import training_device
from art_proxy_trainer.scoring import token_logprobs
from art_proxy_trainer.step import train_step
from tests.trainer.memory_faults import out_of_memory_past
from tests.trainer.models import tiny_llama

# A fast learning rate so that a few steps on a random model move the loss visibly.
CONFIG = TrainerConfig(learning_rate=1e-2)


def _model(config: TrainerConfig = CONFIG) -> PeftModel:
    return lora_model(tiny_llama(), config)


def _batch(model: PeftModel) -> TrainingBatch:
    """Two sequences sampled by the model as it is now (pi_old = pi_theta), one good, one bad."""
    generator = torch.Generator().manual_seed(1)
    tokens_B_T = torch.randint(0, 128, (2, 12), generator=generator)
    mask_B_T = torch.zeros(2, 12)
    mask_B_T[:, 6:] = 1.0
    attention_mask_B_T = torch.ones(2, 12, dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=tokens_B_T, attention_mask=attention_mask_B_T).logits
    old_logprobs_B_T = token_logprobs(logits, tokens_B_T) * mask_B_T
    return TrainingBatch(
        tokens_B_T,
        attention_mask_B_T,
        mask_B_T,
        old_logprobs_B_T,
        torch.tensor([1.0, -1.0]),
        SequenceStats(sequences=2),
    )


def _lora_weights(model: PeftModel) -> dict[str, torch.Tensor]:
    return {
        name: parameter.detach().clone()
        for name, parameter in model.named_parameters()
        if "lora_" in name
    }


def test_lora_defaults_cover_every_linear_projection() -> None:
    model = _model()
    lora_modules = {name.split(".")[-4] for name in _lora_weights(model)}
    assert lora_modules == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    config = model.peft_config["default"]
    assert isinstance(config, LoraConfig)
    assert (config.r, config.lora_alpha) == (8, 16)


def test_steps_change_the_adapter_and_lower_the_loss_on_a_repeated_batch() -> None:
    model = _model()
    optimizer = make_optimizer(model, CONFIG)
    batch = _batch(model)
    before = _lora_weights(model)
    results = [train_step(model, optimizer, batch, CONFIG) for _ in range(5)]
    assert all(result.applied for result in results)
    assert results[0].loss == pytest.approx(0.0, abs=1e-5)  # pi_theta = pi_old, advantages cancel
    assert results[-1].loss < results[0].loss - 0.05
    after = _lora_weights(model)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert all(math.isfinite(result.grad_norm) for result in results)


def test_kl_reference_is_the_base_model_with_the_adapter_off() -> None:
    config = TrainerConfig(learning_rate=1e-2, kl_coef=0.1)
    model = _model(config)
    optimizer = make_optimizer(model, config)
    batch = _batch(model)
    first = train_step(model, optimizer, batch, config)
    second = train_step(model, optimizer, batch, config)
    assert first.metrics is not None and second.metrics is not None
    # The fresh adapter is zero (LoRA's B starts at 0): the policy is the reference.
    assert first.metrics.kl == pytest.approx(0.0, abs=1e-7)
    assert second.metrics.kl > 0.0


def test_a_nan_loss_abandons_the_step_and_leaves_the_adapter_alone() -> None:
    model = _model()
    optimizer = make_optimizer(model, CONFIG)
    batch = _batch(model)
    batch.old_logprobs_B_T[0, 7] = math.nan
    before = _lora_weights(model)
    result = train_step(model, optimizer, batch, CONFIG)
    assert (result.applied, result.reason) == (False, "nan_loss")
    assert math.isnan(result.loss)
    after = _lora_weights(model)
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert not optimizer.state  # AdamW never stepped


def test_out_of_memory_retries_with_smaller_micro_batches_and_gives_the_same_update(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    whole = _model()
    train_step(whole, make_optimizer(whole, CONFIG), _batch(whole), CONFIG)
    model = _model()
    ran = out_of_memory_past(monkeypatch, rows=1)
    result = train_step(model, make_optimizer(model, CONFIG), _batch(model), CONFIG)
    assert result.applied and ran == [1, 1]  # the batch of two, one sequence at a time
    expected, got = _lora_weights(whole), _lora_weights(model)
    assert all(torch.allclose(expected[name], got[name], atol=1e-6) for name in expected)


def test_out_of_memory_even_one_sequence_at_a_time_abandons_the_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _model()
    optimizer = make_optimizer(model, CONFIG)
    before = _lora_weights(model)
    out_of_memory_past(monkeypatch, rows=0)
    result = train_step(model, optimizer, _batch(model), CONFIG)
    assert (result.applied, result.reason) == (False, "out_of_memory")
    assert len(result.too_long) == 2  # each row left out, named once
    after = _lora_weights(model)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_recomputed_activations_give_the_same_step() -> None:
    kept, recomputed = _model(), _model(CONFIG.model_copy(update={"gradient_checkpointing": True}))
    batch = _batch(kept)
    batch.attention_mask_B_T[1, 9:] = 0  # a padded row, as real batches have
    results = [
        train_step(model, make_optimizer(model, CONFIG), batch, CONFIG)
        for model in (kept, recomputed)
    ]
    assert results[0].loss == pytest.approx(results[1].loss, rel=1e-6)
    assert results[0].grad_norm == pytest.approx(results[1].grad_norm, rel=1e-5)
    for name, weight in _lora_weights(kept).items():
        torch.testing.assert_close(_lora_weights(recomputed)[name], weight, msg=name)


def test_a_bfloat16_base_is_refused_on_a_cpu() -> None:
    with pytest.raises(TrainerError, match="--base-dtype bfloat16 is for CUDA"):
        training_device("cpu", CONFIG.model_copy(update={"base_dtype": "bfloat16"}))
    assert training_device("cpu", CONFIG) == torch.device("cpu")


def test_several_updates_per_batch_take_that_many_optimiser_steps_from_one_proximal() -> None:
    config = CONFIG.model_copy(update={"updates_per_batch": 3})
    model = _model(config)
    optimizer = make_optimizer(model, config)
    batch = _batch(model)
    once = _model()
    once.load_state_dict(model.state_dict())
    result = train_step(model, optimizer, batch, config)
    assert result.applied and result.updates == 3
    steps = {int(state["step"]) for state in optimizer.state.values()}
    assert steps == {3}
    # Each update moves the adapter (lora_B starts at zero): three went further than one.
    train_step(once, make_optimizer(once, CONFIG), batch, CONFIG)

    def moved(trained: PeftModel) -> float:
        return sum(float(w.norm()) for n, w in _lora_weights(trained).items() if "lora_B" in n)

    assert moved(model) > moved(once) > 0


def _nan_loss_at_pass(monkeypatch: pytest.MonkeyPatch, failing: int) -> None:
    """The loss of forward pass `failing` (1-based, one pass an update here) is NaN."""
    real = grpo_loss
    passes = [0]

    def loss(*args: Any, **kwargs: Any) -> LossResult:
        passes[0] += 1
        result = real(*args, **kwargs)
        if passes[0] == failing:
            return LossResult(result.loss * math.nan, result.metrics)
        return result

    monkeypatch.setattr(step_module, "grpo_loss", loss)


def test_a_step_abandoned_at_a_later_update_puts_the_adapter_and_optimiser_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = CONFIG.model_copy(update={"updates_per_batch": 3})
    model = _model(config)
    optimizer = make_optimizer(model, config)
    batch = _batch(model)
    assert train_step(model, optimizer, batch, config).applied  # Adam has state to put back
    before = _lora_weights(model)
    moments = {p: {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    _nan_loss_at_pass(monkeypatch, failing=3)
    result = train_step(model, optimizer, batch, config)
    assert (result.applied, result.reason) == (False, "nan_loss")
    after = _lora_weights(model)
    assert all(torch.equal(before[name], after[name]) for name in before)
    assert {int(s["step"]) for s in optimizer.state.values()} == {3}
    for parameter, state in optimizer.state.items():
        for name, value in state.items():
            assert torch.equal(value, moments[parameter][name]), name


def test_a_row_out_of_memory_alone_in_a_later_update_is_not_called_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = CONFIG.model_copy(update={"updates_per_batch": 2, "micro_batch_tokens": 12})
    model = _model(config)
    batch = replace(_batch(model), trajectory_ids=("t-first", "t-second"))
    real = scoring.score_sampled
    forwards = [0]

    def scored(model: PeftModel, tokens_B_T: torch.Tensor, *args: Any) -> Any:
        forwards[0] += 1
        if forwards[0] == 4:  # the second update's second row: both rows fit in the first
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, tokens_B_T, *args)

    monkeypatch.setattr(step_module, "score_sampled", scored)
    result = train_step(model, make_optimizer(model, config), batch, config)
    assert result.applied and result.updates == 2
    assert (result.too_long, result.fewer_updates) == ((), ("t-second",))


def test_a_steps_figures_are_those_of_all_its_updates() -> None:
    config = CONFIG.model_copy(update={"updates_per_batch": 4})
    model = _model(config)
    result = train_step(model, make_optimizer(model, config), _batch(model), config)
    assert result.applied and result.updates == 4
    assert result.metrics is not None and result.last_metrics is not None
    # The first update starts at the proximal weights (nothing clipped, no drift); the later
    # ones moved away from them, and the step reports them.
    assert result.last_metrics.clip_fraction > 0 and result.last_metrics.update_drift > 0
    assert 0 < result.metrics.clip_fraction < result.last_metrics.clip_fraction
    assert result.last_loss != result.loss
