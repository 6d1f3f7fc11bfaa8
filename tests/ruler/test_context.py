"""The judge's prompt fits the judge: its context read from its server (`/v1/models`
`max_model_len`), every prompt it is sent (re-asks included) fitted to it, counted by its own
tokenizer where the server counts (`/tokenize`). The README's judge step once failed with
`ContextWindowExceededError ... maximum context length is 2048 tokens ... 4120 input tokens`."""

from __future__ import annotations

import io

from rich.console import Console

from art_proxy.config import JudgeSettings
from art_proxy.ruler.command import run_judge
from art_proxy.ruler.rubric import DEFAULT_RUBRIC
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.recorded import answered, record_group
from tests.ruler.scripted_judge import (
    Reply,
    answer_by_content,
    running_scripted_judge,
    tokens_in,
)

CONTEXT = 2048


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
        settings = JudgeSettings(
            store=sqlite_url,
            judge="openai/scripted",
            judge_base_url=judge.base_url,
            judge_orders=1,
            wait=0,
        )
        quiet = Console(file=io.StringIO())
        totals = await run_judge(settings, DEFAULT_RUBRIC, quiet, quiet)
    (judgment,) = await store.judgments()

    assert totals.scored == 1, judgment.reason
    assert len(judge.requests) == 2  # the invalid answer, then the answer to the re-ask
    for body in judge.requests:
        assert tokens_in(body["messages"]) + body["max_tokens"] <= CONTEXT
    scores = {score.label: round(score.score, 3) for score in judgment.scores}
    assert scores == {"t1": 0.9, "t2": 0.2, "t3": 0.2, "t4": 0.2}
