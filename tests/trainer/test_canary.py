"""The canary's decision: an anytime-valid interval on the difference in live reward.

Its error rate must hold however often it is looked at: 10,000 simulated canaries whose arms are
equal, each looked at after every one of 1,000 trajectories, promote or roll back in at most
alpha's share. A real difference is found either way; no difference ends with the target kept.
"""

from __future__ import annotations

import pytest
import torch

from art_proxy.records import LiveReward
from art_proxy_trainer.canary import (
    MIN_PER_ARM,
    VERDICTS,
    ArmRewards,
    CanaryPolicy,
    Stage,
    verdict,
)
from art_proxy_trainer.promoter import decide_canary

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
        [Stage(fraction, arm(on_candidate), arm(~on_candidate))], alpha=ALPHA, min_effect=0.05
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


@pytest.mark.parametrize(("fraction", "rate"), [(0.05, 0.9), (0.05, 0.05), (0.5, 0.95)])
def test_the_error_rate_holds_where_a_small_arm_is_often_all_successes_or_all_failures(
    fraction: float, rate: float
) -> None:
    """A 5% arm at a base rate of 0.9 is all 1s after its first 10 trajectories a third of
    the time: a variance of 0 there would move a quarter of equal canaries."""
    decisions, _ = simulated(4_000, 1_000, fraction, (rate, rate), seed=5)
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
    policy = CanaryPolicy(fractions=(0.5,), alpha=ALPHA, min_effect=0.05)
    few, note, _ = decide_canary(
        [(0.5, live("c", [1.0] * 5), live("t", [0.0] * 5, pending=3))], policy
    )
    assert few == "hold" and f"at least {MIN_PER_ARM} scored trajectories an arm" in note
    assert "3 awaiting a reward" in note
    clear, note, _ = decide_canary(
        [(0.5, live("c", [1.0] * 40), live("t", [0.0, 1.0] * 20))], policy
    )
    assert clear == "promote"
    assert note.startswith("live 1.00 (n=40, c) vs 0.50 (n=40, t): difference +0.500 [+")
    assert note.endswith("at alpha 0.05")
    worse, _, _ = decide_canary([(0.5, live("c", [0.0] * 40), live("t", [0.0, 1.0] * 20))], policy)
    assert worse == "rollback"
    same = [0.0, 1.0] * 3000
    kept, note, _ = decide_canary([(0.5, live("c", same), live("t", same))], policy)
    assert kept == "keep", note


def test_a_staged_canary_widens_once_a_stage_has_served_undecided() -> None:
    policy = CanaryPolicy(fractions=(0.05, 0.25), alpha=ALPHA, min_effect=0.05)
    assert policy.widens(0.05, scored_on_candidate=29) is None
    assert policy.widens(0.05, scored_on_candidate=30) == 0.25
    assert policy.widens(0.25, scored_on_candidate=1000) is None  # the last stage decides
    assert policy.stage(0.1) == 0  # a share set by hand: the nearest stage
    stages = [(0.05, live("c", [1.0] * 12), live("t", [0.0, 1.0] * 6))]
    _, note, _ = decide_canary(stages, policy)
    assert note.endswith("at alpha 0.05 (stage 1 of 2, 5%)")
    for shares in ((), (0.25, 0.05), (0.5, 1.0), (0.0,)):
        with pytest.raises(ValueError, match="increase within"):
            CanaryPolicy(fractions=shares, alpha=ALPHA, min_effect=0.05)


def test_stages_are_compared_within_themselves_so_a_drift_between_them_is_no_effect() -> None:
    """Equal arms whose reward drifts from 0.2 in the first stage (5%) to 0.8 in the second
    (50%): pooled, the candidate's arm holds mostly the later, better hours and looks better by
    ~0.2; stratified by stage, the difference is 0."""
    first = (0.05, live("c", [0.2] * 10), live("t", [0.2] * 190))
    second = (0.5, live("c", [0.8] * 200), live("t", [0.8] * 200))
    pooled_c = (1.0 * 10 * 0.2 + 200 * 0.8) / 210
    pooled_t = (190 * 0.2 + 200 * 0.8) / 390
    assert pooled_c - pooled_t > 0.2
    verdict_, note, bounds = decide_canary([first, second], CanaryPolicy((0.05, 0.5), ALPHA, 0.05))
    assert float(bounds.difference) == pytest.approx(0.0)
    assert verdict_ == "keep"  # no spread within a stage: certain of no effect
    assert note.startswith("live 0.77 (n=210, c) vs 0.51 (n=390, t)")  # the arms, pooled
    # One stage: the stratified difference is the difference in means, exactly.
    one = ArmRewards.of([1.0, 0.0, 1.0, 1.0] * 3), ArmRewards.of([0.0, 1.0, 0.0] * 4)
    _, bounds = verdict([Stage(0.5, *one)], alpha=ALPHA, min_effect=0.05)
    assert float(bounds.difference) == pytest.approx(0.75 - 1 / 3)


def test_a_staged_canary_keeps_its_error_rate_when_the_traffic_drifts_between_stages() -> None:
    """10,000 equal-armed canaries at 10% for 300 trajectories, then 50% for 700, the reward
    rising from 0.3 to 0.7 between the stages, looked at after every trajectory: stratified by
    stage, at most alpha's share moved; the arms pooled as one stage, most of them promote."""
    runs, trajectories, switch = 10_000, 1_000, 300
    generator = torch.Generator().manual_seed(4)
    time = torch.arange(trajectories)
    share = torch.where(time < switch, 0.1, 0.5)
    on_candidate = torch.rand(runs, trajectories, generator=generator) < share
    rate = torch.where(time < switch, 0.3, 0.7)
    draws = torch.rand(runs, trajectories, generator=generator, dtype=torch.float64)
    rewards = (draws < rate).double()

    def arm(mask: torch.Tensor) -> ArmRewards:
        total = (rewards * mask).cumsum(1)
        return ArmRewards(mask.double().cumsum(1), total, total)

    first, second = time < switch, time >= switch
    stages = [
        Stage(0.1, arm(on_candidate & first), arm(~on_candidate & first)),
        Stage(0.5, arm(on_candidate & second), arm(~on_candidate & second)),
    ]
    pooled = [Stage(0.5, arm(on_candidate), arm(~on_candidate))]
    moved = {}
    for name, evidence in (("stratified", stages), ("pooled", pooled)):
        decided, _ = verdict(evidence, alpha=ALPHA, min_effect=0.05)
        first_move = torch.where((decided == 1) | (decided == 2), time, trajectories).min(1)
        moved[name] = (first_move.values < trajectories).double().mean().item()
    assert moved["stratified"] <= ALPHA
    assert moved["pooled"] > 0.5
