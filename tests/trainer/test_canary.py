"""The canary's decision: an anytime-valid interval on the difference in live reward.

Its error rate must hold however often it is looked at: 10,000 simulated canaries whose arms are
equal, each looked at after every one of 1,000 trajectories, promote or roll back in at most
alpha's share. A real difference is found either way; no difference ends with the target kept.
"""

from __future__ import annotations

import pytest
import torch

from art_proxy.records import LiveReward
from art_proxy_trainer.canary import MIN_PER_ARM, VERDICTS, ArmRewards, verdict
from art_proxy_trainer.promoter import CanaryPolicy, decide_canary

ALPHA = 0.05


def simulated(
    runs: int, trajectories: int, fraction: float, rates: tuple[float, float], seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each run's first decision (an index into VERDICTS; 0: none) and when, looking after every
    trajectory; 0/1 rewards, the candidate's at rates[0], the target's at rates[1]."""
    generator = torch.Generator().manual_seed(seed)
    on_candidate = torch.rand(runs, trajectories, generator=generator) < fraction
    draws = torch.rand(runs, trajectories, generator=generator, dtype=torch.float64)
    rewards = torch.where(on_candidate, draws < rates[0], draws < rates[1]).double()

    def arm(mask: torch.Tensor) -> ArmRewards:
        total = (rewards * mask).cumsum(1)
        return ArmRewards(mask.double().cumsum(1), total, total)  # 0/1: squares are the rewards

    decided, _ = verdict(
        arm(on_candidate), arm(~on_candidate), fraction=fraction, alpha=ALPHA, min_effect=0.05
    )
    times = torch.arange(trajectories).expand(runs, trajectories)
    first = torch.where(decided > 0, times, trajectories).min(dim=1).values
    at_first = decided.gather(1, first.clamp(max=trajectories - 1)[:, None])[:, 0]
    return torch.where(first < trajectories, at_first, 0), first


@pytest.mark.parametrize("fraction", [0.5, 0.1])
def test_equal_arms_are_promoted_or_rolled_back_at_most_alphas_share_under_continuous_peeking(
    fraction: float,
) -> None:
    decisions, _ = simulated(10_000, 1_000, fraction, (0.5, 0.5), seed=1)
    moved = (decisions == VERDICTS.index("promote")) | (decisions == VERDICTS.index("rollback"))
    assert moved.double().mean().item() <= ALPHA


def test_a_difference_of_a_tenth_is_found_either_way() -> None:
    better, when = simulated(200, 3_000, 0.5, (0.6, 0.5), seed=2)
    worse, _ = simulated(200, 3_000, 0.5, (0.4, 0.5), seed=3)
    assert (better == VERDICTS.index("promote")).double().mean().item() >= 0.9
    assert (worse == VERDICTS.index("rollback")).double().mean().item() >= 0.9
    assert when.min().item() >= 2 * MIN_PER_ARM - 1  # never before both arms have their minimum


def live(model: str, rewards: list[float], pending: int = 0) -> LiveReward:
    count = len(rewards)
    return LiveReward(
        model=model,
        count=count,
        mean=sum(rewards) / count if count else None,
        mean_square=sum(r * r for r in rewards) / count if count else None,
        pending=pending,
    )


def test_the_verdict_says_its_evidence_and_waits_for_enough_on_each_arm() -> None:
    policy = CanaryPolicy(fraction=0.5, alpha=ALPHA, min_effect=0.05)
    few, note, _ = decide_canary(live("c", [1.0] * 5), live("t", [0.0] * 5, pending=3), policy)
    assert few == "hold" and f"at least {MIN_PER_ARM} scored trajectories an arm" in note
    assert "3 awaiting a reward" in note
    clear, note, _ = decide_canary(live("c", [1.0] * 40), live("t", [0.0, 1.0] * 20), policy)
    assert clear == "promote"
    assert note.startswith("live 1.00 (n=40, c) vs 0.50 (n=40, t): difference +0.500 [+")
    assert note.endswith("at alpha 0.05")
    worse, _, _ = decide_canary(live("c", [0.0] * 40), live("t", [0.0, 1.0] * 20), policy)
    assert worse == "rollback"
    same = [0.0, 1.0] * 3000
    kept, note, _ = decide_canary(live("c", same), live("t", same), policy)
    assert kept == "keep", note
