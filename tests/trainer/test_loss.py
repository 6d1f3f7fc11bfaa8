from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from art_proxy.config import TrainSettings
from art_proxy_trainer.loss import Correction, LossMetrics, grpo_loss
from art_proxy_trainer.scoring import token_logprobs

OLD = -1.0
# The coupled objective: clip pi_theta / mu itself (no cap unless a test sets one).
PPO = Correction("ppo", ratio_cap=0.0)


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
    result = grpo_loss(*_example(), correction=PPO)
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
    result = grpo_loss(*example, correction=PPO, kl_coef=0.1, ref_logprobs_B_T=ref_B_T)
    kl = (1 - math.log(2.0)) / 3
    assert result.metrics.kl == pytest.approx(kl, abs=1e-6)
    assert result.loss.item() == pytest.approx(-(1.28 + 0.9 - 0.8) / 3 + 0.1 * kl, abs=1e-6)


def _gradient(
    ratio: float,
    advantage: float,
    ratio_cap: float = 0.0,
    correction: Correction | None = None,
    prox: torch.Tensor | None = None,
) -> tuple[float, float]:
    """(loss, d loss / d logprob) of one token whose pi_theta / mu is `ratio` (`prox`: the
    proximal policy's logprobs, None: the weights now)."""
    logprobs_B_T = _logprobs([[ratio]]).requires_grad_()
    result = grpo_loss(
        logprobs_B_T,
        torch.full((1, 1), OLD),
        torch.tensor([advantage]),
        torch.ones(1, 1),
        correction=correction or Correction("ppo", ratio_cap=ratio_cap),
        prox_logprobs_B_T=prox,
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
    loss = grpo_loss(*example, correction=PPO).loss.item()
    assert loss == pytest.approx(-(1.28 + 0.9 - 0.8) / 3, abs=1e-6)
    assert math.isfinite(grpo_loss(*example).loss.item())


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
    result = grpo_loss(
        logprobs,
        torch.full((1, 2), OLD),
        torch.tensor([1.0]),
        mask,
        correction=Correction("ppo", ratio_cap=0.7),
    )
    torch.autograd.backward(result.loss)
    assert logprobs.grad is not None and torch.count_nonzero(logprobs.grad) == 0
    with pytest.raises(ValidationError, match=r"ratio-cap 0\.7 is below 1"):
        TrainSettings(ratio_cap=0.7)
    assert TrainSettings(ratio_cap=0).ratio_cap == 0 and TrainSettings(ratio_cap=1).ratio_cap == 1


# --- stale data: the decoupled objectives ------------------------------------------------------
TIS = Correction("tis", is_cap=2.0)
MIS = Correction("mis", is_cap=2.0)


@pytest.mark.parametrize("correction", [TIS, MIS, PPO], ids=["tis", "mis", "ppo"])
def test_every_objective_is_the_policy_gradient_at_the_sampling_weights(
    correction: Correction,
) -> None:
    assert _gradient(1.0, 1.0, correction=correction) == pytest.approx((-1.0, -1.0))
    assert _gradient(1.0, -0.5, correction=correction) == pytest.approx((0.5, 0.5))


def test_a_token_the_policy_moved_past_the_clip_still_has_a_gradient_when_decoupled() -> None:
    """The breach: an older adapter sampled the token (mu), the policy has since moved it up past
    1 + eps_high in its advantage's direction. Clipped against mu (ppo) it never trains again;
    clipped against the trainer's own weights it does, weighted by pi_prox / mu."""
    assert _gradient(1.5, 1.0, correction=PPO)[1] == 0.0
    assert _gradient(1.5, 1.0, correction=TIS)[1] == pytest.approx(-1.5)
    assert _gradient(1.5, 1.0, correction=MIS)[1] == pytest.approx(-1.5)


def test_tis_truncates_the_weight_and_mis_drops_the_token() -> None:
    assert _gradient(5.0, -1.0, correction=TIS)[1] == pytest.approx(2.0)
    assert _gradient(5.0, -1.0, correction=MIS)[1] == 0.0
    assert _gradient(0.3, 1.0, correction=TIS)[1] == pytest.approx(-0.3)
    assert _gradient(0.3, 1.0, correction=MIS)[1] == 0.0


def _metrics(ratio: float, advantage: float, correction: Correction) -> LossMetrics:
    return grpo_loss(
        _logprobs([[ratio]]),
        torch.full((1, 1), OLD),
        torch.tensor([advantage]),
        torch.ones(1, 1),
        correction=correction,
    ).metrics


def test_ratio_and_clip_fraction_are_measured_before_the_cap() -> None:
    """A token at ratio 5 with a negative advantage, capped at 3 (ppo): it reports ratio 5 and no
    gradient, not 3.0 and "not clipped"."""
    capped = _metrics(5.0, -1.0, Correction("ppo", ratio_cap=3.0))
    assert (capped.mean_ratio, capped.clip_fraction, capped.is_capped) == pytest.approx(
        (5.0, 1.0, 1.0)
    )
    truncated = _metrics(5.0, -1.0, TIS)  # truncated, but its gradient stays
    assert (truncated.mean_ratio, truncated.clip_fraction, truncated.is_capped) == pytest.approx(
        (5.0, 0.0, 1.0)
    )


def test_the_mismatch_between_trainer_and_sampler_is_measured() -> None:
    metrics = grpo_loss(
        _logprobs([[1.5, 0.5, 9.0]]),
        torch.full((1, 3), OLD),
        torch.tensor([1.0]),
        torch.tensor([[1.0, 1.0, 0.0]]),
        correction=TIS,
    ).metrics
    assert metrics.mismatch == pytest.approx((math.log(1.5) + math.log(2.0)) / 2, abs=1e-6)
    k3 = [r - 1 - math.log(r) for r in (1.5, 0.5)]
    assert metrics.mismatch_kl == pytest.approx(sum(k3) / 2, abs=1e-6)
    assert metrics.mean_ratio == pytest.approx(1.0, abs=1e-6)
    assert metrics.is_weight_std == pytest.approx(0.5, abs=1e-5)


def test_the_kl_is_importance_weighted_when_decoupled() -> None:
    logprobs_B_T = _logprobs([[1.5]])
    ref_B_T = logprobs_B_T + math.log(2.0)
    result = grpo_loss(
        logprobs_B_T,
        torch.full((1, 1), OLD),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        correction=TIS,
        kl_coef=1.0,
        ref_logprobs_B_T=ref_B_T,
    )
    assert result.metrics.kl == pytest.approx(1.5 * (1 - math.log(2.0)), abs=1e-6)


def test_a_later_update_on_one_batch_is_clipped_against_the_weights_before_the_first() -> None:
    """`--updates-per-batch`: the proximal policy is the trainer's weights before the batch's
    first update. A token a first update moved up past 1 + eps_high (positive advantage) stops
    pushing; clipped against the weights now (the breach) it would push again without bound."""
    # The policy raised the token's probability 1.5x (from mu) since the batch's first update.
    before_first = torch.full((1, 1), OLD)
    assert _gradient(1.5, 1.0, correction=TIS, prox=before_first)[1] == 0.0  # clipped
    assert _gradient(1.5, 1.0, correction=TIS)[1] == pytest.approx(-1.5)  # against itself
