"""The judge's prompt fits the judge: its context read from its server (`/v1/models`
`max_model_len`), every prompt it is sent (re-asks included) fitted to it, counted by its own
tokenizer where the server counts (`/tokenize`). The README's judge step once failed with
`ContextWindowExceededError ... maximum context length is 2048 tokens ... 4120 input tokens`."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from art_proxy.config import JudgeSettings
from art_proxy.ruler.command import run_judge
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.ruler.run import Totals
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import (
    Reply,
    ScriptedJudge,
    answer_by_content,
    running_scripted_judge,
    tokens_in,
)

CONTEXT = 2048


async def judge_groups(sqlite_url: str, judge: ScriptedJudge, **options: Any) -> Totals:
    """`art-proxy judge` over the ready groups, in the given order only, with `judge`."""
    settings = JudgeSettings(
        store=sqlite_url,
        judge="openai/scripted",
        judge_base_url=judge.base_url,
        judge_orders=1,
        wait=0,
        **options,
    )
    quiet = Console(file=io.StringIO())
    return await run_judge(settings, DEFAULT_RUBRIC, quiet, quiet)


def paris_is_best(text: str) -> float:
    return 0.9 if "Paris" in text else 0.2


async def test_every_prompt_fits_the_judges_context_a_re_ask_included(
    store: TrajectoryStore, sqlite_url: str
) -> None:
    rambling = " and then it went on about the weather" * 60  # ~2,300 characters each
    cities = ("Paris", "Lyon", "Nice", "Lille")
    await record_group(store, [answered(f"{city}{rambling}") for city in cities])
    invalid = Reply("I think the first one was best.")  # not the form asked for: a re-ask
    script = (invalid, answer_by_content(paris_is_best))
    async with running_scripted_judge(*script, context_tokens=CONTEXT) as judge:
        totals = await judge_groups(sqlite_url, judge)
    (judgment,) = await store.judgments()

    assert totals.scored == 1, judgment.reason
    assert len(judge.requests) == 2  # the invalid answer, then the answer to the re-ask
    for body in judge.requests:
        assert tokens_in(body["messages"]) + body["max_tokens"] <= CONTEXT
    scores = {score.label: round(score.score, 3) for score in judgment.scores}
    assert scores == {"t1": 0.9, "t2": 0.2, "t3": 0.2, "t4": 0.2}


# A reasoning judge cut while it thinks: its thinking apart (vLLM's `reasoning`, older builds'
# `reasoning_content`) and no answer yet, or inline in an unclosed `<think>`.
STILL_THINKING = {
    "apart": Reply("", reasoning="Trajectory t1 names Paris, so", finish_reason="length"),
    "apart_older": Reply(
        "",
        reasoning="Trajectory t1 names Paris, so",
        reasoning_field="reasoning_content",
        finish_reason="length",
    ),
    "inline": Reply("<think>Trajectory t1 names Paris, so", finish_reason="length"),
}


@pytest.mark.parametrize("cut", STILL_THINKING.values(), ids=STILL_THINKING.keys())
async def test_a_judge_cut_while_it_thinks_fails_the_group_saying_what_gives_it_room(
    store: TrajectoryStore, sqlite_url: str, cut: Reply
) -> None:
    """Its thinking counts against `max_tokens` (vLLM): a re-ask would be cut the same way, so
    none is made, and the reason names the option that gives it room."""
    await record_group(store, [answered(city) for city in ("Paris", "Lyon")])
    async with running_scripted_judge(cut, context_tokens=CONTEXT) as judge:
        totals = await judge_groups(sqlite_url, judge)
    (judgment,) = await store.judgments()

    assert totals.scored == 0 and judgment.status == "judge_failed"
    assert len(judge.requests) == 1
    room = judge.requests[0]["max_tokens"]
    assert judgment.reason is not None
    assert f"still thinking when its answer's room of {room} tokens ran out" in judgment.reason
    assert "--judge-thinking-tokens" in judgment.reason


async def test_judge_thinking_tokens_add_to_each_answers_room_within_the_context(
    store: TrajectoryStore, sqlite_url: str
) -> None:
    context = 8192
    rooms = []
    for thinking in (0, 1000):  # two groups told apart, or the second is the first's cached
        await record_group(store, [answered(f"{city} {thinking}") for city in ("Paris", "Lyon")])
        script = answer_by_content(paris_is_best)
        async with running_scripted_judge(script, context_tokens=context) as judge:
            totals = await judge_groups(sqlite_url, judge, judge_thinking_tokens=thinking)
        assert totals.scored == 1
        [body] = judge.requests
        assert tokens_in(body["messages"]) + body["max_tokens"] <= context
        rooms.append(body["max_tokens"])

    assert rooms[1] == rooms[0] + 1000
