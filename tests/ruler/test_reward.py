"""Hybrid rewards: the RULER score mixed with the reward the agent reported, or kept beside it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from art_proxy.config import JudgeSettings
from art_proxy.ruler.reward import RewardRule
from art_proxy.ruler.run import finished_members
from art_proxy.store import schema
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.conftest import MakeRuler
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import answer_by_content, running_scripted_judge

PARIS_LYON_NICE = [answered("Paris"), answered("Lyon"), answered("Nice")]


def paris_is_best(text: str) -> float:
    return 0.9 if "Paris" in text else 0.2


async def test_a_reward_mix_combines_the_reported_reward_with_the_ruler_score(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, PARIS_LYON_NICE, rewards=[1.0, 0.0, None])
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        judgment = await make_ruler(judge, reward=RewardRule(mix=(0.5, 0.5))).score_group(
            group, await finished_members(store, group)
        )
    assert judgment.reward_rule == "0.5*programmatic+0.5*ruler"
    rows = [(s.score, s.programmatic, round(s.reward, 9), s.reward_source) for s in judgment.scores]
    assert rows == [
        (0.9, 1.0, 0.95, "mix"),
        (0.2, 0.0, 0.1, "mix"),
        # Reported no reward: it counts as 0, on the group's scale, never above the reported
        # failure of the same score (its bare score, 0.2, would outrank that 0.1).
        (0.2, None, 0.1, "mix"),
    ]
    assert await store.judgments(group=group) == [judgment]


async def test_a_programmatic_reward_kept_for_validation_is_recorded_beside_not_mixed(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, PARIS_LYON_NICE, rewards=[0.0, 1.0, 0.5])
    rule = RewardRule(programmatic_for_validation=True)
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        judgment = await make_ruler(judge, reward=rule).score_group(
            group, await finished_members(store, group)
        )
    assert judgment.reward_rule == "ruler, programmatic for validation"
    assert [(s.reward, s.programmatic) for s in judgment.scores] == [
        (0.9, 0.0),
        (0.2, 1.0),
        (0.2, 0.5),
    ]


async def test_by_default_the_reward_is_the_ruler_score_alone(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, PARIS_LYON_NICE, rewards=[0.0, 1.0, 0.5])
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        judgment = await make_ruler(judge).score_group(group, await finished_members(store, group))
    assert judgment.reward_rule == "ruler"
    assert [(s.reward, s.programmatic) for s in judgment.scores] == [
        (0.9, None),
        (0.2, None),
        (0.2, None),
    ]


async def test_a_new_reward_rule_judges_the_group_again_from_the_cache(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, PARIS_LYON_NICE, rewards=[0.0, 1.0, None])
    mixed = RewardRule(mix=(1.0, 1.0))
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        plain = make_ruler(judge)
        first = await plain.score_group(group, await finished_members(store, group))
        ruler = make_ruler(judge, reward=mixed)
        unjudged = await store.unjudged_groups(
            judge_model=ruler.judge_model,
            mode="json",
            rubric_hash=ruler.rubric_hash,
            reward_rule=mixed.name,
        )
        again = await ruler.score_group(group, await finished_members(store, group))
    assert [g.id for g in unjudged] == [group]
    assert len(judge.requests) == 1
    assert again.cached_from == first.id and again.attempts == 0
    assert [s.reward for s in again.scores] == pytest.approx([0.9, 1.2, 0.2])
    assert len(await store.judgments(group=group)) == 2


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"reward_mix": "0.5"}, "is not two numbers"),
        ({"reward_mix": "a,b"}, "is not two numbers"),
        ({"reward_mix": "-1,2"}, "0 or more"),
        ({"reward_mix": "0,0"}, "not both 0"),
        ({"reward_mix": "0.5,0.5", "programmatic_for": "validation"}, "either mixed in"),
    ],
)
def test_reward_settings_that_cannot_work_are_refused(
    settings: dict[str, str], problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        JudgeSettings.model_validate({"judge": "openai/x", **settings})


def test_the_reward_mix_flag_reads_as_two_weights() -> None:
    assert JudgeSettings(judge=["openai/x"], reward_mix=" 0.3, 0.7").reward_weights == (0.3, 0.7)
    assert JudgeSettings(judge=["openai/x"]).reward_weights is None


async def test_a_judgment_stored_before_hybrid_rewards_reads_back_with_its_score_as_reward(
    store_url: str,
) -> None:
    store = await TrajectoryStore.open(store_url)
    try:
        group, ids = await record_group(store, [answered("Paris"), answered("Lyon")])
        old = {"trajectory_id": ids[0], "label": "t1", "score": 0.7, "explanation": "fine"}
        async with store.engine.begin() as connection:
            await connection.execute(
                sa.insert(schema.judgments).values(
                    id="old",
                    group_id=group,
                    judge_model="openai/x",
                    mode="json",
                    rubric_hash="h",
                    cache_key="k",
                    status="scored",
                    trajectory_ids=ids,
                    scores=[old],
                    attempts=1,
                    prompt_tokens=1,
                    completion_tokens=1,
                    cost_usd=0.0,
                    created_at=datetime.now(UTC),
                )
            )
        (judgment,) = await store.judgments(group=group)
    finally:
        await store.aclose()
    assert judgment.reward_rule == "ruler" and judgment.members == []
    assert judgment.scores[0].reward == 0.7 and judgment.scores[0].reward_source == "ruler"
