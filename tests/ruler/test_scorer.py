"""One judge call per group against a scripted judge: what it is shown, and every way it can fail."""

from __future__ import annotations

import json

import pytest

from art_proxy.ruler.judge import LitellmJudge
from art_proxy.ruler.prompt import TRIM_MARKER
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import finished_members
from art_proxy.ruler.scorer import Ruler
from art_proxy.ruler.settings import RulerSettings
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.conftest import JUDGE_MODEL, MakeRuler
from tests.ruler.recorded import OPENING, answered, record_group
from tests.ruler.scripted_judge import (
    Reply,
    answer_by_content,
    json_answer,
    running_scripted_judge,
)


def paris_is_best(text: str) -> float:
    return 0.9 if "Paris" in text else 0.2


async def test_the_judge_sees_the_shared_beginning_once_each_rest_and_the_rubric(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, ids = await record_group(store, [answered("Paris"), answered("Lyon"), answered("Nice")])
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        judgment = await make_ruler(judge).score_group(group, await finished_members(store, group))
    assert judgment.status == "scored"
    assert len(judge.requests) == 1
    prompt = judge.prompt()
    assert prompt.count(OPENING[1]["content"]) == 1
    assert prompt.count(OPENING[0]["content"]) == 1
    assert all(f'<trajectory id="t{i}">' in prompt for i in (1, 2, 3))
    assert DEFAULT_RUBRIC in prompt
    assert not any(trajectory_id in prompt for trajectory_id in ids)
    assert judge.requests[0]["temperature"] == 0


async def test_scores_map_back_to_trajectories_when_the_judge_answers_out_of_order(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, ids = await record_group(store, [answered("Lyon"), answered("Paris"), answered("Nice")])
    async with running_scripted_judge(answer_by_content(paris_is_best, reverse=True)) as judge:
        judgment = await make_ruler(judge).score_group(group, await finished_members(store, group))
    by_trajectory = {score.trajectory_id: score.score for score in judgment.scores}
    assert by_trajectory == {ids[0]: 0.2, ids[1]: 0.9, ids[2]: 0.2}
    assert [score.label for score in judgment.scores] == ["t1", "t2", "t3"]
    assert judgment.scores[1].explanation == "t2 judged"
    stored = await store.judgments(group=group)
    assert stored == [judgment]


async def test_structured_output_is_asked_for_with_the_answer_schema(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        await make_ruler(judge).score_group(group, await finished_members(store, group))
    response_format = judge.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert "scores" in json.dumps(response_format["json_schema"]["schema"])


async def test_a_judge_without_structured_output_is_asked_again_without_it(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    refuse = Reply("response_format json_schema is not supported", status=400)
    async with running_scripted_judge(refuse, answer_by_content(paris_is_best)) as judge:
        ruler = make_ruler(judge)
        judgment = await ruler.score_group(group, await finished_members(store, group))
        other, _ = await record_group(store, [answered("Paris."), answered("Lyon.")])
        await ruler.score_group(other, await finished_members(store, other))
    assert judgment.status == "scored"
    assert [("response_format" in body) for body in judge.requests] == [True, False, False]


async def test_a_malformed_answer_is_retried_with_the_problem_shown_to_the_judge(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    missing_t2 = json_answer([("t1", 0.5)])
    fenced = Reply("Sure!\n```json\n" + json_answer([("t2", 0.1), ("t1", 0.7)]).content + "\n```")
    async with running_scripted_judge(missing_t2, fenced) as judge:
        judgment = await make_ruler(judge).score_group(group, await finished_members(store, group))
    assert judgment.status == "scored" and judgment.attempts == 2
    assert [score.score for score in judgment.scores] == [0.7, 0.1]
    retry = judge.requests[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": missing_t2.content}
    assert "missing: t2" in retry[-1]["content"]
    assert judgment.prompt_tokens > 0 and judgment.completion_tokens > 0


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("I think t1 is better.", "holds no JSON"),
        (json_answer([("t1", 0.5), ("t2", 1.5)]).content, "t2 scores 1.5, outside 0 to 1"),
        (json_answer([("t1", 0.5), ("t1", 0.6), ("t2", 0.1)]).content, "t1 appears more than once"),
        (json_answer([("t1", 0.5), ("t2", 0.4), ("t9", 0.1)]).content, "'t9' is not one of"),
    ],
)
async def test_answers_that_stay_malformed_are_recorded_as_judge_failed(
    store: TrajectoryStore, make_ruler: MakeRuler, answer: str, problem: str
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge(Reply(answer)) as judge:
        judgment = await make_ruler(judge, attempts=3).score_group(
            group, await finished_members(store, group)
        )
    assert len(judge.requests) == 3
    assert judgment.status == "judge_failed" and judgment.attempts == 3
    assert judgment.reason is not None and problem in judgment.reason
    assert "no valid answer in 3 attempts" in judgment.reason
    assert judgment.scores == []
    assert await store.judgments(group=group) == [judgment]


async def test_a_rate_limited_judge_is_retried_after_a_pause(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    limited = Reply("slow down", status=429)
    async with running_scripted_judge(limited, limited, answer_by_content(paris_is_best)) as judge:
        judgment = await make_ruler(judge, retries=2).score_group(
            group, await finished_members(store, group)
        )
    assert judgment.status == "scored" and judgment.attempts == 3


async def test_an_unreachable_judge_is_recorded_after_its_retries(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge() as judge:
        closed = judge.base_url  # nothing listens there once the block ends
    judgment = await make_ruler(closed, retries=2).score_group(
        group, await finished_members(store, group)
    )
    assert judgment.status == "judge_failed" and judgment.attempts == 3
    assert judgment.reason is not None and "judge unavailable after 3 tries" in judgment.reason


async def test_a_judge_that_rejects_the_request_is_not_retried(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge(Reply("bad key", status=401)) as judge:
        judgment = await make_ruler(judge).score_group(group, await finished_members(store, group))
    assert len(judge.requests) == 1
    assert judgment.status == "judge_failed"
    assert judgment.reason is not None and "HTTP 401" in judgment.reason


async def test_a_group_of_one_is_skipped_without_a_call(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, ids = await record_group(store, [answered("Paris")])
    async with running_scripted_judge() as judge:
        judgment = await make_ruler(judge).score_group(group, await finished_members(store, group))
    assert judge.requests == []
    assert judgment.status == "skipped" and judgment.trajectory_ids == ids
    assert judgment.reason is not None and "1 finished trajectory" in judgment.reason


async def test_a_cache_hit_makes_no_call(store: TrajectoryStore, make_ruler: MakeRuler) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    twin, twin_ids = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        ruler = make_ruler(judge)
        first = await ruler.score_group(group, await finished_members(store, group))
        again = await ruler.score_group(group, await finished_members(store, group))
        copied = await ruler.score_group(twin, await finished_members(store, twin))
    assert len(judge.requests) == 1
    assert again == first
    assert copied.cached_from == first.id and copied.attempts == 0 and copied.cost_usd == 0
    assert {s.trajectory_id: s.score for s in copied.scores} == {twin_ids[0]: 0.9, twin_ids[1]: 0.2}
    assert len(await store.judgments(group=group)) == 1
    assert len(await store.judgments(group=twin)) == 1


async def test_a_changed_rubric_is_not_a_cache_hit(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        await make_ruler(judge).score_group(group, await finished_members(store, group))
        await make_ruler(judge, rubric="Shorter is better.").score_group(
            group, await finished_members(store, group)
        )
    assert len(judge.requests) == 2
    assert "Shorter is better." in judge.prompt(1)


async def test_long_tool_results_are_trimmed_to_the_prompt_budget(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    with_tool = [
        *OPENING,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "START " + "x" * 40_000 + " END"},
    ]
    group, _ = await record_group(
        store, [[*with_tool, {"role": "assistant", "content": c}] for c in ("Paris", "Lyon")]
    )
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        judgment = await make_ruler(judge, max_prompt_tokens=2000).score_group(
            group, await finished_members(store, group)
        )
    assert judgment.status == "scored"
    prompt = judge.prompt()
    assert len(prompt) < 2000 * 4
    assert "START" in prompt and "END" in prompt
    assert TRIM_MARKER.split("{")[0] in prompt
    assert "[tool call search] {}" in prompt


async def test_a_group_too_long_for_the_budget_is_recorded_as_judge_failed(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge() as judge:
        judgment = await make_ruler(judge, max_prompt_tokens=50).score_group(
            group, await finished_members(store, group)
        )
    assert judge.requests == []
    assert judgment.status == "judge_failed"
    assert judgment.reason is not None and "more than the budget of 50" in judgment.reason


async def test_a_judge_made_after_another_was_closed_still_judges(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    """One process, two runs (`eval`'s arms, a trainer run after a refused one): closing the
    first run's judge must not leave a closed client in litellm's cache for the second."""
    group, _ = await record_group(store, [answered("Paris"), answered("Lyon")])
    async with running_scripted_judge(answer_by_content(paris_is_best)) as judge:
        first = LitellmJudge(JUDGE_MODEL, base_url=judge.base_url, timeout=10)
        ruler = Ruler([first], store, RulerSettings(rubric=DEFAULT_RUBRIC, backoff=0.01))
        judged = await ruler.score_group(group, await finished_members(store, group))
        await first.aclose()
        # Another rubric: not a cache hit, so the second judge calls.
        again = await make_ruler(judge, rubric="Shorter is better.").score_group(
            group, await finished_members(store, group)
        )
    assert judged.status == "scored"
    assert again.status == "scored", again.reason
