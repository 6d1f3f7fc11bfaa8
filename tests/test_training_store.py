"""The store's training records: alias moves, trainer steps, and the groups a run may train on.

A run consumes each group at exactly one step, a recorded step is never written twice, and the
groups offered for training are the ones the run has not consumed, with their members' rewards.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from art_proxy.errors import GroupAlreadyConsumed
from art_proxy.records import (
    AliasRequest,
    FinishRequest,
    GroupOutcome,
    Judgment,
    JudgmentStatus,
    SubjectSelector,
    TeacherScore,
    TokenDisagreement,
    TrainingStep,
    TrajectoryScore,
)
from art_proxy.store.rows import Batch
from art_proxy.store.trajectory_store import TrajectoryStore, utcnow
from tests.store_rows import group_row, scenario_row, trajectory_row

START = utcnow()


async def add_group(
    store: TrajectoryStore,
    group_id: str,
    members: int,
    *,
    rewards: list[float | None] | None = None,
    age: int = 0,
    split: str = "train",
    scenario: str = "inbox",
) -> list[str]:
    """A group of `members` trajectories of `scenario` created `age` minutes after START; with `rewards`, the
    members finish with them (None: still open)."""
    created = START + timedelta(minutes=age)
    ids = [f"{group_id}-t{index}" for index in range(members)]
    rows = [scenario_row(scenario, created), group_row(group_id, scenario, created)]
    rows += [trajectory_row(t, scenario, group_id, created, split=split) for t in ids]
    await store.write(Batch(rows))
    for trajectory_id, reward in zip(ids, rewards or [], strict=False):
        if reward is not None:
            await store.finish(trajectory_id, FinishRequest(reward=reward))
    return ids


def step(run: str, number: int, groups: dict[str, GroupOutcome] | None = None) -> TrainingStep:
    return TrainingStep(
        run=run,
        step=number,
        status="applied",
        adapter=f"agent@{number}",
        groups=groups or {},
        metrics={"loss": 0.25},
        created_at=utcnow(),
    )


def judgment(
    group_id: str,
    rewards: dict[str, float],
    *,
    status: JudgmentStatus = "scored",
    cost: float = 0.01,
    age: int = 0,
) -> Judgment:
    scores = [
        TrajectoryScore(
            trajectory_id=trajectory_id,
            label=f"t{index}",
            score=reward,
            explanation="",
            reward=reward,
        )
        for index, (trajectory_id, reward) in enumerate(rewards.items())
    ]
    return Judgment(
        id=f"{group_id}-j{age}",
        group_id=group_id,
        judge_model="judge",
        mode="json",
        rubric_hash="r",
        cache_key=f"{group_id}-{age}",
        status=status,
        trajectory_ids=list(rewards),
        scores=scores if status == "scored" else [],
        attempts=1,
        cost_usd=cost,
        created_at=START + timedelta(minutes=age),
    )


async def test_set_alias_moves_it_and_records_each_move_with_the_previous_model(
    store: TrajectoryStore,
) -> None:
    first = await store.set_alias("agent", AliasRequest(model="base"))
    second = await store.set_alias("agent", AliasRequest(model="agent@1", step=1, reason="swap"))
    await store.set_alias("other", AliasRequest(model="base"))

    assert (first.previous, second.previous) == (None, "base")
    assert [(a.alias, a.model, a.step) for a in await store.aliases()] == [
        ("agent", "agent@1", 1),
        ("other", "base", None),
    ]
    moves = await store.alias_moves("agent")
    assert [(m.model, m.previous, m.reason) for m in moves] == [
        ("agent@1", "base", "swap"),
        ("base", None, "manual"),
    ]
    assert moves[0] == second
    assert len(await store.alias_moves(limit=2)) == 2


async def test_record_step_is_idempotent_for_a_step_already_recorded(
    store: TrajectoryStore,
) -> None:
    await add_group(store, "g1", 2)
    assert await store.record_step(step("run", 1, {"g1": "trained"}))
    rolled_forward = step("run", 1, {"g1": "zero_variance"}).model_copy(update={"adapter": "x"})
    assert not await store.record_step(rolled_forward)

    steps = await store.training_steps("run")
    assert [(s.step, s.adapter, s.groups) for s in steps] == [(1, "agent@1", {"g1": "trained"})]
    assert await store.consumed_group_ids("run") == {"g1"}


async def test_a_group_consumed_twice_by_a_run_raises_and_writes_nothing(
    store: TrajectoryStore,
) -> None:
    await add_group(store, "g1", 2)
    await add_group(store, "g2", 2)
    await store.record_step(step("run", 1, {"g1": "trained"}))

    with pytest.raises(GroupAlreadyConsumed, match=r"g1 \(step 1\)"):
        await store.record_step(step("run", 2, {"g2": "trained", "g1": "trained"}))

    assert [s.step for s in await store.training_steps("run")] == [1]
    assert await store.consumed_group_ids("run") == {"g1"}
    # Another run trains on the same groups independently.
    assert await store.record_step(step("other-run", 1, {"g1": "trained", "g2": "stale"}))
    assert await store.consumed_group_ids("other-run") == {"g1", "g2"}


async def test_training_steps_are_the_last_ones_oldest_first_with_their_swap(
    store: TrajectoryStore,
) -> None:
    for number in (1, 2, 3):
        await store.record_step(step("run", number))
    await store.record_step(step("other-run", 1))
    await store.set_step_swap("run", 3, "rejected", "upstream 2 answered 500")

    assert [s.step for s in await store.training_steps("run", limit=2)] == [2, 3]
    assert [(s.run, s.step) for s in await store.training_steps()][-1] == ("other-run", 1)
    last = await store.last_step("run")
    assert last is not None
    assert (last.step, last.swap, last.swap_error) == (3, "rejected", "upstream 2 answered 500")
    assert await store.last_step("no-such-run") is None


async def test_trainable_groups_from_finish_rewards_skip_open_unrewarded_and_consumed(
    store: TrajectoryStore,
) -> None:
    newer = await add_group(store, "newer", 2, rewards=[0.0, 1.0], age=2, split="val")
    older = await add_group(store, "older", 3, rewards=[1.0, 0.5, 0.0], age=1)
    await add_group(store, "still-open", 2, rewards=[1.0, None], age=3)
    await add_group(store, "one-reward", 2, age=4)
    await store.finish("one-reward-t0", FinishRequest(reward=1.0))
    await store.finish("one-reward-t1", FinishRequest())
    await add_group(store, "consumed", 2, rewards=[0.0, 1.0], age=0)
    await store.record_step(step("run", 1, {"consumed": "trained"}))

    found = await store.trainable_groups("run", source="finish")

    assert [(g.group_id, g.split, g.judge_cost_usd) for g in found] == [
        ("older", "train", 0.0),
        ("newer", "val", 0.0),
    ]
    assert found[0].rewards == dict(zip(older, [1.0, 0.5, 0.0], strict=True))
    assert found[1].rewards == dict(zip(newer, [0.0, 1.0], strict=True))
    assert found[0].scenario_id == "inbox"
    assert [g.group_id for g in await store.trainable_groups("run", source="finish", limit=1)] == [
        "older"
    ]
    assert len(await store.trainable_groups("other-run", source="finish")) == 3


async def test_trainable_groups_of_the_scenarios_asked_for_only(store: TrajectoryStore) -> None:
    """A store the demo trained on also holds its groups: a run of another agent names its own."""
    await add_group(store, "demo", 2, rewards=[0.0, 1.0], age=0, scenario="fruit")
    await add_group(store, "mine", 2, rewards=[1.0, 0.0], age=1, scenario="inbox")
    await add_group(store, "also-mine", 2, rewards=[1.0, 0.0], age=2, scenario="calendar")
    found = await store.trainable_groups("run", source="finish", scenarios=["inbox", "calendar"])
    assert [g.group_id for g in found] == ["mine", "also-mine"]
    assert len(await store.trainable_groups("run", source="finish")) == 3


async def test_trainable_groups_from_judgments_take_the_newest_scored_and_sum_costs(
    store: TrajectoryStore,
) -> None:
    judged = await add_group(store, "judged", 2, age=1)
    await add_group(store, "failed-only", 2, age=2)
    consumed = await add_group(store, "consumed", 2, age=0)
    await store.add_judgment(judgment("judged", dict(zip(judged, [0.2, 0.8], strict=True))))
    await store.add_judgment(
        judgment("judged", dict(zip(judged, [0.9, 0.1], strict=True)), cost=0.02, age=1)
    )
    await store.add_judgment(judgment("judged", {}, status="judge_failed", cost=0.03, age=2))
    await store.add_judgment(judgment("failed-only", {}, status="judge_failed"))
    await store.add_judgment(judgment("consumed", dict(zip(consumed, [0.0, 1.0], strict=True))))
    await store.record_step(step("run", 1, {"consumed": "trained"}))

    found = await store.trainable_groups("run", source="judgment")

    assert [g.group_id for g in found] == ["judged"]
    assert found[0].rewards == dict(zip(judged, [0.9, 0.1], strict=True))
    assert found[0].judge_cost_usd == pytest.approx(0.06)
    assert found[0].split == "train"


async def test_finish_groups_wait_for_full_size_or_settling_as_the_judge_does(
    store: TrajectoryStore,
) -> None:
    """Rollouts run one after another leave a group with no open member between them: taken then,
    every later member would be lost to training."""
    await add_group(store, "two-so-far", 2, rewards=[0.0, 1.0], age=5)
    await add_group(store, "full", 4, rewards=[0.0, 1.0, 0.5, 0.5], age=5)
    newest_start = START + timedelta(minutes=5)

    async def ready(settled_before: datetime) -> list[str]:
        found = await store.trainable_groups(
            "run", source="finish", full_size=4, settled_before=settled_before
        )
        return sorted(group.group_id for group in found)

    assert await ready(newest_start) == ["full"]
    assert await ready(newest_start + timedelta(seconds=1)) == ["full", "two-so-far"]


async def test_a_step_whose_group_was_erased_while_it_trained_is_recorded_without_it(
    store: TrajectoryStore,
) -> None:
    """Every member of a group the step consumed was erased while it trained: its consumed row
    failed the groups' foreign key, the step was never recorded, and a resume replayed it for
    ever."""
    await add_group(store, "kept", 2)
    await add_group(store, "erased", 2)
    await store.forget(SubjectSelector(trajectory="erased-t0"))
    await store.forget(SubjectSelector(trajectory="erased-t1"))
    assert await store.record_step(step("run", 1, {"kept": "trained", "erased": "trained"}))
    assert [s.step for s in await store.training_steps("run")] == [1]
    assert await store.consumed_group_ids("run") == {"kept"}


async def test_an_erasure_while_a_step_trains_on_the_subject_names_that_step_in_its_lineage(
    store: TrajectoryStore,
) -> None:
    """The step's consumed groups were written when it committed: an erasure meanwhile answered
    no step and no adapter, and the adapter trained on her data was recorded after. The step
    claims its groups before it reads their calls; the erasure names it, training, and its run;
    the claim goes when the step is recorded."""
    await add_group(store, "shared", 2)
    await store.claim_step("run", 1, ["shared"])
    erased = await store.forget(SubjectSelector(trajectory="shared-t0"))
    [learned] = erased.lineage.steps
    assert (learned.run, learned.step, learned.status) == ("run", 1, "training")
    assert learned.groups == {"shared": "training"} and learned.adapter is None
    assert erased.lineage.training_runs == ["run"]
    assert await store.record_step(step("run", 1, {"shared": "trained"}))
    later = await store.lineage(SubjectSelector(trajectory="shared-t1"))
    [learned] = later.steps
    assert (learned.status, learned.adapter, learned.groups) == (
        "applied", "agent@1", {"shared": "trained"},
    )  # fmt: skip
    assert later.training_runs == [] and later.derived_adapters == ["agent@1"]


async def test_a_replayed_step_claims_its_groups_again_and_an_abandoned_one_lets_them_go(
    store: TrajectoryStore,
) -> None:
    await add_group(store, "g", 2)
    await store.claim_step("run", 3, ["g"])
    await store.claim_step("run", 3, ["g"])  # the same step again, after a kill
    abandoned = step("run", 3, {"g": "abandoned"}).model_copy(
        update={"status": "abandoned", "adapter": None}
    )
    assert await store.record_step(abandoned)
    lineage = await store.lineage(SubjectSelector(trajectory="g-t0"))
    assert [(s.step, s.status) for s in lineage.steps] == [(3, "abandoned")]
    assert lineage.training_runs == []


async def test_a_teacher_takes_ended_groups_rewarded_or_not_and_rewards_alone_need_two(
    store: TrajectoryStore,
) -> None:
    """`--reward-source teacher` (production traffic with no judge): a group whose members all
    ended, its unrewarded members listed apart; an open member holds it back, as for finish."""
    mixed = await add_group(store, "mixed", 3, rewards=[1.0])
    for member in mixed[1:]:
        await store.finish(member, FinishRequest())
    await add_group(store, "open", 2, rewards=[1.0, None])
    assert await store.trainable_groups("run", source="finish") == []
    [found] = await store.trainable_groups("run", source="teacher")
    assert (found.group_id, found.rewards, found.unrewarded) == (
        "mixed",
        {mixed[0]: 1.0},
        mixed[1:],
    )
    assert found.members == mixed


def teacher_score(trajectory_id: str, kl: float) -> TeacherScore:
    return TeacherScore(
        call_id=f"{trajectory_id}-c0",
        choice=0,
        trajectory_id=trajectory_id,
        run="run",
        step=1,
        teacher="teacher-model",
        kl=kl,
        tokens=3,
        disagreements=[TokenDisagreement(position=1, text=" Paris", sampled=-0.1, teacher=-4.0)],
        created_at=utcnow(),
    )


async def test_teacher_scores_are_kept_read_back_and_erased_with_their_trajectory(
    store: TrajectoryStore,
) -> None:
    """What the trajectory page shows of a teacher goes with the trajectory; one scored of a
    trajectory erased while the step trained is never written."""
    kept, erased = await add_group(store, "g", 2)
    await add_group(store, "gone", 1)
    await store.forget(SubjectSelector(trajectory="gone-t0"))
    scores = [teacher_score(kept, 0.5), teacher_score(erased, 1.5), teacher_score("gone-t0", 2.0)]
    await store.record_teacher_scores(scores)
    await store.record_teacher_scores(scores[:1])  # the step replayed after a kill: kept once
    assert await store.teacher_scores(kept) == [scores[0]]
    assert await store.teacher_scores("gone-t0") == []
    await store.forget(SubjectSelector(trajectory=erased))
    assert await store.teacher_scores(erased) == []
    assert [s.kl for s in await store.teacher_scores(kept)] == [0.5]
