"""Safe promotion and rollback: the decision rules, and the live reward production gives a model.

A validated adapter is promoted when its validation reward is at least the production target's;
the production alias rolls back when the promoted target's live mean, over enough scored prod
trajectories, is below the previous target's by more than the margin.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from art_proxy.config import TrainSettings
from art_proxy.records import (
    CanaryLook,
    FeedbackRequest,
    FinishRequest,
    LiveReward,
    SubjectSelector,
)
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy.store.writer import Batch, RowKind
from art_proxy_trainer.canary import CanaryPolicy
from art_proxy_trainer.promoter import (
    decide_canary,
    decide_promotion,
    decide_rollback,
)
from tests.store_rows import trajectory_row
from tests.test_training_store import START, add_group, judgment


def live(model: str, count: int, mean: float | None) -> LiveReward:
    return LiveReward(model=model, count=count, mean=mean)


def test_a_candidate_as_good_as_the_current_target_is_promoted() -> None:
    decision = decide_promotion(0.62, "agent@4", 0.62)
    assert decision.act and decision.note == "val 0.62 >= 0.62 (agent@4)"


def test_a_worse_candidate_is_kept_out_with_the_evidence() -> None:
    decision = decide_promotion(0.55, "agent@4", 0.62)
    assert not decision.act and decision.note == "val 0.55 < 0.62 (agent@4)"


def test_a_target_never_validated_gives_way_to_a_validated_candidate() -> None:
    decision = decide_promotion(0.4, "base", None)
    assert decision.act and decision.note == "val 0.40; base was never validated"


def test_no_validation_reward_or_an_earlier_rollback_never_promotes() -> None:
    assert not decide_promotion(math.nan, "base", 0.1).act
    rolled_back = decide_promotion(0.9, "base", 0.1, rolled_back=True)
    assert not rolled_back.act and "rolled back" in rolled_back.note


def test_a_clear_fall_over_enough_trajectories_rolls_back_with_both_means() -> None:
    decision = decide_rollback(live("a@5", 8, 0.5), live("a@4", 20, 0.7), 8, 0.05)
    assert decision.act
    assert decision.note == "live 0.50 (n=8, a@5) vs 0.70 (n=20, a@4), margin 0.05"


@pytest.mark.parametrize(
    ("current", "previous", "why"),
    [
        (live("a@5", 7, 0.0), live("a@4", 20, 0.7), "7 of 8 scored prod trajectories"),
        (live("a@5", 8, 0.66), live("a@4", 20, 0.7), "margin 0.05"),  # within the margin
        (live("a@5", 8, 0.65), live("a@4", 20, 0.7), "margin 0.05"),  # exactly the margin
        (live("a@5", 8, 0.1), None, "no previous target"),
        (live("a@5", 8, 0.1), live("a@4", 0, None), "no scored prod trajectories on a@4"),
    ],
)
def test_no_rollback_without_enough_evidence_of_a_fall(
    current: LiveReward, previous: LiveReward | None, why: str
) -> None:
    decision = decide_rollback(current, previous, 8, 0.05)
    assert not decision.act and why in decision.note


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"promote_alias": "agent", "alias": "agent"}, "must differ from --alias"),
        ({"promote_alias": "prod-agent", "swap": False}, "needs --swap"),
    ],
)
def test_the_production_alias_needs_swapping_and_a_training_alias_of_its_own(
    settings: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValidationError, match=why):
        TrainSettings.model_validate(settings)


# --- the store's live rewards ---------------------------------------------------------------------


def call_row(
    trajectory_id: str, seq: int, model: str, minutes: int, asked: str | None = None
) -> tuple[RowKind, Any]:
    """A call served by `model`, the client having asked for `asked` (None: `model` itself)."""
    return (
        RowKind.call,
        {
            "id": f"{trajectory_id}-c{seq}",
            "trajectory_id": trajectory_id,
            "seq": seq,
            "kind": "chat",
            "created_at": START + timedelta(minutes=minutes),
            "latency_ms": 1.0,
            "upstream": "http://u/v1",
            "status": "ok",
            "http_status": 200,
            "stream": False,
            "model": model,
            "request": {"model": asked or model},
            "sampling": {},
            "trainable": False,
            "stitched": False,
            "attribution": "header",
        },
    )


async def test_live_rewards_average_finished_prod_trajectories_by_their_first_calls_model(
    store: TrajectoryStore,
) -> None:
    # age 0: served by a@1 (finish rewards; the second moved to a@2 mid-conversation)
    old = await add_group(store, "g-old", 2, rewards=[0.2, 0.4], split="prod")
    # age 10: served by a@2; one rewarded by feedback, one by its judgment, one still open
    new = await add_group(store, "g-new", 4, rewards=[None, None, None, None], age=10, split="prod")
    # age 10: validation traffic on a@2 is not production
    val = await add_group(store, "g-val", 1, rewards=[0.0], age=10, split="val")
    await store.write(
        Batch(
            [
                call_row(old[0], 0, "a@1", 0, asked="prod"),
                call_row(old[1], 0, "a@1", 0),
                call_row(old[1], 1, "a@2", 10),
                *(call_row(t, 0, "a@2", 10) for t in new + val),
            ]
        )
    )
    # a shadow sample a@2 drew beside a served call: no user saw it, so it is not live evidence
    at = START + timedelta(minutes=10)
    shadow = trajectory_row(
        "shadow", "inbox", "g-new", at, split="prod", finished_at=at, finish_reason="shadow"
    )
    best = trajectory_row(
        "best", "inbox", "g-new", at, split="prod", finished_at=at, finish_reason="best_of"
    )
    await store.write(Batch([shadow, best, call_row("shadow", 0, "a@2", 10)]))
    await store.write(Batch([call_row("best", 0, "a@2", 10)]))
    await store.finish("best", FinishRequest(reward=1.0))  # a best-of candidate: not served
    await store.finish("shadow", FinishRequest(reward=0.0))  # rated, still a shadow sample
    assert await store.shadow_rewards("a@2", limit=5) == {"shadow": 0.0}
    assert await store.shadow_rewards("a@1", limit=5) == {}
    for trajectory_id in new[:3]:
        await store.finish(trajectory_id, FinishRequest())
    await store.add_feedback(FeedbackRequest(trajectory_id=new[0], thumbs="up", as_reward=True))
    await store.add_judgment(judgment("g-new", {new[1]: 0.1, new[2]: 0.3}, age=1))
    await store.add_judgment(judgment("g-new", {new[1]: 0.5}, age=2))  # the newest counts

    everything = await store.live_rewards()
    assert {model: (r.count, round(r.mean or 0, 6)) for model, r in everything.items()} == {
        "a@1": (2, 0.3),
        "a@2": (3, 0.6),
    }
    # Through the alias only: another app calling a@1 by its name is not the alias's traffic.
    through = await store.live_rewards(alias="prod")
    assert {model: (r.count, r.mean) for model, r in through.items()} == {"a@1": (1, 0.2)}
    cut = START + timedelta(minutes=5)
    assert set(await store.live_rewards(since=cut)) == {"a@2"}
    assert set(await store.live_rewards(until=cut)) == {"a@1"}


async def test_an_erased_trajectory_leaves_a_canarys_evidence(store: TrajectoryStore) -> None:
    """The canary decides on the live rewards the store holds at each poll: an erasure takes
    its trajectories out of the next decision (the moves' notes hold aggregates only)."""
    candidate = await add_group(store, "g-c", 12, rewards=[1.0] * 12, split="prod")
    target = await add_group(store, "g-t", 12, rewards=[0.0] * 12, split="prod")
    await store.write(
        Batch(
            [call_row(t, 0, "a@2", 0) for t in candidate]
            + [call_row(t, 0, "a@1", 0) for t in target]
        )
    )
    policy = CanaryPolicy(fractions=(0.5,), alpha=0.05, min_effect=0.05)
    live = await store.live_rewards()
    assert live["a@2"].count == 12 and live["a@2"].mean_square == 1.0
    verdict, note, _ = decide_canary([(0.5, live["a@2"], live["a@1"])], policy)
    assert verdict == "promote" and "(n=12, a@2)" in note
    # Looks before the trajectories began, and after: two in a row differ by one reward.
    for at, n in ((START - timedelta(minutes=1), 0), (START + timedelta(minutes=1), 11)):
        await store.add_canary_look(look(at, live["a@2"].model_copy(update={"count": n}), live))
    await store.add_canary_look(look(START + timedelta(minutes=2), live["a@2"], live))
    erased = [await store.forget(SubjectSelector(trajectory=t)) for t in candidate[:3]]
    assert sum(e.deleted["canary_looks"] for e in erased) == 2
    assert [look.candidate.count for look in await store.canary_looks("prod")] == [0]
    live = await store.live_rewards()
    assert live["a@2"].count == 9
    verdict, note, _ = decide_canary([(0.5, live["a@2"], live["a@1"])], policy)
    assert verdict == "hold" and "(n=9, a@2)" in note  # under 10 an arm: no decision yet


def look(at: datetime, candidate: LiveReward, live: dict[str, LiveReward]) -> CanaryLook:
    return CanaryLook(
        alias="prod",
        looked_at=at,
        fraction=0.5,
        candidate=candidate,
        target=live["a@1"],
        difference=1.0,
        low=None,
        high=None,
        verdict="hold",
        note="a look",
    )
