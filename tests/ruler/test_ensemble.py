"""Ensembles: several scripted judges, or samples of one, averaged with their disagreement kept."""

from __future__ import annotations

import io
from typing import Any

import pytest
from pydantic import ValidationError
from rich.console import Console

from art_proxy.config import JudgeSettings
from art_proxy.ruler.command import run_judge
from art_proxy.ruler.ensemble import kendall_tau_b
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import finished_members
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.conftest import JUDGE_MODEL, MakeRuler
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import (
    Reply,
    answer_by_content,
    json_answer,
    running_scripted_judge,
)

FIRST, SECOND = f"{JUDGE_MODEL}-1", f"{JUDGE_MODEL}-2"


def paris_is_best(text: str) -> float:
    return 0.9 if "Paris" in text else 0.2


def paris_then_lyon(text: str) -> float:
    return 0.7 if "Paris" in text else 0.5 if "Lyon" in text else 0.1


@pytest.mark.parametrize(
    ("scores", "tau"),
    [
        ([0.9, 0.5, 0.3, 0.1], 1.0),
        ([0.1, 0.3, 0.5, 0.9], -1.0),
        ([0.5, 0.5, 0.5, 0.5], 0.0),
        ([0.9, 0.9, 0.1, 0.1], 0.8165),
    ],
)
def test_kendall_tau_b_against_a_labelled_order(scores: list[float], tau: float) -> None:
    assert kendall_tau_b(scores, [4, 3, 2, 1]) == pytest.approx(tau, abs=1e-4)


async def test_two_judges_are_averaged_and_their_disagreement_is_recorded(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, ids = await record_group(store, [answered("Paris"), answered("Lyon"), answered("Nice")])
    async with (
        running_scripted_judge(answer_by_content(paris_is_best)) as first,
        running_scripted_judge(answer_by_content(paris_then_lyon)) as second,
    ):
        judgment = await make_ruler([first, second]).score_group(
            group, await finished_members(store, group)
        )
    assert len(first.requests) == len(second.requests) == 1
    assert first.prompt() == second.prompt(), "every member sees the same prompt"
    assert judgment.status == "scored" and judgment.judge_model == f"{FIRST}+{SECOND}"
    by_id = {score.trajectory_id: score for score in judgment.scores}
    assert [by_id[i].score for i in ids] == pytest.approx([0.8, 0.35, 0.15])
    assert [by_id[i].std for i in ids] == pytest.approx([0.1, 0.15, 0.05])
    assert [by_id[i].reward for i in ids] == pytest.approx([0.8, 0.35, 0.15])
    # Paris first for both; the first ties Lyon and Nice, the second does not: tau-b 2/sqrt(6).
    assert judgment.rank_agreement == pytest.approx(0.8165, abs=1e-4)
    assert f"[{FIRST}] t1 judged" in by_id[ids[0]].explanation
    assert f"[{SECOND}] t1 judged" in by_id[ids[0]].explanation
    assert [(m.judge_model, m.status, m.scores) for m in judgment.members] == [
        (FIRST, "scored", {"t1": 0.9, "t2": 0.2, "t3": 0.2}),
        (SECOND, "scored", {"t1": 0.7, "t2": 0.5, "t3": 0.1}),
    ]
    assert judgment.attempts == 2
    assert judgment.prompt_tokens == sum(m.prompt_tokens for m in judgment.members) > 0
    assert await store.judgments(group=group) == [judgment]


async def test_samples_of_one_judge_form_an_ensemble(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    answers = [json_answer(s) for s in ([("t1", 0.9), ("t2", 0.1)], [("t1", 0.6), ("t2", 0.3)])]
    answers.append(json_answer([("t1", 0.3), ("t2", 0.6)]))
    async with running_scripted_judge(*answers) as judge:
        judgment = await make_ruler(judge, samples=3).score_group(
            group, await finished_members(store, group)
        )
    assert len(judge.requests) == 3
    assert judgment.judge_model == f"{JUDGE_MODEL}*3"
    assert [score.score for score in judgment.scores] == pytest.approx([0.6, 1 / 3])
    assert sorted(member.sample for member in judgment.members) == [1, 2, 3]
    # Two of the three pairs of samples rank the group in opposite orders.
    assert judgment.rank_agreement == pytest.approx(-1 / 3)


async def test_a_failed_member_is_recorded_and_the_others_score(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with (
        running_scripted_judge(answer_by_content(paris_is_best)) as first,
        running_scripted_judge(Reply("bad key", status=401)) as second,
    ):
        judgment = await make_ruler([first, second]).score_group(
            group, await finished_members(store, group)
        )
    assert judgment.status == "scored" and judgment.reason is None
    assert [score.score for score in judgment.scores] == [0.9, 0.2]
    assert all(score.std is None for score in judgment.scores)
    assert judgment.rank_agreement is None
    failed = judgment.members[1]
    assert (failed.judge_model, failed.status, failed.scores) == (SECOND, "judge_failed", {})
    assert failed.reason is not None and "HTTP 401" in failed.reason


async def test_an_ensemble_whose_members_all_fail_is_judge_failed_with_every_reason(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with (
        running_scripted_judge(Reply("bad key", status=401)) as first,
        running_scripted_judge(Reply("I like both.")) as second,
    ):
        judgment = await make_ruler([first, second], attempts=1).score_group(
            group, await finished_members(store, group)
        )
    assert judgment.status == "judge_failed" and judgment.scores == []
    assert judgment.reason is not None
    assert judgment.reason.startswith("every member of the ensemble failed")
    assert f"[{FIRST}] judge rejected the request" in judgment.reason
    assert f"[{SECOND}] no valid answer in 1 attempts" in judgment.reason
    assert [member.status for member in judgment.members] == ["judge_failed"] * 2


async def test_an_answer_with_a_failed_member_is_not_reused_but_a_whole_one_is(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    conversations = [answered("Paris"), answered("Lyon")]
    groups = [(await record_group(store, conversations))[0] for _ in range(3)]
    async with (
        running_scripted_judge(answer_by_content(paris_is_best)) as first,
        running_scripted_judge(
            Reply("busy", status=401), answer_by_content(paris_is_best)
        ) as second,
    ):
        ruler = make_ruler([first, second])
        judgments = [
            await ruler.score_group(group, await finished_members(store, group)) for group in groups
        ]
    assert [m.status for m in judgments[0].members] == ["scored", "judge_failed"]
    assert judgments[1].cached_from is None, "the failed member is asked again"
    assert judgments[2].cached_from == judgments[1].id
    assert len(first.requests) == len(second.requests) == 2


async def test_the_judge_command_asks_each_sample_at_a_temperature_above_zero(
    store: TrajectoryStore, sqlite_url: str
) -> None:
    await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        settings = JudgeSettings(
            store=sqlite_url,
            judge=["openai/scripted"],
            judge_base_url=[judge.base_url],
            judge_samples=2,
            judge_orders=1,
        )
        quiet = Console(file=io.StringIO())
        totals = await run_judge(settings, DEFAULT_RUBRIC, quiet, quiet)
    assert totals.scored == 1 and totals.calls == 2
    assert [body["temperature"] for body in judge.requests] == [1.0, 1.0]
    (judgment,) = await store.judgments()
    assert judgment.judge_model == "openai/scripted*2"
    assert judgment.rank_agreement == 1.0


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"judge_samples": 3, "judge_temperature": 0}, "needs a temperature above 0"),
        ({"judge": ["a", "b", "c"], "judge_base_url": ["http://x/v1"] * 2}, "2 base URLs for 3"),
    ],
)
def test_ensemble_settings_that_cannot_work_are_refused(
    settings: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem):
        JudgeSettings.model_validate({"judge": ["openai/x"], **settings})


def test_one_base_url_serves_every_judge_and_several_pair_up() -> None:
    one = JudgeSettings(judge=["openai/a", "openai/b"], judge_base_url=["http://h:1/v1/"])
    assert one.base_urls == ["http://h:1/v1", "http://h:1/v1"]
    both = JudgeSettings(
        judge=["openai/a", "openai/b"], judge_base_url=["http://a/v1", "http://b/v1"]
    )
    assert both.base_urls == ["http://a/v1", "http://b/v1"]
    assert JudgeSettings(judge=["openai/a"]).base_urls == [None]
    assert JudgeSettings(judge=["openai/a"]).temperature == 0.0


async def test_the_summary_counts_ensemble_members_that_failed(
    store: TrajectoryStore, sqlite_url: str
) -> None:
    await record_group(store, [answered("Paris"), answered("Lyon")])
    async with (
        running_scripted_judge(answer_by_content(paris_is_best)) as good,
        running_scripted_judge(Reply("bad key", status=401)) as bad,
    ):
        settings = JudgeSettings(
            store=sqlite_url,
            judge=["openai/good", "openai/bad"],
            judge_base_url=[good.base_url, bad.base_url],
            judge_orders=1,
        )
        output = io.StringIO()
        totals = await run_judge(
            settings, DEFAULT_RUBRIC, Console(file=output, width=120), Console(file=io.StringIO())
        )
    assert totals.scored == 1 and totals.failed_members == 1
    assert "openai/good+openai/bad" in output.getvalue()
    assert "1 │ ensemble members failed" in output.getvalue()
