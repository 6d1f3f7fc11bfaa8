from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from art_proxy.config import TrainSettings
from art_proxy_trainer.loss import grpo_loss, token_logprobs

OLD = -1.0


def _logprobs(ratios: list[list[float]]) -> torch.Tensor:
    return torch.tensor([[OLD + math.log(r) for r in row] for row in ratios])


Example = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _example() -> Example:
    """logprobs_B_T, old_logprobs_B_T, advantages_B, mask_B_T."""
    # Row 0 (A=+1): rho 1.5 is clipped to 1.28, rho 0.9 is not. Row 1 (A=-1): rho 0.5 is clipped
    # to 0.8 (the min picks -0.8 over -0.5); its last position is context and does not count.
    return (
        _logprobs([[1.0, 1.5, 0.9], [1.0, 0.5, 7.0]]),
        torch.full((2, 3), OLD),
        torch.tensor([1.0, -1.0]),
        torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),
    )


def test_loss_matches_the_hand_computed_token_mean() -> None:
    result = grpo_loss(*_example())
    assert result.loss.item() == pytest.approx(-(1.28 + 0.9 - 0.8) / 3, abs=1e-6)
    assert result.metrics.clip_fraction == pytest.approx(2 / 3)
    assert result.metrics.mean_ratio == pytest.approx((1.5 + 0.9 + 0.5) / 3, abs=1e-6)
    assert result.metrics.tokens == 3
    assert result.metrics.kl == 0.0


def test_kl_to_the_reference_is_the_k3_estimator_over_trained_tokens() -> None:
    example = _example()
    ref_B_T = example[0].clone()
    ref_B_T[0, 1] += math.log(2.0)  # k3 = 2 - ln 2 - 1 at that token, 0 elsewhere
    ref_B_T[1, 2] += 5.0  # context: ignored
    result = grpo_loss(*example, kl_coef=0.1, ref_logprobs_B_T=ref_B_T)
    kl = (1 - math.log(2.0)) / 3
    assert result.metrics.kl == pytest.approx(kl, abs=1e-6)
    assert result.loss.item() == pytest.approx(-(1.28 + 0.9 - 0.8) / 3 + 0.1 * kl, abs=1e-6)


def _gradient(ratio: float, advantage: float, ratio_cap: float = 0.0) -> tuple[float, float]:
    logprobs_B_T = _logprobs([[ratio]]).requires_grad_()
    result = grpo_loss(
        logprobs_B_T,
        torch.full((1, 1), OLD),
        torch.tensor([advantage]),
        torch.ones(1, 1),
        ratio_cap=ratio_cap,
    )
    torch.autograd.backward(result.loss)
    assert logprobs_B_T.grad is not None
    return result.loss.item(), logprobs_B_T.grad.item()


def test_positive_advantage_stops_pushing_above_one_plus_eps_high() -> None:
    assert _gradient(1.27, 1.0)[1] == pytest.approx(-1.27)
    assert _gradient(1.3, 1.0) == pytest.approx((-1.28, 0.0))
    # Below 1 - eps_low a positive advantage still pulls the token up.
    assert _gradient(0.5, 1.0)[1] == pytest.approx(-0.5)


def test_negative_advantage_stops_pushing_below_one_minus_eps_low() -> None:
    assert _gradient(0.79, -1.0) == pytest.approx((0.8, 0.0))
    assert _gradient(0.81, -1.0)[1] == pytest.approx(0.81)
    # Above 1 + eps_high the min keeps the unclipped term: unbounded without a cap.
    assert _gradient(5.0, -1.0) == pytest.approx((5.0, 5.0))


def test_ratio_cap_bounds_a_drifted_negative_advantage_token() -> None:
    assert _gradient(5.0, -1.0, ratio_cap=3.0) == pytest.approx((3.0, 0.0))
    assert _gradient(2.0, -1.0, ratio_cap=3.0)[1] == pytest.approx(2.0)


def test_context_and_padding_cannot_poison_the_loss() -> None:
    example = _example()
    example[1][1, 2] = math.nan
    example[0][1, 2] = 1e4  # exp would overflow
    assert grpo_loss(*example).loss.item() == pytest.approx(-(1.28 + 0.9 - 0.8) / 3, abs=1e-6)


def test_token_logprobs_gathers_the_next_token_from_log_softmax() -> None:
    torch.manual_seed(0)
    logits_B_T_V = torch.randn(2, 4, 6, dtype=torch.bfloat16)
    tokens_B_T = torch.randint(0, 6, (2, 4))
    logprobs_B_T = token_logprobs(logits_B_T_V, tokens_B_T)
    assert logprobs_B_T.dtype == torch.float32
    assert logprobs_B_T.shape == (2, 4)
    assert (logprobs_B_T[:, 0] == 0).all()
    expected = torch.log_softmax(logits_B_T_V.float(), dim=-1)[1, 2, tokens_B_T[1, 3]]
    assert logprobs_B_T[1, 3].item() == pytest.approx(expected.item())


def test_a_ratio_cap_below_one_would_zero_the_gradient_and_is_refused_at_start() -> None:
    """The breach the check prevents: rho = 1 (sampled at the current weights) truncated at 0.7
    leaves no gradient, so every step would train nothing."""
    logprobs = torch.full((1, 2), OLD, requires_grad=True)
    mask = torch.ones(1, 2)
    result = grpo_loss(logprobs, torch.full((1, 2), OLD), torch.tensor([1.0]), mask, ratio_cap=0.7)
    torch.autograd.backward(result.loss)
    assert logprobs.grad is not None and torch.count_nonzero(logprobs.grad) == 0
    with pytest.raises(ValidationError, match=r"ratio-cap 0\.7 is below 1"):
        TrainSettings(ratio_cap=0.7)
    assert TrainSettings(ratio_cap=0).ratio_cap == 0 and TrainSettings(ratio_cap=1).ratio_cap == 1
